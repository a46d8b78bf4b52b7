"""A recipe's result over several seeds: each run's figures, and the mean and spread of its scores.

One run is not a recipe's result: the same config with another seed lands about a BLEU higher or lower on Multi30k.
The model card of a run lists its sibling runs (`vaswani-mt push RUN REPO --seed-runs RUN2 RUN3`) and
`scripts/seed_summary.py` tabulates any runs; both read them here, from their run folders (`RunRecord`). Siblings are
runs of one recipe: their resolved configs are equal but for `training.seed` and the settings that say only where
and how a run executed (`SEED_KEYS`).
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..run_record import RunFolder, RunRecord

# what may differ between the seeds of one recipe: the seed, where the run and its data were written or read, and
# how many threads and worker processes it used (none of which changes what it learns)
SEED_KEYS = (("training", "seed"), ("output_dir",), ("data", "path"), ("data", "cache_dir"), ("data", "workers"),
             ("training", "num_threads"))
SEED_KEY_NAMES = ", ".join(".".join(path) for path in SEED_KEYS)


class SeedRunError(ValueError):
    """A run folder that cannot stand beside the others as a seed of their recipe; the message names it."""


@dataclass
class RunFigures:
    """One run as a seed of its recipe."""

    name: str
    seed: int | None
    machine: str  # the CPU or GPU, and the precision it trained in
    updates: int | None
    minutes: float | None  # the time budget's whole run, else training's wall time
    valid: float | None  # the final model's valid BLEU (the average or the best checkpoint, as the run chose)
    test: float | None  # cased sacreBLEU on detokenized output (None for a run on preprocessed text)
    test_lctok: float | None  # lowercased Moses-tokenized BLEU, where the run's text was preprocessed so


def run_figures(record: RunRecord) -> RunFigures:
    training, selection, test = record.training, record.selection, record.test
    hardware = training.hardware if training else None
    machine = (hardware.gpu if hardware and hardware.cuda else hardware.cpu if hardware else None) or "?"
    precision = ((training.precision if training else None) or "").split(" (")[0]
    plan = training.time_budget if training else None
    minutes = plan.run_minutes if plan and plan.run_minutes else (
        training.wall_seconds_this_process / 60 if training and training.wall_seconds_this_process else None)
    valid = None
    if selection is not None:
        valid = (selection.valid_bleu_averaged if selection.chosen == "averaged"
                 else selection.valid_bleu_best_checkpoint)
    return RunFigures(
        name=record.name, seed=(record.config.get("training") or {}).get("seed"),
        machine=f"{machine}, {precision}" if precision else machine, updates=training.steps if training else None,
        minutes=minutes, valid=valid, test=test.bleu if test and not test.preprocess else None,
        test_lctok=test.bleu_lowercased_moses_tokenized if test and test.preprocess else None)


def read_run(folder, scored: bool = True) -> RunRecord:
    """A finished run's record (with its resolved config, and with test scores where `scored`; a candidate of an A/B
    on valid may have none), or `SeedRunError` naming the folder."""
    run = RunFolder(folder)
    if not run.record.is_file():
        raise SeedRunError(f"{folder}: no metrics.json (not a finished run of `vaswani-mt train`)")
    record = RunRecord.read(folder)
    if scored and (record.test is None or record.test.bleu is None):
        raise SeedRunError(f"{run.record}: no test scores (not a finished run of `vaswani-mt train`, or not JSON)")
    if not record.config:
        raise SeedRunError(f"{run.config}: missing or not a YAML mapping (the run's resolved config)")
    return record


def recipe_difference(first: RunRecord, other: RunRecord) -> str | None:
    """The first config key (dotted) on which `other` is not a seed of `first`'s recipe; None when it is one."""
    return _difference(_without_seed(first.config), _without_seed(other.config), "")


def recipe_runs(run_dir, folders) -> list[RunFigures]:
    """The run in `run_dir` and the runs in `folders`, each checked to be a seed of its recipe, as figures in that
    order. Raises `SeedRunError` naming a folder that is no finished run, a run of another recipe (and the first key
    that differs), a folder given twice or a seed given twice."""
    record = read_run(run_dir)
    runs = [run_figures(record)]
    places, seeds = {Path(run_dir).resolve(): run_dir}, {runs[0].seed: run_dir}
    for folder in folders:
        if Path(folder).resolve() in places:
            raise SeedRunError(f"{folder}: given twice (as {places[Path(folder).resolve()]} too)")
        other = read_run(folder)
        key = recipe_difference(record, other)
        if key is not None:
            raise SeedRunError(f"{folder}: not a seed of this run's recipe: its config differs at {key} (seeds of one "
                               f"recipe differ only in {SEED_KEY_NAMES})")
        figures = run_figures(other)
        if figures.seed in seeds:
            raise SeedRunError(f"{folder}: training.seed {figures.seed} again (the seed of {seeds[figures.seed]}): "
                               f"give runs with different seeds")
        places[Path(folder).resolve()], seeds[figures.seed] = folder, folder
        runs.append(figures)
    return runs


@dataclass
class Spread:
    """The mean of a score over runs, its lowest and highest value and sample standard deviation."""

    mean: float
    low: float
    high: float
    sd: float | None  # None with one run
    runs: int

    def __str__(self) -> str:
        if self.runs == 1:
            return f"{self.mean:.2f} (one run)"
        return f"{self.mean:.2f} ({self.low:.2f}–{self.high:.2f}, sd {self.sd:.2f}, {self.runs} runs)"


def spread(values) -> Spread | None:
    """The `Spread` of the values a run has (None where no run has one)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(mean=statistics.mean(present), low=min(present), high=max(present),
                  sd=statistics.stdev(present) if len(present) > 1 else None, runs=len(present))


def _without_seed(config: dict) -> dict:
    config = copy.deepcopy(config)
    for path in SEED_KEYS:
        holder = config
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder.get(key), dict) else {}
        holder.pop(path[-1], None)
    return config


def _difference(a, b, where: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            found = _difference(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    return None if a == b else where

