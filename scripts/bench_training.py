"""Training speed: one step (forward + backward + Adam) of our model vs `MarianMTModel`, same shape, same weights.

    python scripts/bench_training.py                    # fp32 and bf16, 5 repetitions of 3 steps each
    python scripts/bench_training.py --precision fp32   # one precision only
    python scripts/bench_training.py --quick            # 2 repetitions of 1 step, short idle waits
    python scripts/bench_training.py --shape mini       # the `mini` preset (the shape of every multi30k config)
    python scripts/bench_training.py --shape mini --precision bf16 --loss training --malloc both
                                                        # the multi30k configs' training step, as `train` runs it

The "small" shape (d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8000, dropout 0.1; `--shape mini`: d_model
128, 4+4 layers, 4 heads, FFN 256, vocab 10000, dropout 0.3 as the preset; the cased configs train with 0.2,
which does not change a step's work), 266 sentence pairs of 15
source and 15 target tokens (3990 target tokens per step, as in /work/shared/notes/benchmarks.md), torch with 2
threads. The Marian model is `vaswani_mt.model.convert.to_marian(ours)`.

Each system makes its updates through its own Trainer, as that Trainer's training loop makes them
(`benchmark_common.trainer_updates`): ours through `VaswaniTrainer` (its `compute_loss`, its Adam), Marian through
transformers' `Seq2SeqTrainer` (fused AdamW without weight decay), both with betas 0.9/0.98 and epsilon 1e-9. The
model and optimizer are prepared by the trainer's accelerator; an update is the trainer's `training_step` (loss and
backward), the gradient norm the loop logs, the optimizer's and the schedule's step.

Precisions: `fp32`; `bf16` = the Trainer's `bf16=True` (what `training.precision: bf16` sets): accelerate's bfloat16
autocast around the model's forward, whose outputs it hands back in float32; fp32 weights and optimizer. Ours then
computes its loss, with the output projection inside it on CPU, under the same autocast (`VaswaniTrainer.loss_autocast`:
the projection's products in bfloat16, softmax and sums in float32); Marian's loss runs on the float32 logits. Under
bf16 Marian runs both with its default attention (sdpa) and with eager attention (`marian eager`), so the peer's
better setting is shown too; ours picks eager attention on CPU by itself. Each repetition times every system
(A B A B ...) after waiting for other processes to go quiet; disturbed repetitions are redone. Prints target tokens
per second (median, min–max), the ratio to Marian at the same precision and to Marian fp32.

`--loss training`: the label-smoothed loss (ε = 0.1) each trainer trains with: ours `VaswaniTrainer`'s
(`label_smoothing` 0.1; on CPU `vaswani_mt.recipe.loss.projected_label_smoothed_cross_entropy`, the output
projection inside the loss, block by block), Marian `Seq2SeqTrainer(label_smoothing_factor=0.1)`'s `LabelSmoother`.
`--loss model`: no smoothing (ours `label_smoothing` 0, Marian's own cross-entropy).
`--malloc keep`: glibc's malloc keeps freed memory in the process, as `vaswani-mt train` sets it on CPU
(`vaswani_mt.recipe.host_memory`); `--malloc both` times every system both ways, switching before each run.

Target of the project (issue): training >= 1.25x Marian.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import SMALL_SHAPE, fmt_range, measure, trainer_updates  # noqa: E402

PAIRS, LENGTH = 266, 15


def make_batch(vocab_size: int, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (PAIRS, LENGTH), generator=generator)
    labels = torch.randint(4, vocab_size, (PAIRS, LENGTH), generator=generator)
    input_ids[:, -1] = labels[:, -1] = 3  # </s>
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def step_runner(model, batch, steps: int, precision: str, label_smoothing: float, malloc=None):
    """`steps` updates of `model` through its Trainer (`benchmark_common.trainer_updates`). `malloc`: the
    (mmap, trim) thresholds to set before each run; None: leave malloc as it is."""
    updates = trainer_updates(model, batch, precision, "cpu", label_smoothing=label_smoothing)

    def run(steps: int = steps):
        if malloc is not None:
            set_malloc(*malloc)
        updates(steps)
    run.trainer = updates.trainer
    return run


def set_malloc(mmap_threshold: int, trim_threshold: int) -> None:
    from vaswani_mt.recipe.host_memory import set_malloc_thresholds

    if not set_malloc_thresholds(mmap_threshold, trim_threshold):
        raise SystemExit("bench_training.py: this C library refused mallopt (--malloc needs glibc)")


# glibc's defaults (the mmap threshold starts there and moves up to 32 MiB; blocks of the [tokens, vocabulary]
# logits are above that either way) and the settings of vaswani_mt.recipe.host_memory.
MALLOC_DEFAULT = (128 * 1024, 128 * 1024)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions of 1 step, short idle waits")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per timed repetition")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--idle-threshold", type=float, default=0.1, help="max cores other processes may use")
    parser.add_argument("--max-wait", type=float,
                        help="seconds to wait for an idle machine (default 120, --quick 10)")
    parser.add_argument("--max-redo", type=int, default=3, help="redos of a disturbed repetition")
    parser.add_argument("--precision", choices=("fp32", "bf16", "all"), default="all")
    parser.add_argument("--shape", choices=("small", "mini"), default="small",
                        help="small (the former multi30k default) or mini (the multi30k configs' shape)")
    parser.add_argument("--loss", choices=("model", "training"), default="model",
                        help="model: no label smoothing; training: label smoothing 0.1, as trained (docstring)")
    parser.add_argument("--malloc", choices=("as-is", "keep", "both"), default="as-is",
                        help="keep: malloc keeps freed memory (as `vaswani-mt train`); both: time each way")
    args = parser.parse_args(argv)
    if args.quick:
        args.repetitions, args.steps, args.max_redo = 2, 1, 1
    if args.max_wait is None:
        args.max_wait = 10.0 if args.quick else 120.0
    torch.set_num_threads(args.threads)

    from vaswani_mt import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.model.convert import to_marian
    from vaswani_mt.recipe.host_memory import MMAP_THRESHOLD, TRIM_THRESHOLD
    from vaswani_mt.precision import native_bf16
    from vaswani_mt.run_record import Hardware

    keep_freed = (MMAP_THRESHOLD, TRIM_THRESHOLD)

    shape = SMALL_SHAPE if args.shape == "small" else {**PRESETS["mini"], "vocab_size": 10000}
    torch.manual_seed(0)
    ours = VaswaniForConditionalGeneration(VaswaniConfig(**shape))
    marian = to_marian(ours)
    ours.train()
    marian.train()
    batch = make_batch(ours.config.vocab_size)
    with torch.no_grad():  # same loss in eval mode (no dropout): the two really compute the same thing
        ours.eval(), marian.eval()
        loss_ours, loss_marian = ours(**batch).loss.item(), marian(**batch).loss.item()
        ours.train(), marian.train()
    precisions = ("fp32", "bf16") if args.precision == "all" else (args.precision,)
    label_smoothing = 0.1 if args.loss == "training" else 0.0
    mallocs = {"as-is": {"": None}, "keep": {"": keep_freed}, "both": {", malloc default": MALLOC_DEFAULT,
                                                                       ", malloc keeps": keep_freed}}[args.malloc]
    systems = {}
    for suffix, malloc in mallocs.items():
        for precision in precisions:  # a fresh copy per system: each has its own trainer, optimizer state, weights
            systems[f"marian{suffix} {precision}"] = step_runner(copy.deepcopy(marian), batch, args.steps, precision,
                                                                 label_smoothing, malloc)
            if precision == "bf16":
                eager = copy.deepcopy(marian)
                eager.set_attn_implementation("eager")
                systems[f"marian eager{suffix} {precision}"] = step_runner(eager, batch, args.steps, precision,
                                                                           label_smoothing, malloc)
            systems[f"ours{suffix} {precision}"] = step_runner(copy.deepcopy(ours), batch, args.steps, precision,
                                                               label_smoothing, malloc)
    tokens = int(batch["labels"].numel())
    print(f"CPU {Hardware.of_this_machine().cpu}; loss {args.loss}; malloc {args.malloc}", file=sys.stderr)
    native, why = native_bf16("cpu")
    if "bf16" in precisions:  # what `training.precision: auto` would choose here, beside the bf16 figures
        print(f"bf16: {why}" + ("" if native else " (training.precision: auto trains in float32 here)"),
              file=sys.stderr)
    print(f"shape {args.shape}; torch {torch.__version__}, {args.threads} threads; {PAIRS} pairs x {LENGTH} tokens = "
          f"{tokens} target tokens/step; {args.repetitions} repetitions x {args.steps} steps", file=sys.stderr)
    for run in systems.values():  # warm-up (allocates Adam state)
        run()
    results = measure(systems, args.repetitions, args.idle_threshold, args.max_wait, args.max_redo,
                      log=lambda m: print(m, file=sys.stderr))

    def rates(name):
        return [tokens * args.steps / s for s in results[name].seconds]

    def rate(name):
        return tokens * args.steps / results[name].median()

    print()
    print("| system | precision | target tok/s (median) | min–max | s/step | vs Marian, same precision | "
          "vs Marian fp32 | disturbed reps |")
    print("|---|---|---|---|---|---|---|---|")
    for name in systems:
        system, precision = name.rsplit(" ", 1)
        suffix = next((s for s in mallocs if s and system.endswith(s)), "")
        same = rate(name) / rate(f"marian{suffix} {precision}")
        fp32 = f"{rate(name) / rate(f'marian{suffix} fp32'):.2f}x" if f"marian{suffix} fp32" in results else "–"
        print(f"| {system} | {precision} | {rate(name):.0f} | {fmt_range(rates(name))} | "
              f"{results[name].median() / args.steps:.3f} | {same:.2f}x | {fp32} | "
              f"{results[name].disturbed}/{len(results[name].seconds)} |")
    print()
    print(f"eval-mode loss on the batch: ours {loss_ours:.6f}, Marian {loss_marian:.6f}")
    disturbed = sum(t.disturbed for t in results.values())
    if disturbed:
        print(f"WARNING: {disturbed} timed runs were disturbed by other processes even after redoing; "
              "treat the figures as rough")
    print("target: training >= 1.25x Marian")
    return 0


if __name__ == "__main__":
    sys.exit(main())
