"""Corpus BLEU and chrF with sacreBLEU: what the ``evaluate`` metric next to this file computes, and what
:mod:`vaswani_mt.metrics` exports (:func:`corpus_scores`, and the BLEU of ``moses_tokenized_bleu``).

This file must stay importable on its own (only ``sacrebleu``, no package-relative imports):
``evaluate.load`` copies it, together with ``sacrebleu_chrf.py``, into its module cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF


def reference_streams(hypotheses: Sequence[str], references: Sequence[Any]) -> list[list[str]]:
    """Turn per-sentence references into sacreBLEU's reference streams.

    ``references`` is either one string per hypothesis or one list of strings per hypothesis
    (several references; every hypothesis must have the same number). sacreBLEU wants the
    transpose: one list per reference "set", each as long as the hypotheses.
    """
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be sequences of sentences, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"got {len(hypotheses)} hypotheses but {len(references)} references; they must pair up one to one"
        )
    if not hypotheses:
        raise ValueError("cannot score an empty corpus")
    if all(isinstance(ref, str) for ref in references):
        return [list(references)]
    if any(isinstance(ref, str) for ref in references):
        raise TypeError("references must be all strings or all lists of strings, not a mix")
    counts = {len(refs) for refs in references}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(
            f"every hypothesis needs the same (non-zero) number of references; got counts {sorted(counts)}"
        )
    return [list(stream) for stream in zip(*references)]


def bleu_scores(
    hypotheses: Sequence[str],
    references: Sequence[Any],
    lowercase: bool = False,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """Corpus BLEU with its details and sacreBLEU signature."""
    streams = reference_streams(hypotheses, references)
    # force=True: the "none" tokenizer is used on purpose for pre-tokenized text; without it
    # sacreBLEU warns that the input looks tokenized.
    bleu = BLEU(lowercase=lowercase, tokenize=tokenize, force=True)
    result = bleu.corpus_score(list(hypotheses), streams)
    return {
        "bleu": result.score,
        "precisions": list(result.precisions),
        "counts": list(result.counts),
        "totals": list(result.totals),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "bleu_signature": str(bleu.get_signature()),
    }


def corpus_scores(
    hypotheses: Sequence[str],
    references: Sequence[Any],
    lowercase: bool = False,
    tokenize: str = "13a",
) -> dict[str, Any]:
    """Corpus BLEU and chrF (chrF2: character 6-grams, β = 2) on detokenized text.

    ``references``: one string per hypothesis, or one list of strings per hypothesis (several
    references, the same number for every hypothesis). Defaults are sacreBLEU's: cased, ``13a``
    tokenization applied by sacreBLEU itself; chrF has no tokenizer (it works on characters);
    ``lowercase`` applies to both. Returns ``bleu``, ``chrf``, their sacreBLEU signatures
    (``bleu_signature``, ``chrf_signature``) and the BLEU details (``precisions``, ``counts``,
    ``totals``, ``bp``, ``sys_len``, ``ref_len``).
    """
    scores = bleu_scores(hypotheses, references, lowercase=lowercase, tokenize=tokenize)
    chrf = CHRF(lowercase=lowercase)
    result = chrf.corpus_score(list(hypotheses), reference_streams(hypotheses, references))
    scores["chrf"] = result.score
    scores["chrf_signature"] = str(chrf.get_signature())
    return scores
