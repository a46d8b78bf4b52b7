"""Folders saved by this code keep decoding right where they travel: under the lowest supported transformers and
the newest, in a process without vaswani_mt, as remote code, exactly as transformers' own loops decoded them when
they were saved (tests/fixtures/saved-with-transformers-*, made by scripts/save_compat_folder.py). Folders saved by
older code, whose model code predates transformers 5.24's cache rename, are repaired by `vaswani-mt upgrade`."""

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from stock_transformers import WITHOUT_VASWANI_MT, run_without_vaswani_mt
from transformers import AutoModelForSeq2SeqLM

from vaswani_mt.cli import main
from vaswani_mt.model.modeling_vaswani import CACHE_FIELD

FIXTURES = Path(__file__).parent / "fixtures"
SAVED = sorted(FIXTURES.glob("saved-with-transformers-*"))
OLD_CODE = FIXTURES / "run-saved-by-c3eb282" / "model"  # code saved before the cache rename

# Decodes a folder as a user without vaswani_mt does, with and without the cache; prints the tokens and whatever
# transformers logged (deprecation shims log through its logger).
DECODE = WITHOUT_VASWANI_MT + textwrap.dedent("""
    import io, json, logging, sys, warnings
    import torch
    from transformers import AutoModelForSeq2SeqLM
    from transformers.utils import logging as hf_logging
    log = io.StringIO()
    hf_logging.get_logger().addHandler(logging.StreamHandler(log))
    warnings.simplefilter("always")
    path = sys.argv[1]
    reference = json.load(open(path + "/reference.json"))
    inputs = {k: torch.tensor(v) for k, v in reference["inputs"].items()}
    with warnings.catch_warnings(record=True) as caught:
        model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
        outputs = {f"{name}/{cache}": model.generate(**inputs, use_cache=cache, **call).tolist()
                   for name, call in reference["calls"].items() for cache in (True, False)}
    print(json.dumps({"class": type(model).__module__, "outputs": outputs, "log": log.getvalue(),
                      "warnings": [str(w.message) for w in caught]}))
""")


def _reference(folder: Path) -> dict:
    return json.loads((folder / "reference.json").read_text())


def _decode_as_remote_code(folder: Path, home: Path) -> dict:
    return run_without_vaswani_mt(DECODE, str(folder), home=home)


def test_there_are_folders_saved_under_the_lowest_supported_and_the_newest_transformers_checked():
    versions = {_reference(folder)["transformers"] for folder in SAVED}
    assert {"5.17.0", "5.24.0"} <= versions


@pytest.mark.parametrize("folder", SAVED, ids=lambda folder: folder.name)
def test_a_saved_folder_decodes_its_reference_tokens_as_remote_code_without_vaswani_mt(folder, tmp_path):
    reference = _reference(folder)
    result = _decode_as_remote_code(folder, tmp_path / "hf")
    assert result["class"].startswith("transformers_modules.")
    for name, expected in reference["outputs"].items():
        assert result["outputs"][f"{name}/True"] == expected, f"{name} with the cache"
        assert result["outputs"][f"{name}/False"] == expected, f"{name} without the cache"
    messages = [result["log"], *result["warnings"]]
    assert not any("deprecated" in message for message in messages), messages


@pytest.mark.parametrize("folder", SAVED, ids=lambda folder: folder.name)
@pytest.mark.parametrize("fast", [True, False], ids=["vaswani_mt loops", "transformers loops"])
def test_the_package_decodes_a_saved_folder_as_its_reference_tokens(folder, fast):
    reference = _reference(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    model.use_fast_decoding = fast
    inputs = {k: torch.tensor(v) for k, v in reference["inputs"].items()}
    for name, call in reference["calls"].items():
        assert model.generate(**inputs, **call).tolist() == reference["outputs"][name], name


def _with_old_code(tmp_path: Path) -> Path:
    """A saved folder whose model code is what vaswani_mt saved before it took the cache under both names."""
    folder = tmp_path / "model"
    shutil.copytree(SAVED[0], folder)
    for name in ("modeling_vaswani.py", "configuration_vaswani.py", "generation_vaswani.py"):
        shutil.copy(OLD_CODE / name, folder / name)
    return folder


def test_upgrade_repairs_a_folder_whose_saved_code_predates_the_cache_rename(tmp_path):
    folder = _with_old_code(tmp_path)
    reference = _reference(folder)["outputs"]
    before = _decode_as_remote_code(folder, tmp_path / "hf-before")["outputs"]
    assert before["greedy/False"] == reference["greedy"]  # without a cache, old code is right on every version
    if CACHE_FIELD == "cache":  # transformers >= 5.24: the old code's cached decoding loses its history
        assert before["greedy/True"] != reference["greedy"]

    assert main(["upgrade", str(folder)]) == 0
    assert not (folder / "generation_vaswani.py").exists()
    after = _decode_as_remote_code(folder, tmp_path / "hf-after")["outputs"]
    for name, expected in reference.items():
        assert after[f"{name}/True"] == expected and after[f"{name}/False"] == expected, name


def test_upgrade_replaces_the_code_of_every_model_folder_of_a_run_and_leaves_the_rest_alone(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run-saved-by-c3eb282", run)
    weights = {path: path.read_bytes() for path in run.rglob("*.safetensors")}
    assert main(["upgrade", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"{run / 'model'}: replaced configuration_vaswani.py, modeling_vaswani.py, pipeline_vaswani.py; " \
           "removed generation_vaswani.py" in out
    assert f"{run / 'checkpoints' / 'checkpoint-2'}: replaced" in out
    assert not (run / "checkpoints" / "checkpoint-2" / "pipeline_vaswani.py").exists()  # none there before
    assert all(path.read_bytes() == data for path, data in weights.items())
    assert main(["upgrade", str(run)]) == 0
    assert capsys.readouterr().out.count("code already current") == 2


def test_upgrade_check_and_dry_run_change_nothing_and_check_fails_on_outdated_code(tmp_path, capsys):
    folder = _with_old_code(tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert main(["upgrade", str(folder), "--dry-run"]) == 0
    assert main(["upgrade", str(folder), "--check"]) == 1
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert capsys.readouterr().out.startswith("would change ")
    main(["upgrade", str(folder)])
    assert main(["upgrade", str(folder), "--check"]) == 0


@pytest.mark.parametrize("make,phrase", [
    (lambda tmp: tmp / "missing", "does not exist"),
    (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", "is not a folder"),
    (lambda tmp: tmp, "holds no vaswani model folder"),
])
def test_upgrade_of_something_that_is_not_a_model_folder_is_one_clear_line(tmp_path, capsys, make, phrase):
    assert main(["upgrade", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vaswani-mt upgrade: error: ") and phrase in err[0]


def test_a_push_of_a_run_whose_code_is_from_another_version_says_how_to_upgrade_it(capsys):
    run = FIXTURES / "run-saved-by-c3eb282"
    assert main(["push", str(run), "someone/old-run", "--dry-run"]) == 0
    assert f"`vaswani-mt upgrade {run}` replaces it before the push" in capsys.readouterr().err
