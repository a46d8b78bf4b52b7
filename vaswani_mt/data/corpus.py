"""Parallel-corpus loading, cleaning and tokenisation.

``load_parallel`` turns a corpus into a ``datasets.DatasetDict`` with one column, ``translation``,
holding ``{src_lang: text, tgt_lang: text}`` dicts (the Hugging Face convention), and a
:class:`CleaningReport` with the counts of everything the cleaning changed or dropped.

Sources (``source`` argument):

* a folder of line-aligned plain-text files ``{split}.{lang}`` (e.g. Multi30k: ``train.en``/``train.de``,
  ``valid.*``, ``test2016.*``); the splits present for both languages are found when ``splits=None``;
* a JSON-lines (``.jsonl``/``.json``), CSV/TSV (``.csv``/``.tsv``, with a header row) or Parquet
  (``.parquet``) file, a dict ``{split: path}`` of such files, or a folder of ``{split}.{ext}`` files.
  A single file is the ``train`` split. Rows hold either a ``translation`` dict (JSON lines, Parquet)
  or one column per language (``en``, ``de``);
* anything else that is not an existing local path is taken as a Hugging Face Hub dataset id and
  loaded with ``datasets.load_dataset(source, hub_config, **hub_kwargs)``; this needs the network
  and is never used unless asked for. A missing path that cannot be a Hub id (``name`` or
  ``owner/name``, see :func:`is_hub_dataset_id`) - one starting with ``/``, ``.`` or ``~``, with two or
  more ``/``, a ``\\`` or a space, or ending in a corpus file extension - raises "does not exist"
  instead of reaching for the Hub.

Cleaning rule (documented contract)
    Every split gets *normalisation*: HTML entities are unescaped (``&amp;`` → ``&``) and the text goes
    through :func:`vaswani_mt.data.tokenization.normalize_text` (NFKC, whitespace runs → one space, strip),
    the same normalisation the tokenizer applies. Only the splits in ``CleaningOptions.filter_splits``
    (by default just ``train``) are *filtered*: pairs that are empty, placeholders (a side with no
    letter or digit, like Multi30k's ``@@``), too long, of extreme length ratio or (if asked) exact
    duplicates are dropped there. Validation and test pairs are never dropped: a pair that would
    have been dropped is kept, counted under ``kept_despite`` and logged as a warning, so evaluation
    always sees the whole test set.

Bad input raises :class:`DataError` (a ``ValueError``) naming the file and the problem: sides of
different lengths (which one is longer and by how much), a missing split file, a file that is not
UTF-8 (with the line number), an empty file, an unknown language (with the languages found), a
training split that the cleaning empties (with the count per reason). Nothing is silently truncated.
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, Value
from datasets.table import InMemoryTable

from ..model.pipeline_vaswani import preprocess_text
from .tokenization import EOS_ID, normalize_text

logger = logging.getLogger(__name__)

TRANSLATION_COLUMN = "translation"
TABULAR_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
# Suffixes that look like a language code but name a file type: never taken as a language.
_NOT_LANGUAGES = {"md", "txt", "py", "sh", "gz", "xz", "bz2", "zip", "tar", "log", "cfg", "ini", "yml",
                  "yaml", "toml", "pdf", "sgm", "xml", "tmx", "rst", "lock"}
_LANGUAGE_SUFFIX = re.compile(r"^[A-Za-z]{2,3}(?:[_-][A-Za-z0-9]{2,8})?$")

# Drop reasons, checked in this order; a pair is counted under the first that applies.
EMPTY, PLACEHOLDER, TOO_LONG, LENGTH_RATIO, DUPLICATE = "empty", "placeholder", "too_long", "length_ratio", "duplicate"
DROP_REASONS = (EMPTY, PLACEHOLDER, TOO_LONG, LENGTH_RATIO, DUPLICATE)


class DataError(ValueError):
    """A corpus cannot be loaded as given (misaligned, missing, undecodable or empty files, ...)."""


# --------------------------------------------------------------------------------------------------
# Cleaning options and report
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------------


class NotUTF8Error(DataError):
    """Text that is not valid UTF-8. ``name`` is the file (or stream), ``line`` the 1-based line number,
    ``raw_line`` the line's bytes, ``start`` the 0-based offset in it of the first bad byte, ``reason``
    Python's (``invalid start byte``, ...). The message names all of them; callers with another wording
    (`vaswani-mt translate`) build theirs from the attributes."""

    def __init__(self, name: str, line: int, raw_line: bytes, start: int, reason: str):
        self.name, self.line, self.raw_line, self.start, self.reason = name, line, raw_line, start, reason
        super().__init__(
            f"{name} is not valid UTF-8: line {line}, byte column {start + 1} "
            f"(byte 0x{raw_line[start]:02X}: {reason}); convert the file to UTF-8"
        )


def _decode_utf8(path: Path) -> str:
    """The whole text of a UTF-8 file (a leading BOM dropped), for the JSON and CSV readers."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        line_end = data.find(b"\n", error.start)
        raw_line = data[line_start:] if line_end < 0 else data[line_start : line_end + 1]
        raise NotUTF8Error(str(path), data.count(b"\n", 0, error.start) + 1, raw_line, error.start - line_start,
                           error.reason) from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DataError(f"{path} is empty (no text)")
    return text


