"""`training.max_minutes`: a stop after so many minutes of training, wherever the schedule is (fairseq's
`--stop-time-hours`). Not the time budget (`training.budget_minutes`, `recipe.budget`), which plans the run's updates
so that its schedule ends when the time is up."""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

logger = logging.getLogger("vaswani_mt.train")


class MaxMinutesStop(TrainerCallback):
    """Stops training (saving and evaluating first) once `max_minutes` of training time have passed. The clock
    counts this process's training only, so a resumed run gets `max_minutes` again for its remaining part."""

    def __init__(self, max_minutes: float):
        self.deadline_seconds = max_minutes * 60
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.started > self.deadline_seconds:
            logger.info("training.max_minutes (%g) reached at update %d: saving and stopping",
                        self.deadline_seconds / 60, state.global_step)
            control.should_training_stop = control.should_save = control.should_evaluate = True
        return control


__all__ = ["MaxMinutesStop"]
