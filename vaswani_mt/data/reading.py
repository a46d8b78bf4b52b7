"""Reading parallel corpora: ``read_parallel`` turns a corpus into a ``datasets.DatasetDict`` with one column,
``translation``, holding ``{src_lang: text, tgt_lang: text}`` dicts (the Hugging Face convention), as it is (no
cleaning: see `vaswani_mt.data.cleaning`).

Sources (``source`` argument):

* a folder of line-aligned plain-text files ``{split}.{lang}`` (e.g. Multi30k: ``train.en``/``train.de``,
  ``valid.*``, ``test2016.*``); the splits present for both languages are found when ``splits=None``. The files are
  read as a stream of line pairs (`iter_line_pairs`), so a corpus of any size can be written to Arrow files chunk by
  chunk (`vaswani_mt.data.prepared`);
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

Bad input raises :class:`DataError` (a ``ValueError``) naming the file and the problem: sides of
different lengths (which one is longer and by how much), a missing split file, a file that is not
UTF-8 (with the line number), an empty file, an unknown language (with the languages found).
Nothing is silently truncated.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Features, Value
from datasets.table import InMemoryTable

TRANSLATION_COLUMN = "translation"
TABULAR_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
# Suffixes that look like a language code but name a file type: never taken as a language.
_NOT_LANGUAGES = {"md", "txt", "py", "sh", "gz", "xz", "bz2", "zip", "tar", "log", "cfg", "ini", "yml",
                  "yaml", "toml", "pdf", "sgm", "xml", "tmx", "rst", "lock"}
_LANGUAGE_SUFFIX = re.compile(r"^[A-Za-z]{2,3}(?:[_-][A-Za-z0-9]{2,8})?$")



class DataError(ValueError):
    """A corpus cannot be loaded as given (misaligned, missing, undecodable or empty files, ...)."""



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


def text_files(folder: Path) -> dict[str, dict[str, Path]]:
    """``{split: {lang: path}}`` for the ``{split}.{lang}`` files in ``folder``."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        lang = _language_of(path) if path.is_file() else None
        if lang is not None:
            found.setdefault(path.stem, {})[lang] = path
    return found


def _train_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda name: (name != "train", name))


def text_split_files(folder: Path, src_lang: str, tgt_lang: str,
                     splits: Sequence[str] | None) -> dict[str, tuple[Path, Path]]:
    """``{split: (source file, target file)}`` of a folder of ``{split}.{lang}`` files, the training split first;
    DataError for an unknown language or a split without both files."""
    files = text_files(folder)
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
        result[split] = (per_split[src_lang], per_split[tgt_lang])
    return result


_END = object()


def iter_line_pairs(src_path: Path, tgt_path: Path, split: str, chunk_size: int = 50_000,
                    progress=None) -> Iterator[tuple[list[str], list[str]]]:
    """The line pairs of two line-aligned files, in chunks of `chunk_size`, read as a stream (the memory held is one
    chunk), with :func:`iter_lines`'s rules; `progress(bytes of the source file read)` is called with each chunk.
    Raises DataError, after the chunks before the problem, for a file that is not UTF-8 (naming the line), a file
    with no text, or files of different lengths (naming the longer one)."""
    counts, has_text = [0, 0], [False, False]
    sources: list[str] = []
    targets: list[str] = []
    with src_path.open("rb") as src_stream, tgt_path.open("rb") as tgt_stream:
        pairs = itertools.zip_longest(iter_lines(src_stream, str(src_path)), iter_lines(tgt_stream, str(tgt_path)),
                                      fillvalue=_END)
        for source, target in pairs:
            if source is _END or target is _END:  # one file ends: count (and look at) the rest of the other
                side = int(source is _END)
                for pair in itertools.chain([(source, target)], pairs):
                    counts[side] += 1
                    has_text[side] = has_text[side] or bool(pair[side].strip())
                break
            counts[0] += 1
            counts[1] += 1
            has_text[0] = has_text[0] or bool(source.strip())
            has_text[1] = has_text[1] or bool(target.strip())
            sources.append(source)
            targets.append(target)
            if len(sources) == chunk_size:
                if progress is not None:
                    progress(src_stream.tell())
                yield sources, targets
                sources, targets = [], []
    for path, text in zip((src_path, tgt_path), has_text):
        if not text:
            raise DataError(f"{path} is empty (no text)")
    if counts[0] != counts[1]:
        longer, shorter = (src_path, tgt_path) if counts[0] > counts[1] else (tgt_path, src_path)
        raise DataError(
            f"split {split!r}: {src_path.name} has {counts[0]} lines but {tgt_path.name} has "
            f"{counts[1]}; {longer.name} is longer by {abs(counts[0] - counts[1])} lines "
            f"({longer} vs {shorter}); the files must be line-aligned"
        )
    if progress is not None:
        progress(src_path.stat().st_size)
    if sources:
        yield sources, targets


