"""A time budget that shapes the schedule: `training.budget_minutes`.

fairseq's `--stop-time-hours` and Marian's `--after` stop a run when its time is up, wherever its schedule is: a
run stopped inside its cool-down, or before it, ends at a rate far from 0, and on a slower machine the same command
gives a worse model than on a faster one. Budgeted training (Li, Yumer & Ramanan, ICLR 2020) lays the schedule over
the budget instead, so that the rate reaches 0 exactly when the time is up. `BudgetPlanner` does that here:

* it measures this machine: seconds per update (a short probe before training, `recipe.pace`, then the updates
  themselves), seconds per validation (the beam-search BLEU pass and checkpoint of every `eval_steps`) and per
  checkpoint saved without one;
* it fixes the number of updates so that the updates, the validations and saves still to come and what follows
  training (model selection, the test translation: `after_training` and `test_passes`, in validation passes) end
  within the budget, counted from the run's start (`started`: the command's start, data preparation included), less
  a small margin; until the run has measured a validation, each pass after training is counted as the probe's pass
  at the length limit, the cost of a model still undertrained at its end (a run that validates only at its end, as
  `--quick` does);
* it lays the schedule over that number: the warm-up (`warmup_steps` updates, at most a quarter of the planned ones,
  to the same peak rate), the Noam decay, and the cool-down (`cooldown_steps` updates, at most those after the
  warm-up, or a fraction of the planned ones), whose rate reaches 0 right after the last update. One log line says
  what was planned and when the run will end; the plan is recorded in each checkpoint (`trainer_state.json`, and the
  schedule in `scheduler.pt`), the run record and the card.

What a short budget cannot afford shrinks with it, and the first plan's line says so: the warm-up (above), and the
test translation, cut to its first sentences when the whole split would take more than a quarter of the time left
(`--quick` on a slow machine). A budget is refused, in one line before any work, only when it cannot hold one update.

The pace is the median seconds of the last 50 updates (of the last twentieth of the plan in a short run, at least 9):
a stall, a slow checkpoint write or a burst of another process over fewer than half of them does not move it, so it
costs the run only the seconds it took (the clock, read at every plan, has them); a change that lasts moves it within
half a window. While the run goes it plans again every logging step, every update once the cool-down's rate is
falling, and after each validation. Before the fall the cool-down is laid anew over every new plan (the rates of the
updates done do not depend on the run's length). Inside the fall, a plan that overruns the margin shortens it (from the
current rate straight to 0 at the last update that fits) and one that leaves more than the margin free lengthens it
(the current rate holds until a fall of the cool-down's length begins): the rate never rises, and the budget is used.

A resumed run counts the whole run's time: each checkpoint keeps the seconds used so far, and the resumed run plans
from what is left, on whatever machine it resumes on, starting from the checkpoint's pace until it has measured its
own. It ends with the weights of the uninterrupted run exactly when both plans end at the same update with the same
schedule, which holds when `max_steps` caps the plan (a budget that fits more updates than `max_steps` on both
machines); otherwise each plans from its own clock. `max_steps`, if given, caps the plan.

Under several processes the main process plans and the others follow its plan.
"""

from __future__ import annotations

import datetime
import logging
import math
import statistics
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
RATE_WINDOW = 50  # the pace: the median seconds of the last RATE_WINDOW updates ...
SHORT_RUN_SHARE = 20  # ... or of the last 1/SHORT_RUN_SHARE of the planned updates, if fewer ...
MIN_WINDOW = 9  # ... but at least this many
MEASURED_ENOUGH = 3  # updates timed before their median replaces the probe's (or a checkpoint's) pace
WARMUP_SHARE = 0.25  # the warm-up takes at most this share of the planned updates
TEST_SHARE = 0.25  # the test translation takes at most this share of the time left when training begins
RELOG = 0.05  # a new plan is logged when its number of updates moved by more than this from the last one logged


@dataclass(frozen=True)
class Pace:
    """What this machine takes: seconds per update, and per validation (beam search on the validation split and a
    checkpoint) as a trained model's translations make it, and as an undertrained model's, which run to the length
    limit (the probe's upper bound: the passes after training are given it until the run has measured a
    validation). Passes not measured yet are counted as the probe measured them, times the ratio of the current pace
    per update to the probe's: a machine that slows down translates slower too."""

    seconds_per_update: float
    seconds_per_validation: float
    seconds_per_validation_at_limit: float | None = None  # never below seconds_per_validation


