"""Translation metrics that work offline.

* :func:`corpus_scores` -- sacreBLEU corpus BLEU and chrF with the sacreBLEU defaults (cased,
  ``13a``, detokenized text), the numbers to report. Computed by the ``evaluate`` metric below
  (loaded once per process), so training, ``vaswani-mt translate --reference`` and an
  ``evaluate`` user get their scores and signatures from the same module.
* :func:`moses_tokenized_bleu` -- the lowercased, Moses-tokenized ``multi-bleu.perl``
  convention behind published Multi30k scores; :func:`tokenized_bleu` the same for text that
  is lowercased and tokenized already.
* :func:`load_metric` -- the same BLEU/chrF as an ``evaluate`` metric, loaded from the
  ``sacrebleu_chrf`` folder shipped in this package (``evaluate.load("sacrebleu")`` needs the Hub).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .moses import moses_tokenize, moses_tokenized_bleu, tokenized_bleu
from .sacrebleu_chrf.corpus_scoring import reference_streams

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


@functools.cache
def _bundled_metric():
    """The bundled metric, loaded once per process (``evaluate.load`` copies the script into its module cache)."""
    return load_metric()


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[Any],
    lowercase: bool = False,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """Corpus BLEU and chrF (chrF2: character 6-grams, β = 2) on detokenized text, computed by the
    bundled ``evaluate`` metric (:func:`load_metric`, kept in memory).

    ``references``: one string per hypothesis, or one list of strings per hypothesis (several
    references, the same number for every hypothesis). Defaults are sacreBLEU's: cased, ``13a``
    tokenization applied by sacreBLEU itself; chrF has no tokenizer (it works on characters);
    ``lowercase`` applies to both. Returns ``bleu``, ``chrf``, their sacreBLEU signatures
    (``bleu_signature``, ``chrf_signature``) and the BLEU details (``precisions``, ``counts``,
    ``totals``, ``bp``, ``sys_len``, ``ref_len``).
    """
    reference_streams(hypotheses, references)  # the shapes, checked with our messages before evaluate's own
    references = [reference if isinstance(reference, str) else list(reference) for reference in references]
    return _bundled_metric().compute(predictions=list(hypotheses), references=references,
                                     lowercase=lowercase, tokenize=tokenize)
