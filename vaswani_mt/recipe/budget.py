"""A time budget that shapes the schedule: `training.budget_minutes`.

fairseq's `--stop-time-hours` and Marian's `--after` stop a run when its time is up, wherever its schedule is: a
run stopped inside its cool-down, or before it, ends at a rate far from 0, and on a slower machine the same command
gives a worse model than on a faster one. Budgeted training (Li, Yumer & Ramanan, ICLR 2020) lays the schedule over
the budget instead, so that the rate reaches 0 exactly when the time is up. `BudgetPlanner` does that here:

* it measures this machine: seconds per update (a short probe before training, `recipe.pace`, then the updates
  themselves), and seconds per validation (the beam-search BLEU pass and checkpoint of every `eval_steps`);
* it fixes the number of updates so that the updates, the validations still to come and what follows training
  (model selection, the test translation: `after_training`, in validation passes) end within the budget, counted
  from the run's start (`started`: the command's start, data preparation included), less a small margin; until the
  run has measured a validation, each pass after training is counted as the probe's pass at the length limit, the
  cost of a model still undertrained at its end (a run that validates only at its end, as `--quick` does);
* it lays the schedule over that number: the warm-up (`warmup_steps` updates, as configured: the warm-up steadies
  Adam's first updates, whatever the run's length), the Noam decay, and the cool-down to 0 at the last update
  (`cooldown_steps` updates, or a fraction of the planned ones). One log line says what was planned and when the run
  will end; the plan is recorded in each checkpoint (`trainer_state.json`, and the schedule in `scheduler.pt`), the
  run record and the card.

While the run goes it plans again every logging step and after each validation. Until the cool-down's fall has
begun the number of updates follows the measurements (the rates of the updates done do not depend on it: the warm-up
and the decay are the same for any length), so a first estimate that was off costs nothing. Once the rate is falling,
a slower machine (another process started) shortens the fall: it goes on from the current rate straight to 0 at the
last update that still fits (`NoamLR.replan`) — the only way to end within the budget with the rate at 0, since the
updates already taken cannot be redone. A faster machine leaves a fall that has begun as it is: the run ends early.

A resumed run keeps its plan (the checkpoint's schedule): it trains to the planned last update, as the uninterrupted
run would have, whatever time is left, so that it ends with the weights of the uninterrupted run. `max_steps`, if
given too, caps the plan: the run plans the updates the budget fits, at most `max_steps`.

Under several processes the main process plans and the others follow its plan.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from dataclasses import dataclass

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .progress import duration
from .schedule import cooldown_length

logger = logging.getLogger("vaswani_mt.train")

MARGIN = 0.02  # of the budget, kept free for what the measurements miss (at least MARGIN_SECONDS)
MARGIN_SECONDS = 5.0
AFTER_TRAINING_SECONDS = 10.0  # saving the final model, averaging, plots: besides the validation passes
# The seconds per update: the mean of the last RATE_WINDOW updates (snapshots, logging included) or of the last
# RECENT ones, whichever is slower, so that a machine that slows down is seen within a few updates.
RATE_WINDOW = 50
RECENT = 10
RELOG = 0.05  # a new plan is logged when its number of updates moved by more than this from the last one logged


@dataclass(frozen=True)
class Pace:
    """What this machine takes: seconds per update, and per validation (beam search on the validation split and a
    checkpoint) as a trained model's translations make it, and as an undertrained model's, which run to the length
    limit (the probe's upper bound: the passes after training are given it until the run has measured a
    validation)."""

    seconds_per_update: float
    seconds_per_validation: float
    seconds_per_validation_at_limit: float | None = None  # never below seconds_per_validation


def validations_between(done: int, total: int, eval_steps: int | None) -> int:
    """The validations of updates done+1 .. total: one every `eval_steps` updates, and one at the last update when it
    is not on that grid (the Trainer evaluates at the end of a run)."""
    if not eval_steps:
        return 0
    return total // eval_steps - done // eval_steps + (1 if total % eval_steps else 0)


def updates_that_fit(seconds: float, done: int, pace: Pace, eval_steps: int | None, after_training: float,
                     cap: int) -> int:
    """The last update of a run that has done `done` updates and has `seconds` left for the rest of its updates,
    their validations and `after_training` seconds after them: the largest total <= `cap` that fits, `done` if none
    does."""

    def needs(total: int) -> float:
        return ((total - done) * pace.seconds_per_update + after_training
                + validations_between(done, total, eval_steps) * pace.seconds_per_validation)

    low, high = done, cap  # needs() grows with total: the last total that fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if needs(middle) <= seconds else (low, middle - 1)
    return low


class BudgetPlanner(TrainerCallback, ExportableState):
    """Plans the run's updates so that it ends within `budget_minutes` with its rate at 0 (module docstring).

    `cooldown_steps`: the cool-down's updates, or a fraction (< 1) of the planned ones; 0 or None: no cool-down.
    `started`: when the budget began (`time.time()`; None: when training begins). `after_training`: what follows
    training, in validation passes (e.g. 2 for model selection + 1 for a test split as large as the validation one).
    `pace`: a first measurement (`recipe.pace.measure_pace`), so that the first plan is made before the first update;
    without one the run plans once it has measured its first updates. `clock`: `time.time`, or a stand-in for tests
    (the budget's deadline and every duration are read from it).
    """

    def __init__(self, budget_minutes: float, cooldown_steps: int | float | None = None, started: float | None = None,
                 after_training: float = 0.0, pace: Pace | None = None, clock=time.time):
        self.budget_minutes = budget_minutes
        self.cooldown_steps = cooldown_steps
        self.started = started
        self.after_training = after_training
        self.pace = pace
        self.clock = clock
        self.update_seconds: list[float] = []  # the last RATE_WINDOW updates' seconds
        self.validation_seconds: float | None = None  # the last validation's (and its checkpoint's)
        self.plans: list[dict] = []  # every plan logged: step, updates, seconds per update and validation, why
        self.resumed = False
        self.cap: int | None = None
        self._last_end = self._mark = None  # when the last update ended; when the last update, pass or save ended
        self._evaluated = False
        self._logged_updates: int | None = None

    # -- what the plan needs ---------------------------------------------------------------------------------------
    @property
    def deadline(self) -> float:
        return self.started + self.budget_minutes * 60

    @property
    def margin(self) -> float:
        return max(MARGIN_SECONDS, MARGIN * self.budget_minutes * 60)

    def measured_pace(self) -> Pace | None:
        """The pace measured so far (the last RATE_WINDOW updates, the last validation), the probe's where the run has
        not measured it yet; None before anything was measured."""
        probe, seconds = self.pace, self.update_seconds
        per_update = (max(sum(seconds) / len(seconds), sum(seconds[-RECENT:]) / len(seconds[-RECENT:])) if seconds
                      else probe and probe.seconds_per_update)
        per_validation = self.validation_seconds if self.validation_seconds is not None else (
            probe.seconds_per_validation if probe else 0.0)
        return Pace(per_update, per_validation) if per_update else None

    def updates_fitting(self, done: int, eval_steps: int | None, cap: int, pace: Pace | None = None,
                        margin: bool = True) -> int:
        """The last update that fits the budget, now, after `done` updates (`margin`: keeping the margin free)."""
        pace = pace or self.measured_pace()
        seconds = self.deadline - self.clock() - (self.margin if margin else 0.0)
        after = self.after_training * self.after_training_pass(pace) + AFTER_TRAINING_SECONDS
        return updates_that_fit(seconds, done, pace, eval_steps, after, cap)

    def after_training_pass(self, pace: Pace) -> float:
        """The seconds of each pass after training: the last validation's, or, before the run has measured one, the
        probe's pass at the length limit. A run that validates only at its end (`--quick`) translates with a model of
        a few hundred updates, which repeats a word up to the limit: its passes after training take several times
        what the probe's translations, cut at the references' length, took."""
        if self.validation_seconds is not None or self.pace is None:
            return pace.seconds_per_validation
        return self.pace.seconds_per_validation_at_limit or pace.seconds_per_validation

    def warmup_problem(self, warmup_steps: int, eval_steps: int | None, cap: int) -> str | None:
        """One line when the budget cannot fit the warm-up on this machine (measured by the probe), else None."""
        if self.started is None:
            self.started = self.clock()
        fit = self.updates_fitting(0, eval_steps, cap)
        if fit >= min(warmup_steps, cap):
            return None
        pace = self.measured_pace()
        seconds = (warmup_steps * pace.seconds_per_update + self.margin + AFTER_TRAINING_SECONDS
                   + validations_between(0, warmup_steps, eval_steps) * pace.seconds_per_validation
                   + self.after_training * self.after_training_pass(pace) + self.clock() - self.started)
        return (f"training.budget_minutes ({self.budget_minutes:g}) is too short on this machine: the "
                f"{warmup_steps:,} warm-up updates ({pace.seconds_per_update:.2f} s each here), their validations and "
                f"what follows training need about {duration(seconds)}; give at least {seconds / 60:.1f} minutes, "
                "or fewer training.warmup_steps")

    # -- the Trainer's events -----------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self.cap = state.max_steps
        self._last_end = self._mark = self.clock()
        if state.global_step > 0:  # resumed: the checkpoint's schedule is the plan
            self.restore(state)
            state.max_steps = lr_scheduler.total_steps or self.cap
            self._say(state, f"resumed at update {state.global_step:,}: keeps its plan of {state.max_steps:,} "
                             "updates (the time budget was the uninterrupted run's)")
            return
        if self.started is None:
            self.started = self.clock()
        if self.pace is not None:
            self._plan(args, state, lr_scheduler, "first plan, from a probe of this machine")

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        now = self.clock()
        if self._evaluated:  # the pause after the last update: a validation and its checkpoint
            self.validation_seconds, self._evaluated = self._mark - self._last_end, False
        if state.global_step > 1 or self.resumed:  # the first update of a process also sets its memory up
            self.update_seconds = [*self.update_seconds, now - self._mark][-RATE_WINDOW:]
        self._last_end = self._mark = now
        if self.resumed or control.should_training_stop or not self.update_seconds:
            return
        # every logging step; inside the fall every update, where a slower machine must be answered at once
        if state.global_step % args.logging_steps == 0 or self._logged_updates is None or lr_scheduler.is_falling():
            self._plan(args, state, lr_scheduler, "measured")

    def on_evaluate(self, args, state, control, **kwargs):
        if self._last_end is not None:
            self._evaluated, self._mark = True, self.clock()

    def on_save(self, args, state, control, **kwargs):
        if self._last_end is not None:
            self._mark = self.clock()

    def on_train_end(self, args, state, control, **kwargs):
        self._last_end = None  # the passes after training are not validations of the plan

    # -- planning -------------------------------------------------------------------------------------------------------
    def _plan(self, args, state, scheduler, why: str) -> None:
        done, pace = state.global_step, self.measured_pace()
        fit, fit_without_margin = _agreed(*(max(self.updates_fitting(done, args.eval_steps, self.cap, pace, margin),
                                                done + 1) for margin in (True, False)))
        falling = scheduler.is_falling()
        if falling and fit_without_margin >= scheduler.total_steps:
            return  # the fall has begun: it is shortened only when the plan overruns the margin, never lengthened
        laid_anew = scheduler.replan(fit, cooldown_length(self.cooldown_steps, fit))
        state.max_steps = fit
        if falling:
            why = f"the pace fell to {pace.seconds_per_update:.2f} s per update: the cool-down is shortened"
        elif not laid_anew:
            why = f"the pace fell to {pace.seconds_per_update:.2f} s per update: the cool-down begins now"
        elif self._logged_updates is not None and abs(fit - self._logged_updates) <= RELOG * self._logged_updates:
            return
        self._log_plan(state, scheduler, pace, why)

    def _log_plan(self, state, scheduler, pace: Pace, why: str) -> None:
        self._logged_updates = scheduler.total_steps
        ends = datetime.datetime.fromtimestamp(self.deadline).strftime("%H:%M:%S")
        self.plans.append({"step": state.global_step, "updates": scheduler.total_steps,
                           "cooldown_from": scheduler.cooldown_start,
                           "seconds_per_update": round(pace.seconds_per_update, 4),
                           "seconds_per_validation": round(pace.seconds_per_validation, 1), "why": why})
        fall = (f"the rate falls to 0 over updates {scheduler.cooldown_start + 1:,}-{scheduler.total_steps:,}"
                if scheduler.cooldown_start is not None else "no cool-down")
        self._say(state, f"time budget {duration(self.budget_minutes * 60)}: {scheduler.total_steps:,} updates "
                         f"planned at update {state.global_step:,} ({why}): {pace.seconds_per_update:.3f} s per update, "
                         f"{pace.seconds_per_validation:.0f} s per validation; {fall}; the run ends by {ends}")

    @staticmethod
    def _say(state, line: str) -> None:
        if state.is_world_process_zero:
            logger.info(line)

    # -- what checkpoints and the run record keep -----------------------------------------------------------------------
    def state(self) -> dict:
        """The plan's facts, saved in each checkpoint's trainer_state.json (transformers' `ExportableState`)."""
        return {"args": {"budget_minutes": self.budget_minutes, "cooldown_steps": self.cooldown_steps,
                         "started": self.started, "after_training": self.after_training},
                "attributes": {"plans": self.plans, "update_seconds": self.update_seconds,
                               "validation_seconds": self.validation_seconds,
                               "pace": dataclasses.asdict(self.pace) if self.pace else None}}

    def restore(self, state) -> None:
        """Take a resumed run's facts of the plan from its checkpoint's trainer state (`TrainerState`, loaded)."""
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) or {}
        attributes = saved.get("attributes", {})
        self.plans = list(attributes.get("plans") or [])
        self.update_seconds = list(attributes.get("update_seconds") or [])
        self.validation_seconds = attributes.get("validation_seconds")
        self.started = saved.get("args", {}).get("started", self.started)
        self.resumed = True

    def facts(self, updates: int | None, cooldown_from: int | None) -> dict:
        """The plan as the run record keeps it (`vaswani_mt.run_record.TimeBudgetPlan`'s fields), with the schedule's
        last update and the start of its fall."""
        pace = self.measured_pace()
        return {"budget_minutes": self.budget_minutes, "updates": updates, "cooldown_from": cooldown_from,
                "resumed": self.resumed, "plans": self.plans,
                "seconds_per_update": round(pace.seconds_per_update, 4) if pace else None,
                "seconds_per_validation": round(pace.seconds_per_validation, 1) if pace else None}


def _agreed(*numbers: int) -> tuple[int, ...]:
    """The main process's numbers on every process (each process measures its own pace; one plan must hold for
    all)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return numbers
    shared = [list(numbers)]
    torch.distributed.broadcast_object_list(shared, src=0)
    return tuple(shared[0])


__all__ = ["BudgetPlanner", "Pace", "updates_that_fit", "validations_between"]
