"""A run pins its Hub dataset (vaswani_mt.data.sources): the commit `data.revision` (main) resolves to when the run
starts is the one `datasets.load_dataset` reads, the one in the run's record and card, and the one `--resume` reads
again after the dataset got a new commit; a fresh preparation says that it took a new commit; without the Hub
(HF_HUB_OFFLINE=1) the data prepared with it is found under the last commit this cache saw.

The Hub is `tests/hub_server.py`, served from a thread of the test process on 127.0.0.1, holding a dataset with two
commits; every client runs in a fresh process (huggingface_hub and datasets read HF_ENDPOINT when imported)."""

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hub_server import make_server

REPO = Path(__file__).resolve().parents[1]
DATASET = "alice/tiny-corpus"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, multi30k_dir):
    """The Hub with DATASET at two commits: `first` (300 training pairs) and `second` (the first 250 of them)."""
    server = make_server(0, tmp_path_factory.mktemp("hub-storage"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    store = server.RequestHandlerClass.store
    pairs = {split: list(zip(*[(multi30k_dir / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
                               for lang in ("en", "de")]))
             for split, name, count in (("train", "train", 300), ("validation", "valid", 16), ("test", "test2016", 16))}

    def publish(repo_id: str, training_pairs: int) -> str:
        """A commit of the corpus with its first `training_pairs` training pairs on the main branch of `repo_id`."""
        repo = store.repo("dataset", repo_id) or store.create_repo("dataset", repo_id, private=False, user="alice")
        operations = [{"key": "file", "value": {"path": f"{split}.jsonl", "encoding": "base64", "content": (
            base64.b64encode("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in (
                rows[:training_pairs] if split == "train" else rows)).encode()).decode())}}
            for split, rows in pairs.items()]
        return store.commit(repo, "main", {"summary": f"{training_pairs} training pairs"}, operations, "alice")

    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}", publish=publish,
                          first=publish(DATASET, 300), second=publish(DATASET, 250))
    server.shutdown()
    server.server_close()


def _client(hub, home: Path, *args: str, offline: bool = False) -> subprocess.CompletedProcess:
    """`vaswani-mt ARGS` with the fake Hub, its own Hugging Face caches under `home`, and no other HF setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(home / "hf"),
               HF_DATASETS_CACHE=str(home / "hf" / "datasets"), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false", **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    return subprocess.run([sys.executable, "-m", "vaswani_mt.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def _config(folder: Path, **data) -> Path:
    config = {"data": {"path": DATASET, "source_lang": "en", "target_lang": "de", "valid_split": "validation",
                       "test_split": "test", "max_length": 64, "cache_dir": str(folder / "cache"), **data},
              "tokenizer": {"vocab_size": 400},
              "model": {"preset": "tiny", "config": {"max_position_embeddings": 128}},
              "training": {"max_tokens": 512, "max_steps": 4, "warmup_steps": 2, "eval_steps": 2, "logging_steps": 2,
                           "keep_checkpoints": 2, "average_last": 2, "num_beams": 1, "seed": 3, "num_threads": 1},
              "output_dir": str(folder / "run")}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder / "config.yaml"


def _prepared(result: subprocess.CompletedProcess) -> dict[str, str]:
    """What `vaswani-mt prepare` printed: its first line as "prepared", then the folders and the data's commit."""
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.splitlines()
    return {"prepared": lines[0].split(": ", 1)[1], **dict(line.split(None, 1) for line in lines[1:])}


