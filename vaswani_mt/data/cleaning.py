"""Cleaning parallel corpora: ``clean_parallel`` normalises every split and filters the training split(s), and
returns a :class:`CleaningReport` with the counts of everything it changed or dropped; ``load_parallel`` reads
(`vaswani_mt.data.reading`) and cleans in one call.

Cleaning rule (documented contract)
    Every split gets *normalisation*: HTML entities are unescaped (``&amp;`` → ``&``) and the text goes
    through :func:`vaswani_mt.data.tokenization.normalize_text` (NFKC, whitespace runs → one space, strip),
    the same normalisation the tokenizer applies. Only the splits in ``CleaningOptions.filter_splits``
    (by default just ``train``) are *filtered*: pairs that are empty, placeholders (a side with no
    letter or digit, like Multi30k's ``@@``), too long, of extreme length ratio or (if asked) exact
    duplicates are dropped there. Validation and test pairs are never dropped: a pair that would
    have been dropped is kept, counted under ``kept_despite`` and logged as a warning, so evaluation
    always sees the whole test set. A training split that the cleaning empties is a :class:`DataError`
    (with the count per reason).
"""

from __future__ import annotations

import hashlib
import html
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Features, Value

from ..model.pipeline_vaswani import preprocess_text
from .reading import TRANSLATION_COLUMN, DataError, _translation_feature, read_parallel
from .tokenization import normalize_text

logger = logging.getLogger(__name__)

# Drop reasons, checked in this order; a pair is counted under the first that applies.
EMPTY, PLACEHOLDER, TOO_LONG, LENGTH_RATIO, DUPLICATE = "empty", "placeholder", "too_long", "length_ratio", "duplicate"
DROP_REASONS = (EMPTY, PLACEHOLDER, TOO_LONG, LENGTH_RATIO, DUPLICATE)


@dataclass(frozen=True)
class CleaningOptions:
    """What :func:`clean_parallel` does. Defaults follow Moses ``clean-corpus-n.perl``.

    Attributes:
        unescape_html: replace HTML entities (``&amp;``, ``&quot;``, ``&#39;``) by their characters
            (see :func:`unescape_html`).
        normalize: apply :func:`~vaswani_mt.data.tokenization.normalize_text` (the tokenizer's normalisation).
        drop_empty: drop pairs with an empty side (after normalisation).
        drop_placeholders: drop pairs where a side has no letter or digit at all (``@@``, ``...``).
        max_length: drop pairs with a side longer than this, in ``length_unit`` (None: no limit).
            250 words is the limit fairseq's WMT'14 En-De preparation passes to clean-corpus-n.
        length_unit: ``"words"`` (whitespace-separated) or ``"chars"``.
        max_ratio: drop pairs whose longer side is more than this many times the shorter one, in
            ``length_unit`` (None: no limit). 9 is clean-corpus-n's default.
        deduplicate: drop exact repeats of an earlier (source, target) pair (after normalisation).
        filter_splits: the splits that are filtered (dropping pairs); all other splits are only
            normalised and their would-be drops are reported as warnings.
    """

    unescape_html: bool = True
    normalize: bool = True
    drop_empty: bool = True
    drop_placeholders: bool = True
    max_length: int | None = 250
    length_unit: Literal["words", "chars"] = "words"
    max_ratio: float | None = 9.0
    deduplicate: bool = False
    filter_splits: tuple[str, ...] = ("train",)

    def __post_init__(self) -> None:
        if self.length_unit not in ("words", "chars"):
            raise ValueError(f"length_unit must be 'words' or 'chars', not {self.length_unit!r}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, not {self.max_length}")
        if self.max_ratio is not None and self.max_ratio < 1:
            raise ValueError(f"max_ratio must be >= 1 or None, not {self.max_ratio}")
        if isinstance(self.filter_splits, str):
            object.__setattr__(self, "filter_splits", (self.filter_splits,))


NO_CLEANING = CleaningOptions(
    unescape_html=False, normalize=False, drop_empty=False, drop_placeholders=False,
    max_length=None, max_ratio=None, deduplicate=False, filter_splits=(),
)


