"""Where bfloat16 pays: on a CUDA device that supports it, and on a CPU that multiplies bfloat16 natively (AVX512-BF16
or AMX). Elsewhere torch multiplies bfloat16 matrices in a generic fallback: on an AMD EPYC with AVX2 only,
`vaswani-mt train --config multi30k-en-de --quick` trained at 200-224 target tokens/s in bfloat16 autocast against
2,700-2,900 in float32, the same losses (docs/model.md).

`training.bf16: auto` (the shipped configs) asks `choose_bf16`; `true` on a CPU without native bfloat16 is kept, with
one warning that says what it costs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

BF16_SETTINGS = (True, False, "auto")
# /proc/cpuinfo flags of the instruction sets that multiply bfloat16 natively
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
SLOW_BF16 = "bfloat16 matrix products run about 13x slower than float32 there"


@dataclass(frozen=True)
class Bf16Choice:
    """Whether a run computes in bfloat16 autocast, and why (for the log, the run record and the model card)."""

    enabled: bool
    reason: str

    def describe(self) -> str:
        return f"{'bfloat16 autocast' if self.enabled else 'float32'} ({self.reason})"


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The native bfloat16 instruction sets of this CPU, from the kernel's flags; where the kernel does not list them
    (not Linux), from torch's own checks of the CPU (`torch.cpu._is_avx512_bf16_supported`, private: used only
    where present)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = None
    if text is not None:
        flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
        return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    try:
        return ["avx512_bf16"] if check is not None and check() else []
    except RuntimeError:
        return []


def native_bf16(device_type: str) -> tuple[bool, str]:
    """(whether `device_type` computes bfloat16 natively, the reason in words)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        name = torch.cuda.get_device_name()
        if _cuda_bf16_native():
            return True, f"{name} supports bfloat16"
        return False, f"{name} has no bfloat16"
    if device_type == "cpu":
        flags = cpu_bf16_flags()
        if flags:
            return True, f"the CPU multiplies bfloat16 natively ({', '.join(flags)})"
        return False, f"the CPU has no native bfloat16 (no {' or '.join(NATIVE_BF16_FLAGS)}): {SLOW_BF16}"
    return False, f"bfloat16 on {device_type} is not known to pay"


def _cuda_bf16_native() -> bool:
    """bfloat16 in the GPU's own units (Ampere and later), not emulated (`is_bf16_supported` counts emulation)."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument
        return torch.cuda.is_bf16_supported()


def choose_bf16(setting: bool | str, device_type: str) -> Bf16Choice:
    """What `training.bf16` = `setting` means on `device_type`: "auto" is bfloat16 where it is native, float32
    elsewhere; True and False are kept, True with one warning where bfloat16 is not native."""
    if setting not in BF16_SETTINGS:
        raise ValueError(f"bf16 must be true, false or auto, got {setting!r}")
    if setting is False:
        return Bf16Choice(False, "training.bf16 is false")
    native, why = native_bf16(device_type)
    if setting == "auto":
        return Bf16Choice(native, f"training.bf16 is auto: {why}")
    if not native:
        logger.warning("training.bf16 is true, but %s; training.bf16: auto would train in float32", why)
    return Bf16Choice(True, "training.bf16 is true" + ("" if native else f", although {why}"))


__all__ = ["BF16_SETTINGS", "Bf16Choice", "choose_bf16", "cpu_bf16_flags", "native_bf16"]
