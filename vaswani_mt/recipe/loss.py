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

# Defined in the model layer, which travels with checkpoints (the model computes its own loss with it, ε = 0); this
# module is its documented home in the training recipe.
from ..model.modeling_vaswani import label_smoothed_cross_entropy

__all__ = ["label_smoothed_cross_entropy"]

