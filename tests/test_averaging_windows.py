"""scripts/averaging_windows.py: a finished run's last weight snapshots averaged over several windows, each scored on
valid as the run's final model is."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import load_script

from vaswani_mt.inference.translate import translate_lines

SOURCES = ["a dog runs in the park .", "the cat sleeps on a red sofa .", "children play in the snow ."]


def _script():
    return load_script("averaging_windows")


@pytest.fixture
def run(tmp_path, tokenizer, model, make_tiny_model):
    """A finished run: snapshots step-10, -20, -30 (three different models), its final model the last of them, and
    valid references that are exactly what the last snapshot writes, so it alone scores 100."""
    folder = tmp_path / "run"
    snapshots = [make_tiny_model(seed=seed, vocab_size=len(tokenizer)) for seed in (1, 2, 3)]
    for step, snapshot in zip((10, 20, 30), snapshots):
        snapshot.save_pretrained(folder / "snapshots" / f"step-{step}")
    final = snapshots[-1]
    final.generation_config = model.generation_config  # beam 4, length penalty 0.6: the run's decoding
    final.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    data = tmp_path / "data"
    data.mkdir()
    (data / "valid.en").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    references = list(translate_lines(final, tokenizer, SOURCES))
    assert all(references)  # the tiny model writes something for each line
    (data / "valid.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    config = {"data": {"path": str(data), "source_lang": "en", "target_lang": "de", "valid_split": "valid"},
              "training": {"average_every": 10}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return folder


def test_a_window_of_one_is_the_last_snapshot_and_wider_windows_average_the_newest_snapshots(run, capsys):
    assert _script().main([str(run), "--last", "1", "2", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU: ") and lines[1] == "| candidate | weights averaged | updates | valid BLEU |"
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[3:]}
    assert rows["the run's final model"] == "| the run's final model | – | – | 100.00 |"
    assert rows["last 1"] == "| last 1 | 1 | 30 | 100.00 |"  # the final model's weights: its very output
    assert rows["last 2"].startswith("| last 2 | 2 | 20–30 | ") and rows["last 3"].startswith("| last 3 | 3 | 10–30 | ")
    assert not rows["last 3"].endswith("| 100.00 |")  # an average of other weights writes other translations


def test_a_window_wider_than_the_snapshots_or_a_missing_valid_file_is_one_line_naming_it(run, capsys):
    assert _script().main([str(run), "--last", "4"]) == 1
    assert capsys.readouterr().err == (f"averaging_windows.py: --last 4: {run / 'snapshots'} holds 3 consecutive "
                                       f"snapshots\n")
    (Path(yaml.safe_load((run / "config.yaml").read_text())["data"]["path"]) / "valid.de").unlink()
    assert _script().main([str(run), "--last", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("averaging_windows.py: ") and "valid.de: no such file" in err and err.count("\n") == 1


def _save_checkpoints(run):
    """checkpoint-10, -20, -30 as the Trainer keeps them (every 10 updates): the snapshots' weights and its state."""
    for step in (10, 20, 30):
        checkpoint = run / "checkpoints" / f"checkpoint-{step}"
        shutil.copytree(run / "snapshots" / f"step-{step}", checkpoint)
        for state in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
            (checkpoint / state).write_bytes(b"state")
        (checkpoint / "trainer_state.json").write_text(json.dumps({"save_steps": 10}), encoding="utf-8")


def test_checkpoint_windows_average_the_last_kept_checkpoints_beside_the_snapshot_windows(run, capsys):
    _save_checkpoints(run)
    assert _script().main([str(run), "--last", "3", "--checkpoints", "1", "3"]) == 0
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()[3:]}
    assert rows["last 1 checkpoint"] == "| last 1 checkpoint | 1 | 30 | 100.00 |"  # checkpoint-30: the final weights
    assert rows["last 3 checkpoints"].startswith("| last 3 checkpoints | 3 | 10–30 | ")
    # here the checkpoints hold the snapshots' weights, so both windows of 3 average the same and translate alike
    assert rows["last 3 checkpoints"].split(" | ")[3] == rows["last 3"].split(" | ")[3] != "100.00 |"


def test_a_checkpoint_window_wider_than_the_kept_checkpoints_is_one_line_naming_it(run, capsys):
    _save_checkpoints(run)
    assert _script().main([str(run), "--last", "1", "--checkpoints", "4"]) == 1
    assert capsys.readouterr().err == (f"averaging_windows.py: --checkpoints 4: {run / 'checkpoints'} holds 3 "
                                       f"consecutive checkpoints\n")
