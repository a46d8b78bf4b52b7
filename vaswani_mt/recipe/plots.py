"""Figures for the learning-rate schedule and for training runs (needs the ``plot`` extra).

Figures are drawn on matplotlib ``Figure`` objects with an Agg canvas, never through
``pyplot``: nothing is registered in pyplot's global figure list (so nothing leaks in long
runs) and the caller's interactive backend, if any, is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .schedule import noam_curve


def _new_figure(figsize: tuple[float, float] = (7.0, 4.5)):
    """A Figure attached to an Agg canvas; raises a helpful ImportError without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # matplotlib is an optional dependency
        raise ImportError(
            'Plotting needs matplotlib: pip install "vaswani-mt[plot]"'
        ) from error
    figure = Figure(figsize=figsize, layout="tight")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, out_path: Path) -> Path:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_path, format="png", dpi=120)
    figure.clear()  # drop the artists now rather than whenever the figure is collected
    return out_path


def plot_schedule(
    pairs: Sequence[tuple[int, int]],
    out_path: str | os.PathLike,
    num_steps: int = 20000,
    factor: float = 1.0,
) -> Path:
    """Noam learning-rate curves (§5.3) for several ``(d_model, warmup_steps)`` pairs in one PNG,
    like the Annotated Transformer's schedule figure."""
    if not pairs:
        raise ValueError("give at least one (d_model, warmup_steps) pair")
    figure = _new_figure()
    axes = figure.add_subplot()
    steps = range(1, num_steps + 1)
    for d_model, warmup_steps in pairs:
        rates = noam_curve(d_model, warmup_steps, num_steps, factor)
        axes.plot(steps, rates, label=f"d_model={d_model}, warmup={warmup_steps}")
    axes.set_xlabel("step")
    axes.set_ylabel("learning rate")
    axes.set_title("Noam schedule" + (f" (factor={factor:g})" if factor != 1.0 else ""))
    axes.legend()
    axes.grid(alpha=0.3)
    return _save(figure, Path(out_path))


def _series(log_history: Iterable[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the entries that carry ``key``; entries without a step are skipped."""
    steps, values = [], []
    for entry in log_history:
        if key in entry and entry[key] is not None and "step" in entry:
            steps.append(entry["step"])
            values.append(entry[key])
    return steps, values


# (log_history key, file name, y label, title). Trainer logs the training loss as "loss" at every
# logging step; its final summary uses "train_loss", an average over the run, which is not a curve.
_TRAINING_CURVES = (
    ("learning_rate", "learning_rate.png", "learning rate", "Learning rate"),
    ("loss", "train_loss.png", "training loss", "Training loss"),
    ("eval_loss", "eval_loss.png", "validation loss", "Validation loss"),
    ("eval_bleu", "eval_bleu.png", "BLEU", "Validation BLEU"),
)


def plot_training_curves(log_history: Sequence[dict[str, Any]], out_dir: str | os.PathLike) -> list[Path]:
    """PNGs of learning rate, training loss, validation loss and validation BLEU against the step,
    from a Hugging Face ``Trainer.state.log_history``. A plot whose key never appears is skipped.

    Returns the written files, in the order listed above.
    """
    out_dir = Path(out_dir)
    written: list[Path] = []
    for key, file_name, y_label, title in _TRAINING_CURVES:
        steps, values = _series(log_history, key)
        if not steps:
            continue
        figure = _new_figure()
        axes = figure.add_subplot()
        # Evaluations are sparse: mark the points so a single evaluation is still visible.
        marker = "o" if key.startswith("eval_") else None
        axes.plot(steps, values, marker=marker)
        axes.set_xlabel("step")
        axes.set_ylabel(y_label)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        written.append(_save(figure, out_dir / file_name))
    return written