def iter_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """The lines of a binary stream (a file opened with ``"rb"``, ``sys.stdin.buffer``), decoded as UTF-8
    one at a time, without their line ending; the one implementation behind :func:`read_lines` and
    `vaswani-mt translate`'s streaming input.

    Lines end at ``\\n`` only (a ``\\r`` right before it, or at the end of the last line, is removed with it):
    ``str.splitlines`` would also split on U+2028, U+0085, form feeds, ... and silently misalign a parallel
    corpus. A byte-order mark at the start of the stream is dropped. Nothing is read ahead: the memory held
    is one line. Raises :class:`NotUTF8Error` (naming ``name`` and the line) at the first line that is not
    UTF-8, after yielding the lines before it.
    """
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise NotUTF8Error(name, number, raw, error.start, error.reason) from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        if line.endswith("\n"):
            line = line[:-1]
        yield line[:-1] if line.endswith("\r") else line


def read_lines(path: str | os.PathLike) -> list[str]:
    """Read a UTF-8 text file as a list of lines (without line endings), with :func:`iter_lines`'s rules.

    Raises :class:`DataError` for a file that is empty (or only whitespace) or not UTF-8 (naming the line).
    """
    path = Path(path)
    with path.open("rb") as stream:
        lines = list(iter_lines(stream, str(path)))
    if not any(line.strip() for line in lines):
        raise DataError(f"{path} is empty (no text)")
    return lines


def _pairs_to_dataset(sources: Sequence[str], targets: Sequence[str], src_lang: str, tgt_lang: str) -> Dataset:
    """Build a ``translation``-column dataset straight from two lists (via Arrow, no per-row dicts)."""
    column = pa.StructArray.from_arrays(
        [pa.array(sources, type=pa.string()), pa.array(targets, type=pa.string())], names=[src_lang, tgt_lang]
    )
    return Dataset(InMemoryTable(pa.table({TRANSLATION_COLUMN: column})))


def _translation_feature(src_lang: str, tgt_lang: str) -> dict[str, Value]:
    return {src_lang: Value("string"), tgt_lang: Value("string")}


def _language_of(path: Path) -> str | None:
    suffix = path.suffix[1:]
    if path.stem and _LANGUAGE_SUFFIX.match(suffix) and suffix.lower() not in _NOT_LANGUAGES:
        return suffix
    return None


