"""Label-smoothed cross-entropy (paper §5.4), checked against a brute-force smoothed distribution."""

import pytest
import torch
import torch.nn.functional as F

from vaswani_mt.model.modeling_vaswani import label_smoothed_cross_entropy
from vaswani_mt.recipe import loss as recipe_loss
from vaswani_mt.recipe.loss import projected_label_smoothed_cross_entropy, smoothed_cross_entropy_of_logits

VOCAB = 11
PAD = 1


def _brute_force(logits, labels, epsilon, ignore_index=-100, pad_token_id=None):
    """Builds the full smoothed target distribution q per token (what the fast path avoids)."""
    vocab = logits.shape[-1]
    log_probs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)
    labels = labels.reshape(-1)
    counted = labels != ignore_index
    if pad_token_id is not None:
        counted &= labels != pad_token_id
    log_probs, labels = log_probs[counted], labels[counted]
    others = vocab - (2 if pad_token_id is not None else 1)
    q = torch.full_like(log_probs, epsilon / others)
    if pad_token_id is not None:
        q[:, pad_token_id] = 0.0
    q.scatter_(1, labels[:, None], 1.0 - epsilon)
    assert torch.allclose(q.sum(-1), torch.ones(len(q)))
    loss = -(q * log_probs).sum()
    nll = -log_probs.gather(1, labels[:, None]).sum()
    return loss, nll, counted.sum()


def _batch(seed=0, shape=(3, 7), dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(*shape, VOCAB, generator=generator)).to(dtype)
    labels = torch.randint(2, VOCAB, shape, generator=generator)
    labels[0, -3:] = -100  # padded label positions, as DataCollatorForSeq2Seq produces
    labels[2, -1] = -100
    return logits, labels


def training_loss(logits, labels, epsilon=0.1, **kwargs):
    """The training loss on CPU, with the output projection inside it, over an identity projection: the hidden
    states are the logits, and so is their gradient."""
    return projected_label_smoothed_cross_entropy(logits, torch.eye(logits.shape[-1]), labels, epsilon, **kwargs)


# The training losses (the projection inside, on CPU; the gradient in the forward pass, for compiled runs) and the
# model's own function (one log_softmax) meet the same specification.
EVERY_LOSS = pytest.mark.parametrize(
    "loss_function", [training_loss, label_smoothed_cross_entropy, smoothed_cross_entropy_of_logits],
    ids=["training_loss", "models_loss", "gradient_in_forward"])


@EVERY_LOSS
@pytest.mark.parametrize("pad_token_id", [None, PAD])
@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_matches_brute_force_smoothed_distribution(epsilon, pad_token_id, loss_function):
    logits, labels = _batch()
    loss, nll, count = loss_function(logits, labels, epsilon, pad_token_id=pad_token_id)
    expected_loss, expected_nll, expected_count = _brute_force(logits, labels, epsilon, pad_token_id=pad_token_id)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(nll, expected_nll)
    assert count.item() == expected_count.item() == labels.ne(-100).sum().item()


def test_epsilon_zero_equals_cross_entropy_sum():
    logits, labels = _batch()
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
    loss, nll, _ = label_smoothed_cross_entropy(logits, labels, epsilon=0.0)
    assert torch.equal(loss, expected) and torch.equal(nll, expected)  # the model's function: exactly
    loss, nll, _ = training_loss(logits, labels, epsilon=0.0)
    torch.testing.assert_close((loss, nll), (expected, expected))


@EVERY_LOSS
@pytest.mark.parametrize("pad_token_id", [None, PAD])
def test_gradient_matches_brute_force(pad_token_id, loss_function):
    logits, labels = _batch(seed=1)
    fast_input = logits.clone().requires_grad_()
    slow_input = logits.clone().requires_grad_()
    loss_function(fast_input, labels, 0.1, pad_token_id=pad_token_id)[0].backward()
    _brute_force(slow_input, labels, 0.1, pad_token_id=pad_token_id)[0].backward()
    torch.testing.assert_close(fast_input.grad, slow_input.grad)


def test_ignored_and_pad_positions_get_no_loss_and_zero_gradient():
    logits, labels = _batch(seed=2)
    labels[1, 0] = PAD  # a label equal to the pad id is skipped like -100
    logits = logits.requires_grad_()
    loss, _, count = training_loss(logits, labels, 0.1, pad_token_id=PAD)
    loss.backward()
    skipped = (labels == -100) | (labels == PAD)
    assert count.item() == (~skipped).sum().item()
    assert torch.all(logits.grad[skipped] == 0)
    assert torch.all(logits.grad[~skipped].abs().sum(-1) > 0)


