"""The training loss: label-smoothed cross-entropy (Vaswani et al. 2017, §5.4: ε_ls = 0.1), with the output
projection inside it on CPU and its gradient computed in the forward pass in compiled runs.

The loss itself is the model's `label_smoothed_cross_entropy` (`vaswani_mt.model.modeling_vaswani`, one
``log_softmax`` of the whole logits). This module holds the same function with the output projection (§3.4)
computed inside it, block by block of rows (:func:`projected_label_smoothed_cross_entropy`, for CPU), the same
function of the logits with its gradient computed in the forward pass (:func:`smoothed_cross_entropy_of_logits`, for
compiled runs), and the way `VaswaniTrainer` hands the projected one the decoder's hidden states instead of logits
(:func:`output_projection_in_the_loss`).
Below: the formulation both compute, and why the projected kernel exists.

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

The output projection in the loss, on CPU
-----------------------------------------
The loss needs the logits only row by row: their softmax, the target's, the pad class's and their sum. Computing
``[tokens, V]`` logits first (164 MB of float32 at a 10,000-token vocabulary and 4,096-token batches, several times
that with a WMT vocabulary), keeping them for the backward pass and making a gradient of the same size costs a
CPU more in memory traffic than in arithmetic. :func:`projected_label_smoothed_cross_entropy` takes the decoder's
final hidden states and the output projection's weight (§3.4; the shared embedding) instead, and for each block of
rows that count (padding positions are skipped: no logits are computed for them) computes the block's logits, the
loss and its gradient ``p - q`` at once, and turns the gradient straight into the gradients of the hidden states
and the weight, one block at a time (`BLOCK_ELEMENTS`: blocks large enough that the weight's gradient, a product
over the block's rows, runs near the CPU's matrix-product rate). The backward pass only scales them. The matrix
products run in the dtype of the autocast around the call (bfloat16 or float16 in runs of `training.precision` bf16
or fp16: `VaswaniTrainer.loss_autocast` enters the run's autocast for the loss, since accelerate's covers only the
model's forward and hands the hidden states back in float32), else in the hidden states' dtype; the softmax and the
sums in float32. ``log_softmax`` is not needed: ``log Σ exp`` comes from the softmax's largest probability, which is
at least 1/V and so never underflows. `VaswaniTrainer` computes its training loss so on CPU
(`output_projection_in_the_loss`); elsewhere (CUDA, ``torch.compile``) the model's function runs on the model's
logits, which the model's forward computes under the run's autocast and accelerate hands back in float32.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..model.modeling_vaswani import VaswaniForConditionalGeneration, check_loss_arguments

__all__ = ["compiled_label_smoothed_cross_entropy", "output_projection_in_the_loss",
           "projected_label_smoothed_cross_entropy", "projects_in_the_loss", "smoothed_cross_entropy_of_logits"]

# Rows per block: 512 rows of a 10,000-token vocabulary (20 MB of float32 logits, and as much gradient; an eighth of
# a 4,096-token batch's). The weight's gradient is a product over the block's rows: on 2 Zen 4 cores the loss of
# 3,990 rows took 224 ms in float32 and 143 ms in bfloat16 with 512-row blocks, 333 and 314 ms with 64 (docs/speed.md).
BLOCK_ELEMENTS = 512 * 10_000


def projects_in_the_loss(model: nn.Module, device: torch.device, compiled: bool) -> bool:
    """Whether `VaswaniTrainer` computes `model`'s output projection inside the training loss: our model, on CPU,
    not compiled."""
    return isinstance(model, VaswaniForConditionalGeneration) and device.type == "cpu" and not compiled


@functools.cache
def compiled_label_smoothed_cross_entropy() -> Callable:
    """`label_smoothed_cross_entropy`'s results and gradient under `torch.compile` (built once, any shape), for runs
    that compile the model (`training.torch_compile`): the compiled model returns its logits and the loss runs
    outside it, where eager kernels read and write the ``[tokens, V]`` logits in float32 several times over (15 of a
    base step's 61 ms on an H200, 25,000 target tokens). Compiled, and with the gradient computed in the forward
    pass (:func:`smoothed_cross_entropy_of_logits`), it is two passes over the logits and one over the gradient:
    5.2 ms of that step, against 7.2 ms for the compiled `label_smoothed_cross_entropy` (docs/speed.md)."""
    return torch.compile(smoothed_cross_entropy_of_logits, dynamic=True)


class _HiddenStatesOut(nn.Module):
    """Stands in for the output projection: its input comes out as the model's `logits`."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states


@contextlib.contextmanager
def output_projection_in_the_loss(model: VaswaniForConditionalGeneration) -> Iterator[tuple]:
    """While inside, the model (itself, or through the DDP wrapper around it) returns the decoder's final hidden
    states as its `logits`; yields the output projection's weight and the model's fixed `final_logits_bias` (or
    None), for :func:`projected_label_smoothed_cross_entropy`. The weight stays where it is: tied, it is the
    embedding the stacks use."""
    head, bias = model.lm_head, model.final_logits_bias
    model.lm_head, model.final_logits_bias = _HiddenStatesOut(), None
    try:
        yield head.weight, bias
    finally:
        model.lm_head, model.final_logits_bias = head, bias


def projected_label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``label_smoothed_cross_entropy(hidden_states @ weight.T + bias, labels, ...)``: the same results and errors,
    with the output projection computed inside the loss, block by block (module docstring). `hidden_states`:
    ``[..., d_model]``, `weight`: ``[V, d_model]``, `bias`: a fixed ``[V]`` (or ``[1, V]``) bias without gradient.
    ``nll_sum`` carries no gradient."""
    if bias is not None and bias.requires_grad:
        raise ValueError("bias must be fixed (a buffer such as final_logits_bias): its gradient is not computed")
    vocab_size = weight.shape[0]
    if hidden_states.shape[:-1] != labels.shape or hidden_states.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden_states must have shape labels.shape + (d_model,) and weight (vocab_size, d_model); "
                         f"got {tuple(hidden_states.shape)}, {tuple(labels.shape)} and {tuple(weight.shape)}")
    # the logits' shape on the meta device: no [tokens, V] memory for a check of shapes
    check_loss_arguments(torch.empty((*labels.shape, vocab_size), device="meta"), labels, epsilon, pad_token_id)
    targets, counted, delta = _counted_targets(labels, vocab_size, epsilon, ignore_index, pad_token_id)
    compute = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden_states.dtype
    loss_sum, nll_sum = _ProjectedSmoothedCrossEntropy.apply(
        hidden_states, weight, None if bias is None else bias.reshape(-1), targets, counted, epsilon, delta,
        pad_token_id, compute)
    return loss_sum, nll_sum, counted.sum()


def _counted_targets(labels: torch.Tensor, vocab_size: int, epsilon: float, ignore_index: int,
                     pad_token_id: int | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The flat targets, which of them count (neither `ignore_index` nor padding), and δ, the smoothing mass of
    each other class (module docstring)."""
    targets = labels.reshape(-1)
    counted = targets != ignore_index
    if pad_token_id is not None:
        counted = counted & (targets != pad_token_id)
    return targets, counted, epsilon / (vocab_size - (2 if pad_token_id is not None else 1))


def _row_blocks(rows: int, vocab_size: int):
    step = max(1, BLOCK_ELEMENTS // vocab_size)
    return (slice(start, min(start + step, rows)) for start in range(0, rows, step))


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """Per counted row, with z = h W^T + b and p = softmax(z): ``nll = lse - z_y``,
    ``loss = (1 - ε - δ) nll + δ (V lse - Σ_c z_c) - δ (lse - z_pad)``, and ``d loss / d z = p - q`` (q: 1 - ε on y,
    δ elsewhere, 0 on pad), so ``d loss / d h = (p - q) W`` and ``d loss / d W = (p - q)^T h``, computed in the
    forward pass block by block and scaled by the incoming gradient in the backward pass."""

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, targets, counted, epsilon, delta, pad_token_id, compute):
        d_model, vocab_size = weight.shape[1], weight.shape[0]
        rows = counted.nonzero().squeeze(1)
        with torch.autocast("cpu", enabled=False):
            hidden = hidden_states.reshape(-1, d_model).index_select(0, rows).to(compute)
            weights, wanted = weight.to(compute), targets.index_select(0, rows)
            bias = None if bias is None else bias.to(compute)
            grad_hidden = torch.empty(len(rows), d_model, dtype=torch.float32)
            grad_weight = torch.zeros(vocab_size, d_model, dtype=torch.float32)
            loss_sum = torch.zeros((), dtype=torch.float32)
            nll_sum = torch.zeros((), dtype=torch.float32)
            for block in _row_blocks(len(rows), vocab_size):
                logits = torch.mm(hidden[block], weights.t())
                if bias is not None:
                    logits = logits + bias
                nll, loss, grad = _block(logits, wanted[block, None], epsilon, delta, pad_token_id)
                nll_sum += nll
                loss_sum += loss
                if compute == torch.float32:  # both gradients straight into their tensors
                    torch.mm(grad, weights, out=grad_hidden[block])
                    grad_weight.addmm_(grad.t(), hidden[block])
                else:  # a product of bfloat16 comes out in bfloat16: added to the float32 gradients
                    grad = grad.to(compute)
                    grad_hidden[block] = torch.mm(grad, weights)
                    grad_weight += torch.mm(grad.t(), hidden[block])
        save_gradients(ctx, hidden_states, grad_hidden, grad_weight, rows, nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        return (*scaled_gradients(ctx, grad_loss), None, None, None, None, None, None, None)


def save_gradients(ctx, hidden_states, grad_hidden_rows, grad_weight, rows, nll_sum) -> None:
    """Keeps in `ctx` what `scaled_gradients` needs: the gradients computed in the forward pass, which rows of
    `hidden_states` the hidden-state gradients are, and their shape and dtype; ``nll_sum`` carries no gradient."""
    ctx.save_for_backward(grad_hidden_rows, grad_weight, rows)
    ctx.hidden_shape, ctx.hidden_dtype = hidden_states.shape, hidden_states.dtype
    ctx.mark_non_differentiable(nll_sum)


def scaled_gradients(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward pass of a loss that computed its gradients in the forward pass and saved them in `ctx` (the
    counted rows' hidden-state gradients, the weight's, and which rows of the hidden states those rows are): the
    hidden states' gradient (0 on the rows not counted) and the weight's, scaled by the loss's incoming gradient."""
    grad_hidden_rows, grad_weight, rows = ctx.saved_tensors
    scale = grad_loss.float()
    grad_hidden = torch.zeros(ctx.hidden_shape[:-1].numel(), ctx.hidden_shape[-1], dtype=torch.float32)
    grad_hidden.index_copy_(0, rows, grad_hidden_rows * scale)
    return grad_hidden.view(ctx.hidden_shape).to(ctx.hidden_dtype), grad_weight * scale


def _block(logits, target, epsilon, delta, pad_token_id) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ nll, Σ loss, ``p - q`` in float32) of a block of logits (the class docstring's formulas)."""
    grad = torch.softmax(logits, 1, dtype=torch.float32)
    log_sum_exp = logits.amax(1).float() - grad.amax(1).log()  # the largest p is at least 1/V: no underflow
    nll = log_sum_exp - logits.gather(1, target).squeeze(1).float()
    loss = (1.0 - epsilon - delta) * nll + delta * (logits.shape[1] * log_sum_exp - logits.sum(1, dtype=torch.float32))
    grad.sub_(delta).scatter_add_(1, target, grad.new_full(target.shape, -(1.0 - epsilon - delta)))
    if pad_token_id is not None:
        loss = loss - delta * (log_sum_exp - logits[:, pad_token_id].float())
        grad[:, pad_token_id] += delta
    return nll.sum(), loss.sum(), grad


def smoothed_cross_entropy_of_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``label_smoothed_cross_entropy(logits, labels, ...)``: the same results and errors, its gradient with respect
    to the logits, ``p - q``, computed in the forward pass in the logits' dtype and only scaled in the backward pass.
    Autograd through the float32 log-softmax reads and writes the ``[tokens, V]`` logits several times over; here,
    compiled, the forward reads them for the sums and again for the gradient, writes the gradient once, and the
    backward scales it. ``nll_sum`` carries no gradient."""
    check_loss_arguments(logits, labels, epsilon, pad_token_id)
    targets, counted, delta = _counted_targets(labels, logits.shape[-1], epsilon, ignore_index, pad_token_id)
    loss_sum, nll_sum = _SmoothedCrossEntropyOfLogits.apply(logits, targets, counted, epsilon, delta, pad_token_id)
    return loss_sum, nll_sum, counted.sum()


class _SmoothedCrossEntropyOfLogits(torch.autograd.Function):
    """Per counted row of z (float32) with p = softmax(z): ``nll = lse - z_y``,
    ``loss = (1 - ε - δ) nll + δ (V lse - Σ_c z_c) - δ (lse - z_pad)`` and ``d loss / d z = p - q``, as
    `_ProjectedSmoothedCrossEntropy` without the projection; rows not counted give 0."""

    @staticmethod
    def forward(ctx, logits, targets, counted, epsilon, delta, pad_token_id):
        vocab_size = logits.shape[-1]
        scores = logits.reshape(-1, vocab_size).float()
        wanted = targets.clamp(min=0).unsqueeze(1)
        log_sum_exp = torch.logsumexp(scores, 1)
        nll = log_sum_exp - scores.gather(1, wanted).squeeze(1)
        loss = (1.0 - epsilon - delta) * nll + delta * (vocab_size * log_sum_exp - scores.sum(1))
        classes = torch.arange(vocab_size, device=scores.device)
        smoothed = torch.where(classes == wanted, 1.0 - epsilon, delta)  # q, one element-wise pass with p - q
        if pad_token_id is not None:
            loss = loss - delta * (log_sum_exp - scores[:, pad_token_id])
            smoothed = torch.where(classes == pad_token_id, 0.0, smoothed)  # a counted row's label is never padding
        grad = torch.exp(scores - log_sum_exp.unsqueeze(1)) - smoothed
        skipped = ~counted  # masked_fill, not a product: rows of -inf logits stay exactly 0
        ctx.save_for_backward(grad.masked_fill(skipped.unsqueeze(1), 0.0).to(logits.dtype))
        ctx.logits_shape = logits.shape
        loss_sum, nll_sum = loss.masked_fill(skipped, 0.0).sum(), nll.masked_fill(skipped, 0.0).sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        (grad,) = ctx.saved_tensors
        # scaled in float32: 1 / tokens rounded to bfloat16 would be off by up to 0.4 %
        return (grad.float() * grad_loss).to(grad.dtype).view(ctx.logits_shape), None, None, None, None, None