def _text_files(folder: Path) -> dict[str, dict[str, Path]]:
    """``{split: {lang: path}}`` for the ``{split}.{lang}`` files in ``folder``."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        lang = _language_of(path) if path.is_file() else None
        if lang is not None:
            found.setdefault(path.stem, {})[lang] = path
    return found


def _train_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda name: (name != "train", name))


def _read_text_folder(
    folder: Path, src_lang: str, tgt_lang: str, splits: Sequence[str] | None
) -> DatasetDict:
    files = _text_files(folder)
    languages = sorted({lang for per_split in files.values() for lang in per_split})
    for lang in (src_lang, tgt_lang):
        if lang not in languages:
            raise DataError(
                f"unknown language {lang!r}: no '*.{lang}' files in {folder}; languages found: {languages}"
            )
    if splits is None:
        wanted = [name for name, per_split in files.items() if src_lang in per_split or tgt_lang in per_split]
    else:
        wanted = list(splits)
    result = {}
    for split in _train_first(wanted):
        per_split = files.get(split, {})
        missing = [folder / f"{split}.{lang}" for lang in (src_lang, tgt_lang) if lang not in per_split]
        if missing:
            present = sorted(name for name, p in files.items() if src_lang in p and tgt_lang in p)
            raise DataError(
                f"split {split!r}: missing file(s) {', '.join(str(p) for p in missing)} "
                f"(complete {src_lang}-{tgt_lang} splits in {folder}: {present})"
            )
        src_path, tgt_path = per_split[src_lang], per_split[tgt_lang]
        sources, targets = read_lines(src_path), read_lines(tgt_path)
        if len(sources) != len(targets):
            longer, shorter = (src_path, tgt_path) if len(sources) > len(targets) else (tgt_path, src_path)
            raise DataError(
                f"split {split!r}: {src_path.name} has {len(sources)} lines but {tgt_path.name} has "
                f"{len(targets)}; {longer.name} is longer by {abs(len(sources) - len(targets))} lines "
                f"({longer} vs {shorter}); the files must be line-aligned"
            )
        result[split] = _pairs_to_dataset(sources, targets, src_lang, tgt_lang)
    return DatasetDict(result)


def _pair_from_record(record: Any, src_lang: str, tgt_lang: str, where: str) -> tuple[str, str]:
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected an object with a 'translation' dict or language keys, got {record!r:.80}")
    pair = record[TRANSLATION_COLUMN] if TRANSLATION_COLUMN in record else record
    if not isinstance(pair, Mapping):
        raise DataError(f"{where}: 'translation' must be a dict of language → text, got {pair!r:.80}")
    for lang in (src_lang, tgt_lang):
        if lang not in pair:
            kind = "'translation' languages" if pair is not record else "keys"
            raise DataError(f"{where}: unknown language {lang!r}; {kind} found: {sorted(pair)}")
    values = pair[src_lang], pair[tgt_lang]
    for lang, value in zip((src_lang, tgt_lang), values):
        if not isinstance(value, str):
            raise DataError(f"{where}: the {lang!r} text is {value!r:.80}, not a string")
    return values


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    text = _decode_utf8(path)
    if text.lstrip().startswith("["):  # a JSON array of records instead of JSON lines
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: line {error.lineno} is not valid JSON ({error.msg})") from None
        numbered = [(f"{path} record {i}", record) for i, record in enumerate(records, 1)]
    else:
        numbered = []
        for line_no, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                numbered.append((f"{path} line {line_no}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}: line {line_no} is not valid JSON ({error.msg})") from None
    if not numbered:
        raise DataError(f"{path} is empty (no records)")
    pairs = [_pair_from_record(record, src_lang, tgt_lang, where) for where, record in numbered]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _read_delimited(path: Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    text = _decode_utf8(path)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix == ".tsv" else ",")
    columns = reader.fieldnames or []
    for lang in (src_lang, tgt_lang):
        if lang not in columns:
            raise DataError(f"{path}: unknown language {lang!r}; columns found in the header: {columns}")
    sources, targets = [], []
    for row in reader:
        src, tgt = row.get(src_lang), row.get(tgt_lang)
        if src is None or tgt is None:
            raise DataError(f"{path} line {reader.line_num}: the row has fewer fields than the header {columns}")
        sources.append(src)
        targets.append(tgt)
    if not sources:
        raise DataError(f"{path} is empty (a header but no rows)")
    return sources, targets


def _read_parquet(path: Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise DataError(f"{path} cannot be read as Parquet: {error}") from None
    if table.num_rows == 0:
        raise DataError(f"{path} is empty (no rows)")
    if TRANSLATION_COLUMN in table.column_names:
        struct = table.column(TRANSLATION_COLUMN).combine_chunks()
        found = [struct.type.field(i).name for i in range(struct.type.num_fields)]
        columns = {name: struct.field(name) for name in found}
        what = "'translation' languages"
    else:
        found, columns, what = table.column_names, {n: table.column(n) for n in table.column_names}, "columns"
    result = []
    for lang in (src_lang, tgt_lang):
        if lang not in found:
            raise DataError(f"{path}: unknown language {lang!r}; {what} found: {found}")
        values = columns[lang].to_pylist()
        for row, value in enumerate(values):
            if not isinstance(value, str):
                raise DataError(f"{path} row {row}: the {lang!r} text is {value!r:.80}, not a string")
        result.append(values)
    return result[0], result[1]


_TABULAR_READERS = {".jsonl": _read_jsonl, ".json": _read_jsonl, ".csv": _read_delimited,
                    ".tsv": _read_delimited, ".parquet": _read_parquet}


def _read_tabular(files: Mapping[str, Path], src_lang: str, tgt_lang: str, splits: Sequence[str] | None) -> DatasetDict:
    if splits is not None:
        missing = [split for split in splits if split not in files]
        if missing:
            raise DataError(f"split(s) {missing} not found; files given: { {k: str(v) for k, v in files.items()} }")
        files = {split: files[split] for split in splits}
    result = {}
    for split in _train_first(list(files)):
        path = Path(files[split])
        if not path.is_file():
            raise DataError(f"split {split!r}: file {path} does not exist")
        reader = _TABULAR_READERS.get(path.suffix.lower())
        if reader is None:
            raise DataError(f"split {split!r}: {path} has an unsupported extension; use one of {TABULAR_SUFFIXES}")
        sources, targets = reader(path, src_lang, tgt_lang)
        result[split] = _pairs_to_dataset(sources, targets, src_lang, tgt_lang)
    return DatasetDict(result)


# File extensions that mark a corpus file: a string ending in one of them is never taken as a Hub id.
_CORPUS_FILE_SUFFIXES = (*TABULAR_SUFFIXES, ".txt")
_HUB_ID = re.compile(r"[\w.-]+(?:/[\w.-]+)?")


def is_hub_dataset_id(path: str) -> bool:
    """Whether ``path`` can be a Hugging Face Hub dataset id rather than a local path. Existence is not checked.

    The rule: ``name`` or ``owner/name``, each part made of letters, digits, ``_``, ``-`` and ``.`` (so no second
    ``/``, no ``\\``, no ``~``, no ``:`` as in ``C:/data``, no spaces), not starting with ``.`` (``./corpus``,
    ``../data``) and not ending in a corpus file extension (``.jsonl .json .csv .tsv .parquet .txt``, any case).
    Examples: ``wmt14``, ``owner/corpus`` are Hub ids; ``/data/wmt``, ``./corpus``, ``a/b/c``, ``corpus.jsonl``,
    ``~/data``, ``C:\\data`` are not. A string that exists locally is a local path whatever this says: callers check
    the file system first (see :func:`read_parallel`).
    """
    return (
        _HUB_ID.fullmatch(path) is not None
        and not path.startswith(".")
        and Path(path).suffix.lower() not in _CORPUS_FILE_SUFFIXES
    )


def _features_languages(dataset: Dataset) -> list[str]:
    feature = dataset.features[TRANSLATION_COLUMN]
    languages = getattr(feature, "languages", None)  # datasets.Translation
    return list(languages) if languages is not None else list(feature)


def _hub_to_translation(dataset: Dataset, src_lang: str, tgt_lang: str, source: str, split: str) -> Dataset:
    """Bring a Hub split to the single ``translation`` column with exactly the two languages."""
    columns = dataset.column_names
    found = _features_languages(dataset) if TRANSLATION_COLUMN in columns else columns
    for lang in (src_lang, tgt_lang):
        if lang not in found:
            what = "'translation' languages" if TRANSLATION_COLUMN in columns else "columns"
            raise DataError(f"Hub dataset {source!r} split {split!r}: unknown language {lang!r}; {what} found: {found}")

    def select_pair(batch: dict[str, list]) -> dict[str, list]:
        if TRANSLATION_COLUMN in batch:
            pairs = batch[TRANSLATION_COLUMN]
            return {TRANSLATION_COLUMN: [{src_lang: p[src_lang], tgt_lang: p[tgt_lang]} for p in pairs]}
        return {TRANSLATION_COLUMN: [{src_lang: s, tgt_lang: t} for s, t in zip(batch[src_lang], batch[tgt_lang])]}

    if columns == [TRANSLATION_COLUMN] and found == [src_lang, tgt_lang]:
        return dataset
    # Explicit features: map would otherwise keep the old struct type, other languages included (as None).
    return dataset.map(
        select_pair,
        batched=True,
        remove_columns=columns,
        features=Features({TRANSLATION_COLUMN: _translation_feature(src_lang, tgt_lang)}),
        desc=f"Selecting {src_lang}-{tgt_lang}",
    )


def _read_hub(source: str, src_lang: str, tgt_lang: str, splits: Sequence[str] | None,
              hub_config: str | None, hub_kwargs: dict[str, Any]) -> DatasetDict:
    import datasets

    try:
        loaded = datasets.load_dataset(source, hub_config, **hub_kwargs)
    except Exception as error:  # network, auth, unknown id: say why the Hub was asked at all
        raise DataError(
            f"{source!r} is not an existing local path, so it was loaded as a Hugging Face Hub dataset id, "
            f"which failed: {type(error).__name__}: {error}"
        ) from error
    if isinstance(loaded, Dataset):
        loaded = DatasetDict({"train": loaded})
    names = list(loaded) if splits is None else list(splits)
    missing = [name for name in names if name not in loaded]
    if missing:
        raise DataError(f"Hub dataset {source!r} has no split(s) {missing}; splits found: {list(loaded)}")
    return DatasetDict({name: _hub_to_translation(loaded[name], src_lang, tgt_lang, source, name) for name in names})


def read_parallel(
    source: str | os.PathLike | Mapping[str, str | os.PathLike],
    src_lang: str,
    tgt_lang: str,
    splits: Sequence[str] | None = None,
    hub_config: str | None = None,
    **hub_kwargs: Any,
) -> DatasetDict:
    """Read a parallel corpus as it is (no cleaning) into a DatasetDict with a ``translation`` column.

    See the module docstring for the accepted sources; raises :class:`DataError` on bad input.
    ``hub_config`` and ``hub_kwargs`` go to ``datasets.load_dataset`` for a Hub dataset id.
    """
    if src_lang == tgt_lang:
        raise DataError(f"source and target language are both {src_lang!r}")
    if isinstance(splits, str):
        splits = [splits]
    if isinstance(source, Mapping):
        return _read_tabular({split: Path(path) for split, path in source.items()}, src_lang, tgt_lang, splits)
    path = Path(source).expanduser()
    if path.is_dir():
        if any(_text_files(path).values()):
            return _read_text_folder(path, src_lang, tgt_lang, splits)
        tables = {p.stem: p for p in sorted(path.iterdir()) if p.suffix.lower() in TABULAR_SUFFIXES}
        if not tables:
            raise DataError(
                f"{path} holds neither '{{split}}.{{lang}}' text files nor {'/'.join(TABULAR_SUFFIXES)} files"
            )
        return _read_tabular(tables, src_lang, tgt_lang, splits)
    if path.is_file():
        return _read_tabular({"train": path}, src_lang, tgt_lang, splits)
    if isinstance(source, os.PathLike) or not is_hub_dataset_id(str(source)):
        raise DataError(f"{source} does not exist")
    return _read_hub(str(source), src_lang, tgt_lang, splits, hub_config, hub_kwargs)


# --------------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------------


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


def _column(dataset: Dataset, name: str) -> list:
    """A column as a Python list, read through Arrow (indexing ``dataset[name]`` iterates row by row)."""
    return dataset.with_format("arrow")[name].to_pylist()


def _clean_batch(batch: dict[str, list], src_lang: str, tgt_lang: str, options: CleaningOptions) -> dict[str, list]:
    pairs, reasons, unescaped, normalized, keys = [], [], [], [], []
    for pair in batch[TRANSLATION_COLUMN]:
        src, src_unescaped, src_normalized = _clean_text(pair[src_lang], options)
        tgt, tgt_unescaped, tgt_normalized = _clean_text(pair[tgt_lang], options)
        pairs.append({src_lang: src, tgt_lang: tgt})
        reasons.append(_drop_reason(src, tgt, options))
        unescaped.append(src_unescaped or tgt_unescaped)
        normalized.append(src_normalized or tgt_normalized)
        keys.append(_pair_key(src, tgt) if options.deduplicate else 0)
    return {
        TRANSLATION_COLUMN: pairs, "_reason": reasons, "_unescaped": unescaped, "_normalized": normalized, "_key": keys,
    }


_HELPER_COLUMNS = ["_reason", "_unescaped", "_normalized", "_key"]
_MAX_LOGGED_EXAMPLES = 5


def _clean_split(
    dataset: Dataset, split: str, src_lang: str, tgt_lang: str, options: CleaningOptions, num_proc: int | None
) -> tuple[Dataset, SplitCleaningReport]:
    filtered = split in options.filter_splits
    report = SplitCleaningReport(split=split, filtered=filtered, pairs_in=len(dataset))
    marked = dataset.map(
        _clean_batch,
        batched=True,
        fn_kwargs={"src_lang": src_lang, "tgt_lang": tgt_lang, "options": options},
        remove_columns=dataset.column_names,
        features=Features({
            TRANSLATION_COLUMN: _translation_feature(src_lang, tgt_lang),
            "_reason": Value("string"),
            "_unescaped": Value("bool"),
            "_normalized": Value("bool"),
            "_key": Value("int64"),
        }),
        num_proc=num_proc if num_proc and num_proc > 1 and len(dataset) > 10_000 else None,
        desc=f"Cleaning {split}",
    )
    reasons = _column(marked, "_reason")
    if options.deduplicate:
        seen: set[int] = set()
        for index, key in enumerate(_column(marked, "_key")):
            if reasons[index]:
                continue
            if key in seen:
                reasons[index] = DUPLICATE
            seen.add(key)
    counts = Counter(reason for reason in reasons if reason)
    report.html_unescaped = sum(_column(marked, "_unescaped"))
    report.text_normalized = sum(_column(marked, "_normalized"))
    ordered = {reason: counts[reason] for reason in DROP_REASONS if counts[reason]}
    if filtered:
        report.dropped = ordered
        kept = [index for index, reason in enumerate(reasons) if not reason]
        if not kept and reasons:
            raise DataError(f"split {split!r} is empty after cleaning: all {len(reasons)} pairs were dropped ("
                            + ", ".join(f"{reason}: {count}" for reason, count in ordered.items())
                            + "); check the data, or the cleaning limits (max_length, max_ratio)")
        if len(kept) < len(marked):
            marked = marked.select(kept)
    else:
        report.kept_despite = ordered
        flagged = [(index, reason) for index, reason in enumerate(reasons) if reason]
        if flagged:
            examples = ", ".join(f"#{i} ({reason})" for i, reason in flagged[:_MAX_LOGGED_EXAMPLES])
            logger.warning(
                "%s: kept %d pair(s) that the cleaning would drop in a training split (e.g. %s); "
                "%s is not filtered so that evaluation sees every pair", split, len(flagged), examples, split,
            )
    report.pairs_out = len(marked)
    logger.info("cleaning %s", report.summary())
    return marked.remove_columns(_HELPER_COLUMNS), report


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


# --------------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------------


def _tokenize_batch(
    batch: dict[str, list], tokenizer: Any, src_lang: str, tgt_lang: str,
    max_length: int | None, with_attention_mask: bool,
) -> dict[str, list]:
    pairs = batch[TRANSLATION_COLUMN]
    encoded = tokenizer(
        [pair[src_lang] for pair in pairs],
        text_target=[pair[tgt_lang] for pair in pairs],
        truncation=False,
        return_attention_mask=False,
    )
    input_ids, labels = encoded["input_ids"], encoded["labels"]
    truncated = [False] * len(pairs)
    if max_length is not None:
        for column in (input_ids, labels):
            for row, ids in enumerate(column):
                if len(ids) > max_length:
                    # Keep the final </s>: the model must still see where the sentence ends.
                    column[row] = ids[: max_length - 1] + [EOS_ID]
                    truncated[row] = True
    result = {"input_ids": input_ids, "labels": labels, "_truncated": truncated}
    if with_attention_mask:
        result["attention_mask"] = [[1] * len(ids) for ids in input_ids]
    return result


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


def tokenize_dataset(
    dataset: DatasetDict | Dataset,
    tokenizer: Any,
    src_lang: str,
    tgt_lang: str,
    max_length: int | None = None,
    num_proc: int | None = None,
    with_attention_mask: bool = False,
    batch_size: int = 1000,
) -> DatasetDict | Dataset:
    """Tokenise the ``translation`` column of every split into ``input_ids`` and ``labels``.

    Both end with ``</s>`` and are *not padded*: pad per batch with
    ``DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)``, which also builds the
    ``attention_mask`` (so none is stored unless ``with_attention_mask=True``). The ``translation``
    column is removed. Lengths for :class:`~vaswani_mt.data.batching.TokenBudgetBatchSampler` are read from
    the two columns.

    Each split is tokenised once with a batched ``Dataset.map``; datasets backed by cache files (e.g.
    from the Hub or ``load_from_disk``) reuse the cached result on the next run. ``num_proc`` > 1 runs
    several processes, which pays off only for large corpora (the Rust tokenizer is already fast).

    ``max_length`` (None: no limit) truncates longer sequences to ``max_length`` tokens ending in
    ``</s>``; how many examples were truncated is logged as a warning per split.
    """
    if isinstance(dataset, Dataset):
        return _tokenize_split(dataset, "dataset", tokenizer, src_lang, tgt_lang, max_length, num_proc,
                               with_attention_mask, batch_size)
    return DatasetDict(
        {
            split: _tokenize_split(ds, split, tokenizer, src_lang, tgt_lang, max_length, num_proc,
                                   with_attention_mask, batch_size)
            for split, ds in dataset.items()
        }
    )


def _tokenize_split(
    dataset: Dataset, split: str, tokenizer: Any, src_lang: str, tgt_lang: str, max_length: int | None,
    num_proc: int | None, with_attention_mask: bool, batch_size: int,
) -> Dataset:
    if TRANSLATION_COLUMN not in dataset.column_names:
        raise DataError(f"{split}: no 'translation' column to tokenise (columns: {dataset.column_names})")
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be at least 2 (one token and </s>), not {max_length}")
    tokenized = dataset.map(
        _tokenize_batch,
        batched=True,
        batch_size=batch_size,
        fn_kwargs={"tokenizer": tokenizer, "src_lang": src_lang, "tgt_lang": tgt_lang,
                   "max_length": max_length, "with_attention_mask": with_attention_mask},
        remove_columns=dataset.column_names,
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        desc=f"Tokenizing {split}",
    )
    truncated = sum(_column(tokenized, "_truncated"))
    if truncated:
        logger.warning(
            "%s: truncated %d of %d examples to max_length=%d tokens", split, truncated, len(tokenized), max_length
        )
    return tokenized.remove_columns(["_truncated"])
