"""Shared helpers of the benchmark scripts: the shape, identical-weight model pairs, and timing that is honest on a
small shared machine (see /work/shared/notes/benchmarks.md).

Noise control: before each repetition we wait until the *other* processes use less than `--idle-threshold` cores
(measured from /proc/stat minus our own CPU time), and a repetition during which they used more is discarded and
redone (up to `--max-redo` times; after that it is kept and counted as disturbed, and the report says so).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

SMALL_SHAPE = dict(
    d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=8000, dropout=0.1,
)


MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def find_model_folder(path: Path) -> Path:
    """A saved model folder given as itself or as the `vaswani-mt train` run folder holding it (`model/`)."""
    for candidate in (path, path / "model"):
        if (candidate / "config.json").is_file():
            return candidate
    raise SystemExit(f"no saved model in {path} or {path / 'model'} (no config.json)")


def read_text_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def read_test_set(source: Path, reference: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """The lines of a source file and of its reference translations (the first `limit` pairs); SystemExit naming both
    files when their line counts differ."""
    sources, references = read_text_lines(source), read_text_lines(reference)
    if len(sources) != len(references):
        raise SystemExit(f"{source} has {len(sources)} lines but {reference} has {len(references)}")
    return (sources[:limit], references[:limit]) if limit else (sources, references)


# The flags that decide which kernels a CPU runs: printed beside every figure.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo ("model name", "cpu family", "flags"...), or None."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.split(":", 1)[0].strip() == field and ":" in line)
    except (OSError, StopIteration):
        return None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), printed beside every figure: ratios differ between CPUs."""
    return cpuinfo("model name") or "unknown CPU"


def cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo lists (empty where it cannot be read)."""
    return set((cpuinfo("flags") or "").split())


def _cpu_busy_seconds() -> tuple[float, float]:
    """(busy CPU-seconds of the whole machine, wall-clock seconds) from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / ticks, time.monotonic()


# Helper processes of the benchmark itself (e.g. the CTranslate2 worker): their CPU time is ours, not "other load".
HELPER_PIDS: set[int] = set()


def _process_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _own_cpu_seconds() -> float:
    times = os.times()
    helpers = sum(_process_cpu_seconds(pid) for pid in HELPER_PIDS)
    return times.user + times.system + times.children_user + times.children_system + helpers


class LoadMonitor:
    """Measures how many cores *other* processes use: machine busy time minus this process's CPU time."""

    def __init__(self):
        self._start = None

    def start(self) -> None:
        self._start = (*_cpu_busy_seconds(), _own_cpu_seconds())

    def other_cores(self) -> float:
        busy0, wall0, own0 = self._start
        busy1, wall1 = _cpu_busy_seconds()
        own1 = _own_cpu_seconds()
        elapsed = max(wall1 - wall0, 1e-6)
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed


def wait_for_idle(threshold: float, max_wait: float, sample: float = 0.5) -> float:
    """Sleep until other processes use < `threshold` cores over a `sample`-second window, or `max_wait` passed.
    Returns the last measured load."""
    deadline = time.monotonic() + max_wait
    monitor = LoadMonitor()
    while True:
        monitor.start()
        time.sleep(sample)
        load = monitor.other_cores()
        if load < threshold or time.monotonic() >= deadline:
            return load


@dataclass
class Timings:
    name: str
    seconds: list[float] = field(default_factory=list)
    disturbed: int = 0
    redone: int = 0

    def median(self) -> float:
        return statistics.median(self.seconds)


def measure(systems: dict, repetitions: int, threshold: float, max_wait: float, max_redo: int,
            log=print) -> dict[str, Timings]:
    """Run every callable in `systems` once per repetition, in the same order each time (A B A B ...), after
    waiting for an idle machine; redo a run that other processes disturbed. Returns wall-clock seconds per system."""
    results = {name: Timings(name) for name in systems}
    monitor = LoadMonitor()
    for repetition in range(repetitions):
        for name, run in systems.items():
            for attempt in range(max_redo + 1):
                load_before = wait_for_idle(threshold, max_wait)
                monitor.start()
                start = time.perf_counter()
                run()
                elapsed = time.perf_counter() - start
                load = monitor.other_cores()
                quiet = load < threshold and load_before < threshold
                if quiet or attempt == max_redo:
                    results[name].seconds.append(elapsed)
                    results[name].disturbed += not quiet
                    results[name].redone += attempt
                    break
            log(f"  rep {repetition + 1}/{repetitions} {name:<28} {elapsed:7.3f} s  other load {load:.2f} cores"
                f"{'' if quiet else '  (disturbed)'}")
    return results


