"""Outgrowing one machine: two torchrun nodes train as one run, an elastic run survives a killed worker, and a run
resumed on another number of processes keeps the tokens of an update (issue #46). Every run here is the same tiny
run of 40 updates with a checkpoint every 10, on CPU (gloo), so that their weights can be compared bit for bit."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from safetensors.torch import load_file

from test_train_cli import REPO, small_corpus, tiny_config  # noqa: F401 - small_corpus: a fixture, used by name
from vaswani_mt.recipe.config import ConfigError, load_run_config
from vaswani_mt.recipe.processes import (BATCH_FILE, UpdateBatch, accumulation_keeping, restarts_across_nodes_problem,
                                         resumed_accumulation)
from vaswani_mt.recipe.trainer import complete_checkpoints

DIE_IN_SAVE = REPO / "tests" / "trainer_helpers" / "die_in_save.py"
RUN = dict(max_steps=40, eval_steps=10, keep_checkpoints=5, average_last=2)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",  # gloo on CPUs, also on a GPU machine
       "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(*args: str, train_args: list[str], script: list[str] | None = None,
             env: dict | None = None) -> subprocess.Popen:
    target = script or ["-m", "vaswani_mt.cli.train"]
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args, *target, *train_args], cwd=REPO,
                            env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(process: subprocess.Popen, timeout: int = 300) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]
    return output


def all_finished(nodes: list[subprocess.Popen], timeout: int = 300) -> list[str]:
    """Each node's output, read side by side (a node whose pipe filled up would stall the others); none left running."""
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            return list(pool.map(lambda node: finished(node, timeout), nodes))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()


def run_config(folder: Path, corpus: Path, **training) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return tiny_config(folder, corpus, **{**RUN, **training})


def weights(run: Path, step: int) -> dict:
    return load_file(run / "checkpoints" / f"checkpoint-{step}" / "model.safetensors")


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[name] == b[name]).all() for name in a)


def learning_rates(run: Path) -> dict[int, float]:
    state = json.loads((run / "checkpoints" / "checkpoint-40" / "trainer_state.json").read_text())
    return {entry["step"]: entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry}


def stopped_after(run: Path, step: int, copy: Path) -> Path:
    """A copy of a finished run as it was when it stopped after the checkpoint of update `step`."""
    shutil.copytree(run, copy)
    for folder in (copy / "checkpoints").glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    for name in ("metrics.json", "model", "averaged", "test.hyp", "plots"):
        target = copy / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["output_dir"] = str(copy)
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    return copy


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, small_corpus) -> Path:  # noqa: F811
    """The uninterrupted run on two processes of one node."""
    folder = tmp_path_factory.mktemp("two-processes")
    config = run_config(folder, small_corpus)
    finished(torchrun("--standalone", "--nproc_per_node", "2", train_args=["--config", str(config)]))
    return folder / "run"


def test_each_checkpoint_records_the_processes_and_accumulation_of_its_updates(two_processes):
    assert UpdateBatch.of_checkpoint(two_processes / "checkpoints" / "checkpoint-40") == UpdateBatch(2, 1, 512)
    assert json.loads((two_processes / "metrics.json").read_text())["training"]["world_size"] == 2


def test_two_nodes_of_one_process_train_as_one_run_in_one_folder_written_once(tmp_path, small_corpus,  # noqa: F811
                                                                                two_processes):
    """torchrun --nnodes 2 on 127.0.0.1, the run folder and the data cache on a file system both nodes see: the same
    updates, bit for bit, as two processes of one node."""
    config = run_config(tmp_path, small_corpus)
    port = str(free_port())
    nodes = [torchrun("--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank), "--master_addr",
                      "127.0.0.1", "--master_port", port, train_args=["--config", str(config)]) for rank in (0, 1)]
    outputs = all_finished(nodes)
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["training"]["world_size"] == 2 and metrics["training"]["steps"] == 40
    log = (run / "train.log").read_text()
    assert log.count("world size 2") == 1 and log.count("run complete after") == 1  # one writer
    assert "run complete after" in outputs[0] and "run complete after" not in outputs[1]
    assert same_bits(weights(run, 40), weights(two_processes, 40))