@dataclass
class SplitCleaningReport:
    """Counts for one split. ``dropped`` and ``kept_despite`` map a reason (see ``DROP_REASONS``) to a
    number of pairs; ``kept_despite`` is filled for splits that are not filtered (valid/test)."""

    split: str
    filtered: bool
    pairs_in: int = 0
    pairs_out: int = 0
    html_unescaped: int = 0
    text_normalized: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    kept_despite: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"{self.split}: {self.pairs_in} pairs read, {self.pairs_out} kept"]
        if self.dropped:
            parts.append("dropped " + ", ".join(f"{k} {v}" for k, v in self.dropped.items()))
        if self.kept_despite:
            parts.append("kept despite " + ", ".join(f"{k} {v}" for k, v in self.kept_despite.items()))
        parts.append(f"HTML entities unescaped in {self.html_unescaped}, text normalised in {self.text_normalized}")
        return "; ".join(parts)


@dataclass
class CleaningReport:
    """Per-split cleaning counts returned by :func:`load_parallel` / :func:`clean_parallel`."""

    splits: dict[str, SplitCleaningReport] = field(default_factory=dict)

    def __getitem__(self, split: str) -> SplitCleaningReport:
        return self.splits[split]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: asdict(report) for name, report in self.splits.items()}

    def summary(self) -> str:
        return "\n".join(report.summary() for report in self.splits.values())




def _length(text: str, unit: str) -> int:
    return len(text.split()) if unit == "words" else len(text)


def _drop_reason(src: str, tgt: str, options: CleaningOptions) -> str:
    """The first reason (in ``DROP_REASONS`` order, duplicates aside) to drop a pair, or ''."""
    if options.drop_empty and (not src.strip() or not tgt.strip()):
        return EMPTY
    if options.drop_placeholders and not (any(c.isalnum() for c in src) and any(c.isalnum() for c in tgt)):
        return PLACEHOLDER
    if options.max_length is None and options.max_ratio is None:
        return ""
    src_len, tgt_len = _length(src, options.length_unit), _length(tgt, options.length_unit)
    if options.max_length is not None and max(src_len, tgt_len) > options.max_length:
        return TOO_LONG
    if options.max_ratio is not None and min(src_len, tgt_len) > 0:
        if max(src_len, tgt_len) / min(src_len, tgt_len) > options.max_ratio:
            return LENGTH_RATIO
    return ""


# Complete entities ("&amp;", "&#39;", "&#x27;"), plus the five XML escapes without their ";" at the end of
# a word (Multi30k train.de line 14351 has "H&amp, R Block"). Not html.unescape on the whole string: it
# also expands HTML5's legacy semicolon-less names inside words ("this&nothing" -> "this¬hing").
_HTML_ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);|&(?:amp|lt|gt|quot|apos)\b")
_XML_ESCAPES = {"&amp": "&", "&lt": "<", "&gt": ">", "&quot": '"', "&apos": "'"}


def _unescape_entity(match: re.Match) -> str:
    entity = match.group(0)
    return html.unescape(entity) if entity.endswith(";") else _XML_ESCAPES[entity]


def unescape_html(text: str) -> str:
    """Replace HTML entities by their characters, leaving any other ``&`` alone.

    Entities must end in ``;``, except the XML escapes ``&amp`` ``&lt`` ``&gt`` ``&quot`` ``&apos``
    at the end of a word (a common corruption of escaped corpora).
    """
    return _HTML_ENTITY.sub(_unescape_entity, text) if "&" in text else text


def _clean_text(text: str, options: CleaningOptions) -> tuple[str, bool, bool]:
    unescaped = unescape_html(text) if options.unescape_html else text
    normalized = normalize_text(unescaped) if options.normalize else unescaped
    return normalized, unescaped != text, normalized != unescaped


