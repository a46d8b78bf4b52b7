"""The recipe's value rules, each written once.

Every rule is a function that returns what is wrong (a sentence naming the setting) or None. The places a value
enters call them and raise their own error: the run config (`config.validate`, which puts the section in front:
`training.warmup_steps must be > 0`), `VaswaniTrainingArguments` (the field's name), the Noam schedule (its
argument's name). So a rule cannot drift apart between a config run and a trainer built by hand.
"""

from __future__ import annotations

from typing import Any

from ..model.modeling_vaswani import LENGTH_PENALTY_STYLES
from ..precision import PRECISIONS

# Settings (run-config `training` keys, trainer arguments, schedule arguments) that must be above 0.
POSITIVE = ("max_tokens", "gradient_accumulation_steps", "max_steps", "num_epochs", "max_minutes", "budget_minutes",
            "warmup_steps", "noam_factor", "factor", "d_model", "total_steps", "eval_steps", "logging_steps",
            "keep_checkpoints", "num_beams", "num_threads", "average_every")
# Settings whose 0 means "none": no average, no cool-down.
AT_LEAST_ZERO = ("average_last", "cooldown_steps", "rdrop_alpha")


def positive_problem(name: str, value: Any) -> str | None:
    return f"{name} must be > 0, got {value!r}" if not value > 0 else None


def setting_problem(name: str, value: Any) -> str | None:
    """What is wrong with the recipe setting `name` = `value` on its own (None: nothing, or no rule for it; a None
    value means "not set" and is always allowed)."""
    if value is None:
        return None
    if name in POSITIVE:
        return positive_problem(name, value)
    if name in AT_LEAST_ZERO and value < 0:
        return f"{name} must be >= 0 (0: none), got {value!r}"
    if name == "cooldown_steps" and value >= 1 and value != int(value):
        return f"{name} must be a number of updates or a fraction of the run (below 1), got {value!r}"
    if name in ("label_smoothing", "bpe_dropout") and not 0.0 <= value < 1.0:
        return f"{name} must be in [0, 1), got {value!r}"
    if name == "precision" and value not in PRECISIONS:
        return f"{name} must be one of {', '.join(PRECISIONS)}, got {value!r}"
    if name == "length_penalty_style" and value not in LENGTH_PENALTY_STYLES:
        return f"{name} must be one of {', '.join(LENGTH_PENALTY_STYLES)}, got {value!r}"
    return None


def cooldown_problem(cooldown_steps: int | float | None, total_steps: int | None,
                     total_name: str = "total_steps", planned: bool = False) -> str | None:
    """The cool-down ends at the run's last update, so it needs the run's length in updates (`total_name`: how the
    caller's user named that length), or a time budget that plans it (`planned`), and must fit in it. 0 or None: no
    cool-down, nothing to check; a fraction (< 1) of the run fits any length."""
    if not cooldown_steps:
        return None
    if total_steps is None and not planned:
        return (f"cooldown_steps ({cooldown_steps}) needs {total_name} (or a time budget, budget_minutes): the "
                "cool-down ends at the run's last update, which a number of epochs or a stop after minutes does not "
                "fix")
    if total_steps is not None and cooldown_steps >= 1 and cooldown_steps > total_steps:
        return f"cooldown_steps ({cooldown_steps}) exceeds {total_name} ({total_steps})"
    return None


__all__ = ["AT_LEAST_ZERO", "POSITIVE", "cooldown_problem", "positive_problem", "setting_problem"]
