"""The paper's learning-rate schedule and optimizer settings (Vaswani et al. 2017, §5.3).

    lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)

The rate rises linearly for the first ``warmup_steps`` updates and then decays with the inverse
square root of the step number; the two branches meet at ``step == warmup_steps``, where the peak
is ``d_model^-0.5 · warmup_steps^-0.5``. The paper uses ``warmup_steps = 4000`` with Adam
(β1 = 0.9, β2 = 0.98, ε = 1e-9). ``factor`` is the extra multiplier from the Annotated
Transformer (the paper itself has factor 1).

Steps are 1-based: step ``k`` is the k-th optimizer update. Step 0 (before any update) has
rate 0, which also keeps the formula free of a division by zero.

Not in the paper: an optional linear cool-down. Over the last ``cooldown_steps`` of a run of known
length the Noam rate is multiplied by a factor falling linearly from 1 to 0, which it reaches right
after the run's last update: the last ``cooldown_steps`` updates run at ``n/cooldown_steps`` of their
rate for n = cooldown_steps ... 1, so no update is spent at rate 0. The inverse square root alone
never anneals: a short run ends at a rate still near its peak (Li et al. 2020, "Budgeted Training":
anneal to 0 by the end of the budget). The cool-down ends at the run's last update, so the run's
length must be fixed in updates: by ``max_steps``, or by a time budget that measures the machine and
re-lays the cool-down while the run goes (`NoamLR.replan`, `vaswani_mt.recipe.budget`), which may
also shorten the warm-up of a run too short for it (`NoamLR.shorten_warmup`: the peak rate stays).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from .rules import cooldown_problem, positive_problem, setting_problem


def _require_positive(name: str, value: float) -> None:
    problem = positive_problem(name, value)
    if problem:
        raise ValueError(problem)


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Learning rate for the ``step``-th optimizer update (§5.3); ``noam_lr(0, ...) == 0.0``."""
    _require_positive("d_model", d_model)
    _require_positive("warmup_steps", warmup_steps)
    _require_positive("factor", factor)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def _check_cooldown(cooldown_steps: int, total_steps: int | None) -> None:
    if total_steps is not None:
        _require_positive("total_steps", total_steps)
    problem = positive_problem("cooldown_steps", cooldown_steps) or cooldown_problem(cooldown_steps, total_steps)
    if problem:
        raise ValueError(problem)


def cooldown_multiplier(step: int, total_steps: int, cooldown_steps: int) -> float:
    """The cool-down's factor for the ``step``-th update of ``total_steps``: 1 until the last ``cooldown_steps``
    updates, which run at ``(total_steps - step + 1) / cooldown_steps``: from 1 down by ``1 / cooldown_steps`` per
    update to ``1 / cooldown_steps`` at the last one; 0 past the end (the rate after the last update)."""
    _check_cooldown(cooldown_steps, total_steps)
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step!r}")
    return _falling(step - 1, total_steps, total_steps - cooldown_steps, 1.0)


def _falling(done: int, total_steps: int, start: int, start_multiplier: float) -> float:
    """The factor of the update that follows ``done`` updates: ``start_multiplier`` while ``done <= start``, then
    falling linearly to 0 at ``done == total_steps`` (after the last update)."""
    return start_multiplier * min(1.0, max(0.0, (total_steps - done) / (total_steps - start)))


def cooldown_length(cooldown_steps: int | float | None, total_steps: int) -> int:
    """The cool-down's updates in a run of ``total_steps``: ``cooldown_steps`` itself, or a fraction (< 1) of the run,
    as transformers reads a ``warmup_steps`` below 1; 0 for none."""
    if not cooldown_steps:
        return 0
    if cooldown_steps < 1:
        return max(1, round(cooldown_steps * total_steps))
    return int(cooldown_steps)


def noam_curve(d_model: int, warmup_steps: int, num_steps: int, factor: float = 1.0) -> list[float]:
    """Rates for updates 1..num_steps (element ``i`` belongs to step ``i + 1``), for plotting."""
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps!r}")
    return [noam_lr(step, d_model, warmup_steps, factor) for step in range(1, num_steps + 1)]