def _pair_key(src: str, tgt: str) -> int:
    # A stable 64-bit digest (Python's hash() differs between worker processes).
    digest = hashlib.blake2b(f"{src}\x00{tgt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def clean_batch(batch: dict[str, list], src_lang: str, tgt_lang: str, options: CleaningOptions,
                 preprocess: str | None = None) -> dict[str, list]:
    """The cleaned pairs of a batch with their marks: the drop reason ('' to keep), whether HTML entities were
    unescaped or the text normalised, and the pair's digest for deduplication. With `preprocess` (e.g.
    "lowercase_moses", see `preprocess_parallel`) the kept text is also preprocessed."""
    pairs, reasons, unescaped, normalized, keys = [], [], [], [], []
    for pair in batch[TRANSLATION_COLUMN]:
        src, src_unescaped, src_normalized = _clean_text(pair[src_lang], options)
        tgt, tgt_unescaped, tgt_normalized = _clean_text(pair[tgt_lang], options)
        reasons.append(_drop_reason(src, tgt, options))
        unescaped.append(src_unescaped or tgt_unescaped)
        normalized.append(src_normalized or tgt_normalized)
        keys.append(_pair_key(src, tgt) if options.deduplicate else 0)
        if preprocess is not None:
            src, tgt = preprocess_text(src, preprocess, src_lang), preprocess_text(tgt, preprocess, tgt_lang)
        pairs.append({src_lang: src, tgt_lang: tgt})
    return {
        TRANSLATION_COLUMN: pairs, "_reason": reasons, "_unescaped": unescaped, "_normalized": normalized, "_key": keys,
    }


CLEANING_MARKS = ["_reason", "_unescaped", "_normalized", "_key"]
_MAX_LOGGED_EXAMPLES = 5


def marked_features(src_lang: str, tgt_lang: str) -> Features:
    """The columns `clean_batch` returns."""
    return Features({
        TRANSLATION_COLUMN: _translation_feature(src_lang, tgt_lang),
        "_reason": Value("string"),
        "_unescaped": Value("bool"),
        "_normalized": Value("bool"),
        "_key": Value("int64"),
    })


def mark_split(dataset: Dataset, split: str, src_lang: str, tgt_lang: str, options: CleaningOptions,
               num_proc: int | None = None) -> Dataset:
    """Every pair of a split cleaned, with the cleaning marks of `clean_batch`."""
    return dataset.map(
        clean_batch,
        batched=True,
        fn_kwargs={"src_lang": src_lang, "tgt_lang": tgt_lang, "options": options},
        remove_columns=dataset.column_names,
        features=marked_features(src_lang, tgt_lang),
        num_proc=num_proc if num_proc and num_proc > 1 and len(dataset) > 10_000 else None,
        desc=f"Cleaning {split}",
    )


def judge_split(marked: Dataset, split: str, options: CleaningOptions) -> tuple[SplitCleaningReport, np.ndarray]:
    """The cleaning report of a marked split and which of its pairs stay (a boolean array): in a filtered split
    those without a drop reason (duplicates of an earlier kept pair included, when deduplicating), in the others all
    (the would-be drops are counted and logged). Reads the marks as Arrow columns: no Python object per pair."""
    filtered = split in options.filter_splits
    report = SplitCleaningReport(split=split, filtered=filtered, pairs_in=len(marked))
    columns = marked.with_format("arrow")
    names = np.array(["", *DROP_REASONS], dtype=object)
    codes = pc.index_in(columns["_reason"], value_set=pa.array(names[:-1].tolist())).to_numpy(zero_copy_only=False)
    codes = codes.astype(np.int8)
    if options.deduplicate and len(codes):
        candidates = np.flatnonzero(codes == 0)
        keys = columns["_key"].to_numpy()[candidates]
        _, first = np.unique(keys, return_index=True)
        duplicate = np.ones(len(candidates), dtype=bool)
        duplicate[first] = False
        codes[candidates[duplicate]] = len(names) - 1
    report.html_unescaped = int(pc.sum(columns["_unescaped"]).as_py() or 0)
    report.text_normalized = int(pc.sum(columns["_normalized"]).as_py() or 0)
    counts = np.bincount(codes, minlength=len(names))
    ordered = {reason: int(counts[i]) for i, reason in enumerate(names) if i and counts[i]}
    if filtered:
        report.dropped = ordered
        keep = codes == 0
        if not keep.any() and len(codes):
            raise DataError(f"split {split!r} is empty after cleaning: all {len(codes)} pairs were dropped ("
                            + ", ".join(f"{reason}: {count}" for reason, count in ordered.items())
                            + "); check the data, or the cleaning limits (max_length, max_ratio)")
    else:
        report.kept_despite = ordered
        keep = np.ones(len(codes), dtype=bool)
        flagged = np.flatnonzero(codes)[:_MAX_LOGGED_EXAMPLES]
        if len(flagged):
            examples = ", ".join(f"#{i} ({names[codes[i]]})" for i in flagged)
            logger.warning(
                "%s: kept %d pair(s) that the cleaning would drop in a training split (e.g. %s); "
                "%s is not filtered so that evaluation sees every pair", split, int(np.count_nonzero(codes)),
                examples, split,
            )
    report.pairs_out = int(keep.sum())
    logger.info("cleaning %s", report.summary())
    return report, keep


