"""The float32 training step of the `mini` shape against routes that might bring it nearer the CPU's limit, each
timed beside the step as shipped, alternated in one process, on the CPU at hand.

    python scripts/bench_step_routes.py                        # every route
    python scripts/bench_step_routes.py --routes products ops  # some of them
    python scripts/bench_step_routes.py --quick                # 2 rounds of 1 step: a check that it runs

Routes (what docs/speed.md reports for each CPU kind):
  products  the step's matrix products, forward and backward, through each library torch ships for float32 on a
            CPU: MKL (`torch.mm`, what `nn.Linear` and the loss call) and oneDNN (`torch.ops.mkldnn._linear_pointwise`,
            the kernel inductor's CPU fusions call), in GFLOP/s, beside torch.mm 2048³; the step can only gain from a
            library that is faster on its own shapes.
  blocks    the step with the loss's row blocks (`vaswani_mt.recipe.loss.BLOCK_ELEMENTS`) at 128 to 4,096 rows of the
            10,000-token vocabulary.
  compiled  the step with each encoder and decoder layer compiled (`torch.compile`, static shapes: the best case of
            a batch whose lengths are bucketed so that shapes repeat; the loss and the output projection outside
            it), after its compilation, whose seconds are printed apart.
  layout    the step with the attention's activations made in the layout its products take: queries, keys and
            values projected head by head straight into [heads x batch, length, size] (one batched product per
            projection instead of a product and a copy that moves the heads), the output projection summed over the
            heads; the same loss and gradients (checked before timing, without dropout).
  ops       where the step's time goes: every operation timed as it runs (a TorchDispatchMode, wall-clock, no
            profiler), grouped: the products, the copies that change the heads' layout, the dropout masks' random
            bits and the rest. A step that moves less memory can save at most the time of the copies and the masks'
            separate calls.

The step is the trainer's update (`benchmark_common.trainer_updates`: `VaswaniTrainer`'s loss with the output
projection inside it, its Adam) on `bench_training.py`'s batch (266 pairs x 15 tokens, 3,990 target tokens), float32,
label smoothing 0.1, 2 threads, glibc's malloc keeping freed memory as `vaswani-mt train` sets it. Each variant
trains its own copy of the same weights; rounds alternate the variants (A B C A B C ...) after waiting for other
processes to go quiet; the median s/step and its share of the float32 `torch.mm` 2048³ rate in model FLOPs
(`benchmark_common.model_flops`) are printed with the CPU's model and flags.
"""

from __future__ import annotations

import argparse
import collections
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import LENGTH, PAIRS, make_batch, set_malloc  # noqa: E402
from benchmark_common import (CPU_FLAGS, cpu_flags, cpuinfo, fmt_range, measure, model_flops,  # noqa: E402
                              trainer_updates)

ROUTES = ("products", "blocks", "compiled", "layout", "ops")
BLOCK_ROWS = (128, 256, 512, 1024, 2048, 4096)


