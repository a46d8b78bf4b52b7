"""Does float16 with dynamic loss scaling train as bfloat16 does? Two runs of the Multi30k recipe's shape with the
same seed, one forced to `training.precision: fp16`, one to `bf16`, through `train_run` as `vaswani-mt train` runs
them; prints both loss curves at every logging step, fp16's loss scale and skipped updates, and whether the curves
agree within the tolerance (exit code 0; 1 when they do not).

    python scripts/check_fp16.py                                          # on the GPU: 300 updates each
    python scripts/check_fp16.py --updates 30 --logging-steps 5 --valid 20   # a short form, e.g. on a CPU

The runs: `multi30k-en-de` (`mini` preset, joint BPE 10,000, batches of 4,096 tokens, warm-up 800, Noam factor 0.64,
seed 1) with dropout 0.2, the setting of the runs in docs/training.md, for `--updates` updates, without the cool-down,
the averaging and the test translation; validation greedy on the first `--valid` pairs at the end only. The same seed
gives both runs the same initial weights, batches and dropout masks (on one device), so they differ by rounding alone.

Tolerance: the mean |loss difference| over the logged losses of the last 100 updates below 0.05 nats, and the last
logged losses within 2 % of each other. A broken loss scaling shows as far more than that: updates all skipped keep
the loss at its start (about 9.2 nats, ln 10,000), gradients that underflow to zero stall it, an unskipped overflow
makes it NaN. Rounding alone moves it much less: a loss near 5 nats, 0.05 is 1 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmark_common import MULTI30K

PRECISIONS = ("fp16", "bf16")
MEAN_TOLERANCE = 0.05  # nats, mean |difference| of the logged losses over the last 100 updates
FINAL_TOLERANCE = 0.02  # relative difference of the last logged losses


def train(precision: str, args, output_dir: Path) -> tuple[dict[int, dict], float, object]:
    """{step: log entry} of one run's logged training losses, its seconds, and its record."""
    from vaswani_mt import load_run_config, train_run

    overrides = {
        "output_dir": str(output_dir / precision), "data.path": str(args.data), "data.test_split": None,
        "data.valid_subset": args.valid, "training.precision": precision, "training.max_steps": args.updates,
        "training.max_minutes": None, "training.cooldown_steps": 0, "training.logging_steps": args.logging_steps,
        "training.eval_steps": args.updates, "training.average_every": None, "training.average_last": 1,
        "training.keep_checkpoints": 1, "training.num_beams": 1, "model.config.dropout": 0.2,
    }
    config = load_run_config("multi30k-en-de", overrides)
    started = time.perf_counter()
    record = train_run(config, command=f"scripts/check_fp16.py ({precision})")
    seconds = time.perf_counter() - started
    history = json.loads((output_dir / precision / "log_history.json").read_text(encoding="utf-8"))
    return {entry["step"]: entry for entry in history if "loss" in entry}, seconds, record


def compare(curves: dict[str, dict[int, dict]], updates: int) -> tuple[float, float, float, float]:
    """(mean |difference| over the last 100 updates, the last fp16 loss, the last bf16 loss, their relative
    difference)."""
    fp16, bf16 = curves["fp16"], curves["bf16"]
    steps = sorted(set(fp16) & set(bf16))
    late = [step for step in steps if step > updates - 100] or steps[-1:]
    mean = sum(abs(fp16[step]["loss"] - bf16[step]["loss"]) for step in late) / len(late)
    last = steps[-1]
    final16, final_bf = fp16[last]["loss"], bf16[last]["loss"]
    return mean, final16, final_bf, abs(final16 - final_bf) / abs(final_bf)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--valid", type=int, default=100, help="validation pairs, scored once at the end")
    parser.add_argument("--data", type=Path, default=MULTI30K, help="the Multi30k folder (default: %(default)s)")
    parser.add_argument("--output-dir", type=Path, help="where the two run folders go (default: a temporary folder)")
    args = parser.parse_args(argv)

    import torch

    from vaswani_mt.precision import default_device
    from vaswani_mt.run_record import Hardware

    device = default_device()
    where = torch.cuda.get_device_name() if device == "cuda" else f"{Hardware.of_this_machine().cpu} ({device})"
    output_dir = args.output_dir or Path(tempfile.mkdtemp(prefix="check-fp16-"))
    curves, seconds, records = {}, {}, {}
    for precision in PRECISIONS:
        curves[precision], seconds[precision], records[precision] = train(precision, args, output_dir)

    print(f"{device}: {where}; torch {torch.__version__}; {args.updates} updates each, loss logged every "
          f"{args.logging_steps}; run folders in {output_dir}")
    print()
    print("| update | fp16 loss | bf16 loss | difference | fp16 loss scale | fp16 updates skipped |")
    print("|---|---|---|---|---|---|")
    for step in sorted(set(curves["fp16"]) | set(curves["bf16"])):
        fp16, bf16 = curves["fp16"].get(step, {}), curves["bf16"].get(step, {})
        difference = f"{fp16['loss'] - bf16['loss']:+.4f}" if fp16 and bf16 else "-"
        print(f"| {step} | {fp16.get('loss', float('nan')):.4f} | {bf16.get('loss', float('nan')):.4f} | "
              f"{difference} | {fp16.get('loss_scale', float('nan')):g} | {fp16.get('skipped_updates', '-')} |")
    print()
    for precision in PRECISIONS:
        training = records[precision].training
        print(f"{precision}: {training.precision}; {training.target_tokens_per_second_median or 0:,.0f} target "
              f"tok/s (median); {seconds[precision]:.0f} s in all"
              + (f"; {training.skipped_updates} of {training.steps} updates skipped"
                 if training.skipped_updates is not None else ""))
    mean, final16, final_bf, relative = compare(curves, args.updates)
    agree = mean < MEAN_TOLERANCE and relative < FINAL_TOLERANCE
    print(f"mean |fp16 - bf16| over the last 100 updates' logged losses: {mean:.4f} (tolerance {MEAN_TOLERANCE}); "
          f"last logged losses {final16:.4f} and {final_bf:.4f}: {relative:.2%} apart (tolerance "
          f"{FINAL_TOLERANCE:.0%})")
    print(f"fp16 and bf16 agree: {'yes' if agree else 'NO'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
