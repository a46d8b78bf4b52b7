"""Label-smoothed cross-entropy (paper §5.4), checked against a brute-force smoothed distribution."""

import pytest
import torch
import torch.nn.functional as F

from vaswani_mt.model.modeling_vaswani import label_smoothed_cross_entropy
from vaswani_mt.recipe import loss as recipe_loss
from vaswani_mt.recipe.loss import blockwise_label_smoothed_cross_entropy, training_loss

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


# The training loss (blockwise on CPU) and the model's own function (one log_softmax) meet the same specification.
BOTH = pytest.mark.parametrize("loss_function", [training_loss, label_smoothed_cross_entropy],
                               ids=["training_loss", "models_loss"])


@BOTH
@pytest.mark.parametrize("pad_token_id", [None, PAD])
@pytest.mark.parametrize("epsilon", [0.1, 0.3])
def test_matches_brute_force_smoothed_distribution(epsilon, pad_token_id, loss_function):
    logits, labels = _batch()
    loss, nll, count = loss_function(logits, labels, epsilon, pad_token_id=pad_token_id)
    expected_loss, expected_nll, expected_count = _brute_force(logits, labels, epsilon, pad_token_id=pad_token_id)
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(nll, expected_nll)
    assert count.item() == expected_count.item() == labels.ne(-100).sum().item()


def test_epsilon_zero_equals_cross_entropy_sum_exactly():
    logits, labels = _batch()
    loss, nll, _ = training_loss(logits, labels, epsilon=0.0)
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
    assert torch.equal(loss, expected) and torch.equal(nll, expected)


@BOTH
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


@BOTH
def test_ignored_positions_with_infinite_logits_do_not_poison_the_sum_or_the_gradient(loss_function):
    logits, labels = _batch(seed=3)
    logits[0, -1] = float("-inf")  # position 0,-1 is ignored (-100)
    logits[0, -1, 0] = 0.0
    logits.requires_grad_()
    loss, nll, _ = loss_function(logits, labels, 0.1)
    (loss + nll).backward()
    assert torch.isfinite(loss) and torch.isfinite(nll) and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pad_token_id", [None, PAD])
def test_blockwise_training_loss_equals_the_models_loss_in_value_and_gradient(monkeypatch, dtype, pad_token_id):
    """Blocks of 3 rows over 4 x 9 positions: several blocks and a short last one. Both outputs carry gradient."""
    monkeypatch.setattr(recipe_loss, "BLOCK_ELEMENTS", 3 * VOCAB)
    logits, labels = _batch(seed=6, shape=(4, 9), dtype=dtype)
    labels[1, 0] = PAD
    blockwise, reference = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss, nll, count = blockwise_label_smoothed_cross_entropy(blockwise, labels, 0.1, pad_token_id=pad_token_id)
    expected_loss, expected_nll, expected_count = label_smoothed_cross_entropy(reference, labels, 0.1,
                                                                              pad_token_id=pad_token_id)
    (0.7 * loss + 0.3 * nll).backward()
    (0.7 * expected_loss + 0.3 * expected_nll).backward()
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(nll, expected_nll)
    assert count.item() == expected_count.item()
    assert blockwise.grad.dtype == dtype  # the gradient comes back in the logits' dtype (bf16 under autocast)
    torch.testing.assert_close(blockwise.grad.float(), reference.grad.float(), rtol=1e-2 if dtype == torch.bfloat16
                               else 1.3e-6, atol=1e-5)


@pytest.mark.parametrize("epsilon,blockwise", [(0.1, True), (0.0, False)])
def test_the_training_loss_is_computed_block_by_block_on_cpu_when_smoothing(monkeypatch, epsilon, blockwise):
    calls = []

    def recorded(*args, **kwargs):
        calls.append(args)
        return blockwise_label_smoothed_cross_entropy(*args, **kwargs)

    monkeypatch.setattr(recipe_loss, "blockwise_label_smoothed_cross_entropy", recorded)
    logits, labels = _batch(seed=8)
    torch.testing.assert_close(training_loss(logits, labels, epsilon, pad_token_id=PAD),
                               label_smoothed_cross_entropy(logits, labels, epsilon, pad_token_id=PAD))
    assert len(calls) == blockwise


def test_training_loss_of_float32_logits_leaves_the_logits_unchanged():
    logits, labels = _batch(seed=7)
    before = logits.clone()
    logits.requires_grad_()
    training_loss(logits, labels, 0.1, pad_token_id=PAD)[0].backward()
    assert torch.equal(logits.detach(), before)


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
