"""scripts/bench_step_routes.py times the float32 step beside its routes to the CPU's limit: what it compares must be
the step's own products and the loss as it ships, whatever a variant changed for its run."""

import importlib.util
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("bench_step_routes", SCRIPTS / "bench_step_routes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_onednn_product_of_the_table_computes_what_torch_mm_computes():
    x, weight = torch.randn(37, 16), torch.randn(24, 16)
    onednn = torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    torch.testing.assert_close(onednn, torch.mm(x, weight.t()), rtol=1e-5, atol=1e-5)


def test_step_products_are_the_layers_products_forward_and_backward_and_the_loss_blocks():
    from vaswani_mt import PRESETS, VaswaniConfig

    config = VaswaniConfig(**{**PRESETS["mini"], "vocab_size": 10000})
    shapes = _script().step_products(config, tokens=3990, block_rows=512)
    flops = {what: 2 * m * k * n for what, m, k, n in shapes}
    for name in ("attention projection", "feed-forward in", "feed-forward out"):
        forward = flops[f"{name}, forward"]
        assert flops[f"{name}, input gradient"] == flops[f"{name}, weight gradient"] == forward
    assert {(m, k, n) for what, m, k, n in shapes if what.startswith("loss block")} == {
        (512, 128, 10000), (512, 10000, 128), (10000, 512, 128)}


def test_a_loss_block_variant_runs_with_its_rows_and_puts_the_shipped_blocks_back_even_when_it_fails():
    from vaswani_mt.recipe import loss

    shipped, seen = loss.BLOCK_ELEMENTS, []

    def run(steps=None):
        seen.append(loss.BLOCK_ELEMENTS)
        if steps == "fail":
            raise RuntimeError("a failing update")

    blocked = _script().with_block_rows(run, 2048, 10000)
    blocked(1)
    assert seen == [2048 * 10000] and loss.BLOCK_ELEMENTS == shipped
    with pytest.raises(RuntimeError):
        blocked("fail")
    assert loss.BLOCK_ELEMENTS == shipped


def test_the_op_clock_counts_and_times_each_operation_by_name():
    clock = _script().OpClock()
    a = torch.randn(64, 64)
    start = time.perf_counter()
    with clock:
        for _ in range(3):
            torch.mm(a, a)
        (a + 1).relu()
    wall = time.perf_counter() - start
    assert clock.calls["mm.default"] == 3 and clock.calls["add.Tensor"] == 1 and clock.calls["relu.default"] == 1
    assert 0 < sum(clock.seconds.values()) <= wall


def test_the_heads_major_attention_trains_with_the_shipped_attentions_loss_and_gradients():
    import copy

    from vaswani_mt import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**{**PRESETS["tiny"], "vocab_size": 64}))
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 64, (6, 9), generator=generator)
    labels = torch.randint(4, 64, (6, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[:2, -3:] = 0  # padding: the masks reach the heads-major layout too
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    routes = _script()
    variant = copy.deepcopy(model)
    routes.heads_major(variant)
    assert routes.same_loss_and_gradients(model, variant, batch) < 1e-5
    broken = copy.deepcopy(model)
    routes.heads_major(broken)
    broken.model.encoder.layers[0].self_attn.scaling *= 2  # a wrong attention is seen
    assert routes.same_loss_and_gradients(model, broken, batch) > 1e-3
