"""What a run tells its user while it trains and translates (`TrainingProgress`), and `duration`, the one way the
package writes a span of time.

The Trainer's own display shows unlabelled bars on a terminal (`0/20`, `0/16`) and, under `disable_tqdm`, only a
metrics dict per logging step, printed on stdout; translating a validation or test split shows nothing at all in a
log file. `TrainingProgress` replaces it with the same facts in both places:

* on a terminal (`disable_tqdm` off): labelled bars on stderr — `train` (step/total, loss, target tokens/s,
  elapsed, ETA), then one per translation pass (`valid at step 500`, `test translation`, ...);
* elsewhere (a log file, CI, nohup; `disable_tqdm` on): one line per logging step with those facts, and for each
  translation pass a line when it starts, one every `every_seconds` and one with its scores when it ends.

Every line also goes to the run's `train.log` (through the `vaswani_mt.train` logger; `vaswani_mt.recipe.run`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

logger = logging.getLogger("vaswani_mt.train")

EVERY_SECONDS = 30.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the package's log lines, stderr and train.log


def duration(seconds: float) -> str:
    """`42 s`, `7 min 05 s`, `1 h 25 min`, each rounded to its last unit: short enough for a progress line, exact
    enough for an ETA; also the model card's training time."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        minutes, seconds = divmod(seconds, 60)
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(int(round(seconds / 60)), 60)
    return f"{hours} h {minutes:02d} min"


@dataclass
class _Pass:
    """One translation pass under way (an evaluate() or predict() call): its label, batches, bar and clock."""

    label: str
    total: int | None
    started: float
    said: float  # when its last progress line was written
    bar: object = None
    done: int = 0


