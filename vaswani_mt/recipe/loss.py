"""Label-smoothed cross-entropy (Vaswani et al. 2017, §5.4: ε_ls = 0.1).

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy (§5.4); see the module docstring for the formulation.

    Args:
        logits: ``[..., V]`` unnormalised scores (any float dtype; computed in float32).
        labels: ``[...]`` target ids, ``ignore_index`` (and ``pad_token_id``) at positions to skip.
        epsilon: smoothing mass ε in [0, 1); 0 gives plain cross-entropy.
        ignore_index: label value of positions that do not count.
        pad_token_id: if given, the padding class receives no smoothing mass and positions
            labelled with it are skipped too.

    Returns:
        ``(loss_sum, nll_sum, num_tokens)``: the smoothed loss and the plain negative
        log-likelihood, both float32 sums over the counted positions, and the number of counted
        positions as a 0-dim int64 tensor (kept on-device: no host sync).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon!r}")
    if logits.dim() < 1 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            "logits must have shape labels.shape + (vocab_size,); got logits "
            f"{tuple(logits.shape)} and labels {tuple(labels.shape)}"
        )
    vocab_size = logits.shape[-1]
    if pad_token_id is not None and not 0 <= pad_token_id < vocab_size:
        raise ValueError(f"pad_token_id {pad_token_id} is outside the vocabulary of size {vocab_size}")

    # float32 log_softmax even for bf16/fp16 logits: low-precision log-probabilities of a large
    # vocabulary lose most of their mantissa to the log-sum-exp.
    log_probs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab_size)
    targets = labels.reshape(-1)
    if pad_token_id is not None:
        targets = targets.masked_fill(targets == pad_token_id, ignore_index)
    counted = targets != ignore_index
    num_tokens = counted.sum()

    # nll_loss is exactly what cross_entropy(reduction="sum") uses, so epsilon=0 matches it bitwise.
    nll_sum = F.nll_loss(log_probs, targets, ignore_index=ignore_index, reduction="sum")
    if epsilon == 0.0:
        return nll_sum, nll_sum, num_tokens

    num_smoothed_classes = vocab_size - (2 if pad_token_id is not None else 1)
    if num_smoothed_classes < 1:
        raise ValueError(
            f"label smoothing needs at least one class besides the target and padding; vocab_size={vocab_size}"
        )
    delta = epsilon / num_smoothed_classes

    # masked_fill (not multiplication by the mask) keeps ignored rows at exactly zero even when
    # they hold -inf log-probabilities, and gives them zero gradient.
    neg_sum_all_classes = -log_probs.sum(dim=-1).masked_fill(~counted, 0.0).sum()
    loss_sum = (1.0 - epsilon - delta) * nll_sum + delta * neg_sum_all_classes
    if pad_token_id is not None:
        neg_pad_log_prob = -log_probs[:, pad_token_id].masked_fill(~counted, 0.0).sum()
        loss_sum = loss_sum - delta * neg_pad_log_prob
    return loss_sum, nll_sum, num_tokens