def test_an_elastic_run_survives_a_worker_killed_while_a_checkpoint_is_saved(tmp_path, small_corpus,  # noqa: F811
                                                                               two_processes):
    """torchrun --max-restarts 1 ... --resume: rank 1 dies as the checkpoint of update 30 is being written; both
    workers restart, the half-written checkpoint is removed, never read, and the run resumes from update 20 to the
    weights of the uninterrupted run, bit for bit."""
    config = run_config(tmp_path, small_corpus)
    output = finished(torchrun("--standalone", "--nproc_per_node", "2", "--max-restarts", "1",
                               script=[str(DIE_IN_SAVE), "1", "30", "--"],
                               train_args=["--config", str(config), "--resume"]))
    run = tmp_path / "run"
    assert "exitcode: -9" in output  # the worker did die, and the job went on
    log = (run / "train.log").read_text()
    assert f"removing {run / 'checkpoints' / 'checkpoint-30'}" in log
    assert f"resuming from {run / 'checkpoints' / 'checkpoint-20'}" in log
    assert [folder.name for folder in complete_checkpoints(run / "checkpoints")][-1] == "checkpoint-40"
    for step in (30, 40):
        assert same_bits(weights(run, step), weights(two_processes, step)), step
    assert json.loads((run / "metrics.json").read_text())["training"]["steps"] == 40


def test_an_elastic_run_of_two_nodes_survives_a_worker_killed_while_a_checkpoint_is_saved(
        tmp_path, small_corpus, two_processes):  # noqa: F811
    """The same on two torchrun nodes of one process each (c10d rendezvous on 127.0.0.1), started as docs/training.md
    says, with a store of each attempt's own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): both nodes restart, and the run
    ends with the uninterrupted run's weights, bit for bit."""
    config = run_config(tmp_path, small_corpus)
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "two-nodes",
                  "--local-addr", "127.0.0.1"]  # not the host name, which may not resolve here
    nodes = [torchrun("--nnodes", "2", "--nproc_per_node", "1", *rendezvous, "--max-restarts", "1",
                      script=[str(DIE_IN_SAVE), "1", "30", "--"], train_args=["--config", str(config), "--resume"],
                      env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}) for _ in range(2)]
    outputs = all_finished(nodes)
    run = tmp_path / "run"
    assert sum("exitcode: -9" in output for output in outputs) == 1  # one worker died, on one node
    log = (run / "train.log").read_text()
    assert f"resuming from {run / 'checkpoints' / 'checkpoint-20'}" in log
    assert not any("pytorch issue 135712" in text for text in [log, *outputs])  # each attempt had a store of its own
    for step in (30, 40):
        assert same_bits(weights(run, step), weights(two_processes, step)), step


@pytest.mark.parametrize(("environment", "warned"), [
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
      "TORCHELASTIC_USE_AGENT_STORE": "True"}, True),
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
      "TORCHELASTIC_USE_AGENT_STORE": "False"}, False),  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
      "TORCHELASTIC_USE_AGENT_STORE": "True"}, False),  # one node: each attempt joins a group of its own
    ({"TORCHELASTIC_MAX_RESTARTS": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
      "TORCHELASTIC_USE_AGENT_STORE": "True"}, False),  # no restarts asked for
], ids=["several-nodes-shared-store", "several-nodes-own-stores", "one-node", "no-restarts"])
def test_restarts_across_nodes_sharing_torchruns_store_are_named_in_one_line(monkeypatch, environment, warned):
    for name, setting in environment.items():
        monkeypatch.setenv(name, setting)
    problem = restarts_across_nodes_problem()
    assert (problem is not None) == warned
    assert problem is None or ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node" in problem
                               and "\n" not in problem)


@pytest.fixture(scope="module")
def resumed_on_one(tmp_path_factory, two_processes) -> tuple[Path, subprocess.CompletedProcess]:
    """The two-process run stopped after update 20 and resumed by one process."""
    run = stopped_after(two_processes, 20, tmp_path_factory.mktemp("resumed-on-one") / "run")
    result = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(run / "config.yaml"),
                             "--resume"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return run, result