class TrainingProgress(TrainerCallback):
    """Labelled progress of training and of every translation pass (module docstring). `install` puts it in place of
    the Trainer's own display. `max_minutes`: the run's stop after so many minutes, so that the ETA says when it ends
    the run rather than when the last of `max_steps` would be reached. `budget_minutes`: the time budget that plans
    the run's updates (`vaswani_mt.recipe.budget`), named in the first line; the plan is the steps shown."""

    def __init__(self, max_minutes: float | None = None, every_seconds: float = EVERY_SECONDS,
                 budget_minutes: float | None = None):
        self.stop_seconds = max_minutes * 60 if max_minutes else None  # training.max_minutes: the stop
        self.budget_seconds = budget_minutes * 60 if budget_minutes else None  # training.budget_minutes: the plan
        self.every_seconds = every_seconds
        self.label: str | None = None  # the name of the translation passes to come (`stage`)
        self.training_bar = None
        self.training_started: float | None = None
        self.last_logged: list[str] = []  # loss, learning rate, tokens/s of the last logging step
        self.first_step = 0
        self.current_pass: _Pass | None = None
        # The Trainer announces a pass only after its first batch: a pass starts when the step, stage or pass
        # before it ended.
        self.last_mark = time.perf_counter()

    def install(self, trainer) -> TrainingProgress:
        """Replace the Trainer's ProgressCallback / PrinterCallback (whichever `disable_tqdm` chose) by this one."""
        for display in (ProgressCallback, PrinterCallback):
            trainer.remove_callback(display)
        trainer.add_callback(self)
        return self

    @contextlib.contextmanager
    def stage(self, label: str) -> Iterator[None]:
        """Name the translation passes (evaluate / predict) run inside the block, e.g. "test translation"."""
        previous, self.label = self.label, label
        self.last_mark = time.perf_counter()
        try:
            yield
        finally:
            self.label = previous

    # -- training ------------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.training_started, self.first_step = time.perf_counter(), state.global_step
        if not args.disable_tqdm:
            # the ETA is ours (in the postfix): tqdm's would ignore the time budget
            self.training_bar = _bar(total=state.max_steps, initial=state.global_step, desc="train", unit="step",
                                     leave=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}"
                                                            "{postfix}")
        budget = f", training.max_minutes {duration(self.stop_seconds)}" if self.stop_seconds else ""
        if self.budget_seconds:
            budget += f", planned to end within {duration(self.budget_seconds)} of the run's start (time budget)"
        self._say(args, f"train: {_count(state.max_steps - state.global_step, 'update')} to go (step "
                        f"{state.global_step}/{state.max_steps}){budget}")

    def on_step_end(self, args, state, control, **kwargs):
        self.last_mark = time.perf_counter()
        if self.training_bar is not None:
            self.training_bar.total = state.max_steps  # a time budget's plan may move it
            self.training_bar.update(state.global_step - self.training_bar.n)
            self.training_bar.set_postfix_str(", ".join([*self.last_logged, self._timing(state)]), refresh=False)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "loss" not in logs or self.training_started is None:
            return
        self.last_logged = [f"loss {logs['loss']:.3f}"]
        if "learning_rate" in logs:
            self.last_logged.append(f"lr {logs['learning_rate']:.2e}")
        if "target_tokens_per_second" in logs:
            self.last_logged.append(f"{logs['target_tokens_per_second']:,.0f} target tok/s")
        facts = ", ".join([*self.last_logged, self._timing(state)])
        if self.training_bar is not None:
            self.training_bar.set_postfix_str(facts, refresh=True)
        self._say(args, f"train: step {state.global_step}/{state.max_steps}, {facts}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_started is None or not state.is_world_process_zero:
            return
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None
        steps = state.global_step - self.first_step
        elapsed = duration(time.perf_counter() - self.training_started)
        self._say(args, f"train: done, {_count(steps, 'update')} in {elapsed}")
        self.training_started = None

    def _timing(self, state) -> str:
        """`elapsed 3 min 10 s, ETA 20 min 05 s`, the ETA from the pace so far, capped by `training.max_minutes`."""
        elapsed = time.perf_counter() - self.training_started
        done = state.global_step - self.first_step
        if done <= 0:
            return f"elapsed {duration(elapsed)}"
        eta, why = elapsed / done * (state.max_steps - state.global_step), ""
        if self.stop_seconds is not None and self.stop_seconds - elapsed < eta:
            eta, why = max(self.stop_seconds - elapsed, 0), " (training.max_minutes)"
        return f"elapsed {duration(elapsed)}, ETA {duration(eta)}{why}"

    # -- translation passes (validation BLEU, model selection, the test split) -----------------------------------
    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.current_pass is None:
            self._begin_pass(args, state, eval_dataloader)
        run = self.current_pass
        run.done += 1
        if run.bar is not None:
            run.bar.update(1)
        elif time.perf_counter() - run.said >= self.every_seconds:
            run.said = time.perf_counter()
            elapsed = run.said - run.started
            eta = f", ETA {duration((run.total - run.done) * elapsed / run.done)}" if run.total else ""
            self._say(args, f"{run.label}: batch {run.done}/{run.total or '?'}, elapsed {duration(elapsed)}{eta}")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._end_pass(args, state, metrics)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._end_pass(args, state, metrics)

    def _begin_pass(self, args, state, loader) -> None:
        label = self.label or (f"valid at step {state.global_step}" if self.training_started else "valid")
        total = len(loader) if loader is not None and hasattr(loader, "__len__") else None
        sentences = len(loader.dataset) if hasattr(getattr(loader, "dataset", None), "__len__") else None
        bar = None if args.disable_tqdm else _bar(total=total, desc=label, unit="batch",
                                                  leave=self.training_bar is None)
        self.current_pass = _Pass(label, total, started=self.last_mark, said=time.perf_counter(), bar=bar)
        what = _count(sentences, "sentence") if sentences is not None else "sentences"
        batches = f" in {_count(total, 'batch')}" if total else ""
        self._say(args, f"{label}: translating {what}{batches}")

    def _end_pass(self, args, state, metrics) -> None:
        run, self.current_pass, self.last_mark = self.current_pass, None, time.perf_counter()
        if run is None or not state.is_world_process_zero:
            return
        if run.bar is not None:
            run.bar.close()
        facts = [f"{_count(run.done, 'batch')} in {duration(time.perf_counter() - run.started)}"]
        facts += [f"{name} {value:.2f}" for name, value in _scores(metrics or {})]
        self._say(args, f"{run.label}: " + ", ".join(facts))

    # -- output --------------------------------------------------------------------------------------------------
    @staticmethod
    def _say(args, line: str) -> None:
        """Log `line` (stderr and train.log); with bars on screen, printed above them instead of through them."""
        if args.disable_tqdm:
            logger.info(line)
            return
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():
            logger.info(line)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "es" if noun.endswith("ch") else "s")


def _bar(**options):
    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **options)


def _scores(metrics: dict) -> list[tuple[str, float]]:
    """(BLEU, value), (chrF, value) from a Trainer metrics dict, whatever its key prefix (eval_, valid_, test_)."""
    found = []
    for suffix, name in (("_bleu", "BLEU"), ("_chrf", "chrF")):
        value = next((v for k, v in metrics.items() if k.endswith(suffix) and isinstance(v, (int, float))), None)
        if value is not None:
            found.append((name, value))
    return found


__all__ = ["LOG_FORMAT", "TrainingProgress", "duration"]
