"""How fast this machine runs a run: a probe made before training, for the time budget's first plan
(`vaswani_mt.recipe.budget`) and its check that the budget holds an update at all (`probed_planner`).

The probe trains a few updates of a throw-away copy of the run (the same model configuration, arguments, batches and
precision, through the same Trainer) and translates a few validation sentences with the run's beam search, timing
both. The model it times is untrained and writes to the length limit (source length + 50); it translates the sentences
twice: cut at the length of the longest reference among them, as long as a trained model's translations, for what a
validation of the run costs (the run replaces it by what it measures at its first validation), and to the limit, for
what a pass costs when the model is still undertrained at the end (a short run's passes after training). It writes
nothing, and the run seeds its own model afterwards, so the probe changes nothing of the run but its start time.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from .budget import BudgetPlanner, Pace
from .building import collator, model_config, set_decoding, validation_split
from .config import ConfigError, RunConfig
from .progress import duration
from .trainer import VaswaniTrainer, VaswaniTrainingArguments

logger = logging.getLogger("vaswani_mt.train")

PROBE_UPDATES = 8  # the first two (memory set-up) are not timed
UNTIMED = 2
PROBE_SENTENCES = 32


class _StepClock(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def measure_pace(make_trainer, args, valid_dataset, updates: int = PROBE_UPDATES,
                 sentences: int = PROBE_SENTENCES) -> Pace:
    """Seconds per update and per validation pass over `valid_dataset`, measured on a throw-away trainer:
    `make_trainer(args)` builds it (a fresh model, the run's data) from these arguments, changed to train `updates`
    updates into a temporary folder without evaluating, saving or logging."""
    clock = _StepClock()
    with tempfile.TemporaryDirectory(prefix="vaswani-mt-probe-") as folder:
        probe_args = dataclasses.replace(
            args, output_dir=folder, max_steps=updates, eval_strategy="no", save_strategy="no",
            logging_strategy="no", logging_first_step=False, load_best_model_at_end=False, report_to=[],
            disable_tqdm=True, budget_minutes=None, save_total_limit=None, checkpoint_limit=None)
        trainer = make_trainer(probe_args)
        for display in (PrinterCallback, ProgressCallback):  # the probe says nothing
            trainer.remove_callback(display)
        trainer.add_callback(clock)
        trainer.compute_metrics = None  # times the translation, not its scoring
        trainer.train()
        timed = clock.ends[min(UNTIMED, len(clock.ends) - 1) - 1:]
        per_update = (timed[-1] - timed[0]) / max(len(timed) - 1, 1)
        probed = valid_dataset.select(range(min(sentences, len(valid_dataset))))
        longest = max((len(labels) for labels in probed["labels"]), default=1) if "labels" in probed.column_names \
            else None
        per_validation = _seconds_per_pass(trainer, probed, len(valid_dataset),
                                           {"max_new_tokens": longest + 1} if longest else {})
        at_limit = _seconds_per_pass(trainer, probed, len(valid_dataset), {})
    return Pace(per_update, per_validation, max(at_limit, per_validation))


def _seconds_per_pass(trainer, probed, sentences: int, generation: dict) -> float:
    """The seconds a beam-search pass over `sentences` sentences takes, from a pass over the `probed` ones."""
    started = time.perf_counter()
    trainer.predict(probed, **generation)
    return (time.perf_counter() - started) * sentences / max(len(probed), 1)


def probed_planner(config: RunConfig, args: VaswaniTrainingArguments, prepared, started: float,
                    from_checkpoint: bool) -> BudgetPlanner | None:
    """The planner of a run with `training.budget_minutes` (`vaswani_mt.recipe.budget`), None without one. A run that
    starts here is probed first (`measure_pace`, on a throw-away trainer of the run's model and data), and refused in
    one line (`ConfigError`) when the budget cannot hold a single update on this machine; a run resumed from a
    checkpoint plans from the checkpoint's pace."""
    t = config.training
    if not t.budget_minutes:
        return None
    valid = validation_split(config, prepared.tokenized)
    test = prepared.tokenized[config.data.test_split] if config.data.test_split else []
    # what follows training, in validation passes: the average's (the best checkpoint's score is its validation's
    # during training), and the test split's
    planner = BudgetPlanner(t.budget_minutes, t.cooldown_steps, started=started, after_training=int(t.average_last > 1),
                            test_passes=len(test) / max(len(valid), 1), test_sentences=len(test) or None)
    if from_checkpoint:
        return planner
    tokenizer = prepared.tokenizer

    def probe_trainer(probe_args):
        model = VaswaniForConditionalGeneration(model_config(config, tokenizer))
        set_decoding(model, config)
        return VaswaniTrainer(model=model, args=probe_args, train_dataset=prepared.tokenized[config.data.train_split],
                              processing_class=tokenizer, data_collator=collator(config, tokenizer, model))

    planner.pace = measure_pace(probe_trainer, args, valid)
    logger.info("time budget %s: this machine takes %.3f s per update and about %.0f s per validation, %.0f s where "
                "the translations run to the length limit (a probe)", duration(t.budget_minutes * 60),
                planner.pace.seconds_per_update, planner.pace.seconds_per_validation,
                planner.pace.seconds_per_validation_at_limit)
    if problem := planner.fit_problem(t.eval_steps, t.max_steps or 10 ** 9):
        raise ConfigError(problem)
    return planner


__all__ = ["PROBE_SENTENCES", "PROBE_UPDATES", "measure_pace", "probed_planner"]
