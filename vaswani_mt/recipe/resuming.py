"""What a resumed run continues from (`train_run(config, resume=True)`, `vaswani-mt train --resume`): the run folder
and config it was started with, its last complete checkpoint (what a kill left half-written or half-deleted is
removed first), the update of that checkpoint kept on another number of processes, and, when training had already
ended there, the trainer put back where training left it so that only the steps after training are left."""

from __future__ import annotations

import dataclasses
import errno
import logging
from pathlib import Path

from transformers import TrainerState

from ..files import remove_incomplete_checkpoints
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..run_record import RunFolder
from .config import ConfigError, RunConfig, load_run_config
from .processes import UpdateBatch, processes_text, resumed_accumulation
from .trainer import VaswaniTrainer, VaswaniTrainingArguments, complete_checkpoints, is_complete_checkpoint

logger = logging.getLogger("vaswani_mt.train")


def check_run_folder(config: RunConfig, run: RunFolder, resume: bool) -> None:
    """A new run needs an empty folder; a resumed one, the config it was started with (`_what_trains`)."""
    if not resume:
        if run.root.exists() and any(run.root.iterdir()):
            raise ConfigError(f"output_dir {run.root} already holds a run: pass --resume (resume=True) to continue "
                              "it, or choose another --output-dir")
        return
    if run.config.exists() and _what_trains(load_run_config(str(run.config))) != _what_trains(config):
        raise ConfigError(f"--resume: the config differs from the one {run.config} was started with; resume with "
                          f"the same config and overrides, or with --config {run.config}")


def _what_trains(config: RunConfig) -> dict:
    """The settings a resumed run must share with its start: all but what only the card and --quick read."""
    settings = config.to_dict()
    settings["data"].pop("description", None)
    settings.pop("quick", None)
    settings["training"].pop("gradient_accumulation_steps")  # checked against the checkpoint (`resumed_update`)
    return settings


def resume_point(checkpoints_dir: Path, args) -> tuple[str | None, TrainerState | None]:
    """Where a resumed run continues: the last complete checkpoint, once what a kill left half-written or
    half-deleted is removed (`vaswani_mt.files`); plus that checkpoint's trainer state when training had already
    ended there (all steps done, or stopped by the time budget), so that only the steps after training are left."""
    with args.main_process_first(desc="resume"):
        if args.should_save:
            for removed in remove_incomplete_checkpoints(checkpoints_dir):
                logger.warning("removing %s", removed)
        complete = complete_checkpoints(checkpoints_dir)
    if not complete:
        logger.info("resuming from scratch (no complete checkpoint yet)")
        return None, None
    state = TrainerState.load_from_json(str(complete[-1] / "trainer_state.json"))
    if not training_ended(state):
        logger.info("resuming from %s", complete[-1])
        return str(complete[-1]), None
    logger.info("resuming from %s: training ended there (step %d); finishing the steps after training", complete[-1],
                state.global_step)
    return str(complete[-1]), state


def training_ended(state: TrainerState) -> bool:
    """Whether training had ended at a checkpoint of this state: all steps done, or stopped (the time budget)."""
    control = (state.stateful_callbacks or {}).get("TrainerControl", {}).get("args", {})
    return state.global_step >= state.max_steps or bool(control.get("should_training_stop"))


def resumed_update(config: RunConfig, run: RunFolder, args: VaswaniTrainingArguments) -> RunConfig:
    """A resumed run keeps the update of its last checkpoint (`vaswani_mt.recipe.processes`): the config with the
    gradient accumulation that gives this number of processes the checkpoint's batches per update (the checkpoint's
    own when only the steps after training are left), also set in `args` before the Trainer is built. A config that
    asks for another accumulation than that and than the run's config.yaml is refused. A checkpoint saved before
    checkpoints recorded their batch resumes with the config's."""
    complete = complete_checkpoints(run.checkpoints)
    started = UpdateBatch.of_checkpoint(complete[-1]) if complete else None
    if started is None:
        return config
    ended = training_ended(TrainerState.load_from_json(str(complete[-1] / "trainer_state.json")))
    saved = load_run_config(str(run.config)).training.gradient_accumulation_steps if run.config.is_file() else None
    asked = config.training.gradient_accumulation_steps
    accumulation = resumed_accumulation(started, started.processes if ended else args.world_size, asked, saved,
                                        complete[-1])
    if accumulation != asked and started.processes == args.world_size:
        logger.warning("resuming with gradient accumulation %d, %s's (training.gradient_accumulation_steps %d in %s "
                       "is the start's)", accumulation, complete[-1].name, asked, run.config)
    if not ended:
        args.gradient_accumulation_steps = accumulation
    return dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                    gradient_accumulation_steps=accumulation))


def say_the_update_batch(args: VaswaniTrainingArguments, checkpoint: str) -> None:
    """One line when a run resumes on another number of processes than its checkpoint's: the gradient accumulation
    `resumed_update` chose keeps the update."""
    started = UpdateBatch.of_checkpoint(checkpoint)
    if started is None or started.processes == args.world_size:
        return
    now = UpdateBatch(args.world_size, args.gradient_accumulation_steps, args.max_tokens)
    logger.warning("resuming on %s where %s was trained on %d: gradient accumulation %d -> %d keeps an update at "
                   "%d batches (%s; was %s)", processes_text(args.world_size), Path(checkpoint).name,
                   started.processes, started.gradient_accumulation_steps, now.gradient_accumulation_steps,
                   now.batches, now.describe(), started.describe())


def restore_ended_training(trainer: VaswaniTrainer, state: TrainerState, checkpoints_dir: Path, last: str) -> dict:
    """Put `trainer` where `trainer.train()` left it when training ended (without training another step, which
    resuming the Trainer at its last step would do): the trainer state, and the weights of the best checkpoint
    (`load_best_model_at_end`), else of the last one. Returns the train metrics (none: nothing was trained)."""
    best = checkpoints_dir / Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
    if best is not None and not is_complete_checkpoint(best):
        raise FileNotFoundError(errno.ENOENT, "the run's best checkpoint is missing or incomplete, so the run cannot "
                                "be finished as it would have been", str(best))
    trainer.state = state
    trainer.state.best_model_checkpoint = str(best) if best is not None else None
    weights = VaswaniForConditionalGeneration.from_pretrained(best or last).state_dict()
    trainer.model.load_state_dict(weights)
    return {}


__all__ = ["check_run_folder", "restore_ended_training", "resume_point", "resumed_update", "say_the_update_batch",
           "training_ended"]
