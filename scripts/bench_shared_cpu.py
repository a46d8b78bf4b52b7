"""A fair share of a busy CPU: the training speed of one process alone, and of each of two processes at once.

    python scripts/bench_shared_cpu.py                       # 30 s per measurement, 3 alone per variant
    python scripts/bench_shared_cpu.py --seconds 20 --repeats 1 --variants shipped

Each measurement runs this script's worker in fresh processes: the `mini` preset (the shape of every Multi30k
config) trains in float32 on a fixed batch of 266 sentence pairs of 15 + 15 tokens (3,990 target tokens per step,
as `bench_training.py`), for `--seconds` after two warm-up steps, and reports its target tokens per second. First one
worker alone, then two at once; the ratio of each one's speed together to the speed alone is what a second run on
the same machine leaves it (two runs sharing 2 cores fairly keep about 50 % each).

Variants (`--variants`): `torch` — torch as it starts without the command (OpenMP threads on every core; a waiting
thread spins 300,000 times before it sleeps); `shipped` — the environment the `vaswani-mt` command sets for its own
process before torch loads (`vaswani_mt.cli.PROCESS_ENVIRONMENT`: a waiting thread spins 10,000 times,
`GOMP_SPINCOUNT`); `one-thread` — one torch thread per process, for comparison. The CPU model and flags are printed
beside the figures. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import CPU_FLAGS, cpu_flags, cpu_model  # noqa: E402

from vaswani_mt.cli import PROCESS_ENVIRONMENT  # noqa: E402

PAIRS, LENGTH = 266, 15
VARIANTS = ("torch", "shipped", "one-thread")


def worker(seconds: float, variant: str) -> dict:
    """Train the mini preset for `seconds`; {"tokens_per_second", "steps", "threads"}."""
    import torch

    if variant == "one-thread":
        torch.set_num_threads(1)
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("mini", vocab_size=10000))
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 10000, (PAIRS, LENGTH), generator=generator)
    labels = torch.randint(4, 10000, (PAIRS, LENGTH), generator=generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step():
        model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        steps += 1
    elapsed = time.perf_counter() - started
    return {"tokens_per_second": steps * PAIRS * LENGTH / elapsed, "steps": steps, "threads": torch.get_num_threads()}


def run_workers(count: int, seconds: float, variant: str) -> list[dict]:
    command = [sys.executable, __file__, "--worker", str(seconds), "--variants", variant]
    env = {name: value for name, value in os.environ.items() if name not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if variant == "shipped":  # read by OpenMP when the worker's torch loads it, as in the command's process
        env.update(PROCESS_ENVIRONMENT)
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) for _ in range(count)]
    results = []
    for process in processes:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a worker failed (exit {process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def flags_shown() -> str:
    return " ".join(flag for flag in CPU_FLAGS if flag in cpu_flags()) or "none of avx2/avx512"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3, help="measurements alone per variant (default 3)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--worker", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.variants[0])))
        return 0

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"CPU: {cpu_model()}, {cores} cores, flags: {flags_shown()}; {args.seconds:g} s per measurement")
    print()
    alone = {variant: [] for variant in args.variants}
    for _ in range(args.repeats):  # interleaved, so that a slow minute of the machine hits every variant alike
        for variant in args.variants:
            alone[variant] += run_workers(1, args.seconds, variant)
    print("| variant | threads | alone, tok/s (median, min-max) | two at once, tok/s each | kept alone's speed |")
    print("|---|---|---|---|---|")
    for variant in args.variants:
        rates = [result["tokens_per_second"] for result in alone[variant]]
        median = statistics.median(rates)
        pair = run_workers(2, args.seconds, variant)
        kept = [p["tokens_per_second"] / median for p in pair]
        print(f"| {variant} | {alone[variant][0]['threads']} | {median:,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | "
              f"{' / '.join(format(p['tokens_per_second'], ',.0f') for p in pair)} | "
              f"{' / '.join(format(k, '.0%') for k in kept)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
