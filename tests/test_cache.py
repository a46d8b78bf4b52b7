"""The prepared-data cache one can see and prune (`vaswani-mt cache`, vaswani_mt.data.cache): each entry is listed
with its size, last use, the data and tokenizer it came from and whether it is in use; `--prune` removes the entries
no current code reads, those unused for N days and the folders of killed preparations, never one in use; an entry's
key changes when the code that shapes the data changes, not when a comment or a docstring does."""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

import vaswani_mt.data.cache as cache_module
import vaswani_mt.data.prepared as prepared_module
from test_prepared import _config, _corpus
from vaswani_mt.cli import main
from vaswani_mt.data.locks import exclusive
from vaswani_mt.data.prepared import prepare


def _listed(cache: Path, capsys) -> dict[str, dict]:
    assert main(["cache", "--cache-dir", str(cache), "--json"]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}


def _prune(cache: Path, capsys, *options: str) -> str:
    assert main(["cache", "--cache-dir", str(cache), "--prune", *options]) == 0
    return capsys.readouterr().out


@pytest.fixture
def prepared(tmp_path):
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), tmp_path / "cache")
    return prepare(data, tokenizer_config)


def test_the_cache_lists_each_entry_with_its_size_last_use_origin_and_whether_it_is_in_use(prepared, tmp_path,
                                                                                          capsys):
    cache = tmp_path / "cache"
    listed = _listed(cache, capsys)
    assert set(listed) == {folder.name for folder in prepared.folders.values()}
    bpe = prepared.folders["bpe"].name
    for name, entry in listed.items():
        assert entry["size"] == sum(p.stat().st_size for p in (cache / name).rglob("*") if p.is_file()) > 0
        assert time.time() - entry["last_used"] < 600
        assert entry["data"] == f"{tmp_path / 'corpus'} en-de"
        assert entry["current"] and entry["in_use"]  # `prepared` reads them
    assert listed[bpe]["tokenizer"] == "joint BPE of 320"
    assert listed[prepared.folders["tokenized"].name]["tokenizer"] == f"joint BPE of 320 ({bpe})"
    assert listed[prepared.folders["corpus"].name]["tokenizer"] == "-"
    prepared.release()
    assert not any(entry["in_use"] for entry in _listed(cache, capsys).values())
    assert main(["cache", "--cache-dir", str(cache)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ENTRY", "SIZE", "LAST", "USED", "DATA", "TOKENIZER", "STATE"]
    assert table[-1].startswith(f"3 entries, ") and table[-1].endswith(f"on disk in {cache}")


def test_prune_removes_the_entries_no_current_code_reads_and_keeps_one_in_use(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    data, tokenizer_config = _config(_corpus(tmp_path / "corpus"), cache)
    with monkeypatch.context() as patched:
        patched.setattr(prepared_module, "code_fingerprint", lambda: "another release's code")
        old = prepare(data, tokenizer_config)
    current = prepare(data, tokenizer_config)
    assert not set(old.folders.values()) & set(current.folders.values())
    listed = _listed(cache, capsys)
    assert {name for name, entry in listed.items() if not entry["current"]} == {f.name for f in old.folders.values()}
    out = _prune(cache, capsys, "--yes")  # `old` still reads them
    assert out.count("keeping ") == 3 and "Nothing to remove." in out
    old.release()
    assert "Removed 3 entries" in _prune(cache, capsys, "--yes")
    assert set(_listed(cache, capsys)) == {folder.name for folder in current.folders.values()}


def test_prune_older_than_removes_the_entries_unused_for_that_many_days(prepared, tmp_path, capsys):
    cache = tmp_path / "cache"
    prepared.release()
    month_ago = time.time() - 31 * 86400
    os.utime(prepared.folders["tokenized"], (month_ago, month_ago))
    assert "Nothing to remove." in _prune(cache, capsys, "--yes")  # all made by this code
    out = _prune(cache, capsys, "--older-than", "30", "--dry-run")
    assert "unused for more than 30 days" in out and "Dry run: nothing was removed." in out
    assert prepared.folders["tokenized"].is_dir()
    _prune(cache, capsys, "--older-than", "30", "--yes")
    assert not prepared.folders["tokenized"].exists() and prepared.folders["corpus"].is_dir()
    data, tokenizer_config = _config(tmp_path / "corpus", cache)
    assert prepare(data, tokenizer_config).folders == prepared.folders  # the next run prepares it again


def test_reading_an_entry_marks_it_used_now(prepared, tmp_path):
    prepared.release()
    month_ago = time.time() - 31 * 86400
    os.utime(prepared.folders["corpus"], (month_ago, month_ago))
    data, tokenizer_config = _config(tmp_path / "corpus", tmp_path / "cache")
    prepare(data, tokenizer_config)
    assert time.time() - prepared.folders["corpus"].stat().st_mtime < 600


def test_prune_removes_a_killed_preparations_folder_but_never_a_build_in_progress(prepared, tmp_path, capsys):
    cache = tmp_path / "cache"
    prepared.release()
    killed = cache / ".corpus-0123456789abcdef0123.tmp-killed"
    building = cache / ".corpus-fedcba9876543210fedc.tmp-building"
    for folder in (killed, building):
        folder.mkdir()
        (folder / "train-00000.arrow").write_bytes(b"half")
    with exclusive(cache / ".corpus-fedcba9876543210fedc.lock", "prepares it"):  # a process prepares it now
        assert main(["cache", "--cache-dir", str(cache)]) == 0
        assert "1 folder(s) of killed preparations" in capsys.readouterr().out
        out = _prune(cache, capsys, "--yes")
    assert "a killed preparation's folder" in out and not killed.exists()
    assert building.is_dir()


def test_prune_asks_before_it_removes_and_off_a_terminal_wants_yes(prepared, tmp_path, capsys, monkeypatch):
    prepared.release()
    monkeypatch.setattr(cache_module, "code_fingerprint", lambda: "the next release's code")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        main(["cache", "--cache-dir", str(tmp_path / "cache"), "--prune"])
    assert stopped.value.code == 2
    assert "confirm with --yes" in capsys.readouterr().err
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert "Nothing was removed." in _prune(tmp_path / "cache", capsys)
    assert prepared.folders["bpe"].is_dir()


def test_a_missing_cache_folder_or_options_without_prune_are_one_line(tmp_path, capsys):
    assert main(["cache", "--cache-dir", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.strip() == f"vaswani-mt cache: error: no cache folder {tmp_path / 'none'}"
    with pytest.raises(SystemExit):
        main(["cache", "--cache-dir", str(tmp_path), "--older-than", "3"])
    assert "go with --prune" in capsys.readouterr().err


# --- the key follows the code, not its comments --------------------------------------------------------------------
def _copy_of_the_shaping_code(tmp_path: Path) -> Path:
    package = tmp_path / "package"
    for name in cache_module.SHAPING_CODE:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache_module.PACKAGE / name, package / name)
    return package


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")


@pytest.mark.parametrize("module,old,new", [
    ("data/cleaning.py", '"""Cleaning parallel corpora:', '"""A reworded docstring.\n\nCleaning parallel corpora:'),
    ("data/prepared.py", "def prepare(", "# a new comment\ndef prepare("),
    ("data/prepared.py", '    """The corpus of a run config', '    """Reworded. The corpus of a run config'),
    ("model/pipeline_vaswani.py", "def is_generation_keyword(", "def another_helper():\n    return 1\n\n\n"
                                                                "def is_generation_keyword("),  # not data's
], ids=["module docstring", "comment", "function docstring", "code that does not shape data"])
def test_an_edit_of_comments_docstrings_or_other_code_keeps_every_key(tmp_path, module, old, new):
    package = _copy_of_the_shaping_code(tmp_path)
    before = cache_module.code_fingerprint(package)
    assert before == cache_module.code_fingerprint()  # the copy is this installation's code
    _edit(package / module, old, new)
    assert cache_module.code_fingerprint(package) == before


@pytest.mark.parametrize("module,old,new", [
    ("data/cleaning.py", "import html\n", "import html\nMORE = 1\n"),
    ("data/shards.py", "SHARD_PAIRS = 100_000", "SHARD_PAIRS = 50_000"),
    ("model/pipeline_vaswani.py", "        return moses_tokenize(text, lang)\n    return text\n",
     "        return moses_tokenize(text, lang)\n    return text.strip()\n"),
], ids=["a cleaning module", "the shard layout", "the preprocessing"])
def test_an_edit_of_the_code_that_shapes_the_data_makes_every_key_new(tmp_path, module, old, new):
    package = _copy_of_the_shaping_code(tmp_path)
    before = cache_module.code_fingerprint(package)
    _edit(package / module, old, new)
    assert cache_module.code_fingerprint(package) != before


def test_the_shaping_functions_named_for_the_key_exist():
    for name, functions in cache_module.SHAPING_CODE.items():
        source = cache_module.shaping_source(cache_module.PACKAGE / name, functions)
        for function in functions or ():
            assert f"name='{function}'" in source, (name, function)