def cpu_line() -> str:
    from vaswani_mt.run_record import Hardware

    flags = cpu_flags()
    shown = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    return (f"CPU {Hardware.of_this_machine().cpu} (family {cpuinfo('cpu family') or '?'} model "
            f"{cpuinfo('model') or '?'}; {shown}; torch capability {torch.backends.cpu.get_cpu_capability()}); "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def best_seconds(function, repetitions: int = 7) -> float:
    function()
    best = float("inf")
    for _ in range(repetitions):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def mm_rate() -> float:
    """float32 torch.mm 2048³ in GFLOP/s, the fastest of 7."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return 2 * 2048**3 / best_seconds(lambda: torch.mm(a, b)) / 1e9


def step_products(config, tokens: int, block_rows: int) -> list[tuple[str, int, int, int]]:
    """(what, rows, inner, columns) of the step's products: y = x W^T forward, dx = dy W and dW = dy^T x backward."""
    d, ffn, vocab = config.d_model, config.encoder_ffn_dim, config.vocab_size
    shapes = []
    for name, fan_in, fan_out in (("attention projection", d, d), ("feed-forward in", d, ffn),
                                  ("feed-forward out", ffn, d)):
        shapes += [(f"{name}, forward", tokens, fan_in, fan_out), (f"{name}, input gradient", tokens, fan_out, fan_in),
                   (f"{name}, weight gradient", fan_out, tokens, fan_in)]
    shapes += [(f"loss block of {block_rows}: logits", block_rows, d, vocab),
               (f"loss block of {block_rows}: hidden gradient", block_rows, vocab, d),
               (f"loss block of {block_rows}: weight gradient", vocab, block_rows, d)]
    return shapes


def products_table(config, tokens: int) -> None:
    """GFLOP/s of each product of the step through MKL and oneDNN (both given the weight as nn.Linear holds it)."""
    print("\n| product | rows x inner x columns | MKL (torch.mm) GFLOP/s | oneDNN GFLOP/s | oneDNN / MKL |")
    print("|---|---|---|---|---|")
    from vaswani_mt.recipe.loss import BLOCK_ELEMENTS

    rows = [("torch.mm 2048³", 2048, 2048, 2048)] + step_products(config, tokens, BLOCK_ELEMENTS // config.vocab_size)
    for what, m, k, n in rows:
        x, weight = torch.randn(m, k), torch.randn(n, k)  # weight [out, in], as nn.Linear's
        flops = 2 * m * k * n
        mkl = flops / best_seconds(lambda: torch.mm(x, weight.t())) / 1e9
        onednn = flops / best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")) / 1e9
        print(f"| {what} | {m} x {k} x {n} | {mkl:.0f} | {onednn:.0f} | {onednn / mkl:.2f} |")


class OpClock(torch.utils._python_dispatch.TorchDispatchMode):
    """Wall-clock seconds per aten operation, summed by name."""

    def __init__(self):
        super().__init__()
        self.seconds = collections.Counter()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        result = func(*args, **(kwargs or {}))
        self.seconds[func.__name__] += time.perf_counter() - start
        self.calls[func.__name__] += 1
        return result


PRODUCT_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul")
LAYOUT_OPS = ("clone", "copy_", "_unsafe_view", "view", "transpose", "contiguous", "_to_copy")


def ops_table(run, steps: int) -> None:
    """Where `steps` updates spend their time, by operation and by group."""
    clock = OpClock()
    start = time.perf_counter()
    with clock:
        run(steps)
    wall = (time.perf_counter() - start) / steps
    inside = sum(clock.seconds.values()) / steps
    groups = collections.Counter()
    for name, seconds in clock.seconds.items():
        base = name.split(".")[0]
        group = ("products" if base in PRODUCT_OPS else "layout copies" if base in LAYOUT_OPS
                 else "random bits" if base.startswith("random") else "element-wise and the rest")
        groups[group] += seconds / steps
    print(f"\nops: {wall * 1000:.0f} ms a step, {inside * 1000:.0f} ms inside operations, "
          f"{(wall - inside) * 1000:.0f} ms between them")
    print("| group | ms per step | share of the step |")
    print("|---|---|---|")
    for group, seconds in groups.most_common():
        print(f"| {group} | {seconds * 1000:.1f} | {seconds / wall:.1%} |")
    print("| operation | calls per step | ms per step |")
    print("|---|---|---|")
    for name, seconds in clock.seconds.most_common(20):
        print(f"| {name} | {clock.calls[name] // steps} | {seconds / steps * 1000:.1f} |")


def with_block_rows(run, rows: int, vocab: int):
    """`run` with the loss's blocks at `rows` rows, the module's setting put back after."""
    from vaswani_mt.recipe import loss

    def blocked(steps=None):
        kept = loss.BLOCK_ELEMENTS
        loss.BLOCK_ELEMENTS = rows * vocab
        try:
            return run() if steps is None else run(steps)
        finally:
            loss.BLOCK_ELEMENTS = kept
    return blocked


def compile_layers(model) -> None:
    """Each encoder and decoder layer's forward compiled with static shapes."""
    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        layer.forward = torch.compile(layer.forward, dynamic=False)


def heads_major_forward(self, hidden_states, key_value_states=None, attention_mask=None, cache=None, **kwargs):
    """`VaswaniAttention.forward` for training without a cache or attention weights, with queries, keys and values
    made in the [heads x batch, length, size] layout of the attention's batched products (no copy moving the
    heads) and the output projection as one batched product per head, summed."""
    batch, length, d_model = hidden_states.shape
    heads = self.num_heads
    source = hidden_states if key_value_states is None else key_value_states

    def project(x, linear):  # [heads, batch * length, size]: x W_h^T + b_h for each head h, one batched product
        weight = linear.weight.view(heads, -1, d_model).transpose(1, 2)
        flat = x.reshape(1, -1, d_model).expand(heads, -1, -1)
        return torch.baddbmm(linear.bias.view(heads, 1, -1), flat, weight)

    query = project(hidden_states, self.q_proj).view(heads * batch, length, -1)
    keys = project(source, self.k_proj).view(heads * batch, source.shape[1], -1)
    values = project(source, self.v_proj).view(heads * batch, source.shape[1], -1)
    scores = (torch.bmm(query, keys.transpose(1, 2)) * self.scaling).view(heads, batch, length, -1)
    mask = attention_mask
    if mask is None and self.is_causal and length > 1:
        mask = torch.ones(length, scores.shape[-1], dtype=torch.bool).tril(scores.shape[-1] - length)
    elif mask is not None:
        mask = mask.transpose(0, 1)  # [batch, 1, q, k] -> [1, batch, q, k], against [heads, batch, q, k]
    if mask is not None:
        scores = (scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool
                  else scores + mask)
    from vaswani_mt.model.modeling_vaswani import attention_softmax

    weights = attention_softmax(scores).to(query.dtype).view(heads * batch, length, -1)
    output = torch.bmm(weights, values).view(heads, batch * length, -1)
    out_weight = self.out_proj.weight.view(d_model, heads, -1).permute(1, 2, 0)  # [heads, size, d_model]
    projected = torch.bmm(output, out_weight).sum(0) + self.out_proj.bias
    return projected.view(batch, length, d_model), None


def heads_major(model) -> None:
    """Every attention of `model` (a copy) made in the heads-major layout of `heads_major_forward`."""
    import types

    from vaswani_mt.model.modeling_vaswani import VaswaniAttention

    for module in model.modules():
        if isinstance(module, VaswaniAttention):
            module.forward = types.MethodType(heads_major_forward, module)


def same_loss_and_gradients(model, variant, batch) -> float:
    """The largest relative difference between `model`'s and `variant`'s loss and gradients on `batch`, both
    without dropout (eval mode's forward, gradients taken); a parameter's gradient difference relative to the whole
    gradient's norm."""
    differences = []
    results = []
    for each in (model, variant):
        each.eval()
        each.zero_grad()
        loss = each(**batch).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in each.named_parameters()
                                        if p.grad is not None}))
        each.zero_grad()
        each.train()
    (loss_a, grads_a), (loss_b, grads_b) = results
    differences.append(((loss_a - loss_b).abs() / loss_a.abs()).item())
    # against the whole gradient's norm: the keys' biases have a gradient of exactly 0 (softmax ignores a shift) and
    # rounding noise of ~1e-10 in both, which a difference relative to their own norm would count as 100 %
    total = torch.stack([grad.norm() for grad in grads_a.values()]).norm()
    differences += [((grad - grads_b[name]).norm() / total).item() for name, grad in grads_a.items()]
    return max(differences)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--rounds", type=int, default=8, help="alternated rounds per variant")
    parser.add_argument("--steps", type=int, default=2, help="updates per timed round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 step, short idle waits")
    parser.add_argument("--dropout", type=float, default=None,
                        help="every dropout of the model at this rate (default: the preset's, 0.3); 0 shows what the "
                             "random masks cost each variant")
    parser.add_argument("--idle-threshold", type=float, default=0.1, help="max cores other processes may use")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 1
    max_wait = 10.0 if args.quick else 120.0
    torch.set_num_threads(args.threads)

    from vaswani_mt import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.recipe.host_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    set_malloc(MMAP_THRESHOLD, TRIM_THRESHOLD)
    torch.manual_seed(0)
    shape = {**PRESETS["mini"], "vocab_size": 10000}
    if args.dropout is not None:
        shape.update(dropout=args.dropout, attention_dropout=args.dropout, activation_dropout=args.dropout)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**shape))
    model.train()
    config, batch = model.config, make_batch(model.config.vocab_size)
    tokens = PAIRS * LENGTH
    flops = model_flops(config, PAIRS, LENGTH, LENGTH)
    cpu_rate = mm_rate()
    print(cpu_line())
    print(f"float32 torch.mm 2048³: {cpu_rate:.0f} GFLOP/s; the step: {PAIRS} pairs x {LENGTH} tokens = {tokens} "
          f"target tokens, {flops / 1e9:.1f} GFLOP of model FLOPs; dropout {config.dropout}, attention dropout "
          f"{config.attention_dropout}, activation dropout {config.activation_dropout}")

    if "products" in args.routes:
        products_table(config, tokens)

    def runner(variant_model):
        return trainer_updates(variant_model, batch, "fp32", "cpu", label_smoothing=0.1)

    variants: dict = {}
    compile_seconds = None
    if {"blocks", "compiled", "layout"} & set(args.routes):
        variants["as shipped"] = runner(copy.deepcopy(model))
    if "blocks" in args.routes:
        from vaswani_mt.recipe.loss import BLOCK_ELEMENTS

        shipped = BLOCK_ELEMENTS // config.vocab_size
        for rows in BLOCK_ROWS:
            if rows != shipped:
                variants[f"loss blocks of {rows} rows"] = with_block_rows(runner(copy.deepcopy(model)), rows,
                                                                          config.vocab_size)
    if "compiled" in args.routes:
        compiled = copy.deepcopy(model)
        compile_layers(compiled)
        variants["layers compiled"] = runner(compiled)
        start = time.perf_counter()
        variants["layers compiled"](1)  # compiles
        compile_seconds = time.perf_counter() - start
    if "layout" in args.routes:
        moved = copy.deepcopy(model)
        heads_major(moved)
        print(f"heads-major attention: loss and gradients within {same_loss_and_gradients(model, moved, batch):.1e} "
              "(relative) of the shipped attention's, without dropout")
        variants["attention in heads-major layout"] = runner(moved)
    if variants:
        for run in variants.values():  # warm-up: Adam's state, the allocator's pools
            run(1)
        timed = {name: (lambda run=run: run(args.steps)) for name, run in variants.items()}
        results = measure(timed, args.rounds, args.idle_threshold, max_wait, max_redo=2,
                          log=lambda line: print(line, file=sys.stderr))
        base = results["as shipped"].median()
        print("\n| variant | s/step (median) | min–max | target tok/s | share of torch.mm 2048³ | vs as shipped | "
              "disturbed |")
        print("|---|---|---|---|---|---|---|")
        for name, timing in results.items():
            per_step = timing.median() / args.steps
            share = flops / per_step / 1e9 / cpu_rate
            print(f"| {name} | {per_step:.3f} | {fmt_range([s / args.steps for s in timing.seconds])} | "
                  f"{tokens / per_step:.0f} | {share:.0%} | {base / timing.median():.3f}x | "
                  f"{timing.disturbed}/{len(timing.seconds)} |")
        if compile_seconds is not None:
            print(f"layers compiled: the first update (compilation included) took {compile_seconds:.1f} s")
    if "ops" in args.routes:
        run = runner(copy.deepcopy(model))
        run(1)
        ops_table(run, max(2, args.steps))
    print(f"\nmedian of {args.rounds} alternated rounds of {args.steps} updates; {cpu_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