def test_prepare_reads_the_commit_it_resolves_then_a_new_commit_prepares_again_saying_so_and_offline_finds_it(
        hub, tmp_path):
    """Asked for the first commit (`--data.revision`, as a resumed run asks), its data is read; main, at the second
    commit, is prepared apart, saying that the dataset has a new commit since the cache last saw it; asked for the
    first commit again, its entries are found; offline, the second commit's entries are found as they are."""
    config = str(_config(tmp_path))
    first = _prepared(_client(hub, tmp_path / "a", "prepare", "--config", config, "--data.revision", hub.first))
    assert first["data"] == f"{DATASET} at commit {hub.first}" and "train 300," in first["prepared"]
    index = tmp_path / "cache" / "hub-revisions.json"  # as a run that resolved main before the second commit left it
    index.write_text(json.dumps({f"{DATASET}@main": {"commit": hub.first, "seen": "then"}}))
    latest = _client(hub, tmp_path / "b", "prepare", "--config", config)
    second = _prepared(latest)
    assert f"is at a new commit, {hub.second} (this cache last saw {hub.first}, then): preparing it" in latest.stderr
    assert second["data"] == f"{DATASET} at commit {hub.second}" and "train 250," in second["prepared"]
    assert first["corpus"] != second["corpus"]
    again = _prepared(_client(hub, tmp_path / "c", "prepare", "--config", config, "--data.revision", hub.first))
    assert again == first
    offline = _client(hub, tmp_path / "d", "prepare", "--config", config, offline=True)
    assert _prepared(offline) == second
    assert f"taking commit {hub.second}, the last one this cache saw" in offline.stderr
    assert offline.stderr.count("prepared data found") == 3


def test_a_run_pins_its_commit_in_record_and_card_and_a_resume_after_a_new_commit_reads_the_same(hub, tmp_path):
    """The run starts when main is at its first commit; the dataset gets a new one; a resume that has only the steps
    after training left prepares nothing: it reads the first commit again, not main's new one, and says so."""
    from vaswani_mt.publishing.model_card import render_card
    from vaswani_mt.run_record import RunRecord

    config, run = str(_config(tmp_path, path="alice/moving-corpus")), tmp_path / "run"
    first = hub.publish("alice/moving-corpus", 300)
    started = _client(hub, tmp_path / "a", "train", "--config", config)
    assert started.returncode == 0, started.stderr[-4000:]
    assert json.loads((run / "data_revision.json").read_text()) == {"path": "alice/moving-corpus", "revision": first}
    record = RunRecord.read(run)
    assert record.data_revision == first and record.data["train"]["pairs_in"] == 300
    card = render_card(record)
    assert f"loaded from the Hub dataset `alice/moving-corpus` at commit `{first}`" in card
    assert f"revision: {first}" in card  # the model-index's dataset revision
    second = hub.publish("alice/moving-corpus", 250)
    for name in ("metrics.json", "model", "averaged", "test.hyp", "plots"):  # as a kill after training leaves it
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink(missing_ok=True)
    resumed = _client(hub, tmp_path / "b", "train", "--config", config, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"alice/moving-corpus at commit {first}, the commit the run started with" in resumed.stderr
    assert "prepared data found" in resumed.stderr and second not in resumed.stderr
    record = RunRecord.read(run)
    assert record.data_revision == first and record.data["train"]["pairs_in"] == 300  # not the new commit's 250


@pytest.mark.parametrize("process", [0, 1])
def test_every_process_of_a_run_reads_the_commit_process_0_resolved(tmp_path, monkeypatch, process):
    """Processes (and nodes) that asked the Hub apart could see different commits: process 0 asks, all read its."""
    import torch

    import vaswani_mt.data.sources as sources
    from vaswani_mt.data.cache import cache_folder
    from vaswani_mt.recipe.config import load_run_config
    from vaswani_mt.run_record import RunFolder

    asked = []
    monkeypatch.setattr(sources, "hub_commit", lambda *args: asked.append(args) or "a" * 40)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list",
                        lambda found, src: found.__setitem__(0, "a" * 40) if src == 0 else None)
    config = load_run_config(str(_config(tmp_path)))
    pinned = RunFolder(tmp_path / "run").data_revision
    assert sources.pinned_revision(config.data.path, config.data.revision, cache_folder(config.data), pinned, False,
                                   2, process) == "a" * 40
    assert len(asked) == (1 if process == 0 else 0)