def test_a_run_of_two_processes_resumed_on_one_accumulates_two_batches_per_update(resumed_on_one, two_processes):
    run, result = resumed_on_one
    assert ("resuming on 1 process where checkpoint-20 was trained on 2: gradient accumulation 1 -> 2 keeps an "
            "update at 2 batches (1 process x 2 accumulated x 512 tokens; was 2 processes x 1 accumulated x 512 "
            "tokens)") in result.stderr
    assert UpdateBatch.of_checkpoint(run / "checkpoints" / "checkpoint-40") == UpdateBatch(1, 2, 512)
    assert yaml.safe_load((run / "config.yaml").read_text())["training"]["gradient_accumulation_steps"] == 2
    resumed, uninterrupted = learning_rates(run), learning_rates(two_processes)
    assert {step: resumed[step] for step in range(22, 41, 2)} == {step: uninterrupted[step] for step in
                                                                  range(22, 41, 2)}  # the schedule goes on
    assert json.loads((run / "metrics.json").read_text())["training"]["steps"] == 40


def test_a_run_of_one_process_resumed_on_two_halves_its_accumulation(tmp_path, resumed_on_one, two_processes):
    """The run above, trained by one process with 2 accumulated batches from update 20 on, stopped after update 30
    and resumed by two processes."""
    run = stopped_after(resumed_on_one[0], 30, tmp_path / "run")
    output = finished(torchrun("--standalone", "--nproc_per_node", "2",
                               train_args=["--config", str(run / "config.yaml"), "--resume"]))
    assert ("resuming on 2 processes where checkpoint-30 was trained on 1: gradient accumulation 2 -> 1 keeps an "
            "update at 2 batches") in output
    assert UpdateBatch.of_checkpoint(run / "checkpoints" / "checkpoint-40") == UpdateBatch(2, 1, 512)
    assert learning_rates(run) == learning_rates(two_processes)


def test_a_number_of_processes_that_cannot_split_an_update_is_one_line_naming_the_numbers(tmp_path):
    (tmp_path / BATCH_FILE).write_text(json.dumps({"processes": 2, "gradient_accumulation_steps": 3,
                                                   "max_tokens": 4096}))
    started = UpdateBatch.of_checkpoint(tmp_path)
    assert accumulation_keeping(started, 3, tmp_path) == 2 and accumulation_keeping(started, 6, tmp_path) == 1
    with pytest.raises(ConfigError, match=re.escape(
            f"--resume on 4 processes: {tmp_path} was trained with 2 processes x 3 accumulated x 4,096 tokens per "
            "update (6 batches), which 4 processes cannot split evenly; resume on a number of processes that "
            "divides 6")):
        accumulation_keeping(started, 4, tmp_path)


def test_a_checkpoint_saved_before_checkpoints_recorded_their_batch_resumes_with_the_configs_accumulation(
        two_processes, tmp_path):
    from vaswani_mt.recipe.resuming import resumed_update as _resumed_update
    from vaswani_mt.run_record import RunFolder

    run = stopped_after(two_processes, 20, tmp_path / "run")
    (run / "checkpoints" / "checkpoint-20" / BATCH_FILE).unlink()
    config = load_run_config(str(run / "config.yaml"), {"training.gradient_accumulation_steps": 3})
    args = SimpleNamespace(world_size=1, gradient_accumulation_steps=3, max_tokens=512)
    assert _resumed_update(config, RunFolder(run), args) is config and args.gradient_accumulation_steps == 3