def validations_between(done: int, total: int, eval_steps: int | None) -> int:
    """The validations of updates done+1 .. total: one every `eval_steps` updates, and one at the last update when it
    is not on that grid (the Trainer evaluates at the end of a run)."""
    if not eval_steps:
        return 0
    return total // eval_steps - done // eval_steps + (1 if total % eval_steps else 0)


def saves_between(done: int, total: int, save_steps: int | None, eval_steps: int | None) -> int:
    """The checkpoints saved without a validation after updates done+1 .. total: those every `save_steps` updates
    that are not also on the `eval_steps` grid."""
    if not save_steps:
        return 0
    saves = total // save_steps - done // save_steps
    if eval_steps:
        both = save_steps * eval_steps // math.gcd(save_steps, eval_steps)
        saves -= total // both - done // both
    return saves


def updates_that_fit(seconds: float, done: int, pace: Pace, eval_steps: int | None, after_training: float,
                     cap: int, save_steps: int | None = None, seconds_per_save: float = 0.0) -> int:
    """The last update of a run that has done `done` updates and has `seconds` left for the rest of its updates,
    their validations and saves and `after_training` seconds after them: the largest total <= `cap` that fits,
    `done` if none does."""

    def needs(total: int) -> float:
        return ((total - done) * pace.seconds_per_update + after_training
                + validations_between(done, total, eval_steps) * pace.seconds_per_validation
                + saves_between(done, total, save_steps, eval_steps) * seconds_per_save)

    low, high = done, cap  # needs() grows with total: the last total that fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if needs(middle) <= seconds else (low, middle - 1)
    return low


