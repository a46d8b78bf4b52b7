"""Prepared data (vaswani_mt.data.prepared): a corpus is read, cleaned and tokenised once into the cache; later runs,
resumes and other processes find it; any change to the inputs prepares again; an interrupted or failing preparation
leaves nothing a run would take for data; the result equals what the in-memory functions give."""

import errno
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import vaswani_mt.data.cache as cache_module
import vaswani_mt.data.locks as locks_module
import vaswani_mt.data.prepared as prepared_module
import vaswani_mt.data.shards as shards_module
import vaswani_mt.data.sources as sources_module
import vaswani_mt.data.workers as workers_module
from vaswani_mt.cli import main
from vaswani_mt.data.cleaning import CleaningOptions, load_parallel, preprocess_parallel
from vaswani_mt.data.prepared import prepare
from vaswani_mt.data.reading import DataError
from vaswani_mt.data.tokenizing import tokenize_dataset
from vaswani_mt.recipe.config import DataConfig, TokenizerConfig

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a dog cat runs sleeps on in red blue big small house park snow tree water ball man woman".split()
WOERTER = "der die ein hund katze rennt schläft auf im rot blau gross klein haus park schnee baum wasser mann frau".split()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _corpus(folder: Path, train: int = 300, seed: int = 0) -> Path:
    """A small En-De folder: train (with an HTML entity, a placeholder pair and duplicates), valid, test."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("valid", 20), ("test", 20)):
        lengths = rng.integers(3, 12, count)
        picks = [rng.integers(0, len(WORDS), n) for n in lengths]
        en = [" ".join(WORDS[i] for i in p) for p in picks]
        de = [" ".join(WOERTER[i] for i in p) for p in picks]
        if split == "train":
            en[:4] = ["fish &amp; chips", "@@", en[5], "a  spaced   line "]
            de[:4] = ["fisch &amp; pommes", "@@", de[5], "eine  zeile "]
        _write(folder / f"{split}.en", en)
        _write(folder / f"{split}.de", de)
    return folder


def _folders(cache: Path) -> list[Path]:
    """The entries and temporary folders of a cache (not its folder of in-use locks)."""
    return [path for path in cache.iterdir() if path.is_dir() and path.name != locks_module.IN_USE]


def _config(folder: Path, cache: Path, **data) -> tuple[DataConfig, TokenizerConfig]:
    settings = dict(path=str(folder), test_split="test", max_length=64, cache_dir=str(cache))
    return DataConfig(**{**settings, **data}), TokenizerConfig(vocab_size=320, min_frequency=1)


def test_prepared_data_equals_what_loading_cleaning_and_tokenizing_in_memory_give(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache", drop_duplicates=True)
    result = prepare(data, tokenizer_config)
    options = CleaningOptions(deduplicate=True, filter_splits=("train",))
    text, report = load_parallel(data.path, "en", "de", splits=["train", "valid", "test"], clean=options)
    assert report.to_dict() == result.report.to_dict()
    assert report["train"].dropped == {"placeholder": 1, "duplicate": 1}
    for split in text:
        assert text[split]["translation"] == result.text[split]["translation"]
    tokenized = tokenize_dataset(text, result.tokenizer, "en", "de", max_length=data.max_length)
    for split in text:
        assert tokenized[split]["input_ids"] == result.tokenized[split]["input_ids"]
        assert tokenized[split]["labels"] == result.tokenized[split]["labels"]


@pytest.mark.parametrize("workers,expected_processes", [(None, 3), (2, 2), (1, None)])
def test_large_splits_are_prepared_by_data_workers_processes_with_the_same_tokens(tmp_path, monkeypatch, workers,
                                                                                  expected_processes):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus", train=600), tmp_path / "cache", drop_duplicates=True)
    alone = prepare(data, tokenizer_config)
    monkeypatch.setattr(workers_module, "LARGE_SPLIT", 100)  # train now goes through the worker processes,
    monkeypatch.setattr(shards_module, "SHARD_PAIRS", 150)  # in shards of 150 pairs
    monkeypatch.setattr(shards_module, "BATCH_PAIRS", 50)
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)  # 3 usable
    pools = []
    pool = workers_module.ProcessPoolExecutor
    monkeypatch.setattr(workers_module, "ProcessPoolExecutor", lambda count, **kw: pools.append(count) or pool(count,
                                                                                                                **kw))
    data = replace(data, cache_dir=str(tmp_path / "other-cache"), workers=workers)
    with_workers = prepare(data, tokenizer_config, tokenizer=alone.tokenizer)
    assert set(pools) == ({expected_processes} if expected_processes else set())
    assert len(list((Path(with_workers.folders["tokenized"])).glob("train*.arrow"))) == 4
    for split in alone.tokenized:
        assert alone.tokenized[split]["input_ids"] == with_workers.tokenized[split]["input_ids"]
        assert alone.text[split]["translation"] == with_workers.text[split]["translation"]


SPAWNED = textwrap.dedent("""
    import json, multiprocessing, sys
    from vaswani_mt.data import prepared, shards, workers
    from vaswani_mt.recipe.config import DataConfig, TokenizerConfig
    if __name__ == "__main__":
        multiprocessing.set_start_method("spawn", force=True)  # as on macOS and Windows
        workers.LARGE_SPLIT, shards.SHARD_PAIRS, shards.BATCH_PAIRS = 100, 150, 50  # train: 4 shards, 2 workers
        methods, pool = [], workers.ProcessPoolExecutor
        workers.ProcessPoolExecutor = lambda count, mp_context: methods.append(
            mp_context.get_start_method()) or pool(count, mp_context=mp_context)
        data = DataConfig(path=sys.argv[1], test_split="test", max_length=64, cache_dir=sys.argv[2], workers=2,
                          drop_duplicates=True)
        result = prepared.prepare(data, TokenizerConfig(vocab_size=320, min_frequency=1))
        print(json.dumps({"methods": methods, "ids": list(result.tokenized["train"]["input_ids"]),
                          "text": list(result.text["train"]["translation"])}))