class NoamLR(LRScheduler):
    """Sets every param group's lr to :func:`noam_lr` of the coming update (§5.3).

    Call ``scheduler.step()`` after each ``optimizer.step()``, as with any torch scheduler.
    Counting is 1-based: right after construction the optimizer's lr is already
    ``noam_lr(1)``, so the k-th optimizer update runs with ``noam_lr(k)``. Internally
    ``last_epoch`` holds the number of updates done so far and the current lr is
    ``noam_lr(last_epoch + 1)``.

    ``last_epoch`` follows the torch convention: -1 for a fresh run. A run resumed after ``n``
    updates can be rebuilt with ``last_epoch=n - 1``, but the usual route is
    :meth:`load_state_dict`, which also restores ``d_model``, ``warmup_steps`` and ``factor`` and
    re-applies the restored lr to the optimizer, so the curve continues exactly where it was
    saved, whichever order optimizer and scheduler state are loaded in.

    ``cooldown_steps`` (with ``total_steps``, the run's length): the Noam rate times
    :func:`cooldown_multiplier`, a linear fall to 0 over the last ``cooldown_steps`` updates (module docstring);
    0 or None: no cool-down. :meth:`replan` lays a new one while the run goes (a time budget). A restored state keeps
    its own cool-down; one given here as well must be the same.

    The optimizer's own initial lr is ignored (see :func:`make_adam`, which passes 1.0).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        d_model: int,
        warmup_steps: int,
        factor: float = 1.0,
        last_epoch: int = -1,
        cooldown_steps: int | None = None,
        total_steps: int | None = None,
    ) -> None:
        _require_positive("d_model", d_model)
        _require_positive("warmup_steps", warmup_steps)
        _require_positive("factor", factor)
        if problem := setting_problem("cooldown_steps", cooldown_steps):
            raise ValueError(problem)
        cooldown_steps = cooldown_steps or None  # 0: no cool-down
        if cooldown_steps is not None:
            _check_cooldown(cooldown_steps, total_steps)
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.factor = factor
        self.cooldown_steps = cooldown_steps
        self.total_steps = total_steps
        # The fall: the multiplier is `cooldown_start_multiplier` up to update `cooldown_start`, then falls linearly
        # to 0 at `total_steps`. As laid out: 1 up to the last `cooldown_steps` updates; `replan` moves it.
        self.cooldown_start = total_steps - cooldown_steps if cooldown_steps is not None else None
        self.cooldown_start_multiplier = 1.0
        # The base class insists on "initial_lr" when resuming with last_epoch >= 0; our schedule
        # never reads it, so provide it instead of making callers fake it.
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        super().__init__(optimizer, last_epoch)

    def multiplier(self, step: int) -> float:
        """The cool-down's factor of the ``step``-th update (1 without one; 0 after the last)."""
        if self.cooldown_steps is None:
            return 1.0
        return _falling(step - 1, self.total_steps, self.cooldown_start, self.cooldown_start_multiplier)

    def is_falling(self) -> bool:
        """Whether the cool-down's fall has begun: the coming update runs below the full Noam rate."""
        done = max(self.last_epoch, 0)
        return self.cooldown_start is not None and (done > self.cooldown_start or self.cooldown_start_multiplier < 1)

    def peak_lr(self) -> float:
        """The highest rate of the schedule, at the end of the warm-up (before any cool-down)."""
        return noam_lr(self.warmup_steps, self.d_model, self.warmup_steps, self.factor)

    def shorten_warmup(self, warmup_steps: int) -> None:
        """Warm up over ``warmup_steps`` updates instead, to the same peak rate (the factor scaled by
        sqrt(new / old)): a run planned too short for its warm-up (a time budget) still reaches its peak and decays
        from there. Only before the first update."""
        _require_positive("warmup_steps", warmup_steps)
        if self.last_epoch > 0:
            raise ValueError(f"the warm-up can only be changed before the first update ({self.last_epoch} done)")
        self.factor *= (warmup_steps / self.warmup_steps) ** 0.5
        self.warmup_steps = warmup_steps
        self._apply_current_lr()

    def _current_lr(self) -> float:
        step = self.last_epoch + 1
        return noam_lr(step, self.d_model, self.warmup_steps, self.factor) * self.multiplier(step)

    def replan(self, total_steps: int, cooldown_steps: int) -> bool:
        """End the run at update ``total_steps`` instead, its rate falling to 0 there over ``cooldown_steps`` updates
        (0: no cool-down, the run just ends there). One rule for every case: the coming update keeps the factor it
        had, which holds until the new fall's start, ``total_steps - cooldown_steps`` (or now, if that has passed),
        and falls linearly from there to 0 after update ``total_steps``. Before the fall has begun (the updates done
        ran at the full Noam rate, the new cool-down lies wholly ahead) that is the cool-down laid anew, as if the run
        had been started with this length: the rates already used are the same either way. Inside the fall, a shorter
        run goes on from the current rate straight to 0, and a longer one holds the current rate until its fall of
        ``cooldown_steps`` updates begins: the rate never rises. Returns whether the cool-down was laid anew (not yet
        falling, and wholly ahead). The next update runs with the new rate."""
        done = max(self.last_epoch, 0)
        if total_steps <= done:
            raise ValueError(f"total_steps ({total_steps}) must lie after the {done} updates done")
        if problem := setting_problem("cooldown_steps", cooldown_steps):
            raise ValueError(problem)
        falling = self.is_falling()
        if not falling:  # where the fall began stays known however often it is re-laid (`fall_start`)
            self.first_fall_start = None
        anew = not falling and done <= total_steps - cooldown_steps
        previous_start = self.cooldown_start
        if not cooldown_steps and not falling:
            self.cooldown_start = None
        else:
            factor = self.multiplier(done + 1)
            self.cooldown_start = max(done, total_steps - max(cooldown_steps, 1))  # a fall of at least one update
            self.cooldown_start_multiplier = factor
        self.total_steps = total_steps
        self.cooldown_steps = None if self.cooldown_start is None else total_steps - self.cooldown_start
        if falling and getattr(self, "first_fall_start", None) is None:
            self.first_fall_start = previous_start
        self._apply_current_lr()
        return anew

    def fall_start(self) -> int | None:
        """The update after which the rate first fell below the Noam rate (None: no cool-down): the start of the fall
        as laid, or, once a re-plan inside the fall moved it, where it had begun."""
        first = getattr(self, "first_fall_start", None)
        return first if first is not None else self.cooldown_start

    def get_lr(self) -> list[float]:
        """The lr for every param group; torch calls this after advancing ``last_epoch``."""
        return [self._current_lr()] * len(self.optimizer.param_groups)

    # Used by the (deprecated) ``step(epoch)`` form; the schedule is closed-form anyway.
    _get_closed_form_lr = get_lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scheduler and put the restored lr back into the optimizer."""
        if self.cooldown_steps is not None:  # given here: it must be the saved one
            for name in ("cooldown_steps", "total_steps"):
                if getattr(self, name) != state_dict.get(name):
                    raise ValueError(f"the saved schedule has {name}={state_dict.get(name)!r}, this one "
                                     f"{getattr(self, name)!r}: a resumed run keeps the cool-down it was started with")
        super().load_state_dict(state_dict)
        if "cooldown_start" not in state_dict:  # saved before the cool-down could be re-laid: as it was laid out
            self.cooldown_start = self.total_steps - self.cooldown_steps if self.cooldown_steps is not None else None
            self.cooldown_start_multiplier = 1.0
        self._apply_current_lr()

    def _apply_current_lr(self) -> None:
        """Put the rate of the coming update into the optimizer (after a restore or a new plan)."""
        lr = self._current_lr()
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [
            group["lr"].clone() if isinstance(group["lr"], torch.Tensor) else group["lr"]
            for group in self.optimizer.param_groups
        ]


def make_adam(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> torch.optim.Adam:
    """Adam with the paper's β1 = 0.9, β2 = 0.98, ε = 1e-9 (§5.3).

    The lr is a placeholder (1.0); attach a :class:`NoamLR`, which overwrites it. The fused kernel (one pass over
    each parameter instead of a Python loop of elementwise ops; what transformers' Trainer uses by default too)
    gives the same update and is several times faster on CPU.
    """
    return torch.optim.Adam(params, lr=1.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
