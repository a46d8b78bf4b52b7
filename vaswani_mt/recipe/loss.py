"""The training loss: label-smoothed cross-entropy (Vaswani et al. 2017, §5.4: ε_ls = 0.1), computed block by
block on CPU.

The loss itself is the model's `label_smoothed_cross_entropy` (`vaswani_mt.model.modeling_vaswani`, one
``log_softmax`` of the whole logits). This module holds the same function computed block by block of rows
(:func:`blockwise_label_smoothed_cross_entropy`, for CPU) and :func:`training_loss`, the one place that picks
between the two for `VaswaniTrainer`. Below: the formulation both compute, and why the block-wise kernel exists.

Formulation
-----------
For a target token ``y`` over a vocabulary of ``V`` classes, the model is trained against the
smoothed distribution ``q``:

* the target class gets ``1 - ε``;
* every other class gets ``δ = ε / (V - 2)`` when a padding id is given -- padding itself gets
  0, since it is never a valid prediction -- or ``δ = ε / (V - 1)`` without a padding id;

and the loss per target token is the cross-entropy ``-Σ_c q_c log p_c``. Positions whose label
is ``ignore_index`` (or the padding id) contribute nothing, neither loss nor gradient.

To avoid building a ``V``-sized ``q`` per token, the sum is rewritten (pad id given)::

    Σ_c q_c log p_c = (1 - ε) log p_y + δ Σ_{c ∉ {y, pad}} log p_c
                    = (1 - ε - δ) log p_y + δ Σ_c log p_c - δ log p_pad

(without a pad id the last term is absent). Only the per-token sum of log-probabilities, the
target log-probability and the pad log-probability are needed.

Reduction
---------
Everything is SUMMED over the non-ignored positions and returned together with the token count.
The caller divides by the number of target tokens in the whole optimizer batch (all
gradient-accumulation micro-batches, all processes -- the Trainer's ``num_items_in_batch``).
Dividing each micro-batch by its own count and averaging micro-batches would weight tokens of
short micro-batches more; summing and dividing once makes accumulation and data-parallel
training exactly equal to one big batch.

Relation to other implementations
---------------------------------
* The Annotated Transformer's ``LabelSmoothing`` builds the same ``q`` (``ε / (V - 2)``, pad
  column and pad rows zeroed) and uses ``KLDivLoss(reduction="sum")``. KL(q‖p) is this
  cross-entropy minus the entropy of ``q``, a constant that does not depend on the model, so
  the gradients are identical; only the reported value differs (KL reaches 0, cross-entropy
  bottoms out at H(q)).
* transformers' ``Trainer(label_smoothing_factor=ε)`` uses ``LabelSmoother``:
  ``(1 - ε)·NLL + ε·mean_c(-log p_c)`` where the mean runs over ALL ``V`` classes, target and
  padding included. Its ``q`` therefore puts ``1 - ε + ε/V`` on the target and ``ε/V`` on every
  other class including padding -- slightly different mass from the paper's recipe. In
  transformers 5.23 it divides by the Trainer's ``num_items_in_batch`` when given and by the
  micro-batch's own token count otherwise, and takes log_softmax in the logits' dtype.
* ``nll_sum`` (the unsmoothed negative log-likelihood) is returned as well, because perplexity
  should be reported from it, not from the smoothed loss.

Memory on CPU
-------------
The model's function takes a float32 ``log_softmax`` of the whole ``[tokens, V]`` logits; autograd then keeps it,
zero-fills two more ``[tokens, V]`` gradients (``nll_loss`` and the pad column) and casts the result back to bfloat16
under autocast: 164 MB per tensor at a 10,000-token vocabulary and 4,096-token batches, several times that with a WMT
vocabulary. The block-wise kernel computes the same sums and their gradient ``p - q`` block by block of rows, straight
from the logits as they come (bfloat16 under autocast), and recomputes the float32 probabilities backward instead of
keeping them. When it was written it took the peak memory of a CPU training process on Multi30k batches from 2.77 GB
to 2.04 GB at the same speed (2-core AMD EPYC, `mini` shape; ``scripts/bench_training.py --loss training``).
:func:`training_loss` uses it on CPU with ε > 0; elsewhere (CUDA, ``torch.compile``, ε = 0) the model's function runs
as it is.
"""

from __future__ import annotations

import torch

from ..model.modeling_vaswani import check_loss_arguments, label_smoothed_cross_entropy

__all__ = ["blockwise_label_smoothed_cross_entropy", "training_loss"]

# Rows per block: 64 rows of a 10,000-token vocabulary are 2.5 MB of float32, the size of a core's L2 and L3 share.
BLOCK_ELEMENTS = 64 * 10_000


