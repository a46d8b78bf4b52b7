"""scripts/seed_summary.py: a recipe's seeds as one result (mean, spread) and an A/B read on valid only."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from vaswani_mt.run_record import (Hardware, RunFolder, RunRecord, Selection, TestScores, TimeBudgetPlan,
                                   TrainingFigures)

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script():
    spec = importlib.util.spec_from_file_location("seed_summary", SCRIPTS / "seed_summary.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, seed: int, valid: float, test: float, lctok: float | None = None, chosen="averaged") -> Path:
    folder.mkdir(parents=True)
    RunRecord(
        training=TrainingFigures(steps=3950 + seed, hardware=Hardware(cpu="AMD EPYC", cuda=False),
                                 precision="float32 (training.precision is auto: no native bfloat16)",
                                 time_budget=TimeBudgetPlan(budget_minutes=80, run_minutes=75.5)),
        selection=Selection(chosen=chosen, valid_bleu_averaged=valid if chosen == "averaged" else valid - 1,
                            valid_bleu_best_checkpoint=valid if chosen != "averaged" else valid - 1),
        test=TestScores(bleu=test, bleu_lowercased_moses_tokenized=lctok,
                        preprocess="lowercase_moses" if lctok is not None else None),
    ).write(RunFolder(folder))
    (folder / "config.yaml").write_text(yaml.safe_dump({"training": {"seed": seed}}), encoding="utf-8")
    return folder


def test_three_seeds_give_each_runs_figures_and_the_mean_spread_and_deviation_of_each_score(tmp_path, capsys):
    runs = [_run(tmp_path / f"s{seed}", seed, valid, test, lctok, chosen)
            for seed, valid, test, lctok, chosen in ((1, 39.9, 38.6, 40.8, "averaged"), (2, 39.1, 38.0, 40.2, "best"),
                                                     (3, 40.0, 39.1, 41.4, "averaged"))]
    assert _script().main([str(r) for r in runs]) == 0
    out = capsys.readouterr().out
    # runs on lowercased Moses-tokenized text: their score is the lc-tok BLEU, not a cased one
    assert "| s2 | 2 | AMD EPYC, float32 | 3,952 | 75.5 | 39.10 | – | 40.20 |" in out
    assert "valid BLEU:  39.67 (39.10–40.00, sd 0.49, 3 runs)" in out
    assert "test lc-tok: 40.80 (40.20–41.40, sd 0.60, 3 runs)" in out
    assert "test BLEU:" not in out


def test_an_ab_compares_mean_valid_bleu_and_asks_for_a_second_seed_when_one_run_per_side_is_close(tmp_path, capsys):
    a = _run(tmp_path / "a1", 1, 40.0, 38.0)
    b = _run(tmp_path / "b1", 1, 39.5, 39.0)
    assert _script().main([str(a), "--against", str(b)]) == 0
    out = capsys.readouterr().out
    assert "A/B on valid: A 40.00 (one run) against B 39.50 (one run): A - B = +0.50" in out
    assert "run a second seed on each side" in out
    assert "test lc-tok:" not in out  # cased runs: no lc-tok mean


def test_a_folder_without_a_finished_record_is_named_and_refused(tmp_path, capsys):
    (tmp_path / "unfinished").mkdir()
    assert _script().main([str(tmp_path / "unfinished")]) == 1
    assert capsys.readouterr().err.strip() == (f"seed_summary.py: {tmp_path / 'unfinished'}: no metrics.json "
                                               "(not a finished run of `vaswani-mt train`)")


@pytest.mark.parametrize("values, shown", [([None], "–"), ([38.5], "38.50 (one run)")])
def test_a_score_from_fewer_than_two_runs_says_so(values, shown):
    assert _script().spread(values) == shown
