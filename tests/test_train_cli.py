"""`vaswani-mt train`: config errors before any work, resumable after SIGKILL, checkpoints never half-complete."""

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from vaswani_mt.cli.train import main as train_main
from vaswani_mt.publishing.model_card import render_model_card
from vaswani_mt.recipe.config import ConfigError, load_run_config, parse_overrides
from vaswani_mt.recipe.trainer import SAVING_MARKER, complete_checkpoints, is_complete_checkpoint

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, multi30k_dir) -> Path:
    """300 training, 16 validation and 16 test pairs of Multi30k in a {split}.{lang} folder."""
    folder = tmp_path_factory.mktemp("corpus")
    for split, source, count in (("train", "train", 300), ("valid", "valid", 16), ("test", "test2016", 16)):
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{source}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def tiny_config(tmp_path: Path, corpus: Path, test_split: str | None = None, **training) -> Path:
    config = {
        "data": {"path": str(corpus), "source_lang": "en", "target_lang": "de", "test_split": test_split,
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


# The runs of these tests train on the CPU, also on a machine with a GPU: they compare weights bit for bit, which
# CUDA kernels do not promise.
CPU_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_train(*args: str, timeout: int = 300, umask: int = -1) -> subprocess.CompletedProcess:
    env = CPU_ENV
    return subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO, umask=umask)


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
    (["--tokenizer.vocab_size", "120"], "tokenizer.vocab_size must be above 260"),
    (["--data.max_length", "600"], "data.max_length (600) exceeds training.max_tokens (512)"),
    (["--training.length_penalty_style", "gnm"], "training.length_penalty_style must be one of transformers, gnmt"),
    (["--training.average_every", "0"], "training.average_every must be > 0"),
    (["--training.average_every", "3", "--training.average_last", "1"], "which must then be at least 2, got 1"),
    (["--data.workers", "0"], "data.workers must be a positive number of processes or null (the usable cores), got 0"),
    (["--training.ddp_backend", "glo"], "training.ddp_backend must be null (NCCL on CUDA, gloo on CPUs) or one of"),
    (["--training.cooldown_steps", "-1"], "training.cooldown_steps must be >= 0 (0: none), got -1"),
    (["--data.max_length", "1"], "data.max_length must be at least 2 (one token and </s>), got 1"),
    (["--training.cooldown_steps", "13"], "training.cooldown_steps (13) exceeds training.max_steps (12)"),
    (["--training.cooldown_steps", "5", "--training.max_steps", "null", "--training.max_minutes", "5"],
     "training.cooldown_steps (5) needs training.max_steps"),
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
    assert full.model.preset == "mini" and full.training.budget_minutes == 80
    assert quick.training.budget_minutes < full.training.budget_minutes and quick.output_dir != full.output_dir
    assert load_run_config("multi30k-de-en").data.source_lang == "de"
    assert load_run_config("wmt14-en-de-base", {"data.path": "."}).tokenizer.vocab_size == 37000


def test_unknown_shipped_config_and_malformed_overrides_are_named():
    with pytest.raises(ConfigError, match="neither a file nor a shipped config"):
        load_run_config("multi30k-xx-yy")
    with pytest.raises(ConfigError, match="has no value"):
        parse_overrides(["--training.max_steps"])
    assert parse_overrides(["--training.max_steps=300", "--model.config.norm_style", "pre"]) == {
        "training.max_steps": 300, "model.config.norm_style": "pre"}


def test_a_config_section_left_empty_is_named(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("extends: multi30k-en-de\ntraining:\n")
    with pytest.raises(ConfigError, match="^training must be a mapping of keys to values, got None$"):
        load_run_config(str(config))


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
                               cwd=REPO, env=CPU_ENV,
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
    # A save killed half-way: the folder exists, with the marker still in it (and the run never got to metrics.json).
    (checkpoints / "checkpoint-8" / SAVING_MARKER).touch()
    (tmp_path / "run" / "metrics.json").unlink()
    assert not is_complete_checkpoint(checkpoints / "checkpoint-8")
    result = run_train("--config", str(config), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "removing" in result.stderr and "checkpoint-8" in result.stderr
    assert "resuming from " + str(checkpoints / "checkpoint-4") in result.stderr
    assert is_complete_checkpoint(checkpoints / "checkpoint-8")  # written again by the resumed run


# -- the same command under torchrun ------------------------------------------------------------------------------

def test_the_train_command_runs_under_torchrun_with_two_processes(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, max_steps=4, eval_steps=4, average_last=0)
    # two CPU processes (gloo), also on a machine with one GPU, which two processes cannot share under NCCL
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "vaswani_mt.cli.train", "--config", str(config)],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["training"]["world_size"] == 2
    assert metrics["training"]["steps"] == 4
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    assert is_complete_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint-4")


# -- nothing a user types destroys work (issue #12) -------------------------------------------------------------------

KILL_AT = REPO / "tests" / "trainer_helpers" / "kill_at.py"
# Saves every 2 updates; 2 checkpoints kept besides the best one (the first: BLEU stays 0 on this tiny run), so the
# save of update 8 is the first to delete one (checkpoint-4); the last 2 saves are averaged.
# Beam 2 with GNMT's length penalty: validation, test and the saved model decode with the config's settings.
FAULT_RUN = dict(max_steps=12, eval_steps=2, keep_checkpoints=2, average_last=2, num_beams=2, length_penalty=0.8,
                 length_penalty_style="gnmt")


# The reference run's umask: group-writable files (0664), unlike both the usual umask's 0644 and safetensors' 0600.
RUN_UMASK = 0o002


@pytest.fixture(scope="module")
def reference_output(tmp_path_factory, small_corpus) -> subprocess.CompletedProcess:
    """An uninterrupted run (with test scoring) that the interrupted ones must end up equal to; stderr is a pipe, not
    a terminal (as in a log file or CI)."""
    folder = tmp_path_factory.mktemp("reference")
    result = run_train("--config", str(tiny_config(folder, small_corpus, test_split="test", **FAULT_RUN)),
                       umask=RUN_UMASK)
    assert result.returncode == 0, result.stderr[-3000:]
    result.run_dir = folder / "run"
    return result


@pytest.fixture(scope="module")
def reference_run(reference_output) -> Path:
    return reference_output.run_dir


@pytest.fixture
def restore_logging():
    """`train.main` in-process configures the root logger (train.log): put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.handlers[:], root.level = handlers, level


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _same_bits(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


def _copy_run(run: Path, destination: Path) -> Path:
    """A copy of `run` whose config.yaml names the copy as its output_dir (so that --resume accepts it)."""
    import shutil

    shutil.copytree(run, destination)
    config = yaml.safe_load((destination / "config.yaml").read_text())
    config["output_dir"] = str(destination)
    (destination / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return destination


def test_progress_lines_when_stderr_is_not_a_terminal(reference_output):
    """One line per logging step (step/total, loss, target tokens/s, ETA) and for every translation pass, in place
    of the Trainer's bare metrics dicts (which went to stdout)."""
    err = reference_output.stderr
    assert "vaswani_mt.train: train: 12 updates to go (step 0/12)" in err
    for step in (2, 4, 12):
        assert f"train: step {step}/12, loss " in err
    assert "target tok/s, elapsed " in err and ", ETA " in err
    for label in ("valid at step 2", "valid at step 12", "valid, average of the last 2 saves", "test translation"):
        assert f"{label}: translating 16 sentences in 1 batch\n" in err, label
        assert f"{label}: 1 batch in " in err and ", BLEU " in err, label
    assert "valid, best checkpoint" not in err  # its score is its validation's during training
    assert "train: done, 12 updates in " in err
    assert "{'loss'" not in err + reference_output.stdout
    assert "test translation: 1 batch in" in (reference_output.run_dir / "train.log").read_text()


def test_train_ends_with_a_summary_on_stderr_and_leaves_stdout_empty(reference_output):
    run_dir, err = reference_output.run_dir, reference_output.stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    summary = err[err.index("finished in "):]
    assert summary.splitlines()[0].endswith("(12 updates)")
    assert f"model         {run_dir / 'model'}  (average of checkpoint-10, checkpoint-12)" in summary \
        or f"model         {run_dir / 'model'}  (best checkpoint checkpoint-" in summary
    assert f"test          BLEU {metrics['test']['bleu']:.2f}  {metrics['test']['bleu_signature']}" in summary
    assert f"chrF {metrics['test']['chrf']:.2f}  {metrics['test']['chrf_signature']}" in summary
    assert f"vaswani-mt translate {run_dir / 'model'} --input sentences.en > sentences.de" in summary
    assert f"vaswani-mt push {run_dir} YOUR-NAME/MODEL-NAME --dry-run" in summary
    assert reference_output.stdout == ""
    assert summary.splitlines()[0] in (run_dir / "train.log").read_text()


def test_the_run_says_what_precision_it_trained_in_and_why_in_its_log_record_and_card(reference_output):
    run_dir = reference_output.run_dir
    precision = json.loads((run_dir / "metrics.json").read_text())["training"]["precision"]
    assert precision == "float32 (training.precision is fp32)"
    assert precision in (run_dir / "train.log").read_text()
    assert f"| Precision | {precision} |" in render_model_card(run_dir)


def test_a_precision_apples_gpu_cannot_run_is_refused_in_one_line_before_any_work(tmp_path, small_corpus, capsys,
                                                                                   monkeypatch, restore_logging):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.backends.mps.is_built", lambda: True)
    monkeypatch.setattr("torch.backends.mps.is_available", lambda: True)  # a Mac, with a torch too old for fp16 there
    monkeypatch.setattr("torch.__version__", "2.7.1")
    assert train_main(["--config", str(tiny_config(tmp_path, small_corpus, precision="fp16"))]) == 2
    assert capsys.readouterr().err.endswith(
        "vaswani-mt train: error: training.precision fp16 on Apple's GPU (MPS) needs torch 2.8 or later for float16 "
        "(its GradScaler); this is torch 2.7.1\n")
    assert not (tmp_path / "run").exists()


def test_a_run_forced_to_float16_records_its_skipped_updates_in_its_record_and_card(tmp_path, small_corpus):
    """`--training.fp16 true` (transformers' name) on the CPU: float16 autocast with a grad scaler, the loss scale
    and skipped updates at each logging step, their sum in metrics.json and the card."""
    config = tiny_config(tmp_path, small_corpus, max_steps=4, eval_steps=4, average_last=1)
    result = run_train("--config", str(config), "--training.fp16", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    training = json.loads((run_dir / "metrics.json").read_text())["training"]
    assert training["precision"] == "float16 autocast with dynamic loss scaling (training.precision is fp16)"
    assert "on the CPU: float16 with loss scaling pays on GPUs" in result.stderr  # the warning of its cost
    history = json.loads((run_dir / "log_history.json").read_text())
    logged = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 4] and all("loss_scale" in entry for entry in logged)
    assert training["skipped_updates"] == sum(entry.get("skipped_updates", 0) for entry in history)
    assert (f"| Precision | {training['precision']}; {training['skipped_updates']} of 4 updates skipped (their "
            "gradients overflowed in float16) |") in render_model_card(run_dir)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["precision"] == "fp16"


def test_the_files_of_a_run_follow_the_umask(reference_run):
    """safetensors writes weights 0600 and the atomic writes used a 0600 temporary file: every file of the run must
    get what the umask gives any other new file."""
    expected = 0o666 & ~RUN_UMASK
    files = ["model/model.safetensors", "model/config.json", "averaged/model.safetensors", "metrics.json", "test.hyp",
             "log_history.json", "checkpoints/checkpoint-12/model.safetensors"]
    modes = {name: oct((reference_run / name).stat().st_mode & 0o777) for name in files}
    assert modes == {name: oct(expected) for name in files}


def test_the_saved_model_decodes_with_the_runs_beam_size_and_length_penalty(reference_run):
    generation = json.loads((reference_run / "model" / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["length_penalty_style"]) == (
        2, 0.8, "gnmt")
    record = json.loads((reference_run / "metrics.json").read_text())
    assert record["test"]["num_beams"] == 2


def test_the_last_saves_are_averaged_not_an_older_best_checkpoint(reference_run):
    checkpoints = sorted(p.name for p in (reference_run / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint-10", "checkpoint-12", "checkpoint-2"]  # the best one is kept as well
    selection = json.loads((reference_run / "metrics.json").read_text())["selection"]
    assert selection["best_checkpoint"].endswith("checkpoint-2")
    assert selection["averaged_checkpoints"] == ["checkpoint-10", "checkpoint-12"]
    assert "averaging the last 2 saves: checkpoint-10, checkpoint-12" in (reference_run / "train.log").read_text()


def test_resume_of_a_finished_run_has_nothing_to_do_and_touches_nothing(reference_run, capsys):
    before = _files(reference_run)
    assert train_main(["--config", str(reference_run.parent / "config.yaml"), "--resume"]) == 0
    assert "is a finished run (it has metrics.json): nothing to do" in capsys.readouterr().err
    assert _files(reference_run) == before


def test_resume_of_a_finished_run_with_another_config_is_refused(reference_run, capsys):
    config = str(reference_run.parent / "config.yaml")
    assert train_main(["--config", config, "--resume", "--training.seed", "99"]) == 2
    assert "--resume: the config differs from the one" in capsys.readouterr().err


def test_train_run_from_a_script_without_logging_says_what_it_does_on_stderr(reference_run):
    """Python's last-resort handler shows only warnings: a caller with no logging set up still sees the run's lines."""
    script = ("from vaswani_mt import load_run_config, train_run\n"
              f"train_run(load_run_config({str(reference_run.parent / 'config.yaml')!r}), resume=True)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is a finished run (it has metrics.json): nothing to do" in result.stderr


def test_resume_after_a_kill_during_averaging_or_test_scoring_ends_with_the_uninterrupted_model(reference_run,
                                                                                                tmp_path):
    """What a kill after training leaves: every checkpoint, a half-written average, no model/ and no metrics.json."""
    run = _copy_run(reference_run, tmp_path / "run")
    for name in ("metrics.json", "test.hyp", "log_history.json"):
        (run / name).unlink()
    for name in ("model", "plots"):
        import shutil

        shutil.rmtree(run / name)
    averaged = run / "averaged" / "model.safetensors"
    averaged.write_bytes(averaged.read_bytes()[:100])
    checkpoints = _files(run / "checkpoints")

    result = run_train("--config", str(reference_run.parent / "config.yaml"), "--output-dir", str(run), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training ended there (step 12)" in result.stderr
    assert _files(run / "checkpoints") == checkpoints  # no step past max_steps, no checkpoint deleted
    for name in ("model/model.safetensors", "averaged/model.safetensors", "test.hyp"):
        assert _same_bits(run / name, reference_run / name), name
    metrics, expected = (json.loads((folder / "metrics.json").read_text()) for folder in (run, reference_run))
    assert metrics["training"]["steps"] == 12 and metrics["test"]["bleu"] == expected["test"]["bleu"]
    assert metrics["selection"]["averaged_checkpoints"] == expected["selection"]["averaged_checkpoints"]


@pytest.mark.parametrize("point", [
    "delete-half",
    pytest.param("save-begun", marks=pytest.mark.slow),
    pytest.param("save-weights", marks=pytest.mark.slow),
    pytest.param("save-written", marks=pytest.mark.slow),
    pytest.param("delete-renamed", marks=pytest.mark.slow),
    pytest.param("delete-in-place", marks=pytest.mark.slow),
])
def test_a_kill_inside_saving_or_deleting_a_checkpoint_resumes_to_the_uninterrupted_weights(reference_run, tmp_path,
                                                                                          small_corpus, point):
    """SIGKILL at `point` (tests/trainer_helpers/kill_at.py) during the save of update 8, or during the deletion of
    checkpoint-4 that this save triggers; then `--resume`: the final weights are bitwise the reference run's."""
    config = tiny_config(tmp_path, small_corpus, test_split="test", **FAULT_RUN)
    killed = subprocess.run([sys.executable, str(KILL_AT), point, "8", "--", "--config", str(config)],
                            capture_output=True, text=True, env=CPU_ENV, cwd=REPO,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint-10").exists()

    result = run_train("--config", str(config), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    for name in ("checkpoints/checkpoint-12/model.safetensors", "model/model.safetensors", "test.hyp"):
        assert _same_bits(run / name, reference_run / name), name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-10", "checkpoint-12",
                                                                        "checkpoint-2"]


@pytest.mark.parametrize("damage", ["rng_state.pth", "training_args.bin", "optimizer.pt", "trainer_state.json",
                                    "model.safetensors", SAVING_MARKER])
def test_a_checkpoint_missing_a_file_it_must_have_does_not_count_and_resume_removes_it(reference_run, tmp_path,
                                                                                       damage):
    """The one completeness rule (vaswani_mt.files.checkpoint_problem): `--resume`, averaging at the end of training
    and `vaswani-mt average --run-dir` all read it."""
    from vaswani_mt.files import remove_incomplete_checkpoints
    from vaswani_mt.recipe.averaging import find_checkpoints

    checkpoints = _copy_run(reference_run, tmp_path / "run") / "checkpoints"
    damaged = checkpoints / "checkpoint-10"
    if damage == SAVING_MARKER:
        (damaged / damage).touch()
    elif damage == "model.safetensors":
        (damaged / damage).write_bytes((damaged / damage).read_bytes()[:500])  # a write cut short
    else:
        (damaged / damage).unlink()
    assert not is_complete_checkpoint(damaged)
    assert [p.name for p in complete_checkpoints(checkpoints)] == ["checkpoint-2", "checkpoint-12"]
    assert find_checkpoints(checkpoints) == complete_checkpoints(checkpoints)
    (checkpoints / "deleting-checkpoint-4").mkdir()  # a deletion that a kill stopped
    removed = remove_incomplete_checkpoints(checkpoints)
    assert [line.split(":")[0] for line in removed] == [str(damaged), str(checkpoints / "deleting-checkpoint-4")]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-12", "checkpoint-2"]


def _corpus_with(tmp_path: Path, small_corpus: Path, **files: str) -> Path:
    import shutil

    folder = tmp_path / "corpus"
    shutil.copytree(small_corpus, folder)
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("files,message", [
    ({"train_en": "@@\n...\n", "train_de": "@@\nEin Hund.\n"},
     "split 'train' is empty after cleaning: all 2 pairs were dropped (placeholder: 2)"),
    ({"train_de": "Ein Hund.\n"}, "train.en has 300 lines but train.de has 1"),
])
def test_bad_data_is_one_line_and_leaves_no_run_folder_so_the_retry_is_not_refused(tmp_path, small_corpus, capsys,
                                                                                    files, message):
    config = tiny_config(tmp_path, _corpus_with(tmp_path, small_corpus, **files))
    assert train_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err  # the lines before the error are datasets' progress bars
    assert err.splitlines()[-1].startswith("vaswani-mt train: error: ") and message in err.splitlines()[-1], err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_naming_it(tmp_path, small_corpus, capsys, monkeypatch,
                                                                     restore_logging):
    import os

    import torch

    def full_disk(*args, **kwargs):  # the disk fills up: no blocks left, and torch's error says nothing of space
        no_blocks_left = os.statvfs_result((4096, 4096, 1000, 0, 0, 100, 50, 50, 0, 255))
        monkeypatch.setattr(os, "statvfs", lambda path: no_blocks_left)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", full_disk)  # what the Trainer writes the optimizer state with
    config = tiny_config(tmp_path, small_corpus, max_steps=2, eval_steps=2)
    assert train_main(["--config", str(config)]) == 1
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    assert capsys.readouterr().err.endswith(f"vaswani-mt train: error: no space left on device: {checkpoint}\n")
    assert not is_complete_checkpoint(checkpoint)


def test_training_torch_compile_reaches_the_trainers_arguments(tmp_path, small_corpus):
    from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

    config = load_run_config(str(tiny_config(tmp_path, small_corpus)),
                             parse_overrides(["--training.torch_compile", "true"]))
    assert VaswaniTrainingArguments.from_config(config.training, str(tmp_path)).torch_compile is True
    config = load_run_config(str(tiny_config(tmp_path, small_corpus)))
    assert VaswaniTrainingArguments.from_config(config.training, str(tmp_path)).torch_compile is False


def test_every_training_setting_of_the_config_reaches_the_trainers_arguments_and_back(tmp_path, small_corpus):
    """A training key that names a trainer argument is that argument; the others arrive converted."""
    import dataclasses

    from vaswani_mt.recipe.config import TrainingConfig
    from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

    overrides = ["--training.warmup_steps", "123", "--training.noam_factor", "2.5", "--training.label_smoothing",
                 "0.2", "--training.num_beams", "5", "--training.max_grad_norm", "1.5", "--training.seed", "7",
                 "--training.max_steps", "40", "--training.keep_checkpoints", "3", "--training.average_last", "2",
                 "--training.cooldown_steps", "10", "--training.num_epochs", "3", "--training.bpe_dropout", "0.1"]
    training = load_run_config(str(tiny_config(tmp_path, small_corpus)), parse_overrides(overrides)).training
    args = VaswaniTrainingArguments.from_config(training, str(tmp_path))
    arguments = {f.name for f in dataclasses.fields(VaswaniTrainingArguments)}
    shared = [f.name for f in dataclasses.fields(TrainingConfig) if f.name in arguments]
    assert {"warmup_steps", "noam_factor", "label_smoothing", "max_grad_norm", "seed", "cooldown_steps",
            "max_tokens", "torch_compile", "bpe_dropout"} <= set(shared)
    for key in shared:
        assert getattr(args, key) == getattr(training, key), key
    assert (args.max_steps, args.save_steps, args.checkpoint_limit) == (40, training.eval_steps, 4)
    assert (args.generation_num_beams, args.num_train_epochs) == (5, 3)
    settings = args.recipe_settings()
    assert {key: settings[key] for key in shared} == {key: getattr(training, key) for key in shared}
    assert (settings["max_steps"], settings["num_beams"], settings["num_epochs"]) == (40, 5, 3)


def test_the_trainers_argument_defaults_are_the_run_configs(tmp_path):
    from vaswani_mt.recipe.config import TrainingConfig
    from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

    args, recipe = VaswaniTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True), TrainingConfig()
    for key, argument in [("label_smoothing", "label_smoothing"), ("noam_factor", "noam_factor"),
                          ("warmup_steps", "warmup_steps"), ("adam_beta2", "adam_beta2"),
                          ("adam_epsilon", "adam_epsilon"), ("weight_decay", "weight_decay"),
                          ("num_beams", "generation_num_beams")]:
        assert getattr(args, argument) == getattr(recipe, key), key


def test_resume_accepts_a_config_that_differs_only_in_what_the_card_and_quick_read(tmp_path, small_corpus):
    from vaswani_mt.recipe.resuming import _what_trains

    first = load_run_config(str(tiny_config(tmp_path, small_corpus)))
    later = load_run_config(str(tiny_config(tmp_path, small_corpus)),
                            parse_overrides(["--data.description.name", "My corpus"]))
    assert _what_trains(first) == _what_trains(later)
    changed = load_run_config(str(tiny_config(tmp_path, small_corpus)), parse_overrides(["--training.seed", "99"]))
    assert _what_trains(first) != _what_trains(changed)


# -- averaging weight snapshots (training.average_every) ---------------------------------------------------------------

def test_snapshots_every_n_updates_are_averaged_and_a_resumed_run_ends_with_the_same_average(tmp_path, small_corpus):
    """Snapshots every 3 updates, the last 2 averaged (not the evaluation checkpoints, every 4). A run resumed from
    checkpoint-4 drops the snapshots written after it (a stray later one and a half-written one) and writes them again:
    its average is the uninterrupted run's, bit for bit."""
    import shutil

    (tmp_path / "a").mkdir()
    config = tiny_config(tmp_path / "a", small_corpus, average_every=3)
    result = run_train("--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    reference = tmp_path / "a" / "run"
    assert sorted(p.name for p in (reference / "snapshots").iterdir()) == ["step-12", "step-9"]
    selection = json.loads((reference / "metrics.json").read_text())["selection"]
    assert selection["averaged_checkpoints"] == ["step-9", "step-12"]
    assert "averaging the last 2 snapshots: step-9, step-12" in result.stderr
    assert "valid, average of the last 2 snapshots: 1 batch in " in result.stderr

    run = _copy_run(reference, tmp_path / "b")
    for name in ("metrics.json", "log_history.json"):
        (run / name).unlink()
    for name in ("model", "plots", "averaged", "checkpoints/checkpoint-8", "checkpoints/checkpoint-12"):
        shutil.rmtree(run / name)
    shutil.copytree(run / "snapshots" / "step-12", run / "snapshots" / "step-15")  # after the checkpoint: dropped
    shutil.copytree(run / "snapshots" / "step-12", run / "snapshots" / ".step-18.tmp")
    result = run_train("--config", str(run / "config.yaml"), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from " + str(run / "checkpoints" / "checkpoint-4") in result.stderr
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["step-12", "step-9"]
    assert _same_bits(run / "averaged" / "model.safetensors", reference / "averaged" / "model.safetensors")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_training_on_cpu_keeps_freed_memory_in_the_process(reference_output):  # CPU_ENV: on the CPU everywhere
    """vaswani_mt.recipe.host_memory: the step's ~80 MB logits are not mapped and unmapped again every step."""
    assert "malloc keeps freed memory for the next step" in (reference_output.run_dir / "train.log").read_text()


def test_a_time_budget_that_stops_a_run_inside_its_cooldown_is_logged_and_named_on_the_card(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, cooldown_steps=4, max_minutes=1e-5)  # stops after the first update
    assert train_main(["--config", str(config)]) == 0
    run_dir = tmp_path / "run"
    updates = json.loads((run_dir / "metrics.json").read_text())["training"]["steps"]
    assert updates < 12
    log = (run_dir / "train.log").read_text()
    assert f"the run stopped at update {updates}, before the end of its cool-down at update 12 (training.max_steps)" in log
    card = render_model_card(run_dir)
    assert f"linear fall to 0 over updates 9-12 (not in the paper), but the run stopped at update {updates}" in card


# -- the same run from Python ------------------------------------------------------------------------------------------

def test_train_run_trains_from_python_returns_the_record_and_leaves_the_callers_logging_alone(tmp_path, small_corpus):
    from vaswani_mt import RunRecord, load_run_config, train_run

    config = load_run_config(str(tiny_config(tmp_path, small_corpus, test_split="test", max_steps=4)))
    root, package = logging.getLogger(), logging.getLogger("vaswani_mt")
    handlers, levels = root.handlers[:], (root.level, package.level)
    record = train_run(config)
    assert (root.handlers, (root.level, package.level)) == (handlers, levels)
    run_dir = tmp_path / "run"
    assert isinstance(record, RunRecord) and record.training.steps == 4
    assert record.to_json() == json.loads((run_dir / "metrics.json").read_text())
    assert record.test.bleu_signature.startswith("nrefs:1|")
    assert "train: done, 4 updates in " in (run_dir / "train.log").read_text()
    with pytest.raises(ConfigError, match="already holds a run: pass --resume"):
        train_run(config)
    before = _files(run_dir)
    assert train_run(config, resume=True).to_json() == record.to_json()
    assert _files(run_dir) == before
