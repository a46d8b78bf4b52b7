"""What flushing subnormal floats to zero buys on this CPU: `torch.exp`, the softmax, log-softmax and training loss
of a batch of the `mini` shape, with and without `torch.set_flush_denormal(True)`.

    python scripts/bench_denormals.py                        # 10 rounds, spreads 4 15 30
    python scripts/bench_denormals.py --rounds 4 --spreads 4

Float32 numbers below 1.18e-38 (subnormals) take a slow path on some CPUs; flushing them to 0 skips it. A softmax
makes them where a row's logits lie more than 87 apart: exp(-87) is float32's smallest normal number. The workloads:
`exp` of 64 x 10,000 floats whose results are subnormal (and, for comparison, of as many whose results are normal),
and, on 4,096 target tokens, a 10,000-token vocabulary and d_model 128 (the `mini` preset of the Multi30k configs),
`softmax` and `log_softmax` of the [tokens, vocabulary] float32 logits and `loss`, the forward and backward pass of
the training loss on CPU (`projected_label_smoothed_cross_entropy`, label smoothing 0.1, with the output projection).
The logits are hidden states times the output projection, both random, scaled so that a row's logits have the
standard deviation `--spreads` (a row of 10,000 then spans about 8 of them); the share of probabilities below the
normal range is printed for each. A model trained with label smoothing stays at the low end: the smoothed loss pushes
up every class whose probability falls below ε / (V - 2) (1e-5 here), so its logits do not drift 87 apart.

Flushing is a setting of each thread (a thread inherits it from the one that starts it), so this runs torch on one
thread and toggles the setting in it, call by call: the two kinds of call alternate, so that a busy machine slows
both alike. The medians are printed with the CPU model and flags.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import cpu_flags, cpu_model  # noqa: E402

from vaswani_mt.recipe.loss import projected_label_smoothed_cross_entropy  # noqa: E402

TOKENS, VOCAB, D_MODEL = 4096, 10_000, 128
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def flags_listed() -> list[str]:
    """Which of `FLAGS` /proc/cpuinfo lists."""
    return [flag for flag in FLAGS if flag in cpu_flags()]


def alternated(call, rounds: int) -> tuple[float, float]:
    """Median seconds of `call` (kept, flushed), the two alternating for `rounds` rounds after one warm-up each."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(rounds + 1):
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            started = time.perf_counter()
            call()
            if round_:
                seconds[flush].append(time.perf_counter() - started)
    torch.set_flush_denormal(False)
    return statistics.median(seconds[False]), statistics.median(seconds[True])


def row(spread: str, share: str, name: str, kept: float, flushed: float) -> str:
    return f"| {spread} | {share} | {name} | {kept * 1e3:.1f} | {flushed * 1e3:.1f} | {kept / flushed:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="calls of each kind per workload, alternated")
    parser.add_argument("--spreads", type=float, nargs="+", default=[4.0, 15.0, 30.0],
                        help="standard deviations of a row's logits")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the setting is the calling thread's: the one that computes
    print(f"CPU: {cpu_model()}; flags: {', '.join(flags_listed()) or 'none of ' + ', '.join(FLAGS)}; "
          f"torch {torch.__version__}, 1 thread; medians of {args.rounds} calls of each kind, alternated")
    print("| logits' spread | subnormal share of p | workload | kept, ms | flushed, ms | kept / flushed |")
    print("|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for name, low, high in (("exp, subnormal results", -103.0, -88.0), ("exp, normal results", -80.0, -65.0)):
        inputs = torch.empty(64, VOCAB).uniform_(low, high, generator=generator)
        print(row("-", "-", name, *alternated(lambda: torch.exp(inputs), args.rounds * 10)), flush=True)
    for spread in args.spreads:
        hidden = torch.randn(TOKENS, D_MODEL, generator=generator)
        weight = torch.randn(VOCAB, D_MODEL, generator=generator) * spread / D_MODEL**0.5
        labels = torch.randint(4, VOCAB, (TOKENS,), generator=generator)
        logits = hidden @ weight.t()
        probabilities = torch.softmax(logits, 1)
        share = ((probabilities > 0) & (probabilities < torch.finfo(torch.float32).tiny)).double().mean().item()
        hidden.requires_grad_()
        weight.requires_grad_()

        def loss():
            projected_label_smoothed_cross_entropy(hidden, weight, labels, 0.1, pad_token_id=1)[0].backward()
            hidden.grad = weight.grad = None

        for name, call in (("softmax", lambda: torch.softmax(logits, 1)),
                           ("log_softmax", lambda: torch.log_softmax(logits, 1)), ("loss", loss)):
            print(row(f"{spread:g}", f"{share:.2%}", name, *alternated(call, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
