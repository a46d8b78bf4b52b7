"""Weight snapshots for checkpoint averaging at the paper's spacing (§6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were written at
10-minute intervals": of a 12-hour run, the average spans its last ~5 %. A short run's evaluation checkpoints are too
far apart for that (10 saves every 800 updates span 90 % of an 8,000-update run, early weights included); fairseq's
Multi30k recipes average the checkpoints of the last epochs instead.

`training.average_every: N` writes the model's weights every N updates and at the last update (the steps a resumed
run reaches too, so it writes the same ones) to the run's `snapshots/step-<update>` folder, as `save_pretrained`
writes a model; the newest `training.average_last` are kept, and the end of training averages the last consecutive
ones instead of the evaluation checkpoints. A snapshot is written to a hidden temporary folder, synced, and renamed
into place; an old one is renamed before it is deleted (`files.delete_checkpoint`); so a kill never leaves a
half-written `step-<update>`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from transformers import TrainerCallback

from ..files import (
    DELETING_PREFIX,
    consecutive_saves,
    delete_checkpoint,
    fsync_directory,
    fsync_tree,
    share_weights,
    weights_problem,
    writing,
)

_SNAPSHOT = re.compile(r"step-(\d+)")


def _step(path: Path) -> int | None:
    match = _SNAPSHOT.fullmatch(path.name)
    return int(match.group(1)) if match else None


def snapshot_folders(folder: str | os.PathLike) -> list[Path]:
    """The whole snapshots in `folder` (a config.json and whole weights), oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = sorted((step, path) for path in folder.iterdir() if path.is_dir() and (step := _step(path)) is not None)
    return [path for _, path in found if (path / "config.json").is_file() and weights_problem(path) is None]


def last_snapshots(folder: str | os.PathLike, every: int, count: int) -> list[Path]:
    """The whole snapshots of the last `count` snapshot steps, oldest first. Consecutive: walking back from the newest
    by `every` updates (the newest may be the run's last update, between two regular ones), it stops at the first
    that is missing or damaged, so an older snapshot never stands in for a later one."""
    return consecutive_saves({_step(path): path for path in snapshot_folders(folder)}, every, count)


def drop_snapshots_after(folder: str | os.PathLike, step: int) -> list[Path]:
    """Before resuming from the checkpoint of update `step`: remove the snapshots written after it (the resumed run
    writes them again, from the updates it repeats) and whatever a kill left half-written or half-deleted.
    Returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    whole, removed = set(snapshot_folders(folder)), []
    for path in sorted(folder.iterdir()):
        if not path.is_dir():
            continue
        snapshot_step = _step(path)
        if snapshot_step is None and path.name.startswith((".", DELETING_PREFIX)):  # half-written or half-deleted
            shutil.rmtree(path)
            removed.append(path)
        elif snapshot_step is not None and (snapshot_step > step or path not in whole):
            delete_checkpoint(path)
            removed.append(path)
    return removed


class WeightSnapshots(TrainerCallback):
    """Writes the model's weights to `folder`/step-<update> every `every` updates and keeps the newest `keep`."""

    def __init__(self, folder: str | os.PathLike, every: int, keep: int):
        self.folder, self.every, self.keep = Path(folder), every, keep

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # should_training_stop: the last update (max_steps reached, or the time budget's stop, set before this runs);
        # the Trainer saves the final checkpoint after this, so a run that ended has its final snapshot.
        last = control.should_training_stop or state.global_step >= state.max_steps > 0
        if (state.global_step % self.every == 0 or last) and args.should_save:
            self.write(model, state.global_step)

    def write(self, model, step: int) -> Path:
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper holds the model
        target = self.folder / f"step-{step}"
        temporary = self.folder / f".step-{step}.tmp"
        with writing(target):
            shutil.rmtree(temporary, ignore_errors=True)
            model.save_pretrained(temporary)
            share_weights(temporary)
            fsync_tree(temporary)
            if target.exists():
                delete_checkpoint(target)
            os.replace(temporary, target)
            fsync_directory(self.folder)
        for old in snapshot_folders(self.folder)[:-self.keep]:
            delete_checkpoint(old)
        return target
