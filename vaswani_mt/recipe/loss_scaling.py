"""float16 training's dynamic loss scaling (`training.precision: fp16`, transformers' `fp16=True`), as transformers'
Trainer runs it through accelerate, on every device.

* accelerate gives a GPU (CUDA, MPS) float16 autocast and a `GradScaler` for `fp16=True`, but a CPU neither: there it
  trains in float32 and says nothing. `scale_losses_on_the_cpu` gives the CPU what a GPU gets (torch has float16
  autocast and `GradScaler("cpu")` on the CPU), so `fp16` means the same everywhere and the CPU tests run the GPU's
  path. The loss's softmax and sums stay float32 on every device: accelerate hands the model's outputs back in
  float32; on a GPU the loss of the logits is float32 (`label_smoothed_cross_entropy`), on a CPU the output
  projection inside the loss runs its products under the run's float16 autocast (`VaswaniTrainer.loss_autocast`).
* An update whose scaled gradients overflowed is skipped (the weights stay, the scale halves). accelerate cannot
  tell a skipped update of a fused optimizer (`step_was_skipped` is always False: the fused Adam receives the
  overflow flag and skips inside), so `SkippedUpdates` counts them from the scale, which falls only then (one host
  synchronisation per update, float16 runs only). Skipped updates still advance the Noam schedule, as the Trainer
  steps it after every update it sees as made: the rate stays a function of the update number.
* A checkpoint holds the scaler's state (`scaler.pt`, saved and loaded by the Trainer itself on transformers 5.17 and
  5.24), so a resumed run continues with the scale it had (tests/test_loss_scaling.py).
"""

from __future__ import annotations

import logging

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def scale_losses_on_the_cpu(accelerator) -> bool:
    """Give an accelerator that trains a CPU with `mixed_precision="fp16"` float16 autocast and a `GradScaler("cpu")`
    (accelerate's `scaler` and `native_amp`, what it sets for a GPU), before the Trainer prepares the model and
    optimizer. Returns False where an accelerate without those attributes keeps its own float32 (one warning)."""
    if accelerator.device.type != "cpu" or accelerator.mixed_precision != "fp16" or \
            getattr(accelerator, "scaler", None) is not None:
        return True
    if not (hasattr(accelerator, "scaler") and hasattr(accelerator, "native_amp")):
        logger.warning("this accelerate has no grad scaler to set for the CPU: fp16 trains in float32 there")
        return False
    accelerator.scaler = torch.amp.GradScaler("cpu")
    accelerator.native_amp = True
    return True


class SkippedUpdates(TrainerCallback):
    """Counts the updates dynamic loss scaling skipped since the last `take()`, from the scaler's scale (module
    docstring); nothing without a scaler."""

    def __init__(self):
        self.count = 0
        self.scale: float | None = None  # the scale after the last update seen
        self.first_step: int | None = None  # the first update since the last take

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        scaler = _scaler(optimizer)
        if scaler is not None and self.scale is None:  # the first update of this trainer: the (resumed) scale
            self.scale = scaler.get_scale()
        if self.first_step is None:
            self.first_step = state.global_step + 1

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        scaler = _scaler(optimizer)
        if scaler is None:
            return
        scale = scaler.get_scale()
        if self.scale is not None and scale < self.scale:
            self.count += 1
        self.scale = scale

    def take(self, last_step: int) -> int:
        """The skipped updates since the last take (one log line when there were any); starts counting anew."""
        count, first = self.count, self.first_step
        if count:
            logger.info("updates %s-%d: %d skipped, their float16 gradients overflowed; loss scale now %g",
                        first, last_step, count, self.scale)
        self.count, self.first_step = 0, None
        return count


def _scaler(optimizer) -> torch.amp.GradScaler | None:
    """The enabled grad scaler of accelerate's optimizer wrapper (its public `scaler` attribute), or None."""
    scaler = getattr(optimizer, "scaler", None)
    return scaler if scaler is not None and scaler.is_enabled() else None


__all__ = ["SkippedUpdates", "scale_losses_on_the_cpu"]
