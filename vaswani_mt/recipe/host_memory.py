"""Training on CPU: keep freed memory in the process instead of handing it back to the kernel after every step.

glibc's malloc serves each block above its mmap threshold (128 KiB, rising to at most 32 MiB as blocks are freed)
with a fresh mmap, and returns it with munmap when the tensor is freed. A training step on Multi30k allocates and
frees blocks of ~80 MB (the [tokens, vocabulary] logits and their gradient at 4,096 tokens and 10,000 BPE tokens),
so every step the kernel maps, zero-fills and unmaps them again: 5 of 30 seconds of system time in 40 steps on
the 2-core machine. Serving them from the heap and not trimming it made the `mini` training step 1.73x faster
there (`python scripts/bench_training.py --shape mini --precision bf16 --loss training --malloc both`,
docs/speed.md). The price: the process keeps its peak memory until it exits, as a training run does anyway.

Nothing here runs on import: `train_run` (`vaswani_mt.recipe.run`) calls `keep_freed_memory` when it trains on CPU.
The setting then holds for the rest of the process, not for the run only: glibc has no call that reads these
thresholds back, and setting one turns off malloc's own adjustment of the mmap threshold for good, so the run could
not restore what the process had before.
"""

from __future__ import annotations

import ctypes

# mallopt(3) parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# Blocks below 1 GiB come from the heap; the heap is never trimmed.
MMAP_THRESHOLD = 2**30
TRIM_THRESHOLD = 2**31 - 1


def set_malloc_thresholds(mmap_threshold: int, trim_threshold: int) -> bool:
    """mallopt(3) M_MMAP_THRESHOLD and M_TRIM_THRESHOLD. True if the C library took both (glibc); False where it has
    no `mallopt` or refused one (macOS, Windows, musl)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def keep_freed_memory() -> bool:
    """Ask the C library's malloc to serve large blocks from its heap and keep freed memory for reuse. True if the
    C library took both settings (glibc); False where it cannot."""
    return set_malloc_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD)
