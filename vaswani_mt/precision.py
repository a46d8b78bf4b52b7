"""The device a run computes on by default, and the precision that pays there, with the reason in words.

`training.precision` (the run config) is one of `PRECISIONS`; `choose_precision` says what it means on a device:

* `auto` (the shipped configs): bfloat16 autocast where the device multiplies bfloat16 natively (a CPU with
  AVX512-BF16 or AMX, aarch64 with `bf16`; an NVIDIA GPU of compute capability 8.0 or later); float16 autocast with
  dynamic loss scaling on an NVIDIA GPU without it whose float16 is fast (T4 and V100: tensor cores, 7.x; P100,
  6.0: twice float32's rate); float32 elsewhere (a CPU without native bfloat16, Pascal GPUs of capability 6.1 whose
  float16 runs at 1/64 of float32's rate, Apple's GPUs: below).
* `bf16`, `fp16`, `fp32`: that precision, with one warning where it does not pay, or a `PrecisionError` (one line
  naming what is missing) where it cannot run.

Apple's GPUs (MPS): `auto` trains in float32 there. torch computes float16 autocast on MPS from 2.5 and its
GradScaler works there from 2.8; bfloat16 autocast needs torch 2.6 and macOS 14, and M1/M2 emulate bfloat16 in float32
(transformers' `is_torch_bf16_gpu_available`). Whether either pays for this model on a Mac was not measured (no Mac
was at hand); float32 is the one that runs on every Mac, and `fp16` or `bf16` can be asked for.

The log line, `metrics.json` and the model card say what was chosen and why: facts of the device at hand (the CPU's
flags, the GPU's name and compute capability), and no speed figure, since one measured on another machine does not
hold for this one. The figures, each with the machine it was measured on, are in docs/training.md and docs/speed.md.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")  # the values of training.precision
DESCRIPTIONS = {"bf16": "bfloat16 autocast", "fp16": "float16 autocast with dynamic loss scaling", "fp32": "float32"}
CPUINFO = Path("/proc/cpuinfo")
# /proc/cpuinfo flags of the x86 instruction sets that multiply bfloat16 natively
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# The first torch releases with each piece of mixed precision on Apple's GPUs (accelerate checks the same).
MPS_FP16_TORCH = (2, 8)  # float16 autocast from 2.5, its GradScaler from 2.8
MPS_BF16_TORCH, MPS_BF16_MACOS = (2, 6), (14, 0)


class PrecisionError(ValueError):
    """A precision the device cannot train in; the message names what is missing, in one line."""


@dataclass(frozen=True)
class PrecisionChoice:
    """What a run computes in ("bf16", "fp16" or "fp32") and why (for the log, the run record and the model card)."""

    name: str
    reason: str

    def describe(self) -> str:
        return f"{DESCRIPTIONS[self.name]} ({self.reason})"

    def trainer_flags(self) -> dict[str, bool]:
        """transformers' `bf16` and `fp16` training arguments of this choice."""
        return {"bf16": self.name == "bf16", "fp16": self.name == "fp16"}


@dataclass(frozen=True)
class CpuKind:
    """A kind of CPU as far as bfloat16 goes: whether it multiplies bfloat16 natively, and that fact in words."""

    native: bool
    what: str

    def reason(self) -> str:
        return f"the CPU {self.what}"


AVX512_WITHOUT_BF16 = CpuKind(False, "has AVX-512 but no native bfloat16 (no avx512_bf16 or amx_bf16)")
AVX2_OR_OLDER = CpuKind(False, "has no native bfloat16 (AVX2 or older: no avx512f, avx512_bf16 or amx_bf16)")
# Said where `training.precision: bf16` asks for bfloat16 on a CPU without it (the figures: docs/training.md).
EMULATED_BF16 = "bfloat16 without native support trained or multiplied slower than float32 on each CPU measured"