class BudgetPlanner(TrainerCallback, ExportableState):
    """Plans the run's updates so that it ends within `budget_minutes` with its rate at 0 (module docstring).

    `cooldown_steps`: the cool-down's updates, or a fraction (< 1) of the planned ones; 0 or None: no cool-down.
    `started`: when the budget began (`time.time()`; None: when training begins). `after_training`: what follows
    training besides the test translation, in validation passes (e.g. 1 for scoring the average of the last
    checkpoints); `test_passes`: the test translation, in validation passes (the test split's sentences over the
    validation split's), of `test_sentences` sentences. `pace`: a first measurement (`recipe.pace.measure_pace`), so
    that the first plan is made before the first update; without one the run plans once it has measured its first
    updates. `clock`: `time.time`, or a stand-in for tests (the budget's deadline and every duration are read from
    it).
    """

    def __init__(self, budget_minutes: float, cooldown_steps: int | float | None = None, started: float | None = None,
                 after_training: float = 0.0, pace: Pace | None = None, clock=time.time, test_passes: float = 0.0,
                 test_sentences: int | None = None):
        self.budget_minutes = budget_minutes
        self.cooldown_steps = cooldown_steps
        self.started = started
        self.after_training = after_training
        self.test_passes = test_passes
        self.test_sentences = test_sentences
        self.pace = pace  # the probe's, or a resumed run's checkpoint's: until the run has timed its own updates
        self.clock = clock
        self.update_seconds: list[float] = []  # the last RATE_WINDOW updates' seconds
        self.validation_seconds: float | None = None  # the last validation's (and its checkpoint's)
        self.save_seconds = 0.0  # the last checkpoint's saved without a validation
        self.test_kept: int | None = None  # the test sentences translated, when the budget cuts the split
        self.fall_from: int | None = None  # where the rate first fell (`NoamLR.fall_start`), once it has
        self.plans: list[dict] = []  # every plan logged: step, updates, seconds per update and validation, why
        self.resumed = False
        self.used_before = 0.0  # seconds of the budget that the run's earlier attempts used (a resumed run)
        self.cap: int | None = None
        self._last_end = self._mark = None  # when the last update ended; when the last update, pass or save ended
        self._evaluated = False
        self._timed_first_update = False  # a process's first update also sets its memory up: not timed
        self._logged_updates: int | None = None

    # -- what the plan needs ---------------------------------------------------------------------------------------
    @property
    def deadline(self) -> float:
        return self.started + self.budget_minutes * 60 - self.used_before

    @property
    def margin(self) -> float:
        return max(MARGIN_SECONDS, MARGIN * self.budget_minutes * 60)

    def window(self) -> int:
        """How many of the last updates the pace is the median of."""
        planned = self._logged_updates or RATE_WINDOW * SHORT_RUN_SHARE
        return max(MIN_WINDOW, min(RATE_WINDOW, planned // SHORT_RUN_SHARE))

    def measured_pace(self) -> Pace | None:
        """The pace measured so far: the median of the last updates' seconds (`window`), the last validation; the
        probe's (or a resumed run's checkpoint's) where the run has not measured enough yet; None before anything was
        measured."""
        prior, seconds = self.pace, self.update_seconds[-self.window():]
        if len(seconds) >= MEASURED_ENOUGH or (seconds and prior is None):
            per_update = statistics.median(seconds)
        else:
            per_update = prior and prior.seconds_per_update
        if not per_update:
            return None
        per_validation = self.validation_seconds if self.validation_seconds is not None else (
            prior.seconds_per_validation * self._slowdown(per_update) if prior else 0.0)
        return Pace(per_update, per_validation)

    def _slowdown(self, per_update: float) -> float:
        """How much slower than the probe (or the checkpoint) this machine now updates: its passes, not measured yet,
        are counted that much slower too."""
        prior = self.pace
        return per_update / prior.seconds_per_update if prior and prior.seconds_per_update else 1.0

    def after_training_seconds(self, pace: Pace) -> float:
        """What follows training: the passes after it (the test translation cut as planned) and the saves."""
        test = self.test_passes * (self.test_kept / self.test_sentences if self.test_kept is not None else 1.0)
        return (self.after_training + test) * self.after_training_pass(pace) + AFTER_TRAINING_SECONDS

    def updates_fitting(self, done: int, eval_steps: int | None, cap: int, pace: Pace | None = None,
                        margin: bool = True, save_steps: int | None = None, validating: bool = False) -> int:
        """The last update that fits the budget, now, after `done` updates (`margin`: keeping the margin free;
        `validating`: the validation of update `done` is still to come)."""
        pace = pace or self.measured_pace()
        seconds = (self.deadline - self.clock() - (self.margin if margin else 0.0)
                   - (pace.seconds_per_validation if validating else 0.0))
        return updates_that_fit(seconds, done, pace, eval_steps, self.after_training_seconds(pace), cap, save_steps,
                                self.save_seconds)

    def after_training_pass(self, pace: Pace) -> float:
        """The seconds of each pass after training: the last validation's, or, before the run has measured one, the
        probe's pass at the length limit. A run that validates only at its end (`--quick`) translates with a model of
        a few hundred updates, which may repeat a word up to the limit: its passes after training can take several
        times what the probe's translations, cut at the references' length, took."""
        if self.validation_seconds is not None or self.pace is None or not self.pace.seconds_per_validation_at_limit:
            return pace.seconds_per_validation
        return self.pace.seconds_per_validation_at_limit * self._slowdown(pace.seconds_per_update)

    def fit_problem(self, eval_steps: int | None, cap: int, save_steps: int | None = None) -> str | None:
        """Before training, from the probe: cut the test translation where the whole split would take more than
        TEST_SHARE of the time left (`test_kept`), and say in one line why the budget cannot hold a single update on
        this machine; None when it can."""
        if self.started is None:
            self.started = self.clock()
        pace = self.measured_pace()
        left = self.deadline - self.clock() - self.margin
        test_seconds = self.test_passes * self.after_training_pass(pace)
        if self.test_sentences and test_seconds > TEST_SHARE * max(left, 0.0):
            self.test_kept = max(1, min(self.test_sentences,
                                        int(self.test_sentences * TEST_SHARE * max(left, 0.0) / test_seconds)))
        problem = None
        if self.updates_fitting(0, eval_steps, cap, pace, save_steps=save_steps) < 1:
            needs = (pace.seconds_per_update + validations_between(0, 1, eval_steps) * pace.seconds_per_validation
                     + self.after_training_seconds(pace) + self.margin + self.clock() - self.started)
            problem = (f"training.budget_minutes ({self.budget_minutes:g}) is too short on this machine to train a "
                       f"single update: the run's start, one update ({pace.seconds_per_update:.2f} s here), its "
                       f"validation and what follows training need about {duration(needs)}; give at least "
                       f"{needs / 60:.1f} minutes")
        self.test_kept, problem = _agreed(self.test_kept, problem)  # one test split and one answer for all processes
        return problem

    # -- the Trainer's events -----------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self.cap = state.max_steps
        self._last_end = self._mark = self.clock()
        self._timed_first_update = False
        if self.started is None:
            self.started = self.clock()
        if state.global_step > 0:  # resumed: plan what is left of the budget from the checkpoint's pace
            self.restore(state)
            state.max_steps = lr_scheduler.total_steps or self.cap
            if self.measured_pace() is None:  # a checkpoint of updates not timed yet: plans once it has timed some
                return
            left = duration(max(self.deadline - self.clock(), 0.0))
            self._plan(args, state, lr_scheduler, f"resumed at update {state.global_step:,} with {left} of the "
                                                  "budget left, at the checkpoint's pace", log=True)
        elif self.pace is not None:
            self._plan(args, state, lr_scheduler, "first plan, from a probe of this machine", log=True)

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        now = self.clock()
        if self._evaluated:  # the pause after the last update: a validation and its checkpoint
            self.validation_seconds, self._evaluated = self._mark - self._last_end, False
        if self._timed_first_update:  # the first update of a process also sets its memory up
            self.update_seconds = [*self.update_seconds, now - self._mark][-RATE_WINDOW:]
        self._timed_first_update = True
        self._last_end = self._mark = now
        if lr_scheduler.is_falling():  # kept with the checkpoints, for a run resumed after its training ended
            self.fall_from = lr_scheduler.fall_start()
        if control.should_training_stop or self.measured_pace() is None:
            return
        # every logging step; inside the fall every update, where a slower machine must be answered at once
        if (state.global_step % args.logging_steps == 0 or self._logged_updates is None
                or lr_scheduler.is_falling()):
            self._plan(args, state, lr_scheduler, "measured", log=self._logged_updates is None,
                       validating=control.should_evaluate)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._last_end is not None:
            self._evaluated, self._mark = True, self.clock()

    def on_save(self, args, state, control, **kwargs):
        if self._last_end is None:
            return
        now = self.clock()
        if self._evaluated:  # a validation and its checkpoint: known now, so that the checkpoint keeps it
            self.validation_seconds = now - self._last_end
        else:  # a checkpoint without a validation: counted in the plan (`saves_between`)
            self.save_seconds = now - self._mark
        self._mark = now

    def on_train_end(self, args, state, control, **kwargs):
        self._last_end = None  # the passes after training are not validations of the plan

    # -- planning -------------------------------------------------------------------------------------------------------
    def _plan(self, args, state, scheduler, why: str, log: bool = False, validating: bool = False) -> None:
        done, pace, planned = state.global_step, self.measured_pace(), scheduler.total_steps
        save_steps = args.save_steps if getattr(args, "save_strategy", None) in ("steps", "STEPS") else None
        if save_steps is not None and not isinstance(save_steps, int):  # a fraction of the run: not planned here
            save_steps = None
        fit, fit_without_margin = _agreed(*(
            max(self.updates_fitting(done, args.eval_steps, self.cap, pace, margin, save_steps, validating), done + 1)
            for margin in (True, False)))
        falling = scheduler.is_falling()
        if falling and fit <= planned <= fit_without_margin:  # the fall has begun and ends inside the margin: as it is
            if log:
                self._log_plan(state, scheduler, pace, why)
            return
        notes = []
        if done == 0:
            notes += self._shorten_warmup(scheduler, fit)
        cooldown = cooldown_length(self.cooldown_steps, fit)
        if cooldown > fit - scheduler.warmup_steps > 0:
            notes.append(f"the cool-down cut from {cooldown:,} to the {fit - scheduler.warmup_steps:,} updates after "
                         "the warm-up")
            cooldown = fit - scheduler.warmup_steps
        laid_anew = scheduler.replan(fit, cooldown)
        state.max_steps = fit
        if done == 0 and self.test_kept is not None:
            notes.append(f"the test translation cut to its first {self.test_kept:,} of {self.test_sentences:,} "
                         f"sentences (the whole split would take more than {TEST_SHARE:.0%} of the time left)")
        if falling:
            why = (f"the pace moved to {pace.seconds_per_update:.2f} s per update: the cool-down is "
                   f"{'shortened' if fit < planned else 'lengthened'}")
        elif not laid_anew and cooldown:
            why, log = f"the pace fell to {pace.seconds_per_update:.2f} s per update: the cool-down begins now", True
        if not log and self._logged_updates is not None and abs(fit - self._logged_updates) <= RELOG * \
                self._logged_updates:
            return
        self._log_plan(state, scheduler, pace, "; ".join([why, *notes]))

    def _shorten_warmup(self, scheduler, fit: int) -> list[str]:
        """Before the first update: a warm-up longer than WARMUP_SHARE of the plan is shortened to it, to the same
        peak rate (`NoamLR.shorten_warmup`)."""
        warmup = max(1, round(WARMUP_SHARE * fit))
        if scheduler.last_epoch > 0 or scheduler.warmup_steps <= warmup:
            return []
        configured = scheduler.warmup_steps
        scheduler.shorten_warmup(warmup)
        return [f"the warm-up shortened from {configured:,} to {warmup:,} updates ({WARMUP_SHARE:.0%} of the plan), to "
                f"the same peak rate {scheduler.peak_lr():.2e}"]

    def _log_plan(self, state, scheduler, pace: Pace, why: str) -> None:
        self._logged_updates = scheduler.total_steps
        ends = datetime.datetime.fromtimestamp(self.deadline).strftime("%H:%M:%S")
        self.plans.append({"step": state.global_step, "updates": scheduler.total_steps,
                           "cooldown_from": scheduler.cooldown_start, "warmup_steps": scheduler.warmup_steps,
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
    def seconds_used(self) -> float:
        """The budget's seconds used so far, by this attempt and the run's earlier ones."""
        return self.used_before + (self.clock() - self.started if self.started is not None else 0.0)

    def state(self) -> dict:
        """The plan's facts, saved in each checkpoint's trainer_state.json (transformers' `ExportableState`; its
        `restore_callback_states_from_checkpoint` rebuilds the planner from `args` and sets the `attributes`)."""
        return {"args": {"budget_minutes": self.budget_minutes, "cooldown_steps": self.cooldown_steps,
                         "after_training": self.after_training, "test_passes": self.test_passes,
                         "test_sentences": self.test_sentences},
                "attributes": {"plans": self.plans, "update_seconds": self.update_seconds,
                               "validation_seconds": self.validation_seconds, "save_seconds": self.save_seconds,
                               "test_kept": self.test_kept, "fall_from": self.fall_from,
                               "seconds_used": round(self.seconds_used(), 3),
                               "probed_validation_seconds": self.pace and [self.pace.seconds_per_validation,
                                                                           self.pace.seconds_per_validation_at_limit]}}

    def restore(self, state) -> None:
        """Take a resumed run's facts of the plan from its checkpoint's trainer state (`TrainerState`, loaded): its
        plans, the seconds it used, its pace as the prior of this attempt's plans (this attempt times its own
        updates from here)."""
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) or {}
        attributes = saved.get("attributes", {})
        self.plans = list(attributes.get("plans") or [])
        self.validation_seconds = attributes.get("validation_seconds")
        self.save_seconds = attributes.get("save_seconds") or 0.0
        self.test_kept = attributes.get("test_kept")
        self.fall_from = attributes.get("fall_from")
        self.used_before = float(attributes.get("seconds_used") or 0.0)
        self._logged_updates = self.plans[-1]["updates"] if self.plans else None
        seconds = list(attributes.get("update_seconds") or [])
        probed = attributes.get("probed_validation_seconds") or [None, None]
        if seconds:  # the prior of this attempt's plans: the checkpoint's pace, its probe's passes
            per_validation = self.validation_seconds if self.validation_seconds is not None else probed[0] or 0.0
            self.pace = Pace(statistics.median(seconds[-self.window():]), per_validation, probed[1])
        self.update_seconds = []
        self.resumed = True

    def facts(self, updates: int | None, fall_from: int | None, warmup_steps: int | None = None) -> dict:
        """The plan as the run record keeps it (`vaswani_mt.run_record.TimeBudgetPlan`'s fields), with the schedule's
        last update, the start of its fall and its warm-up."""
        pace = self.measured_pace()
        return {"budget_minutes": self.budget_minutes, "updates": updates, "fall_from": fall_from,
                "warmup_steps": warmup_steps, "test_sentences": self.test_kept, "resumed": self.resumed,
                "plans": self.plans,
                "seconds_per_update": round(pace.seconds_per_update, 4) if pace else None,
                "seconds_per_validation": round(pace.seconds_per_validation, 1) if pace else None}


def _agreed(*numbers):
    """The main process's values on every process (each process measures its own pace; one plan must hold for
    all)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return numbers
    shared = [list(numbers)]
    torch.distributed.broadcast_object_list(shared, src=0)
    return tuple(shared[0])


__all__ = ["BudgetPlanner", "Pace", "saves_between", "updates_that_fit", "validations_between"]
