"""`vaswani-mt train`: config errors before any work, resumable after SIGKILL, checkpoints never half-complete."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from vaswani_mt.run_config import ConfigError, load_run_config, parse_overrides
from vaswani_mt.train import main as train_main
from vaswani_mt.trainer import SAVING_MARKER, complete_checkpoints, is_complete_checkpoint

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, multi30k_dir) -> Path:
    """300 training and 16 validation pairs of Multi30k in a {split}.{lang} folder."""
    folder = tmp_path_factory.mktemp("corpus")
    for split, source, count in (("train", "train", 300), ("valid", "valid", 16)):
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{source}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def tiny_config(tmp_path: Path, corpus: Path, **training) -> Path:
    config = {
        "data": {"path": str(corpus), "source_lang": "en", "target_lang": "de", "test_split": None,
                 "max_length": 64},
        "tokenizer": {"vocab_size": 400},
        "model": {"preset": "tiny", "config": {"max_position_embeddings": 128}},
        "training": {"max_tokens": 512, "max_steps": 12, "warmup_steps": 4, "eval_steps": 4, "logging_steps": 2,
                     "keep_checkpoints": 5, "average_last": 2, "num_beams": 1, "seed": 3, "num_threads": 1,
                     **training},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_train(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


# -- bad configs fail fast, naming the key --------------------------------------------------------------------------

@pytest.mark.parametrize("override,message", [
    (["--training.warmup_step", "10"], "unknown config key 'training.warmup_step'; did you mean 'warmup_steps'?"),
    (["--training.max_tokens", "lots"], "config key 'training.max_tokens' must be of type int, got 'lots'"),
    (["--training.warmup_steps", "0"], "training.warmup_steps must be > 0"),
    (["--data.path", "/nonexistent/corpus"], "data.path '/nonexistent/corpus' does not exist"),
    (["--model.config.drop_out", "0.2"], "unknown config key 'model.config.drop_out'; did you mean 'dropout'?"),
    (["--model.config.norm_style", "middle"], "norm_style must be one of"),
    (["--training.label_smoothing", "1.5"], "training.label_smoothing must be in [0, 1)"),
    (["--training.average_last", "9"], "cannot exceed training.keep_checkpoints"),
])
def test_bad_config_is_refused_before_any_work_with_the_key_named(tmp_path, small_corpus, capsys, override,
                                                                   message):
    config = tiny_config(tmp_path, small_corpus)
    assert train_main(["--config", str(config), *override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_shipped_configs_load_and_quick_mode_shortens_the_run():
    full = load_run_config("multi30k-en-de")
    quick = load_run_config("multi30k-en-de", quick=True)
    assert full.model.preset == "small" and full.training.max_minutes == 85
    assert quick.training.max_steps < 1000 and quick.output_dir != full.output_dir
    assert load_run_config("multi30k-de-en").data.source_lang == "de"
    assert load_run_config("wmt14-en-de-base", {"data.path": "."}).tokenizer.vocab_size == 37000


def test_unknown_shipped_config_and_malformed_overrides_are_named():
    with pytest.raises(ConfigError, match="neither a file nor a shipped config"):
        load_run_config("multi30k-xx-yy")
    with pytest.raises(ConfigError, match="has no value"):
        parse_overrides(["--training.max_steps"])
    assert parse_overrides(["--training.max_steps=300", "--model.config.norm_style", "pre"]) == {
        "training.max_steps": 300, "model.config.norm_style": "pre"}


def test_an_existing_run_folder_needs_resume(tmp_path, small_corpus, capsys):
    config = tiny_config(tmp_path, small_corpus)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("x: 1")
    assert train_main(["--config", str(config)]) == 2
    assert "pass --resume" in capsys.readouterr().err


# -- resume after SIGKILL ------------------------------------------------------------------------------------------

def _last_checkpoint_weights(run_dir: Path) -> dict:
    return load_file(complete_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors")


def test_training_killed_with_sigkill_resumes_to_the_same_weights_as_an_uninterrupted_run(tmp_path, small_corpus):
    (tmp_path / "a").mkdir()
    uninterrupted = tiny_config(tmp_path / "a", small_corpus)
    result = run_train("--config", str(uninterrupted))
    assert result.returncode == 0, result.stderr[-3000:]
    expected = _last_checkpoint_weights(tmp_path / "a" / "run")

    (tmp_path / "b").mkdir()
    interrupted = tiny_config(tmp_path / "b", small_corpus)
    checkpoints = tmp_path / "b" / "run" / "checkpoints"
    process = subprocess.Popen([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(interrupted)],
                               cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (checkpoints / "checkpoint-4").exists() or not is_complete_checkpoint(checkpoints / "checkpoint-4"):
        assert process.poll() is None and time.monotonic() < deadline, "training ended before the first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (checkpoints / "checkpoint-12").exists()

    result = run_train("--config", str(interrupted), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stderr
    resumed = _last_checkpoint_weights(tmp_path / "b" / "run")
    assert resumed.keys() == expected.keys()
    for name in expected:
        assert (resumed[name] == expected[name]).all(), name  # bitwise on CPU

    metrics = json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())
    assert metrics["training"]["steps"] == 12
    for name in ("config.yaml", "train.log", "model/model.safetensors", "model/tokenizer.json"):
        assert (tmp_path / "b" / "run" / name).exists(), name


def test_resume_skips_a_checkpoint_whose_save_did_not_finish(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, max_steps=8)
    assert run_train("--config", str(config)).returncode == 0
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [p.name for p in complete_checkpoints(checkpoints)] == ["checkpoint-4", "checkpoint-8"]
    # A save killed half-way: the folder exists, with the marker still in it.
    (checkpoints / "checkpoint-8" / SAVING_MARKER).touch()
    assert not is_complete_checkpoint(checkpoints / "checkpoint-8")
    result = run_train("--config", str(config), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "removing" in result.stderr and "checkpoint-8" in result.stderr
    assert "resuming from " + str(checkpoints / "checkpoint-4") in result.stderr
    assert is_complete_checkpoint(checkpoints / "checkpoint-8")  # written again by the resumed run


# -- the same command under torchrun ------------------------------------------------------------------------------

def test_the_train_command_runs_under_torchrun_with_two_processes(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, max_steps=4, eval_steps=4, average_last=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "vaswani_mt.train", "--config", str(config)],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["training"]["world_size"] == 2
    assert metrics["training"]["steps"] == 4
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    assert is_complete_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint-4")
