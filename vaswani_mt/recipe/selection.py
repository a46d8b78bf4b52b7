"""The final model (§6.1): the average of the last checkpoints or weight snapshots (those of the cool-down's fall,
where the schedule has one), kept when it scores at least the best checkpoint's validation BLEU. Chosen on one half of
valid and scored on the other, this rule beat "always the average" by 0.10 BLEU over six runs (docs/recipe.md;
scripts/selection_rules.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from ..files import last_saves
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..run_record import RunFolder, Selection
from .averaging import average_checkpoints
from .config import RunConfig
from .progress import TrainingProgress
from .snapshots import last_snapshots
from .trainer import VaswaniTrainer

logger = logging.getLogger("vaswani_mt.train")


def select_final_model(trainer: VaswaniTrainer, run: RunFolder, config: RunConfig, valid_dataset,
                        progress: TrainingProgress) -> Selection:
    """§6.1: average the last checkpoints; keep the average if it beats the best checkpoint on valid BLEU."""
    # its validation during training (the same split, weights and decoding), where those weights are the ones loaded
    best_bleu = trainer.state.best_metric if trainer.state.best_model_checkpoint else None
    if best_bleu is None:
        with progress.stage("valid, best checkpoint"):
            best_bleu = trainer.evaluate(valid_dataset, metric_key_prefix="valid").get("valid_bleu")
    best_metrics = {"valid_bleu": best_bleu}
    choice = Selection(chosen="best_checkpoint", best_checkpoint=trainer.state.best_model_checkpoint,
                       valid_bleu_best_checkpoint=best_bleu)
    t = config.training
    if t.average_every is None:
        kind, last = "saves", last_saves(run.checkpoints, t.average_last)
    else:
        kind, last = "snapshots", last_snapshots(run.snapshots, t.average_every, t.average_last)
        if len(last) < 2 <= t.average_last:
            logger.warning("nothing averaged: %d weight snapshot(s) of training.average_every %d in %d updates",
                           len(last), t.average_every, trainer.state.global_step)
    if 1 < len(last) < t.average_last:
        logger.warning("averaging only the last %d %s (%s): the one before them is not on disk", len(last), kind,
                       ", ".join(p.name for p in last))
    schedule = trainer.lr_scheduler
    fall_from = (schedule.fall_start() if schedule is not None and schedule.cooldown_steps
                 else (trainer.time_budget_facts() or {}).get("fall_from"))
    if fall_from is not None and len(last) > 2:  # weights of the fall only (at least the last two): the lowest rates
        falling = [p for p in last if _saved_step(p) > fall_from] or last[-2:]
        falling = falling if len(falling) >= 2 else last[-2:]
        if len(falling) < len(last):
            logger.info("averaging the %s of the cool-down's fall (after update %d) only: %d of the last %d",
                        kind, fall_from, len(falling), len(last))
        last = falling
    if t.average_last > 1 and len(last) > 1:
        logger.info("averaging the last %d %s: %s", len(last), kind, ", ".join(p.name for p in last))
        if trainer.args.should_save:
            average_checkpoints(last, output_dir=run.averaged)
        trainer.accelerator.wait_for_everyone()
        best_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        averaged = VaswaniForConditionalGeneration.from_pretrained(run.averaged)
        trainer.model.load_state_dict(averaged.state_dict())
        with progress.stage(f"valid, average of the last {len(last)} {kind}"):
            averaged_metrics = trainer.evaluate(valid_dataset, metric_key_prefix="valid")
        choice.averaged_checkpoints = [p.name for p in last]
        choice.valid_bleu_averaged = averaged_metrics.get("valid_bleu")
        if averaged_metrics.get("valid_bleu", -1) >= best_metrics.get("valid_bleu", -1):
            choice.chosen = "averaged"
        else:
            trainer.model.load_state_dict(best_state)
    chosen = {key: value for key, value in dataclasses.asdict(choice).items() if value is not None}
    logger.info("final model: %s", json.dumps(chosen))
    return choice


def _saved_step(folder: Path) -> int:
    """The update a checkpoint-<step> or step-<step> folder holds the weights of."""
    return int(folder.name.rsplit("-", 1)[1])


__all__ = ["select_final_model"]
