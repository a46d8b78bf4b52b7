"""R-Drop (Liang et al., NeurIPS 2021, "R-Drop: Regularized Dropout for Neural Networks"; not in the paper):
`training.rdrop_alpha`.

Each training batch goes through the model twice, with independent dropout masks (one forward pass over the batch
stacked on itself: :func:`duplicated`), and the loss adds to the two passes' label-smoothed cross-entropy (§5.4) the
symmetric KL divergence between their output distributions, target token by target token::

    loss = ½ (CE₁ + CE₂) + (α / 4) (KL(p₁‖p₂) + KL(p₂‖p₁))

summed over the counted target tokens of one copy and divided, as the plain loss is, by their number. Against the
authors' fairseq criterion (both copies' cross-entropy summed, plus α times the mean of the two KL directions) this is
the same loss up to a constant factor, which Adam ignores: α means what their ``--reg-alpha`` means (5 in their
translation runs). Both directions carry gradient into both passes, as theirs do. Validation and test decode once,
as always. A step costs about twice a plain one, so under a time budget a run makes about half the updates.

Two implementations, as for the plain loss (`recipe/loss.py`): :func:`rdrop_label_smoothed_cross_entropy` of the
logits, through autograd (GPUs, compiled runs), and :func:`projected_rdrop_label_smoothed_cross_entropy` of the
decoder's hidden states, with the output projection (§3.4) inside it, block by block of rows, and the gradient
computed in the forward pass (CPU). For a pair of rows z₁, z₂ (the same target token in both passes), with
p = softmax(z), d = log p₁ - log p₂ and q the smoothed target::

    ∂loss/∂z₁ = ½ (p₁ - q) + (α / 4) (p₁ ⊙ (d - KL(p₁‖p₂) + 1) - p₂)
    ∂loss/∂z₂ = ½ (p₂ - q) + (α / 4) (p₂ ⊙ (-d - KL(p₂‖p₁) + 1) - p₁)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.modeling_vaswani import check_loss_arguments, label_smoothed_cross_entropy
from .loss import _counted_targets, _row_blocks, save_gradients, scaled_gradients

__all__ = ["duplicated", "projected_rdrop_label_smoothed_cross_entropy", "rdrop_label_smoothed_cross_entropy"]


def duplicated(inputs: dict) -> dict:
    """The batch stacked on itself (each tensor's rows twice, along the batch dimension): one forward pass of it is
    the two passes of R-Drop, each row with its own dropout masks."""
    return {name: torch.cat([value, value]) if isinstance(value, torch.Tensor) else value
            for name, value in inputs.items()}


def _halves(tensor: torch.Tensor, labels: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if tensor.shape[0] != 2 * labels.shape[0] or tensor.shape[1:-1] != labels.shape[1:]:
        raise ValueError(f"{what} must hold the batch twice (duplicated): shape (2 * {labels.shape[0]}, "
                         f"{', '.join(map(str, labels.shape[1:]))}, ...), got {tuple(tensor.shape)}")
    return tensor.chunk(2)


def rdrop_label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The R-Drop loss (module docstring) of `logits` ``[2B, ..., V]``, the two passes of a batch whose targets are
    `labels` ``[B, ...]``, through autograd. Returns ``(loss_sum, nll_sum, num_tokens)`` as
    `label_smoothed_cross_entropy` does for one pass: sums over the counted tokens of one copy (``nll_sum``: the mean
    of the two passes'), and their number."""
    first, second = _halves(logits, labels, "logits")
    smoothed_1, nll_1, num_tokens = label_smoothed_cross_entropy(first, labels, epsilon, ignore_index, pad_token_id)
    smoothed_2, nll_2, _ = label_smoothed_cross_entropy(second, labels, epsilon, ignore_index, pad_token_id)
    _, counted, _ = _counted_targets(labels, logits.shape[-1], epsilon, ignore_index, pad_token_id)
    vocab_size = logits.shape[-1]
    log_p1 = F.log_softmax(first.float(), dim=-1).reshape(-1, vocab_size)[counted]
    log_p2 = F.log_softmax(second.float(), dim=-1).reshape(-1, vocab_size)[counted]
    difference = log_p1 - log_p2
    kl_both = (log_p1.exp() * difference).sum() - (log_p2.exp() * difference).sum()  # KL(p1||p2) + KL(p2||p1)
    loss_sum = 0.5 * (smoothed_1 + smoothed_2) + 0.25 * alpha * kl_both
    return loss_sum, (0.5 * (nll_1 + nll_2)).detach(), num_tokens


def projected_rdrop_label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rdrop_label_smoothed_cross_entropy(hidden_states @ weight.T + bias, labels, alpha, ...)`` with the output
    projection computed inside the loss, block by block of row pairs (module docstring), as
    `projected_label_smoothed_cross_entropy` does for one pass. `hidden_states`: ``[2B, ..., d_model]``, the batch
    twice; `labels`: ``[B, ...]``; `bias`: a fixed ``[V]`` (or ``[1, V]``) bias without gradient."""
    if bias is not None and bias.requires_grad:
        raise ValueError("bias must be fixed (a buffer such as final_logits_bias): its gradient is not computed")
    _halves(hidden_states, labels, "hidden_states")
    vocab_size = weight.shape[0]
    if hidden_states.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden_states' last dimension must be weight's d_model: got {tuple(hidden_states.shape)} "
                         f"and weight {tuple(weight.shape)}")
    check_loss_arguments(torch.empty((*labels.shape, vocab_size), device="meta"), labels, epsilon, pad_token_id)
    targets, counted, delta = _counted_targets(labels, vocab_size, epsilon, ignore_index, pad_token_id)
    compute = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden_states.dtype
    loss_sum, nll_sum = _ProjectedRDrop.apply(
        hidden_states, weight, None if bias is None else bias.reshape(-1), targets, counted, alpha, epsilon, delta,
        pad_token_id, compute)
    return loss_sum, nll_sum, counted.sum()


class _ProjectedRDrop(torch.autograd.Function):
    """The loss of each pair of counted rows (row r of the first pass, row r of the second) and its gradients with
    respect to both rows' hidden states and the weight, computed in the forward pass block by block and scaled by
    the incoming gradient in the backward pass (`recipe/loss.py`'s `_ProjectedSmoothedCrossEntropy`, for two)."""

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, targets, counted, alpha, epsilon, delta, pad_token_id, compute):
        d_model, vocab_size = weight.shape[1], weight.shape[0]
        rows = counted.nonzero().squeeze(1)
        pairs = torch.cat([rows, rows + counted.numel()])  # the first pass's rows, then the same in the second's
        with torch.autocast("cpu", enabled=False):
            flat = hidden_states.reshape(-1, d_model)
            hidden_1, hidden_2 = flat.index_select(0, rows).to(compute), flat.index_select(0, pairs[len(rows):])
            hidden_2 = hidden_2.to(compute)
            weights, wanted = weight.to(compute), targets.index_select(0, rows)
            bias = None if bias is None else bias.to(compute)
            grad_hidden = torch.empty(2 * len(rows), d_model, dtype=torch.float32)
            grad_weight = torch.zeros(vocab_size, d_model, dtype=torch.float32)
            loss_sum = torch.zeros((), dtype=torch.float32)
            nll_sum = torch.zeros((), dtype=torch.float32)
            for block in _row_blocks(len(rows), vocab_size):
                logits_1, logits_2 = torch.mm(hidden_1[block], weights.t()), torch.mm(hidden_2[block], weights.t())
                if bias is not None:
                    logits_1, logits_2 = logits_1 + bias, logits_2 + bias
                nll, loss, grad_1, grad_2 = _pair_block(logits_1, logits_2, wanted[block, None], alpha, epsilon,
                                                        delta, pad_token_id)
                nll_sum += nll
                loss_sum += loss
                second = slice(block.start + len(rows), block.stop + len(rows))
                for grad, hidden, out in ((grad_1, hidden_1[block], block), (grad_2, hidden_2[block], second)):
                    grad = grad.to(compute)
                    grad_hidden[out] = torch.mm(grad, weights)
                    grad_weight += torch.mm(grad.t(), hidden)
        save_gradients(ctx, hidden_states, grad_hidden, grad_weight, pairs, nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        return (*scaled_gradients(ctx, grad_loss), None, None, None, None, None, None, None, None)


def _pair_block(logits_1, logits_2, target, alpha, epsilon, delta, pad_token_id):
    """(Σ nll, Σ loss, ∂loss/∂z₁, ∂loss/∂z₂ in float32) of a block of row pairs (the module docstring's formulas)."""
    log_p1 = torch.log_softmax(logits_1, 1, dtype=torch.float32)
    log_p2 = torch.log_softmax(logits_2, 1, dtype=torch.float32)
    p1, p2 = log_p1.exp(), log_p2.exp()
    difference = log_p1 - log_p2
    kl_12 = torch.linalg.vecdot(p1, difference, dim=1)
    kl_21 = -torch.linalg.vecdot(p2, difference, dim=1)
    nll_1, nll_2 = -log_p1.gather(1, target).squeeze(1), -log_p2.gather(1, target).squeeze(1)
    smoothed = (1.0 - epsilon - delta) * (nll_1 + nll_2) - delta * (log_p1.sum(1) + log_p2.sum(1))
    if pad_token_id is not None:
        smoothed = smoothed + delta * (log_p1[:, pad_token_id] + log_p2[:, pad_token_id])
    quarter = 0.25 * alpha
    loss = 0.5 * smoothed + quarter * (kl_12 + kl_21)
    grad_1 = difference.sub(kl_12[:, None]).add_(1.0).mul_(quarter).add_(0.5).mul_(p1).sub_(p2, alpha=quarter)
    grad_2 = difference.neg_().sub_(kl_21[:, None]).add_(1.0).mul_(quarter).add_(0.5).mul_(p2).sub_(p1, alpha=quarter)
    for grad in (grad_1, grad_2):  # - ½ q: ½ (1 - ε) on the target, ½ δ elsewhere, nothing on padding
        grad.sub_(0.5 * delta).scatter_add_(1, target, grad.new_full(target.shape, -0.5 * (1.0 - epsilon - delta)))
        if pad_token_id is not None:
            grad[:, pad_token_id] += 0.5 * delta
    return 0.5 * (nll_1 + nll_2).sum(), loss.sum(), grad_1, grad_2