@EVERY_LOSS
def test_ignored_positions_with_infinite_logits_do_not_poison_the_sum_or_the_gradient(loss_function):
    logits, labels = _batch(seed=3)
    logits[0, -1] = float("-inf")  # position 0,-1 is ignored (-100)
    logits[0, -1, 0] = 0.0
    logits.requires_grad_()
    loss, nll, _ = loss_function(logits, labels, 0.1)
    (loss + nll if nll.requires_grad else loss).backward()
    assert torch.isfinite(loss) and torch.isfinite(nll) and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("pad_token_id", [None, PAD])
def test_the_loss_with_the_projection_inside_equals_the_models_loss_on_its_logits_in_value_and_gradient(
        monkeypatch, autocast, pad_token_id, with_bias):
    """Blocks of 3 rows over the counted ones of 4 x 9 positions: several blocks and a short last one. Under bfloat16
    autocast both compute the projection in bfloat16 and the softmax in float32."""
    monkeypatch.setattr(recipe_loss, "BLOCK_ELEMENTS", 3 * VOCAB)
    generator = torch.Generator().manual_seed(6)
    hidden = torch.randn(4, 9, 5, generator=generator)
    weight = torch.randn(VOCAB, 5, generator=generator)
    bias = torch.randn(VOCAB, generator=generator) if with_bias else None
    _, labels = _batch(seed=6, shape=(4, 9))
    labels[1, 0] = PAD
    ours = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, nll, count = projected_label_smoothed_cross_entropy(*ours, labels, 0.1, pad_token_id=pad_token_id,
                                                                  bias=bias)
        logits = F.linear(*theirs) + (bias if with_bias else 0)
        expected_loss, expected_nll, expected_count = label_smoothed_cross_entropy(logits, labels, 0.1,
                                                                                  pad_token_id=pad_token_id)
    loss.backward()
    expected_loss.backward()
    tolerance = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((loss, nll), (expected_loss, expected_nll), **tolerance)
    assert count.item() == expected_count.item() and not nll.requires_grad
    for mine, reference in zip(ours, theirs):
        assert mine.grad.dtype == reference.grad.dtype == torch.float32
        torch.testing.assert_close(mine.grad, reference.grad, **tolerance)


def test_the_projected_loss_skips_ignored_rows_and_refuses_a_bias_with_a_gradient():
    hidden, weight = torch.randn(2, 3, 4), torch.randn(VOCAB, 4)
    labels = torch.tensor([[2, -100, -100], [-100, -100, -100]])
    hidden.requires_grad_()
    loss, _, count = projected_label_smoothed_cross_entropy(hidden, weight, labels, 0.1)
    loss.backward()
    assert count.item() == 1 and torch.all(hidden.grad[labels == -100] == 0)
    with pytest.raises(ValueError, match="bias must be fixed"):
        projected_label_smoothed_cross_entropy(hidden, weight, labels, 0.1, bias=torch.zeros(VOCAB,
                                                                                             requires_grad=True))