@pytest.mark.parametrize("started,count,asked,saved,expected", [
    ((2, 1), 1, 1, 1, 2),  # 2 processes -> 1: the config left as it was
    ((2, 1), 1, 2, 1, 2),  # ... or asking for the accumulation that keeps the update
    ((1, 2), 1, 2, 2, 2),  # the same number of processes again, config.yaml rewritten with 2
    ((1, 2), 2, 2, 2, 1),  # 1 process -> 2
    ((1, 2), 1, 1, 1, 2),  # a run folder whose config.yaml kept the start's accumulation
], ids=["fewer", "fewer-asked", "same", "more", "config-yaml-of-before"])
def test_a_resumed_run_keeps_the_update_of_its_checkpoint(started, count, asked, saved, expected):
    assert resumed_accumulation(UpdateBatch(*started, 512), count, asked, saved, "checkpoint-30") == expected


@pytest.mark.parametrize("started,count,asked,saved", [((1, 2), 1, 1, 2), ((1, 2), 1, 4, 2), ((2, 1), 1, 4, 1)],
                         ids=["the-starts-config-again", "another-on-the-same-count", "another-on-another-count"])
def test_an_accumulation_that_would_change_the_update_on_resume_is_one_line(started, count, asked, saved):
    keeping = UpdateBatch(*started, 512).batches // count
    with pytest.raises(ConfigError, match=re.escape(
            f"checkpoint-30 was trained with {UpdateBatch(*started, 512).describe()} per update, which gradient "
            f"accumulation {keeping} keeps here; training.gradient_accumulation_steps {asked} would change the "
            f"update in the middle of the run: resume with {keeping} (the run's config.yaml says {saved})")):
        resumed_accumulation(UpdateBatch(*started, 512), count, asked, saved, "checkpoint-30")


def test_an_explicit_accumulation_that_would_change_the_update_is_refused_before_any_work(tmp_path, resumed_on_one):
    """2 processes -> 1 (accumulation 1 -> 2, config.yaml rewritten with 2) -> stopped after update 30 -> 1 process
    again with --training.gradient_accumulation_steps 1: refused in one line; config.yaml and checkpoints stay."""
    run = stopped_after(resumed_on_one[0], 30, tmp_path / "run")
    config_before = (run / "config.yaml").read_text()
    result = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(run / "config.yaml"),
                             "--training.gradient_accumulation_steps", "1", "--resume"], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"vaswani-mt train: error: --resume on 1 process: {run / 'checkpoints' / 'checkpoint-30'} was trained with 1 "
        "process x 2 accumulated x 512 tokens per update, which gradient accumulation 2 keeps here; "
        "training.gradient_accumulation_steps 1 would change the update in the middle of the run: resume with 2 "
        "(the run's config.yaml says 2), or start a new run")
    assert (run / "config.yaml").read_text() == config_before
    assert [folder.name for folder in complete_checkpoints(run / "checkpoints")][-1] == "checkpoint-30"


def test_a_resume_with_only_the_steps_after_training_left_records_the_update_training_ended_with(
        tmp_path, two_processes):
    """Trained on 2 processes with accumulation 1; killed after training; finished by 1 process: its record and card
    give 2 processes x 1, not 1 process x the config's accumulation."""
    from vaswani_mt.publishing.model_card import render_card
    from vaswani_mt.run_record import RunRecord

    run = stopped_after(two_processes, 40, tmp_path / "run")
    result = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(run / "config.yaml"),
                             "--resume"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training ended there (step 40); finishing the steps after training" in result.stderr
    record = RunRecord.read(run)
    assert (record.training.world_size, record.training.gradient_accumulation_steps) == (2, 1)
    assert "| Processes | 2 |" in render_card(record)


def test_a_second_resume_on_the_same_number_of_processes_keeps_the_accumulation_the_first_one_set(
        tmp_path, resumed_on_one, two_processes):
    """2 processes -> 1 (accumulation 1 -> 2) -> stopped after update 30 -> 1 again: still 2, without a word."""
    run = stopped_after(resumed_on_one[0], 30, tmp_path / "run")
    result = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(run / "config.yaml"),
                             "--resume"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gradient accumulation" not in result.stderr
    assert UpdateBatch.of_checkpoint(run / "checkpoints" / "checkpoint-40") == UpdateBatch(1, 2, 512)
    assert learning_rates(run) == learning_rates(two_processes)
    assert json.loads((run / "metrics.json").read_text())["training"]["gradient_accumulation_steps"] == 2
