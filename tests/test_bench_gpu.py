"""scripts/bench_gpu.py: it says so and exits 0 without CUDA, and its CPU smoke path prints the tables."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.py"


def _bench_gpu() -> dict:
    """The script's globals (its functions and constants), without running main()."""
    return runpy.run_path(str(SCRIPT), run_name="bench_gpu")


@pytest.fixture
def saved_model(model, tokenizer, tmp_path):
    """A tiny model folder with its tokenizer (as `vaswani-mt train` writes runs/NAME/model) and a source file."""
    from tiny_tokenizer import SENTENCES

    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    source = tmp_path / "source.en"
    source.write_text("\n".join(SENTENCES) + "\n\n")
    return tmp_path / "model", source


def test_without_cuda_it_says_so_measures_nothing_and_exits_0():
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=environment)
    assert done.returncode == 0, done.stderr
    assert "no CUDA device" in done.stdout and "nothing measured" in done.stdout
    assert "|" not in done.stdout  # no table


def test_cpu_smoke_run_prints_both_tables_and_float32_outputs_all_identical(saved_model, capsys, monkeypatch):
    folder, source = saved_model
    bench = _bench_gpu()
    monkeypatch.setattr(sys.modules["benchmark_common"], "wait_for_idle", lambda *args, **kwargs: 0.0)
    code = bench["main"](["--device", "cpu", "--shapes", "tiny", "--tokens", "512", "--reps", "1", "--limit", "8",
                       "--steps", "2", "--warmup-steps", "1", "--max-redo", "0", "--model", str(folder),
                       "--input", str(source)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert bench["TRAINING_HEADER"] in out and bench["DECODING_HEADER"] in out
    training = [line.split(" | ") for line in out.splitlines() if line.startswith("| tiny |")]
    assert [(row[1], row[2]) for row in training] == [(p, s) for p in ("fp32", "bf16") for s in ("marian", "ours")]
    decoding = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith(("| fp32 |", "| bf16 |"))]
    assert len(decoding) == 12
    for precision, mode, system, *_, same_as_marian, same_as_transformers_loop in decoding:
        if precision == "fp32":
            expected = {"marian": ("–", "8/8"), "ours, transformers loop": ("8/8", "–"), "ours": ("8/8", "8/8")}
            assert (same_as_marian, same_as_transformers_loop) == expected[system], (mode, system)
    assert "8 sentences" in out and "(cpu" in out  # what was measured, and where


def test_a_missing_model_folder_is_one_line_and_a_non_zero_exit(tmp_path):
    with pytest.raises(SystemExit) as error:
        _bench_gpu()["main"](["--device", "cpu", "--skip-training", "--model", str(tmp_path / "missing")])
    assert "no saved model" in str(error.value) and "\n" not in str(error.value)