def translation_schema(src_lang: str, tgt_lang: str) -> pa.Schema:
    return pa.schema([(TRANSLATION_COLUMN, pa.struct([(src_lang, pa.string()), (tgt_lang, pa.string())]))])


def _read_text_folder(
    folder: Path, src_lang: str, tgt_lang: str, splits: Sequence[str] | None
) -> DatasetDict:
    result = {}
    for split, (src_path, tgt_path) in text_split_files(folder, src_lang, tgt_lang, splits).items():
        sources, targets = [], []
        for chunk_sources, chunk_targets in iter_line_pairs(src_path, tgt_path, split):
            sources += chunk_sources
            targets += chunk_targets
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


def _read_tabular(files: Mapping[str, Path], src_lang: str, tgt_lang: str, splits: Sequence[str] | None,
                  cache_dir: str | os.PathLike | None = None) -> DatasetDict:
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
        try:  # `datasets`' own builder: Arrow files on disk, memory-mapped, whatever the file's size
            result[split] = _as_translation(_load_with_builder(path, cache_dir), src_lang, tgt_lang)
        except Exception:  # noqa: BLE001 - read it with the checks that name the file, line and field instead
            sources, targets = reader(path, src_lang, tgt_lang)
            result[split] = _pairs_to_dataset(sources, targets, src_lang, tgt_lang)
    return DatasetDict(result)


class _NotAsExpected(ValueError):
    """What a builder read is not a pair of text columns without gaps: the file is read again, by our own reader."""


def _load_with_builder(path: Path, cache_dir: str | os.PathLike | None) -> Dataset:
    """A JSON-lines, CSV/TSV or Parquet file through `datasets`' json / csv / parquet builder, CSV columns as text."""
    import datasets

    suffix = path.suffix.lower()
    kwargs: dict[str, Any] = {}
    if suffix in (".csv", ".tsv"):
        with path.open(encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle, delimiter="\t" if suffix == ".tsv" else ","), [])
        # pandas' NA rules stay on: an empty or missing field, or text such as "NA", becomes null, which sends the
        # file to our reader (it keeps such text, and names a row with a missing field)
        kwargs = {"delimiter": "\t" if suffix == ".tsv" else ",",
                  "features": Features({name: Value("string") for name in header}), "encoding": "utf-8-sig"}
    builder = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}[suffix]
    return datasets.load_dataset(builder, data_files={"train": str(path)}, split="train",
                                 cache_dir=str(cache_dir) if cache_dir else None, **kwargs)


