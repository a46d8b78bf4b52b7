"""The test split's scores: beam-search translations scored with sacreBLEU (BLEU, chrF) and lowercased tokenized
BLEU, each with its signature."""

from __future__ import annotations

import time

from ..data.tokenization import normalize_text
from ..metrics import corpus_scores, moses_tokenized_bleu, tokenized_bleu
from ..run_record import TestScores
from .config import RunConfig
from .progress import TrainingProgress
from .trainer import VaswaniTrainer


def score_test(trainer: VaswaniTrainer, dataset, references: list[str], config: RunConfig,
           progress: TrainingProgress) -> tuple[TestScores, list[str]]:
    """Translate `dataset` with beam search and score against the `references` (normalised as the tokenizer
    normalises): sacreBLEU BLEU + chrF, and lowercased Moses-tokenized BLEU. With `data.preprocess`, references and
    output are lowercased tokenized text already: the tokenized BLEU is then multi-bleu's on them as they are."""
    num_beams, target_lang = config.training.num_beams, config.data.target_lang
    started = time.perf_counter()
    with progress.stage("test translation"):
        output = trainer.predict(dataset, metric_key_prefix="test", num_beams=num_beams)
    tokenizer = trainer.processing_class
    predictions = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    predictions = predictions.clip(min=0)
    hypotheses = [h.strip() for h in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [normalize_text(r) for r in references]
    scores = corpus_scores(hypotheses, references)
    if config.data.preprocess:
        tokenized = tokenized_bleu(hypotheses, references)
    else:
        tokenized = moses_tokenized_bleu(hypotheses, references, lang=target_lang, lowercase=True)
    result = TestScores(
        split=config.data.test_split, sentences=len(hypotheses), preprocess=config.data.preprocess,
        bleu=scores["bleu"], bleu_signature=scores["bleu_signature"],
        chrf=scores["chrf"], chrf_signature=scores["chrf_signature"],
        bleu_lowercased_moses_tokenized=tokenized["bleu"],
        bleu_lowercased_moses_tokenized_signature=tokenized["bleu_signature"],
        num_beams=num_beams, seconds=round(time.perf_counter() - started, 1),
    )
    return result, hypotheses


__all__ = ["score_test"]
