"""GPU speed: our model vs `MarianMTModel` with identical weights (`vaswani_mt.model.convert.to_marian`), on CUDA.

    python scripts/bench_gpu.py --skip-decoding                              # training: small and base, fp32 and bf16
    python scripts/bench_gpu.py --skip-training --model runs/NAME/model --input test2016.en   # decoding
    python scripts/bench_gpu.py --device cpu --shapes tiny --tokens 512 --reps 1 --limit 8   # smoke run on the CPU

Training step (`--shapes`, presets of VaswaniConfig: `small` = d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8000;
`base` = the paper's base, vocab 37000) on random sentence pairs of `--length` source and target tokens, `--tokens`
target tokens per step (the paper's ~25k), dropout on: each model makes its updates through its own Trainer, as that
Trainer's training loop makes them (`benchmark_common.trainer_updates`): ours through `VaswaniTrainer` with the
training's loss (label smoothing 0.1, §5.4), Marian through transformers' `Seq2SeqTrainer` with its own cross-entropy;
each update is the trainer's `training_step` (forward, loss, backward), the gradient norm the loop logs, the fused
Adam(W) step (betas 0.9/0.98, eps 1e-9) and the schedule's. `fp32`, and `bf16` = the Trainer's `bf16=True`: accelerate's
bfloat16 autocast around the model's forward (on a GPU the output projection included), whose outputs it hands back in
float32, so the loss reads float32 logits, as in a training run (on the CPU smoke path ours computes the projection
inside its loss, under the trainer's own autocast); fp32 weights and optimizer. `--warmup-steps` untimed steps first,
then `--reps` repetitions of `--steps` steps. `--compile` adds both under the Trainer's `torch_compile` (accelerate
compiles the model during the warm-up steps; ours marks the batch dimensions dynamic and compiles its loss beside the
model, as `training.torch_compile` trains). Prints target tokens/s (median, min–max), the ratio to Marian as it comes
(eager) per precision, the model FLOPs per second (`model_flops`: every matrix product of forward and backward,
attention's included) and MFU, their share of the GPU's dense peak for the precision (a table of known GPUs, or
`--peak-tflops`).
`--profile` then prints, per system, where a step's GPU time goes (torch.profiler: kernels by kind, the busiest).

Decoding of a trained model (`--model`: a folder written by `vaswani-mt train`, e.g. runs/NAME/model, or the run
folder; with its tokenizer): the non-empty lines of `--input` (default Multi30k test2016.en beside the repository),
the first `--limit`, sorted by token length (longest first) into batches of `--batch-size` sentences, decoded with the
model's defaults (its length penalty, e.g. 0.6 for the paper's and 1.0 for the Multi30k configs; at most padded
source length + 50 new tokens, passed explicitly so that Marian gets the same limit) greedy (`num_beams=1`) and
beam 4, with the models cast to float32 and to bfloat16. Systems:
`ours` (generate() as shipped: the fast loops in float32; a bfloat16 model decodes with transformers' loops),
`ours, transformers loop` (`use_fast_decoding = False`) and `marian`.
After one warm-up call each, prints seconds and sentences/s (median over `--reps`), the ratio to Marian, and how many
outputs (token ids) equal Marian's and those of transformers' loop; with `--model` the float32 ones must all be
equal (exit code 1 otherwise). Without `--model` nothing is trained: random weights of the small shape on random
source sentences (outputs may then differ on a GPU, where logits are near-tied).

Every repetition runs every system once (A B A B ...), each run ends with `torch.cuda.synchronize()`, after waiting
for other processes to leave the CPU (benchmark_common.measure). The device (GPU or CPU model), torch and transformers
versions are printed beside every table; the tables at the end are Markdown, ready for docs/speed.md. Without a CUDA
device (and `--device cuda`, the default) it says so in one line, measures nothing and exits 0.

Needs vaswani_mt importable, which imports datasets and sacremoses; never imports ctranslate2 or matplotlib. On the
GPU machine copy the input file into the checkout (../shared does not travel) and pass it with --input.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import (  # noqa: E402
    MULTI30K, find_model_folder, fmt_range, measure, model_flops, read_text_lines, trainer_updates)

DEFAULT_INPUT = MULTI30K / "test2016.en"
MODES = (("greedy", 1), ("beam4", 4))
PRECISIONS = ("fp32", "bf16")
DECODERS = ("marian", "ours, transformers loop", "ours")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per system (default: 5)")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-decoding", action="store_true")
    parser.add_argument("--shapes", default="small,base", help="training shapes, presets (default: small,base)")
    parser.add_argument("--precisions", default="fp32,bf16", help="fp32 and/or bf16 (default: both)")
    parser.add_argument("--tokens", type=int, default=25000, help="target tokens per training step (default: 25000)")
    parser.add_argument("--length", type=int, default=25, help="tokens per training sentence (default: 25)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per repetition (default: 10)")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed training steps first (default: 3)")
    parser.add_argument("--compile", action="store_true",
                        help="training: also both models under torch.compile (what training.torch_compile does)")
    parser.add_argument("--profile", action="store_true",
                        help="training: after timing, where each system's GPU time goes (torch.profiler)")
    parser.add_argument("--peak-tflops", type=float,
                        help="the device's dense peak in TFLOP/s for MFU (default: known GPUs' datasheet figure)")
    parser.add_argument("--model", type=Path, help="trained model folder (runs/NAME/model) for decoding")
    parser.add_argument("--input", type=Path, help=f"source sentences, one a line (default: {DEFAULT_INPUT})")
    parser.add_argument("--limit", type=int, help="decode only the first N sentences (random weights: 1000)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per decoding batch (default: 128)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--idle-threshold", type=float, default=1.0, help="max cores other processes may use")
    parser.add_argument("--max-wait", type=float, default=30.0, help="seconds to wait for an idle CPU")
    parser.add_argument("--max-redo", type=int, default=1, help="redos of a disturbed repetition")
    args = parser.parse_args(argv)
    args.shapes, args.precisions = args.shapes.split(","), args.precisions.split(",")
    if unknown := [p for p in args.precisions if p not in PRECISIONS]:
        parser.error(f"unknown precision {unknown[0]!r}; choose from fp32, bf16")
    for name in ("reps", "tokens", "length", "steps", "batch_size", "limit", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.input and not args.model:
        parser.error("--input needs --model (its tokenizer); without --model the sources are random")
    return args


# --- where we run ---------------------------------------------------------------------------------------------


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def environment(device: torch.device) -> str:
    import transformers

    threads = f", {torch.get_num_threads()} CPU threads" if device.type == "cpu" else ""
    return (f"{device_name(device)} ({device.type}{threads}); torch {torch.__version__}, transformers "
            f"{transformers.__version__}, fp32 matmul precision {torch.get_float32_matmul_precision()!r}")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Section(NamedTuple):
    """One measured part: its Markdown table rows, what was measured (the table's caption), and how many timed runs
    other processes disturbed; `fp32_identical`: whether all float32 decoding outputs were the same."""

    rows: list[str]
    caption: str
    disturbed: int
    fp32_identical: bool = True


def median_rates(timings, work: float) -> tuple[float, list[float]]:
    """(work per second at the median time, work per second of every repetition)."""
    return work / timings.median(), [work / s for s in timings.seconds]


# --- training step --------------------------------------------------------------------------------------------

# Dense datasheet peaks in TFLOP/s (bfloat16 tensor cores, float32 without TF32: torch's default "highest" float32
# matmul precision) by a part of the name torch gives the GPU; the SXM parts of the H100 and the H200 share one chip.
PEAK_TFLOPS = {"H100": {"bf16": 989.4, "fp32": 66.9}, "H200": {"bf16": 989.4, "fp32": 66.9},
               "A100": {"bf16": 312.0, "fp32": 19.5}}


def peak_tflops(args, device: torch.device, precision: str) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    name = device_name(device) if device.type == "cuda" else ""
    return next((peaks[precision] for part, peaks in PEAK_TFLOPS.items() if part in name), None)


def training_batch(config, tokens: int, length: int, device: torch.device) -> dict:
    """Random pairs of `length` source and target tokens (ending in </s>), `tokens` target tokens in all."""
    generator = torch.Generator().manual_seed(1)
    shape = (max(1, tokens // length), length)
    input_ids, labels = (torch.randint(4, config.vocab_size, shape, generator=generator) for _ in range(2))
    input_ids[:, -1] = labels[:, -1] = config.eos_token_id
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def training_runner(model, name: str, batch: dict, args, precision: str, device: torch.device):
    """`run(steps=args.steps)`: updates of `model` through its Trainer (`benchmark_common.trainer_updates`); ours with
    the training's label smoothing, Marian with its own loss; compiled when the system's name says so."""
    updates = trainer_updates(copy.deepcopy(model), batch, precision, device,
                              label_smoothing=0.0 if name.startswith("marian") else 0.1,
                              compile=name.endswith("torch.compile"))

    def run(steps: int = args.steps) -> None:
        updates(steps)
    run.trainer = updates.trainer
    return run


def bench_training(args, device: torch.device) -> Section:
    """Rows: shape, precision, system, target tok/s, min–max, s/step, vs Marian, model TFLOP/s, MFU."""
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.model.convert import to_marian

    rows, disturbed = [], 0
    for shape in args.shapes:
        torch.manual_seed(0)
        ours = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(shape)).train()
        models = {"marian": to_marian(ours), "ours": ours}
        if args.compile:  # the Trainer's torch_compile, same weights; compiled during the untimed warm-up
            models.update({f"{name}, torch.compile": model for name, model in list(models.items())})
        batch = training_batch(ours.config, args.tokens, args.length, device)
        pairs, tokens = batch["labels"].shape[0], batch["labels"].numel()
        flops = model_flops(ours.config, pairs, args.length, args.length)
        parameters = sum(p.numel() for p in ours.parameters() if p.requires_grad)
        log(f"training, shape {shape} ({parameters / 1e6:.2f}M parameters): {pairs} pairs x {args.length} tokens = "
            f"{tokens} target tokens/step, {flops / 1e12:.2f} TFLOP/step; {args.reps} reps x {args.steps} steps")
        systems = {}
        for precision in args.precisions:
            for name, model in models.items():
                systems[f"{name} {precision}"] = training_runner(model, name, batch, args, precision, device)
        for run in systems.values():  # allocates Adam state, picks the kernels
            run(args.warmup_steps)
        results = measure(systems, args.reps, args.idle_threshold, args.max_wait, args.max_redo, log=log)
        for precision in args.precisions:
            marian, _ = median_rates(results[f"marian {precision}"], tokens * args.steps)
            peak = peak_tflops(args, device, precision)
            for name in models:
                timings = results[f"{name} {precision}"]
                rate, rates = median_rates(timings, tokens * args.steps)
                achieved = flops * args.steps / timings.median() / 1e12
                rows.append(f"| {shape} | {precision} | {name} | {rate:,.0f} | {fmt_range(rates)} | "
                            f"{timings.median() / args.steps:.4f} | {rate / marian:.2f}x | {achieved:.1f} | "
                            f"{f'{100 * achieved / peak:.1f} %' if peak else '–'} |")
        if args.profile:
            for name, run in systems.items():
                print_profile(f"{shape}, {name}", run, device)
        disturbed += sum(timings.disturbed for timings in results.values())
        del systems, results
        release(device)
    pairs = max(1, args.tokens // args.length)
    peaks = ", ".join(f"{p} {peak_tflops(args, device, p)}" for p in args.precisions if peak_tflops(args, device, p))
    caption = (f"Training step (forward + backward + fused Adam), {environment(device)}; {pairs} pairs x "
               f"{args.length} tokens = {pairs * args.length:,} target tokens/step, median of {args.reps} x "
               f"{args.steps} steps; MFU against the dense peak in TFLOP/s: {peaks or 'unknown (--peak-tflops)'}")
    return Section(rows, caption, disturbed)


# Kernels by kind, by parts of their names (the first kind that matches; cuDNN's attention names "sm90" too).
KERNEL_KINDS = (("attention", ("flash", "fmha", "attention", "sdpa")),
                ("matrix products", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "splitk")),
                ("optimizer", ("adam", "multi_tensor_apply")),
                ("fused by torch.compile", ("triton",)),
                ("softmax and loss", ("softmax", "nll", "cross_entropy")),
                ("layer norm", ("layer_norm", "layernorm", "gammabeta")),
                ("dropout", ("dropout", "bernoulli")))


def print_profile(title: str, run, device: torch.device, steps: int = 3, top: int = 12) -> None:
    """Where `steps` steps of `run` spend the GPU's time: milliseconds per step by kind of kernel and for the
    busiest kernels, and how much of the wall time the GPU was busy."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        print(f"\n{title}: --profile needs a CUDA device")
        return
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        run(steps)
        wall = (time.perf_counter() - started) / steps * 1e3
    kernels: dict[str, float] = {}
    for event in profiler.events():
        if getattr(event, "device_type", None) == DeviceType.CUDA:
            kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time / steps / 1e3
    kinds: dict[str, float] = {}
    for name, ms in kernels.items():
        kind = next((kind for kind, parts in KERNEL_KINDS if any(p in name.lower() for p in parts)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    busy = sum(kernels.values())
    print(f"\n{title}: {wall:.1f} ms per step (profiled), kernels {busy:.1f} ms ({100 * busy / wall:.0f} % busy)")
    for kind, ms in sorted(kinds.items(), key=lambda item: -item[1]):
        print(f"  {ms:7.2f} ms  {kind}")
    for name, ms in sorted(kernels.items(), key=lambda item: -item[1])[:top]:
        print(f"  {ms:7.2f} ms    {name[:110]}")


# --- decoding -------------------------------------------------------------------------------------------------


class Batch(NamedTuple):
    indices: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    max_new_tokens: int


def decoding_sources(args):
    """(model on the CPU in eval mode, token ids of each source sentence, pad id, description)."""
    if args.model is None:
        from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("small")).eval()
        generator = torch.Generator().manual_seed(2)
        lengths = torch.randint(6, 30, (args.limit or 1000,), generator=generator).tolist()
        sources = [torch.randint(4, model.config.vocab_size, (n - 1,), generator=generator).tolist()
                   + [model.config.eos_token_id] for n in lengths]
        return model, sources, model.config.pad_token_id, (
            f"NO --model: random weights of the small shape, nothing trained, {len(sources)} random sources of 6-29 "
            "tokens (outputs may differ on a GPU: near-tied logits)")
    from vaswani_mt.inference.translate import TranslateError, load_model_and_tokenizer

    try:
        folder = find_model_folder(args.model)
    except SystemExit as error:
        raise SystemExit(f"bench_gpu.py: error: {error}") from None
    path = args.input or DEFAULT_INPUT
    if not path.is_file():
        raise SystemExit(f"bench_gpu.py: error: input {path} does not exist (give --input FILE)")
    try:
        model, tokenizer = load_model_and_tokenizer(str(folder), "cpu")
    except TranslateError as error:
        raise SystemExit(f"bench_gpu.py: error: {error}") from None
    lines = [line for line in read_text_lines(path) if line.strip()][: args.limit]
    if not lines:
        raise SystemExit(f"bench_gpu.py: error: {path} has no sentences")
    sources = tokenizer(lines, truncation=True, max_length=model.config.max_position_embeddings)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    return model, sources, pad, f"model {folder}, {path}, {len(sources)} sentences"


def make_batches(sources: list[list[int]], batch_size: int, pad: int, limit: int, device) -> list[Batch]:
    """Sentences sorted longest first, in groups of `batch_size`, right-padded, on `device`; each with the model's
    default output limit: padded source length + 50 new tokens, at most `limit` (max_position_embeddings)."""
    from vaswani_mt.model.modeling_vaswani import OUTPUT_LENGTH_MARGIN

    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    batches = []
    for start in range(0, len(order), batch_size):
        indices = order[start: start + batch_size]
        width = len(sources[indices[0]])
        input_ids = torch.full((len(indices), width), pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, i in enumerate(indices):
            input_ids[row, : len(sources[i])] = torch.tensor(sources[i])
            attention_mask[row, : len(sources[i])] = 1
        batches.append(Batch(indices, input_ids.to(device), attention_mask.to(device),
                             min(width + OUTPUT_LENGTH_MARGIN, limit)))
    return batches


def decoding_runner(model, batches: list[Batch], beams: int, device: torch.device):
    def run() -> list[torch.Tensor]:
        with torch.no_grad():
            outputs = [model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                      num_beams=beams, max_new_tokens=batch.max_new_tokens) for batch in batches]
        synchronize(device)
        return outputs

    return run


def per_sentence(outputs: list[torch.Tensor], batches: list[Batch], pad: int) -> list[tuple[int, ...]]:
    """Each sentence's output ids in input order, without the trailing padding."""
    result: list[tuple[int, ...]] = [()] * sum(len(batch.indices) for batch in batches)
    for batch, output in zip(batches, outputs):
        for i, row in zip(batch.indices, output.tolist()):
            while row and row[-1] == pad:
                row.pop()
            result[i] = tuple(row)
    return result


def decoding_models(model, precision: str, device: torch.device) -> dict:
    """The three systems' models, cast to the precision, on the device (Marian built on the CPU from fp32)."""
    from vaswani_mt.model.convert import to_marian

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    ours = copy.deepcopy(model).to(device, dtype).eval()
    ours.use_fast_decoding = True
    transformers_loop = copy.deepcopy(ours)
    transformers_loop.use_fast_decoding = False
    marian = to_marian(model).to(device, dtype).eval()
    return {"marian": marian, "ours, transformers loop": transformers_loop, "ours": ours}


def same_outputs(outputs: dict, system: str, peer: str) -> int:
    return sum(a == b for a, b in zip(outputs[system], outputs[peer]))


def decoding_rows(results: dict, outputs: dict, suffix: str, sentences: int) -> list[str]:
    """Markdown rows of one decoding mode and precision (`suffix`, e.g. "beam4 fp32"): speed, and how many
    outputs equal Marian's and those of transformers' loop."""
    rows = []
    marian_rate, _ = median_rates(results[f"marian {suffix}"], sentences)
    mode, precision = suffix.split()
    for name in DECODERS:
        rate, rates = median_rates(results[f"{name} {suffix}"], sentences)
        counts = [f"{same_outputs(outputs, f'{name} {suffix}', f'{peer} {suffix}')}/{sentences}" if peer != name
                  else "–" for peer in ("marian", "ours, transformers loop")]
        rows.append(f"| {precision} | {mode} | {name} | {results[f'{name} {suffix}'].median():.3f} | {rate:.1f} | "
                    f"{fmt_range(rates)} | {rate / marian_rate:.2f}x | {' | '.join(counts)} |")
    return rows


def bench_decoding(args, setup, device: torch.device) -> Section:
    """Rows: precision, mode, system, seconds, sent/s, min–max, vs Marian, outputs equal to Marian's and to those
    of transformers' loop."""
    model, sources, pad, description = setup
    log(f"decoding: {description}; batches of {args.batch_size}; {args.reps} reps")
    batches = make_batches(sources, args.batch_size, pad, model.config.max_position_embeddings, device)
    rows, fp32_identical, disturbed = [], True, 0
    for precision in args.precisions:
        models = decoding_models(model, precision, device)
        systems = {f"{name} {mode} {precision}": decoding_runner(models[name], batches, beams, device)
                   for mode, beams in MODES for name in DECODERS}
        outputs = {name: per_sentence(run(), batches, pad) for name, run in systems.items()}  # also the warm-up
        results = measure(systems, args.reps, args.idle_threshold, args.max_wait, args.max_redo, log=log)
        for mode, _ in MODES:
            rows += decoding_rows(results, outputs, f"{mode} {precision}", len(sources))
            fp32_identical &= precision != "fp32" or all(
                outputs[f"{name} {mode} {precision}"] == outputs[f"marian {mode} {precision}"] for name in DECODERS)
        disturbed += sum(timings.disturbed for timings in results.values())
        del models, systems, results
        release(device)
    caption = (f"Decoding, {environment(device)}; {description}; batches of {args.batch_size} sentences sorted by "
               f"length, the model's defaults (length penalty {model.generation_config.length_penalty}, source "
               f"length + 50), median of {args.reps}")
    return Section(rows, caption, disturbed, fp32_identical)


# --- report ---------------------------------------------------------------------------------------------------


TRAINING_HEADER = ("| shape | precision | system | target tok/s (median) | min–max | s/step | vs Marian | "
                   "model TFLOP/s | MFU |")
DECODING_HEADER = ("| precision | mode | system | seconds | sent/s (median) | min–max | vs Marian | = Marian | "
                   "= transformers loop |")


def print_tables(command: str, sections: list[tuple[str, Section]]) -> None:
    print(f"\n`python scripts/bench_gpu.py {command}`".rstrip() + "\n")
    for header, section in sections:
        print(f"{section.caption}:\n")
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        print("\n".join(section.rows) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise SystemExit(f"bench_gpu.py: error: --device {args.device}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"bench_gpu.py: no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False); "
              "nothing measured")
        return 0
    from vaswani_mt.model.configuration_vaswani import PRESETS

    if unknown := [shape for shape in args.shapes if shape not in PRESETS]:
        raise SystemExit(f"bench_gpu.py: error: unknown shape {unknown[0]!r}; choose from {', '.join(PRESETS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = None if args.skip_decoding else decoding_sources(args)  # bad --model / --input: fail before training
    log(environment(device))
    sections = []
    if not args.skip_training:
        sections.append((TRAINING_HEADER, bench_training(args, device)))
    if setup is not None:
        sections.append((DECODING_HEADER, bench_decoding(args, setup, device)))
    print_tables(" ".join(sys.argv[1:] if argv is None else argv), sections)
    if disturbed := sum(section.disturbed for _, section in sections):
        print(f"WARNING: {disturbed} timed runs were disturbed by other processes on the CPU even after redoing; "
              "treat the figures as rough")
    if not all(section.fp32_identical for _, section in sections):
        if args.model is not None:
            print("FAIL: in float32 some outputs differ between ours, transformers' loop and Marian")
            return 1
        print("note: float32 outputs differ somewhere; with random weights near-tied logits can do that")
    return 0


if __name__ == "__main__":
    sys.exit(main())