def _as_translation(dataset: Dataset, src_lang: str, tgt_lang: str) -> Dataset:
    """The builder's rows as one `translation` column of the two languages; _NotAsExpected when a language is
    missing, a value is not text, or there are no rows."""
    if len(dataset) == 0:
        raise _NotAsExpected("no rows")
    table = dataset.with_format("arrow")
    if TRANSLATION_COLUMN in dataset.column_names:
        struct = table[TRANSLATION_COLUMN]
        if not pa.types.is_struct(struct.type):
            raise _NotAsExpected("translation is not a struct")
        columns = {struct.type.field(i).name: i for i in range(struct.type.num_fields)}
        arrays = {lang: pc.struct_field(struct, columns[lang]) for lang in (src_lang, tgt_lang) if lang in columns}
    else:
        arrays = {lang: table[lang] for lang in (src_lang, tgt_lang) if lang in dataset.column_names}
    if len(arrays) < 2 or any(not pa.types.is_string(a.type) or a.null_count for a in arrays.values()):
        raise _NotAsExpected("a language is missing or not text in every row")
    try:
        for array in arrays.values():
            array.validate(full=True)  # text that is not UTF-8
    except pa.ArrowInvalid as error:
        raise _NotAsExpected(str(error)) from None
    if dataset.column_names == [TRANSLATION_COLUMN] and list(columns) == [src_lang, tgt_lang]:
        return dataset

    def select_pair(batch: pa.Table) -> pa.Table:
        if TRANSLATION_COLUMN in batch.column_names:
            pairs = batch.column(TRANSLATION_COLUMN).combine_chunks()
            src, tgt = pairs.field(src_lang), pairs.field(tgt_lang)
        else:
            src, tgt = batch.column(src_lang).combine_chunks(), batch.column(tgt_lang).combine_chunks()
        return pa.table({TRANSLATION_COLUMN: pa.StructArray.from_arrays([src, tgt], names=[src_lang, tgt_lang])})

    return dataset.with_format("arrow").map(
        select_pair, batched=True, remove_columns=dataset.column_names,
        features=Features({TRANSLATION_COLUMN: _translation_feature(src_lang, tgt_lang)}),
        desc=f"Selecting {src_lang}-{tgt_lang}").with_format(None)


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
    cache_dir: str | os.PathLike | None = None,
    **hub_kwargs: Any,
) -> DatasetDict:
    """Read a parallel corpus as it is (no cleaning) into a DatasetDict with a ``translation`` column.

    See the module docstring for the accepted sources; raises :class:`DataError` on bad input.
    ``hub_config`` and ``hub_kwargs`` go to ``datasets.load_dataset`` for a Hub dataset id. JSON-lines, CSV/TSV and
    Parquet files are read by `datasets`' builders into Arrow files under ``cache_dir`` (default: `datasets`' cache);
    a file they read otherwise than the rules above is read again by this module's own readers, whose errors name
    the file, line and field.
    """
    if src_lang == tgt_lang:
        raise DataError(f"source and target language are both {src_lang!r}")
    if isinstance(splits, str):
        splits = [splits]
    if isinstance(source, Mapping):
        return _read_tabular({split: Path(path) for split, path in source.items()}, src_lang, tgt_lang, splits,
                             cache_dir)
    path = Path(source).expanduser()
    if path.is_dir():
        if any(text_files(path).values()):
            return _read_text_folder(path, src_lang, tgt_lang, splits)
        tables = {p.stem: p for p in sorted(path.iterdir()) if p.suffix.lower() in TABULAR_SUFFIXES}
        if not tables:
            raise DataError(
                f"{path} holds neither '{{split}}.{{lang}}' text files nor {'/'.join(TABULAR_SUFFIXES)} files"
            )
        return _read_tabular(tables, src_lang, tgt_lang, splits, cache_dir)
    if path.is_file():
        return _read_tabular({"train": path}, src_lang, tgt_lang, splits, cache_dir)
    if isinstance(source, os.PathLike) or not is_hub_dataset_id(str(source)):
        raise DataError(f"{source} does not exist")
    return _read_hub(str(source), src_lang, tgt_lang, splits, hub_config, hub_kwargs)


def arrow_column(dataset: Dataset, name: str) -> list:
    """A column as a Python list, read through Arrow (indexing ``dataset[name]`` iterates row by row)."""
    return dataset.with_format("arrow")[name].to_pylist()