def _clean_split(
    dataset: Dataset, split: str, src_lang: str, tgt_lang: str, options: CleaningOptions, num_proc: int | None
) -> tuple[Dataset, SplitCleaningReport]:
    marked = mark_split(dataset, split, src_lang, tgt_lang, options, num_proc)
    report, keep = judge_split(marked, split, options)
    if not keep.all():
        marked = marked.select(np.flatnonzero(keep))
    return marked.remove_columns(CLEANING_MARKS), report


def clean_parallel(
    dataset_dict: DatasetDict,
    src_lang: str,
    tgt_lang: str,
    options: CleaningOptions | None = None,
    num_proc: int | None = None,
) -> tuple[DatasetDict, CleaningReport]:
    """Normalise every split and filter the training split(s); see the module docstring for the rule.

    Returns the cleaned DatasetDict (``translation`` column only) and the per-split counts, which are
    also logged (INFO for the summary, WARNING for pairs kept in unfiltered splits).
    """
    options = options or CleaningOptions()
    cleaned, report = {}, CleaningReport()
    for split, dataset in dataset_dict.items():
        cleaned[split], report.splits[split] = _clean_split(dataset, split, src_lang, tgt_lang, options, num_proc)
    return DatasetDict(cleaned), report


def load_parallel(
    source: str | os.PathLike | Mapping[str, str | os.PathLike],
    src_lang: str,
    tgt_lang: str,
    splits: Sequence[str] | None = None,
    clean: bool | CleaningOptions = True,
    num_proc: int | None = None,
    hub_config: str | None = None,
    **hub_kwargs: Any,
) -> tuple[DatasetDict, CleaningReport]:
    """Load a parallel corpus and clean it.

    Args:
        source: a folder of ``{split}.{lang}`` files, a JSON-lines/CSV/TSV/Parquet file or a
            ``{split: path}`` dict of them, a folder of ``{split}.{ext}`` such files, or a Hub
            dataset id (see the module docstring).
        src_lang, tgt_lang: language codes, i.e. file suffixes, column names or ``translation`` keys.
        splits: the splits to load (default: all found).
        clean: True for the default :class:`CleaningOptions`, an instance to customise, or False to
            load the text untouched (the report then shows zero changes).
        num_proc: worker processes for cleaning large splits.
        hub_config, hub_kwargs: passed to ``datasets.load_dataset`` for a Hub dataset id.

    Returns:
        ``(dataset_dict, report)``: a DatasetDict whose only column is ``translation``
        (``{src_lang: ..., tgt_lang: ...}``) and the :class:`CleaningReport`.
    """
    raw = read_parallel(source, src_lang, tgt_lang, splits=splits, hub_config=hub_config, **hub_kwargs)
    if clean is True:
        options = CleaningOptions()
    elif clean is False or clean is None:
        options = NO_CLEANING
    else:
        options = clean
    return clean_parallel(raw, src_lang, tgt_lang, options, num_proc=num_proc)


def preprocess_parallel(dataset: DatasetDict, preprocess: str | None, source_lang: str,
                        target_lang: str) -> DatasetDict:
    """Both sides of every pair as a model trained with `preprocess` (`VaswaniConfig.preprocess`, e.g.
    "lowercase_moses") sees text; the dataset itself when `preprocess` is None. The model applies the same rule
    (`preprocess_text`) to raw input at translation time."""
    if preprocess is None:
        return dataset

    def convert(batch):
        return {"translation": [{source_lang: preprocess_text(pair[source_lang], preprocess, source_lang),
                                 target_lang: preprocess_text(pair[target_lang], preprocess, target_lang)}
                                for pair in batch["translation"]]}

    return dataset.map(convert, batched=True, desc=f"Preprocessing ({preprocess})")
