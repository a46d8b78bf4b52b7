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


def test_model_flops_are_three_times_two_per_weight_and_token_plus_attentions_two_products():
    from vaswani_mt import VaswaniConfig

    model_flops = _bench_gpu()["model_flops"]
    config = VaswaniConfig.from_preset("base")
    d, heads, layers, vocab = 512, 8, 6, config.vocab_size
    weights = layers * (4 * d * d + 2 * d * 2048) + layers * (8 * d * d + 2 * d * 2048) + vocab * d
    attention = 2 * heads * (64 + 64) * (layers * 25 ** 2 + layers * 25 * 50)  # per pair: Q K^T and weights x V
    assert model_flops(config, 1000, 25, 25) == 3 * 1000 * (2 * 25 * weights + attention)
    parameters = 63_082_496  # the base shape's (docs/model.md): 6 N per token, within attention's 0.6 %
    assert model_flops(config, 1000, 25, 25) == pytest.approx(6 * parameters * 25_000, rel=0.01)


def test_mfu_uses_the_gpus_datasheet_peak_or_the_one_given_and_none_on_an_unknown_device():
    bench = _bench_gpu()
    import torch

    cpu = torch.device("cpu")
    assert bench["peak_tflops"](bench["parse_args"](["--skip-decoding"]), cpu, "bf16") is None
    assert bench["peak_tflops"](bench["parse_args"](["--peak-tflops", "312"]), cpu, "bf16") == 312
    assert bench["PEAK_TFLOPS"]["H100"]["bf16"] == bench["PEAK_TFLOPS"]["H200"]["bf16"] == 989.4
