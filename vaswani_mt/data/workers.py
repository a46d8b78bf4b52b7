"""The worker processes of a preparation: how many (`data.workers` and its rule; by default the cores this process may
use) and the pool that runs a pass over a large split's shards (`run_pass`).

The pool starts its processes the way Python does on the platform, or as `multiprocessing.set_start_method` said:
`fork` on Linux (before Python 3.14), `spawn` on macOS and Windows. A job is a module-level function and a tuple of
plain values (folders, file names, numpy arrays, a `tokenizers.Tokenizer`), so a spawned worker, which starts from a
fresh interpreter, gets all it needs from the job itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

LARGE_SPLIT = 100_000  # pairs from which the cleaning and tokenising passes use worker processes
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" microseconds, or "max <period>"


def workers_problem(workers: Any) -> str | None:
    """The one rule of `data.workers` (the config and `prepare` both ask it): a positive number of processes, or
    None for the usable cores."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        return f"workers must be a positive number of processes or null (the usable cores), got {workers!r}"
    return None


def usable_cores() -> int:
    """The cores this process may use, at least 1: its CPU affinity (a job scheduler's or `taskset`'s share, not the
    whole machine's count), capped by a container's CPU quota (`docker --cpus`, a Kubernetes CPU limit: cgroup v2's
    cpu.max), rounded down."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        cores = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, int(quota) // int(period))
    except (OSError, ValueError):  # no cgroup v2 file, or one this does not understand: the affinity alone
        pass
    return max(1, cores)


def run_pass(function: Callable[[tuple], tuple], jobs: list[tuple], rows: int, desc: str, workers: int) -> list:
    """`function(job)` for every job (one shard each), in up to `workers` processes when there are `rows` >=
    LARGE_SPLIT and several shards; the results in job order. Progress counts pairs (each result's first item)."""
    workers = min(workers, len(jobs)) if rows >= LARGE_SPLIT else 1
    results = []
    with tqdm(total=rows, unit=" pairs", desc=desc) as bar:
        if workers <= 1:
            for job in jobs:
                results.append(function(job))
                bar.update(results[-1][0])
            return results
        # a worker that dies (killed, out of memory) breaks the pool with an error instead of a wait without end
        context = multiprocessing.get_context()  # the platform's start method, or the one the program set
        with _tokenizers_on_one_thread(), ProcessPoolExecutor(workers, mp_context=context) as pool:
            for result in pool.map(function, jobs):
                results.append(result)
                bar.update(result[0])
    return results


@contextlib.contextmanager
def _tokenizers_on_one_thread() -> Iterator[None]:
    """Each worker encodes on one thread (the workers are the parallelism): said up front, since a worker forked after
    the tokenizers library used its threads would warn and turn them off, and a spawned one reads it at its start."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


__all__ = ["CGROUP_CPU_MAX", "LARGE_SPLIT", "run_pass", "usable_cores", "workers_problem"]