""")


def test_large_splits_are_prepared_by_spawned_worker_processes_as_on_macos_and_windows(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus", train=600), tmp_path / "cache", drop_duplicates=True)
    alone = prepare(data, tokenizer_config)
    done = subprocess.run([sys.executable, "-c", SPAWNED, data.path, str(tmp_path / "spawned-cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    spawned = json.loads(done.stdout.strip().splitlines()[-1])
    assert spawned["methods"] == ["spawn", "spawn"]  # the cleaning and the tokenising pass of train
    assert spawned["ids"] == list(alone.tokenized["train"]["input_ids"])
    assert spawned["text"] == list(alone.text["train"]["translation"])


@pytest.mark.parametrize("cpu_max,expected", [("max 100000", 6), ("200000 100000", 2), ("50000 100000", 1),
                                               ("garbled", 6)])
def test_the_usable_cores_are_the_affinity_capped_by_a_containers_cpu_quota(tmp_path, monkeypatch, cpu_max, expected):
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    monkeypatch.setattr(workers_module, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    assert prepared_module.usable_cores() == expected
    monkeypatch.setattr(workers_module, "CGROUP_CPU_MAX", tmp_path / "absent")
    assert prepared_module.usable_cores() == 6


def test_a_hub_dataset_is_keyed_by_the_commit_it_resolves_to(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    commits = iter(["a" * 40, "a" * 40, "b" * 40])
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kw: SimpleNamespace(sha=next(commits)))
    keys = [sources_module.source_identity("someone/corpus", ["train"], sources_module.hub_commit(
        "someone/corpus", tmp_path)) for _ in range(3)]
    assert keys[0] == keys[1] == ["hub", "someone/corpus", "a" * 40]
    assert keys[2] == ["hub", "someone/corpus", "b" * 40]  # a new commit: prepared again


def test_without_the_hub_a_dataset_is_keyed_by_the_last_commit_this_cache_saw_else_by_its_id(tmp_path, monkeypatch,
                                                                                            caplog):
    from huggingface_hub import HfApi

    def offline(self, repo_id, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(HfApi, "dataset_info", offline)
    assert sources_module.hub_commit("someone/corpus", tmp_path) is None  # never seen: the id alone
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kw: SimpleNamespace(sha="c" * 40))
    assert sources_module.hub_commit("someone/corpus", tmp_path) == "c" * 40
    monkeypatch.setattr(HfApi, "dataset_info", offline)
    with caplog.at_level(logging.INFO, logger="vaswani_mt.data.sources"):
        assert sources_module.hub_commit("someone/corpus", tmp_path) == "c" * 40
    assert "the last one this cache saw" in caplog.text
    assert sources_module.hub_commit("someone/corpus", tmp_path, revision="d" * 40) == "d" * 40  # a commit, as is


def test_the_number_of_workers_does_not_enter_the_cache_key(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    assert prepare(replace(data, workers=1), tokenizer_config).folders == prepare(data, tokenizer_config).folders


@pytest.mark.parametrize("workers", [0, -2, "many", True])
def test_a_bad_number_of_workers_is_one_clear_line(tmp_path, workers):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    with pytest.raises(DataError, match=r"data.workers must be a positive number of processes or null"):
        prepare(replace(data, workers=workers), tokenizer_config)


@pytest.mark.parametrize("workers", [0, -2])  # a value of another type: the config's type check names it first
def test_the_data_workers_rule_is_one_and_says_the_same_from_the_config_and_from_prepare(tmp_path, workers):
    from vaswani_mt.recipe.config import ConfigError, load_run_config

    folder = _corpus(tmp_path / "corpus")
    with pytest.raises(ConfigError) as from_config:
        load_run_config("multi30k-en-de", {"data.path": str(folder), "data.workers": workers})
    data, tokenizer_config = _config(folder, tmp_path / "cache")
    with pytest.raises(DataError) as from_prepare:
        prepare(replace(data, workers=workers), tokenizer_config)
    assert str(from_config.value) == str(from_prepare.value) == (
        f"data.workers must be a positive number of processes or null (the usable cores), got {workers!r}")


def test_a_second_preparation_of_the_same_data_reads_nothing_and_gives_the_same_result(tmp_path, monkeypatch):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    first = prepare(data, tokenizer_config)
    for name in ("write_shards", "read_parallel", "train_tokenizer", "_clean_shard", "_tokenize_shard"):
        monkeypatch.setattr(prepared_module, name, lambda *a, **k: pytest.fail("prepared again"))
    second = prepare(data, tokenizer_config)
    assert second.folders == first.folders
    assert second.tokenized["train"]["input_ids"] == first.tokenized["train"]["input_ids"]
    assert second.report.to_dict() == first.report.to_dict()


@pytest.mark.parametrize("change,prepared_again", [
    (lambda folder, data, tok: _write(folder / "train.de", (folder / "train.de").read_text().splitlines()[:-1] + ["neu"]),
     {"corpus", "bpe", "tokenized"}),
    (lambda folder, data, tok: (replace(data, drop_duplicates=True), tok), {"corpus", "bpe", "tokenized"}),
    (lambda folder, data, tok: (replace(data, preprocess="lowercase_moses"), tok), {"corpus", "bpe", "tokenized"}),
    (lambda folder, data, tok: (data, replace(tok, vocab_size=300)), {"bpe", "tokenized"}),
    (lambda folder, data, tok: (data, replace(tok, sample=50)), {"bpe", "tokenized"}),
    (lambda folder, data, tok: (replace(data, max_length=8), tok), {"tokenized"}),
], ids=["a data file", "deduplication", "preprocessing", "vocabulary size", "bpe sample", "max length"])
def test_a_change_to_an_input_prepares_again_what_depends_on_it_and_only_that(tmp_path, change, prepared_again):
    folder = _corpus(tmp_path / "corpus")
    data, tokenizer_config = _config(folder, tmp_path / "cache")
    before = prepare(data, tokenizer_config).folders
    changed = change(folder, data, tokenizer_config) or (data, tokenizer_config)
    after = prepare(*changed).folders
    assert {name for name in before if before[name] != after[name]} == prepared_again


def test_the_bpe_sample_learns_from_an_evenly_spread_subset_of_the_kept_pairs(tmp_path, monkeypatch):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    text = prepare(data, tokenizer_config).text["train"]["translation"]
    calls = []
    learn = prepared_module.train_tokenizer
    monkeypatch.setattr(prepared_module, "train_tokenizer",
                        lambda texts, **kwargs: learn(calls.append(list(texts)) or calls[-1], **kwargs))
    prepare(data, replace(tokenizer_config, sample=50))
    stride = -(-len(text) // 50)
    assert sorted(calls[0]) == sorted(pair[lang] for pair in text[::stride] for lang in ("en", "de"))
    assert len(calls[0]) == 2 * len(text[::stride]) <= 2 * 50


def test_a_preparation_that_fails_halfway_leaves_no_entry_and_the_next_one_prepares(tmp_path, monkeypatch):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache" / "x.arrow"))
    monkeypatch.setattr(prepared_module, "train_tokenizer", full_disk)
    with pytest.raises(OSError):
        prepare(data, tokenizer_config)
    names = sorted(path.name for path in (tmp_path / "cache").iterdir() if not path.name.startswith("."))
    assert len(names) == 1 and names[0].startswith("corpus-")  # the corpus was complete; nothing else is left
    monkeypatch.undo()
    assert len(prepare(data, tokenizer_config).tokenized["train"]) > 0


def test_the_folder_of_a_killed_preparation_is_never_taken_for_data_and_is_removed(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    corpus_name = prepare(data, tokenizer_config).folders["corpus"].name
    for entry in (tmp_path / "cache").iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            entry.rename(tmp_path / "cache" / f".{entry.name}.tmp-killed")  # as a kill before the rename leaves it
    result = prepare(data, tokenizer_config)
    assert result.folders["corpus"].name == corpus_name
    assert not list((tmp_path / "cache").glob(".*.tmp-*"))


PREPARE = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from vaswani_mt.data.prepared import prepare
    from vaswani_mt.recipe.config import DataConfig, TokenizerConfig
    data = DataConfig(path=sys.argv[1], test_split="test", max_length=64, cache_dir=sys.argv[2])
    result = prepare(data, TokenizerConfig(vocab_size=320, min_frequency=1))
    print(json.dumps({"folders": {k: str(v) for k, v in result.folders.items()},
                      "ids": list(result.tokenized["train"]["input_ids"])}))
""")