class _LargestTensor(torch.overrides.TorchFunctionMode):
    """While inside: the most elements of a tensor that a torch function called from Python returned, in memory
    (tensors on the meta device hold none)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, tuple) else (result,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                self.largest = max(self.largest, tensor.numel())
        return result


def test_the_projected_loss_and_its_gradient_make_no_tensor_of_the_whole_batchs_logits():
    """Rows beyond one block (`BLOCK_ELEMENTS`): its largest tensors are a block's logits, not [tokens, V] ones,
    and the checks of its arguments need no tensor of that size either."""
    vocab, rows = 10_000, 3 * (recipe_loss.BLOCK_ELEMENTS // 10_000)
    hidden = torch.randn(rows, 8, requires_grad=True)
    weight = torch.randn(vocab, 8, requires_grad=True)
    labels = torch.randint(2, vocab, (rows,))
    with _LargestTensor() as seen:
        loss, _, _ = projected_label_smoothed_cross_entropy(hidden, weight, labels, 0.1, pad_token_id=PAD)
        loss.backward()
    assert seen.largest <= recipe_loss.BLOCK_ELEMENTS < rows * vocab


def test_sum_over_half_batches_divided_by_total_tokens_equals_full_batch_mean():
    """The gradient-accumulation / data-parallel property: normalise once by the global token count."""
    logits, labels = _batch(seed=4, shape=(4, 9))
    labels[0, 2:] = -100  # the halves have very different token counts
    full_loss, _, full_count = training_loss(logits, labels, 0.1, pad_token_id=PAD)
    halves = [
        training_loss(logits[rows], labels[rows], 0.1, pad_token_id=PAD)
        for rows in (slice(0, 2), slice(2, 4))
    ]
    total_tokens = sum(count for _, _, count in halves)
    assert total_tokens == full_count
    accumulated = sum(loss / total_tokens for loss, _, _ in halves)
    torch.testing.assert_close(accumulated, full_loss / full_count)
    # whereas averaging per-micro-batch means would not be the full-batch mean
    mean_of_means = sum(loss / count for loss, _, count in halves) / 2
    assert not torch.allclose(mean_of_means, full_loss / full_count)


def test_bfloat16_logits_are_computed_in_float32():
    logits, labels = _batch(seed=5)
    loss, nll, _ = training_loss(logits.bfloat16(), labels, 0.1, pad_token_id=PAD)
    expected, _, _ = _brute_force(logits.bfloat16().float(), labels, 0.1, pad_token_id=PAD)
    assert loss.dtype == torch.float32 and nll.dtype == torch.float32
    torch.testing.assert_close(loss, expected)


def test_smoothed_loss_exceeds_nll_for_a_confident_correct_model():
    labels = torch.tensor([[3, 4, 5]])
    logits = torch.full((1, 3, VOCAB), -10.0)
    logits[0, torch.arange(3), labels[0]] = 10.0
    loss, nll, _ = training_loss(logits, labels, 0.1)
    assert loss > nll  # over-confidence is penalised (§5.4 "hurts perplexity")


@pytest.mark.parametrize("epsilon", [-0.1, 1.0, 1.5])
def test_epsilon_outside_unit_interval_is_rejected(epsilon):
    logits, labels = _batch()
    with pytest.raises(ValueError, match="epsilon"):
        training_loss(logits, labels, epsilon)


def test_shape_mismatch_names_both_shapes():
    logits, labels = _batch()
    with pytest.raises(ValueError, match=r"\(3, 7, 11\).*\(3, 6\)"):
        training_loss(logits, labels[:, :6])


def test_pad_id_outside_vocabulary_is_rejected():
    logits, labels = _batch()
    with pytest.raises(ValueError, match="pad_token_id"):
        training_loss(logits, labels, pad_token_id=VOCAB)


def test_the_compiled_loss_of_compiled_runs_is_the_loss_and_gradient_of_the_eager_one():
    from vaswani_mt.recipe.loss import compiled_label_smoothed_cross_entropy

    torch.manual_seed(0)
    labels = torch.randint(0, 50, (3, 7))
    labels[0, -2:] = -100
    labels[1, -1] = 1  # the padding id
    for loss in (label_smoothed_cross_entropy, compiled_label_smoothed_cross_entropy()):
        logits = torch.randn(3, 7, 50, requires_grad=True)
        with torch.no_grad():
            logits.copy_(torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(1)))
        loss_sum, nll_sum, tokens = loss(logits, labels, epsilon=0.1, pad_token_id=1)
        loss_sum.backward()
        if loss is label_smoothed_cross_entropy:
            expected = (loss_sum.detach(), nll_sum.detach(), tokens, logits.grad)
    torch.testing.assert_close((loss_sum.detach(), nll_sum.detach(), tokens, logits.grad), expected)
    assert compiled_label_smoothed_cross_entropy() is compiled_label_smoothed_cross_entropy()  # compiled once


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gradient_in_the_forward_pass_is_the_models_loss_and_gradient_in_the_logits_dtype(dtype):
    """Compiled, as a compiled run computes it; bfloat16 logits give a bfloat16 gradient (autograd's dtype too)."""

    logits, labels = _batch(seed=3, dtype=dtype)
    results = []
    for loss in (label_smoothed_cross_entropy, torch.compile(smoothed_cross_entropy_of_logits, dynamic=True)):
        scores = logits.detach().clone().requires_grad_()
        loss_sum, nll_sum, tokens = loss(scores, labels, epsilon=0.1, pad_token_id=PAD)
        (loss_sum / tokens).backward()
        results.append((loss_sum.detach(), nll_sum.detach(), tokens, scores.grad))
    assert results[1][3].dtype == dtype
    tolerance = {} if dtype == torch.float32 else {"atol": 1e-3, "rtol": 1e-2}
    torch.testing.assert_close(results[1], results[0], **tolerance)