def cpu_kind() -> CpuKind:
    """This CPU's kind, from the kernel's /proc/cpuinfo: x86 `flags` (avx512_bf16 or amx_bf16: native; avx512f
    without them; AVX2 or older), aarch64 `Features` (`bf16`: native). Without either (not Linux, unreadable), torch's
    own check of the CPU (`torch.cpu._is_avx512_bf16_supported`, private: used only where present)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    fields = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.split())
    if "flags" in fields:
        native = [flag for flag in NATIVE_BF16_FLAGS if flag in fields["flags"]]
        if native:
            return CpuKind(True, f"multiplies bfloat16 natively ({', '.join(native)})")
        return AVX512_WITHOUT_BF16 if "avx512f" in fields["flags"] else AVX2_OR_OLDER
    if "Features" in fields:
        if "bf16" in fields["Features"]:
            return CpuKind(True, "multiplies bfloat16 natively (bf16 in its Features)")
        return CpuKind(False, "has no native bfloat16 (no bf16 in its Features)")
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    try:
        native = check is not None and bool(check())
    except RuntimeError:
        native = False
    return CpuKind(native, "multiplies bfloat16 natively (torch's check: AVX512-BF16)" if native
                   else "has no native bfloat16 that torch knows of")


def default_device() -> str:
    """Where train, translate and the demo compute unless told: "cuda" when a CUDA device is available, else "mps"
    (Apple's GPU) when available, else "cpu"."""
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if mps_problem() is None else "cpu"


def mps_problem() -> str | None:
    """Why Apple's GPU (MPS) cannot be used here, or None."""
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return "this torch was built without MPS (Apple's GPUs: torch for macOS on Apple silicon)"
    if not mps.is_available():
        return "MPS is not available on this machine (torch.backends.mps.is_available() is False: not a Mac with " \
               "Apple silicon, or its macOS is too old for this torch)"
    return None


def choose_precision(setting: str, device_type: str) -> PrecisionChoice:
    """What `training.precision` = `setting` means on `device_type` ("cpu", "cuda", "mps"): "auto" is the precision
    that pays there (module docstring); "bf16", "fp16" and "fp32" are kept, with one warning where they do not pay,
    and `PrecisionError` where the device cannot train in them."""
    if setting not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {setting!r}")
    said = f"training.precision is {setting}"
    if setting == "auto":
        name, why = _paying(device_type)
        return PrecisionChoice(name, f"{said}: {why}")
    if setting == "fp32":
        return PrecisionChoice("fp32", said)
    if device_type == "mps":
        _check_mps(setting)
    if setting == "fp16":
        if device_type == "cpu":
            logger.warning("%s on the CPU: float16 with loss scaling pays on GPUs; training.precision: auto trains "
                           "a CPU in bfloat16 where it is native, else in float32", said)
        return PrecisionChoice("fp16", said)
    native, why = native_bf16(device_type)
    if not native:
        measured = f" ({EMULATED_BF16}: docs/training.md)" if device_type == "cpu" else ""
        logger.warning("%s, but %s; training.precision: auto would choose otherwise%s", said, why, measured)
    return PrecisionChoice("bf16", said + ("" if native else f", although {why}"))


def native_bf16(device_type: str) -> tuple[bool, str]:
    """(whether `device_type` computes bfloat16 natively, the reason in words)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        name = torch.cuda.get_device_name()
        if _cuda_bf16_native():
            return True, f"{name} computes bfloat16 natively"
        return False, f"{name} has no native bfloat16"
    if device_type == "cpu":
        kind = cpu_kind()
        return kind.native, kind.reason()
    if device_type == "mps":
        return False, "Apple's GPU (MPS): M1 and M2 emulate bfloat16 in float32, and no speed was measured on one"
    return False, f"bfloat16 on {device_type} is not known to pay"


def _paying(device_type: str) -> tuple[str, str]:
    """("bf16" / "fp16" / "fp32", why) of `auto` on `device_type`."""
    if device_type == "mps":
        return "fp32", ("Apple's GPU (MPS): neither half precision was measured to pay there (training.precision "
                        "fp16 or bf16 asks for one)")
    native, why = native_bf16(device_type)
    if native or device_type != "cuda" or not torch.cuda.is_available():
        return ("bf16" if native else "fp32"), why
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (7, 0) or (major, minor) in ((6, 0), (6, 2)):
        return "fp16", f"{why} (compute capability {major}.{minor}), but fast float16"
    return "fp32", f"{why} and no fast float16 (compute capability {major}.{minor})"


def _cuda_bf16_native() -> bool:
    """bfloat16 in the GPU's own units (Ampere and later), not emulated (`is_bf16_supported` counts emulation)."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument
        return torch.cuda.is_bf16_supported()


def _check_mps(setting: str) -> None:
    """`PrecisionError` naming what mixed precision `setting` needs on Apple's GPU and this machine lacks."""
    torch_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    needed = MPS_FP16_TORCH if setting == "fp16" else MPS_BF16_TORCH
    what = "float16 (its GradScaler)" if setting == "fp16" else "bfloat16 autocast"
    if torch_version < needed:
        raise PrecisionError(f"training.precision {setting} on Apple's GPU (MPS) needs torch "
                             f"{needed[0]}.{needed[1]} or later for {what}; this is torch {torch.__version__}")
    if setting == "bf16" and not _macos_at_least(MPS_BF16_MACOS):
        raise PrecisionError(f"training.precision bf16 on Apple's GPU (MPS) needs macOS {MPS_BF16_MACOS[0]} or "
                             f"later; this is macOS {platform.mac_ver()[0] or 'unknown'}")


def _macos_at_least(version: tuple[int, int]) -> bool:
    check = getattr(torch.backends.mps, "is_macos_or_newer", None)
    if check is not None:
        return bool(check(*version))
    release = platform.mac_ver()[0]
    return bool(release) and tuple(int(part) for part in release.split(".")[:2]) >= version


__all__ = ["CpuKind", "PRECISIONS", "PrecisionChoice", "PrecisionError", "choose_precision", "cpu_kind",
           "default_device", "mps_problem", "native_bf16"]