def test_two_processes_preparing_the_same_data_at_once_take_turns_and_agree(tmp_path):
    folder, cache = _corpus(tmp_path / "corpus", train=2000), tmp_path / "cache"
    processes = [subprocess.Popen([sys.executable, "-c", PREPARE, str(folder), str(cache)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    results = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in results]
    outputs = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    assert outputs[0] == outputs[1]
    built = sum(err.count("prepared " + outputs[0]["folders"]["corpus"]) for _, err in results)
    assert built == 1  # one process prepared the corpus, the other found it
    assert not list(cache.glob(".*.tmp-*"))


def test_vaswani_mt_prepare_fills_the_cache_that_a_later_run_finds(tmp_path, capsys, caplog):
    folder, cache = _corpus(tmp_path / "corpus"), tmp_path / "cache"
    options = ["--data.path", str(folder), "--data.test_split", "test", "--data.cache_dir", str(cache),
               "--tokenizer.vocab_size", "320"]
    assert main(["prepare", "--config", "multi30k-en-de", *options]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prepared in ") and "train 299, test 20, valid 20 pairs" in out
    entries = sorted(path.name.split("-")[0] for path in _folders(cache))
    assert entries == ["bpe", "corpus", "tokenized"]
    with caplog.at_level(logging.INFO, logger="vaswani_mt.data"):
        assert main(["prepare", "--config", "multi30k-en-de", *options]) == 0
    assert caplog.text.count("prepared data found") == 3


def test_a_full_disk_while_preparing_is_one_clear_line_and_leaves_no_partial_entry(tmp_path, capsys, monkeypatch):
    folder, cache = _corpus(tmp_path / "corpus"), tmp_path / "cache"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(cache / "train.raw.arrow"))
    monkeypatch.setattr(prepared_module, "write_shards", full_disk)
    code = main(["prepare", "--config", "multi30k-en-de", "--data.path", str(folder), "--data.test_split", "test",
                 "--data.cache_dir", str(cache)])
    assert code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err == [f"vaswani-mt prepare: error: no space left on device: {cache / 'train.raw.arrow'}"]
    assert not _folders(cache)


FILE_SIZE_LIMITED = textwrap.dedent("""
    import resource, signal, sys
    from vaswani_mt.data import shards, workers
    from vaswani_mt.cli import main
    workers.LARGE_SPLIT, shards.SHARD_PAIRS, shards.BATCH_PAIRS = 100, 150, 50  # 2 worker processes
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of a signal
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.exit(main(["prepare", "--config", "multi30k-en-de", "--data.path", sys.argv[2], "--data.test_split", "test",
                   "--data.cache_dir", sys.argv[3], "--data.workers", "2"]))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_write_that_fails_in_a_worker_process_is_one_line_naming_the_entry_and_leaves_no_partial_entry(tmp_path,
                                                                                                        monkeypatch):
    """pyarrow's own error, raised in a worker process: files may not grow past the size of a cleaned shard, so the
    workers' first write of one fails as on a full disk (with EFBIG, "File too large", instead of ENOSPC)."""
    folder = _corpus(tmp_path / "corpus", train=600)
    data, tokenizer_config = _config(folder, tmp_path / "sizes")
    for module, name, value in ((workers_module, "LARGE_SPLIT", 100), (shards_module, "SHARD_PAIRS", 150),
                                (shards_module, "BATCH_PAIRS", 50)):  # as the script sets them
        monkeypatch.setattr(module, name, value)
    shard = max(path.stat().st_size for path in Path(prepare(data, tokenizer_config).folders["corpus"]).glob("train-*"))
    cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMITED, str(shard - 1), str(folder), str(cache)],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Cleaning train" in result.stderr  # the worker pass ran
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and re.search(r"vaswani-mt prepare: error: File too large: \S+/corpus-[0-9a-f]+$",
                                          errors[0]), errors
    assert not _folders(cache)  # nothing half-written, no temporary folder


def test_bad_data_is_one_clear_line_from_prepare(tmp_path, capsys):
    folder = _corpus(tmp_path / "corpus")
    _write(folder / "train.de", (folder / "train.de").read_text().splitlines()[:-3])
    assert main(["prepare", "--config", "multi30k-en-de", "--data.path", str(folder), "--data.test_split", "test",
                 "--data.cache_dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("vaswani-mt prepare: error: split 'train': train.en has 300 lines but train.de has 297")


def test_the_cache_defaults_to_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_MT_CACHE", str(tmp_path / "env-cache"))
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "unused")
    result = prepare(replace(data, cache_dir=None), tokenizer_config)
    assert all(Path(folder).parent == tmp_path / "env-cache" for folder in result.folders.values())


def test_a_text_folder_is_read_as_a_stream_of_chunks(tmp_path):
    from vaswani_mt.data.reading import iter_line_pairs

    folder = _corpus(tmp_path / "corpus", train=250)
    chunks = list(iter_line_pairs(folder / "train.en", folder / "train.de", "train", chunk_size=100))
    assert [len(sources) for sources, _ in chunks] == [100, 100, 50]
    assert sum((sources for sources, _ in chunks), []) == (folder / "train.en").read_text().splitlines()


def test_lowercase_moses_preprocessing_is_applied_to_the_prepared_text_and_tokens(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache", preprocess="lowercase_moses")
    result = prepare(data, tokenizer_config)
    text, _ = load_parallel(data.path, "en", "de", splits=["train", "valid", "test"],
                            clean=CleaningOptions(filter_splits=("train",)))
    expected = preprocess_parallel(text, "lowercase_moses", "en", "de")
    assert expected["train"]["translation"] == result.text["train"]["translation"]


def test_a_missing_data_folder_names_the_path(tmp_path):
    data, tokenizer_config = _config(tmp_path / "nothing", tmp_path / "cache")
    with pytest.raises(DataError, match="does not exist"):
        prepare(data, tokenizer_config)
    assert not os.path.exists(tmp_path / "cache") or not _folders(tmp_path / "cache")


# --- what users install and share -----------------------------------------------------------------------------------
def test_data_prepared_by_other_code_or_libraries_is_not_reused(tmp_path, monkeypatch):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    first = prepare(data, tokenizer_config).folders
    real_version = cache_module.importlib.metadata.version
    monkeypatch.setattr(cache_module.importlib.metadata, "version",
                        lambda name: "0.0.1" if name == "sacremoses" else real_version(name))
    second = prepare(data, tokenizer_config).folders
    assert all(first[kind] != second[kind] for kind in first)
    shaping = dict(cache_module.SHAPING_CODE)
    shaping.pop("data/shards.py")
    monkeypatch.setattr(cache_module, "SHAPING_CODE", shaping)  # another data layer
    assert prepare(data, tokenizer_config).folders["corpus"] not in (first["corpus"], second["corpus"])


def test_a_cache_prepared_under_a_group_umask_is_readable_and_lockable_by_the_group(tmp_path):
    script = textwrap.dedent("""
        import os, sys
        os.umask(0o002)
        from vaswani_mt.data.prepared import prepare
        from vaswani_mt.recipe.config import DataConfig, TokenizerConfig
        data = DataConfig(path=sys.argv[1], test_split="test", max_length=64, cache_dir=sys.argv[2])
        prepare(data, TokenizerConfig(vocab_size=320, min_frequency=1))
    """)
    cache = tmp_path / "cache"
    subprocess.run([sys.executable, "-c", script, str(_corpus(tmp_path / "corpus")), str(cache)], check=True,
                   capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    entries = [path for path in cache.iterdir() if not path.name.startswith(".")]
    locks = list(cache.glob(".*.lock"))
    assert len(entries) == 3 and locks
    assert {oct(path.stat().st_mode & 0o777) for path in entries} == {oct(0o775)}
    assert {oct(path.stat().st_mode & 0o777) for path in locks} == {oct(0o664)}


@pytest.mark.parametrize("number", sorted(locks_module.NO_FILE_LOCKS), ids=errno.errorcode.get)
def test_where_the_file_system_has_no_file_locks_a_lock_file_serves(tmp_path, monkeypatch, caplog, number):
    def no_flock(descriptor):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(locks_module, "_flock", no_flock)
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="vaswani_mt.data"):
        result = prepare(data, tokenizer_config)
    assert len(result.tokenized["train"]) > 0
    assert "no file locks on this file system" in caplog.text
    assert not list((tmp_path / "cache").glob("*.softlock"))  # released
    assert len(list((tmp_path / "cache" / locks_module.IN_USE).glob("*.softlock"))) == 3  # in use while it lives
    result.release()
    assert not list((tmp_path / "cache" / locks_module.IN_USE).glob("*.softlock"))


@pytest.mark.parametrize("number", [errno.EAGAIN, errno.EIO])
def test_a_file_system_that_locks_takes_real_locks_whatever_else_flock_says(tmp_path, monkeypatch, number):
    monkeypatch.setattr(locks_module, "_flock", lambda descriptor: (_ for _ in ()).throw(OSError(number, "no")))
    assert locks_module.file_locks_missing(tmp_path) is None


def _lock_files_denied(monkeypatch, cache: Path) -> None:
    """Opening any lock file of `cache` fails as for another user's lock file that this one may not write."""
    real_open = os.open

    def denied(path, flags, *args, **kwargs):
        if str(path).startswith(str(cache)) and str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(os, "open", denied)


def test_a_lock_file_this_user_may_not_take_is_one_line_naming_it_and_prepares_nothing(tmp_path, monkeypatch,
                                                                                       capsys):
    folder, cache = _corpus(tmp_path / "corpus"), tmp_path / "cache"
    cache.mkdir()
    _lock_files_denied(monkeypatch, cache)
    code = main(["prepare", "--config", "multi30k-en-de", "--data.path", str(folder), "--data.test_split", "test",
                 "--data.cache_dir", str(cache)])
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and re.fullmatch(
        rf"vaswani-mt prepare: error: cannot take the lock {re.escape(str(cache))}/\.corpus-[0-9a-f]+\.lock: "
        r"permission denied; it belongs to another user .*set data.cache_dir .*", errors[0]), errors
    assert not _folders(cache) and not list(cache.glob("*.softlock"))  # no lock file that exists while held either


def test_data_prepared_in_a_cache_this_user_may_only_read_is_read_without_locks(tmp_path, monkeypatch, caplog):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    first = prepare(data, tokenizer_config)
    first.release()
    _lock_files_denied(monkeypatch, tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="vaswani_mt.data"):
        again = prepare(data, tokenizer_config)
    assert again.folders == first.folders and again.in_use == []
    assert caplog.text.count("reading it unmarked") == 3


PAUSED_BUILD = textwrap.dedent("""
    import logging, os, sys, time
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from vaswani_mt.data import prepared
    from vaswani_mt.recipe.config import DataConfig, TokenizerConfig
    building, go = Path(sys.argv[3]), Path(sys.argv[4])
    build = prepared._build_corpus
    def paused(tmp, *args):
        building.write_text(str(tmp))
        while not go.exists():
            time.sleep(0.05)
        build(tmp, *args)
    prepared._build_corpus = paused
    data = DataConfig(path=sys.argv[1], test_split="test", max_length=64, cache_dir=sys.argv[2])
    prepared.prepare(data, TokenizerConfig(vocab_size=320, min_frequency=1))
""")
DENIED = textwrap.dedent("""
    import errno, os, sys
    real_open = os.open
    def denied(path, flags, *args, **kwargs):
        if str(path).startswith(sys.argv[2]) and str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)
    os.open = denied
    from vaswani_mt.cli import main
    sys.exit(main(["prepare", "--config", "multi30k-en-de", "--data.path", sys.argv[1], "--data.test_split", "test",
                   "--data.cache_dir", sys.argv[2], "--tokenizer.vocab_size", "320"]))
""")


def _wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def test_a_build_in_progress_is_never_removed_by_another_process(tmp_path):
    """A prepares the corpus and stops inside its build; B, which may not take the lock (another user's lock file),
    stops with one line and leaves A's temporary folder alone; C waits for A; A goes on and finishes; C finds A's
    entry. Before locks held, B fell back to a lock file of its own and removed A's build."""
    folder, cache = _corpus(tmp_path / "corpus"), tmp_path / "cache"
    building, go = tmp_path / "building", tmp_path / "go"

    def start(script: str, *args: str, log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", script, str(folder), str(cache), *args], cwd=REPO, text=True,
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / log, "w"))

    first = start(PAUSED_BUILD, str(building), str(go), log="a.log")
    try:
        _wait_for(building.exists, "A's build to start")
        build = Path(building.read_text())
        denied = subprocess.run([sys.executable, "-c", DENIED, str(folder), str(cache)], cwd=REPO, text=True,
                                capture_output=True, timeout=300)
        assert denied.returncode == 2, denied.stderr[-2000:]
        assert denied.stderr.strip().splitlines()[-1].startswith(
            f"vaswani-mt prepare: error: cannot take the lock {cache}/.corpus-")
        assert build.is_dir()  # A's build is still there
        waiting = start(PAUSED_BUILD, str(tmp_path / "c-building"), str(go), log="c.log")
        _wait_for(lambda: "waiting for another process that prepares" in (tmp_path / "c.log").read_text(),
                  "C to wait for A")
        assert build.is_dir()
        go.touch()
        assert first.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert waiting.wait(timeout=300) == 0, (tmp_path / "c.log").read_text()[-3000:]
    finally:
        go.touch()
        for process in (first, locals().get("waiting")):
            if process is not None and process.poll() is None:
                process.kill()
    corpus = next(cache.glob("corpus-*"))
    assert f"prepared {corpus}" in (tmp_path / "a.log").read_text()
    assert f"prepared data found: {corpus}" in (tmp_path / "c.log").read_text()
    assert not (tmp_path / "c-building").exists()  # C never built the corpus
    assert not list(cache.glob(".*.tmp-*"))


def test_the_package_imports_where_there_is_no_fcntl():
    # the libraries under it choose their own locking on Windows (sacrebleu's portalocker, filelock): loaded first
    script = ("import sys, datasets, sacrebleu, torch, transformers; sys.modules['fcntl'] = None; "
              "import vaswani_mt; print('imported')")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("imported")


def test_truncation_ends_a_cut_sentence_with_the_tokenizers_own_end_of_sentence_id(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "</s>": 2, **{word: i + 3 for i, word in enumerate(WORDS + WOERTER)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    folder = tmp_path / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                            eos_token="</s>").save_pretrained(folder)
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache", max_length=4)
    tokenized = prepare(data, replace(tokenizer_config, path=str(folder))).tokenized["train"]
    rows = list(tokenized["input_ids"]) + list(tokenized["labels"])
    assert all(len(ids) <= 4 and ids[-1] == 2 for ids in rows)
    assert any(len(ids) == 4 for ids in rows)


def test_prepare_warns_once_per_split_of_the_examples_it_truncates(tmp_path, caplog):
    options = ["--data.path", str(_corpus(tmp_path / "corpus")), "--data.test_split", "test", "--data.cache_dir",
               str(tmp_path / "cache"), "--tokenizer.vocab_size", "320", "--data.max_length", "6"]
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.data.prepared"):
        assert main(["prepare", "--config", "multi30k-en-de", *options]) == 0
    warnings = [r.getMessage() for r in caplog.records if "truncated to data.max_length=6" in r.getMessage()]
    assert sorted(w.split(":")[0] for w in warnings) == ["test", "train", "valid"]
