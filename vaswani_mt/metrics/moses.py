"""BLEU on lowercased, Moses-tokenized text: how published Multi30k (and older WMT) scores were
computed with ``multi-bleu.perl``.

Those numbers are not comparable with sacreBLEU's default (cased, detokenized, ``13a``): Moses
splits more punctuation and contractions, and lowercasing forgives case errors, so tokenized
BLEU usually comes out higher. Report which one you quote; the signature records ``tok:none``
and the case setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..model.pipeline_vaswani import moses_tokenize  # the one implementation: a model trained on such text uses it
from .sacrebleu_chrf.corpus_scoring import bleu_scores, reference_streams


def moses_tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Any],
    lang: str,
    lowercase: bool = True,
) -> dict[str, Any]:
    """multi-bleu.perl-style corpus BLEU: both sides lowercased and Moses-tokenized for ``lang``,
    then scored with sacreBLEU's ``tokenize="none"``.

    ``references`` takes the same forms as :func:`vaswani_mt.metrics.corpus_scores`. Returns
    ``bleu``, its details and ``bleu_signature``.
    """
    streams = reference_streams(hypotheses, references)  # validates counts before tokenizing
    tokenized_hypotheses = [moses_tokenize(h, lang, lowercase) for h in hypotheses]
    tokenized_references = [
        [moses_tokenize(stream[i], lang, lowercase) for stream in streams] for i in range(len(hypotheses))
    ]
    return tokenized_bleu(tokenized_hypotheses, tokenized_references, lowercase)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[Any], lowercase: bool = True) -> dict[str, Any]:
    """multi-bleu.perl's BLEU of text that is Moses-tokenized (and lowercased) already, e.g. the output of a model
    trained with ``preprocess: lowercase_moses`` against references that went through the same: sacreBLEU with
    ``tokenize="none"``. Tokenizing again would not be a no-op (Moses splits ``'s`` once more). ``lowercase`` is
    passed on (a no-op on lowercased text) so that the signature says case:lc."""
    return bleu_scores(list(hypotheses), references, lowercase=lowercase, tokenize="none")
