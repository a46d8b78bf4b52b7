"""BLEU on lowercased, Moses-tokenized text: how published Multi30k (and older WMT) scores were
computed with ``multi-bleu.perl``.

Those numbers are not comparable with sacreBLEU's default (cased, detokenized, ``13a``): Moses
splits more punctuation and contractions, and lowercasing forgives case errors, so tokenized
BLEU usually comes out higher. Report which one you quote; the signature records ``tok:none``
and the case setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sacremoses import MosesTokenizer

from .sacrebleu_chrf.corpus_scoring import bleu_scores, reference_streams


@lru_cache(maxsize=8)
def _moses_tokenizer(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str, lowercase: bool = True) -> str:
    """Lowercase (optionally), then Moses-tokenize, without escaping ``&<>'"`` to XML entities.

    Lowercasing comes first, as in the Multi30k preprocessing (``lowercase.perl | tokenizer.perl``).
    """
    if lowercase:
        text = text.lower()
    return _moses_tokenizer(lang).tokenize(text, return_str=True, escape=False)


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
    # lowercase is passed on as well (a no-op on lowercased text) so the signature says case:lc.
    return bleu_scores(tokenized_hypotheses, tokenized_references, lowercase=lowercase, tokenize="none")