def fmt_range(values: list[float]) -> str:
    return f"{min(values):.1f}–{max(values):.1f}"


def model_flops(config, pairs: float, source_length: float, target_length: float) -> float:
    """FLOPs of one training step (forward and backward: 3x the forward's) of `pairs` sentence pairs: 2 per weight
    of each matrix product per token it multiplies (encoder layers per source token; decoder layers and the output
    projection over the vocabulary per target token; embedding lookups are no products) and attention's two
    products, Q K^T and its weights times V, per query and key."""
    d, heads = config.d_model, config.encoder_attention_heads
    d_k, d_v = config.head_sizes(heads)
    attention = d * heads * (2 * d_k + d_v) + heads * d_v * d  # the four projections' weights
    encoder_layer = attention + 2 * d * config.encoder_ffn_dim
    decoder_layer = 2 * attention + 2 * d * config.decoder_ffn_dim
    per_pair = (2 * source_length * config.encoder_layers * encoder_layer
                + 2 * target_length * (config.decoder_layers * decoder_layer + config.vocab_size * d)
                + 2 * heads * (d_k + d_v) * (config.encoder_layers * source_length ** 2
                                             + config.decoder_layers * target_length * (target_length + source_length)))
    return 3.0 * pairs * per_pair


def trainer_updates(model, batch: dict, precision: str, device, label_smoothing: float = 0.1,
                    compile: bool = False, work_dir: str | None = None):
    """A function `run(steps)` that makes `steps` updates of `model` on `batch` as its Trainer's training loop makes
    them: our model through `VaswaniTrainer` (its `compute_loss`: on CPU the output projection inside the loss, under
    the run's autocast), any other (`MarianMTModel`) through transformers' `Seq2SeqTrainer` (`label_smoothing` > 0:
    its `LabelSmoother`, else the model's own loss), each with the Adam betas 0.9/0.98 and epsilon 1e-9.

    `precision` ("fp32", "bf16", "fp16") and `compile` are the Trainer's `bf16`, `fp16` and `torch_compile`. The
    model and its optimizer are prepared by the trainer's accelerator as `train()` prepares them (bf16/fp16: autocast
    around the forward and its outputs handed back in float32; fp16: the grad scaler; `compile`: the compiled model);
    each update is `trainer.training_step` (loss and backward), the gradient norm the loop logs, the optimizer's and
    the schedule's step and `zero_grad`, as in transformers 5.24's `_inner_training_loop`. Build each system's runner
    right before the next: accelerate reads some settings from a process-wide state that the newest trainer sets."""
    import tempfile

    import torch
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    device = torch.device(device)
    threads = torch.get_num_threads()
    settings = dict(output_dir=work_dir or tempfile.mkdtemp(prefix="bench-trainer-"), use_cpu=device.type == "cpu",
                    bf16=precision == "bf16", fp16=precision == "fp16", torch_compile=compile, report_to=[],
                    disable_tqdm=True, save_strategy="no", eval_strategy="no", dataloader_pin_memory=False,
                    adam_beta2=0.98, adam_epsilon=1e-9, weight_decay=0.0, max_grad_norm=0.0)
    labels = batch["labels"]
    if isinstance(model, VaswaniForConditionalGeneration):
        args = VaswaniTrainingArguments(**settings, label_smoothing=label_smoothing, budget_minutes=None,
                                        cooldown_steps=0, warmup_steps=4000)
        trainer = VaswaniTrainer(model=model, args=args)
    else:  # Seq2SeqTrainer's collator gives the model its decoder inputs; the label smoother pops the labels
        args = Seq2SeqTrainingArguments(**settings, label_smoothing_factor=label_smoothing)
        trainer = Seq2SeqTrainer(model=model, args=args)
        batch = {**batch, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=labels)}
    torch.set_num_threads(threads)
    trainer.create_optimizer_and_scheduler(num_training_steps=10 ** 6)
    prepared, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = prepared
    trainer.current_gradient_accumulation_steps = 1
    batch = {name: tensor.to(trainer.args.device) for name, tensor in batch.items()}
    num_items = (labels != -100).sum().to(trainer.args.device)  # the Trainer's count: labels not ignored

    def run(steps: int) -> None:
        for _ in range(steps):
            trainer.training_step(prepared, batch, num_items)
            trainer.accelerator.clip_grad_norm_(prepared.parameters(), float("inf"))  # the norm the loop logs
            trainer.optimizer.step()
            if not trainer.accelerator.optimizer_step_was_skipped:
                trainer.lr_scheduler.step()
            prepared.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run.trainer, run.model = trainer, prepared
    return run
