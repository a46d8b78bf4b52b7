"""Translation metrics that work offline.

* :func:`corpus_scores` -- sacreBLEU corpus BLEU and chrF with the sacreBLEU defaults (cased,
  ``13a``, detokenized text), the numbers to report. The function is the one the ``evaluate``
  metric below computes with (``sacrebleu_chrf/corpus_scoring.py``), so training,
  ``vaswani-mt translate --reference`` and an ``evaluate`` user get the same scores and signatures.
* :func:`moses_tokenized_bleu` -- the lowercased, Moses-tokenized ``multi-bleu.perl``
  convention behind published Multi30k scores; :func:`tokenized_bleu` the same for text that
  is lowercased and tokenized already.
* :func:`load_metric` -- the same BLEU/chrF as an ``evaluate`` metric, loaded from the
  ``sacrebleu_chrf`` folder shipped in this package (``evaluate.load("sacrebleu")`` needs the Hub).
  ``evaluate.load`` copies that folder into its module cache, so it imports nothing of the package;
  this module imports from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .moses import moses_tokenize, moses_tokenized_bleu, tokenized_bleu
from .sacrebleu_chrf.corpus_scoring import corpus_scores

METRIC_DIR = Path(__file__).resolve().parent / "sacrebleu_chrf"

__all__ = ["METRIC_DIR", "corpus_scores", "load_metric", "moses_tokenize", "moses_tokenized_bleu", "tokenized_bleu"]


def load_metric(**load_kwargs: Any):
    """``evaluate.load`` of the bundled ``sacrebleu_chrf`` metric; never touches the network.

    ``keep_in_memory`` defaults to True (no Arrow cache files for a single-process
    evaluation); pass ``keep_in_memory=False`` plus ``num_process``/``process_id`` for evaluate's
    distributed mode. Other keyword arguments go to ``evaluate.load``.
    """
    import evaluate  # imported lazily: it pulls in datasets, which takes a moment

    load_kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(METRIC_DIR), **load_kwargs)
