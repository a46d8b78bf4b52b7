"""VaswaniDropout: the model's dropout (§5.4) with a cheaper CPU mask behaves like nn.Dropout."""

import pytest
import torch

from vaswani_mt.model.modeling_vaswani import VaswaniDropout


def test_dropout_drops_the_configured_fraction_and_keeps_the_expectation():
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = VaswaniDropout(0.1).train()(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - 6554 / 65536)))  # p rounded to 6554/65536
    assert abs(y.mean().item() - 1.0) < 0.003


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_the_dropped_positions_are_independent_of_the_position_within_a_64_bit_word(p):
    torch.manual_seed(1)
    y = VaswaniDropout(p).train()(torch.ones(400_000, 4))
    per_lane = (y == 0).float().mean(dim=0)  # column j = 16-bit slice j of each random word
    assert torch.allclose(per_lane, torch.full((4,), p), atol=0.005)


def test_dropout_is_the_identity_in_eval_mode_and_for_p_zero():
    x = torch.randn(7, 5)
    assert torch.equal(VaswaniDropout(0.3).eval()(x), x)
    assert torch.equal(VaswaniDropout(0.0).train()(x), x)
    assert torch.equal(VaswaniDropout(1.0).train()(x), torch.zeros_like(x))


def test_dropout_follows_the_torch_seed():
    x = torch.randn(33, 17)  # an element count that is not a multiple of 4
    torch.manual_seed(5)
    a = VaswaniDropout(0.2).train()(x)
    torch.manual_seed(5)
    b = VaswaniDropout(0.2).train()(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, VaswaniDropout(0.2).train()(x))


def test_dropout_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    y = VaswaniDropout(0.25).train()(x)
    y.sum().backward()
    kept = y.detach() != 0
    assert torch.allclose(x.grad[kept], torch.tensor(1 / 0.75))
    assert torch.equal(x.grad[~kept], torch.zeros_like(x.grad[~kept]))


def test_dropout_keeps_bfloat16_activations_in_bfloat16():
    torch.manual_seed(3)
    y = VaswaniDropout(0.1).train()(torch.ones(100, 100, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16


def test_the_model_uses_it_for_embeddings_residuals_and_the_feed_forward(make_tiny_model):
    model = make_tiny_model()
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(isinstance(m, VaswaniDropout) for m in dropouts)
