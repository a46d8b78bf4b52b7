"""`vaswani-mt plot-schedule`: draw Noam learning-rate curves (§5.3; `vaswani_mt.recipe.plots`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..recipe.plots import plot_schedule


def main(argv: Sequence[str] | None = None) -> int:
    """`vaswani-mt plot-schedule`: Noam curves for (d_model, warmup) pairs, like the Annotated Transformer's."""
    import argparse

    parser = argparse.ArgumentParser(prog="vaswani-mt plot-schedule", description=main.__doc__)
    parser.add_argument("--pair", action="append", metavar="D_MODEL:WARMUP",
                        help="a curve, e.g. 512:4000 (repeatable; default: 512:4000 512:8000 256:4000)")
    parser.add_argument("--steps", type=int, default=20000, help="steps on the x axis (default: %(default)s)")
    parser.add_argument("--factor", type=float, default=1.0, help="schedule multiplier (default: %(default)s)")
    parser.add_argument("--out", default="noam_schedule.png",
                        help="the PNG to write (default: %(default)s in the current folder)")
    args = parser.parse_args(argv)
    pairs = []
    for text in args.pair or ["512:4000", "512:8000", "256:4000"]:
        d_model, _, warmup = text.partition(":")
        if not (d_model.isdigit() and warmup.isdigit() and int(d_model) > 0 and int(warmup) > 0):
            parser.error(f"--pair {text!r}: expected D_MODEL:WARMUP with two positive integers, e.g. 512:4000")
        pairs.append((int(d_model), int(warmup)))
    if args.steps < 1 or not args.factor > 0:
        parser.error(f"--steps and --factor must be positive, got {args.steps} and {args.factor}")
    try:
        path = plot_schedule(pairs, args.out, num_steps=args.steps, factor=args.factor)
    except (ImportError, OSError) as error:
        print(f"vaswani-mt plot-schedule: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {path.resolve()} ({len(pairs)} curve{'s' if len(pairs) > 1 else ''})", file=sys.stderr)
    return 0
