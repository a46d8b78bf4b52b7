"""An offline ``evaluate`` metric: sacreBLEU corpus BLEU and chrF.

``evaluate.load("sacrebleu")`` needs the Hugging Face Hub. evaluate 0.4.6 also loads a local
directory ``<dir>`` when it contains a script named ``<dir name>.py``, which is this file::

    import evaluate
    metric = evaluate.load("/abs/path/to/vaswani_mt/metrics/sacrebleu_chrf")
    metric.compute(predictions=["..."], references=[["..."]])

evaluate copies this script and its relative imports (``corpus_scoring.py``) into its module
cache, so it must only import installed libraries and siblings in this folder.
"""

import datasets
import evaluate

from .corpus_scoring import corpus_scores

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU and chrF computed by sacreBLEU, with the signatures that make scores
comparable across papers. Works without network access.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of detokenized hypothesis strings.
    references: one reference string per prediction, or one list of reference strings per
        prediction (every prediction with the same number of references).
    tokenize: sacreBLEU tokenizer for BLEU ("13a" default, "intl", "none", ...).
    lowercase: case-insensitive scoring (default False).
Returns:
    bleu, chrf: corpus scores in [0, 100];
    bleu_signature, chrf_signature: sacreBLEU signature strings;
    precisions, counts, totals, bp, sys_len, ref_len: BLEU details.
Example:
    >>> metric = evaluate.load("vaswani_mt/metrics/sacrebleu_chrf")
    >>> round(metric.compute(predictions=["a cat sat on the mat"], references=[["a cat sat on the mat"]])["bleu"])
    100
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuChrf(evaluate.Metric):
    """sacreBLEU corpus BLEU + chrF as an ``evaluate`` metric."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            homepage="https://github.com/mjpost/sacrebleu",
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Value("string", id="sequence"),
                    }
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/W18-6319/", "https://aclanthology.org/W15-3049/"],
        )

    def _compute(self, predictions, references, tokenize="13a", lowercase=False):
        return corpus_scores(predictions, references, lowercase=lowercase, tokenize=tokenize)