def training_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss_sum, nll_sum, num_tokens)`` of `label_smoothed_cross_entropy` (same arguments and errors), as
    `VaswaniTrainer` computes it: block by block on CPU when ε > 0, the model's function as it is elsewhere."""
    blockwise = epsilon > 0.0 and logits.device.type == "cpu" and not torch.compiler.is_compiling()
    loss = blockwise_label_smoothed_cross_entropy if blockwise else label_smoothed_cross_entropy
    return loss(logits, labels, epsilon, ignore_index=ignore_index, pad_token_id=pad_token_id)


def blockwise_label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's `label_smoothed_cross_entropy` (arguments, results, errors), computed block by block of rows of
    CPU logits without keeping ``[tokens, V]`` float32 tensors for the backward pass (module docstring)."""
    check_loss_arguments(logits, labels, epsilon, pad_token_id)
    vocab_size = logits.shape[-1]
    targets = labels.reshape(-1)
    counted = targets != ignore_index
    if pad_token_id is not None:
        counted &= targets != pad_token_id
    delta = epsilon / (vocab_size - (2 if pad_token_id is not None else 1))
    safe_targets = targets.masked_fill(~counted, 0)  # ignored rows read column 0 and are masked out
    loss_sum, nll_sum = _BlockwiseSmoothedCrossEntropy.apply(
        logits.reshape(-1, vocab_size), safe_targets, counted, epsilon, delta, pad_token_id)
    return loss_sum, nll_sum, counted.sum()


def _row_blocks(rows: int, vocab_size: int):
    step = max(1, BLOCK_ELEMENTS // vocab_size)
    return (slice(start, min(start + step, rows)) for start in range(0, rows, step))


class _BlockwiseSmoothedCrossEntropy(torch.autograd.Function):
    """Per counted row, with p = softmax(logits): ``nll = -log p_y``,
    ``loss = (1 - ε - δ) nll + δ Σ_c -log p_c - δ (-log p_pad)``, and
    ``d loss / d logits = p - q`` (q: 1 - ε on y, δ elsewhere, 0 on pad), ``d nll / d logits = p - onehot(y)``.
    (log_)softmax, not exp: torch.exp on CPU is an order of magnitude slower where its results fall below float32's
    normal range, as most of a trained model's probabilities do (docs/speed.md)."""

    @staticmethod
    def forward(ctx, logits, targets, counted, epsilon, delta, pad_token_id):
        rows, vocab_size = logits.shape
        target_log_prob = torch.empty(rows, dtype=torch.float32)
        sum_log_probs = torch.empty(rows, dtype=torch.float32)
        pad_log_prob = torch.zeros(rows, dtype=torch.float32)
        for block in _row_blocks(rows, vocab_size):
            log_probs = torch.log_softmax(logits[block], dim=-1, dtype=torch.float32)
            target_log_prob[block] = log_probs.gather(1, targets[block, None]).squeeze(1)
            torch.sum(log_probs, dim=-1, out=sum_log_probs[block])
            if pad_token_id is not None:
                pad_log_prob[block] = log_probs[:, pad_token_id]
        nll_rows = -target_log_prob
        loss_rows = (1.0 - epsilon - delta) * nll_rows - delta * (sum_log_probs - pad_log_prob)
        # where (not multiplication by the mask): ignored rows may hold infinite logits.
        zero = torch.zeros((), dtype=torch.float32)
        ctx.save_for_backward(logits, targets, counted)
        ctx.epsilon, ctx.delta, ctx.pad_token_id = epsilon, delta, pad_token_id
        return torch.where(counted, loss_rows, zero).sum(), torch.where(counted, nll_rows, zero).sum()

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, targets, counted = ctx.saved_tensors
        zero = torch.zeros((), dtype=torch.float32)
        grad_loss = zero if grad_loss is None else grad_loss.float()
        grad_nll = zero if grad_nll is None else grad_nll.float()
        scale = torch.where(counted, grad_loss + grad_nll, zero)[:, None]  # times p
        shift = torch.where(counted, grad_loss * ctx.delta, zero)[:, None]  # δ on every class ...
        at_target = torch.where(counted, grad_loss * (1.0 - ctx.epsilon - ctx.delta) + grad_nll, zero)[:, None]
        grad = torch.empty_like(logits)
        for block in _row_blocks(*logits.shape):
            g = torch.softmax(logits[block], dim=-1, dtype=torch.float32).mul_(scale[block]).sub_(shift[block])
            g.scatter_add_(1, targets[block, None], -at_target[block])
            if ctx.pad_token_id is not None:
                g[:, ctx.pad_token_id] += shift[block, 0]  # ... but none on padding
            grad[block] = g
        return grad, None, None, None, None, None
