"""Prepared data: a corpus read, cleaned and tokenised once into Arrow files on disk, which every run, `--resume` and
process of a multi-process run memory-maps instead of redoing the work (what fairseq-preprocess's binarised data is to
fairseq, with `datasets`' Arrow files).

    prepared = prepare(data_config, tokenizer_config)        # `vaswani-mt prepare --config NAME` does the same
    prepared.text["test2016"], prepared.tokenized["train"], prepared.tokenizer, prepared.report

Three kinds of entry in the cache folder (`data.cache_dir`; default $VASWANI_MT_CACHE, else ~/.cache/vaswani_mt),
each named by a fingerprint of everything it depends on, so that a change to any input prepares again and the same
inputs never do:

  corpus-<key>/     every pair of each split, cleaned (and `data.preprocess`ed), with its cleaning marks; which pairs
                    stay (`keep-<split>.npy`); the cleaning counts. Key: the data files (path, size, modification
                    time), languages, splits, cleaning options, preprocessing.
  bpe-<key>/        the joint BPE learned on the kept training pairs, or an evenly spread sample of them
                    (`tokenizer.sample`). Key: the corpus key, vocabulary size, minimum frequency, sample size.
  tokenized-<key>/  `input_ids` and `labels` of the kept pairs. Key: the corpus key, the tokenizer's content,
                    `data.max_length`.

An entry is written in a temporary folder beside it and renamed into place once complete (the rename is the commit):
a process killed while preparing leaves only a `.tmp` folder that no run takes for data, and the next preparation of
that entry removes it. Processes preparing the same entry at once take turns through a lock file, so the second one
finds the first one's result. Memory does not grow with the corpus: text files are read as a stream of line pairs
and written chunk by chunk, cleaning and tokenising run as batched `Dataset.map` passes over memory-mapped files
(in two worker processes for large splits), and the token-budget sampler reads the lengths as Arrow columns.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Features, Sequence, Value, concatenate_datasets
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .cleaning import CLEANING_MARKS, CleaningOptions, CleaningReport, SplitCleaningReport, judge_split, mark_split
from .reading import (
    TABULAR_SUFFIXES,
    TRANSLATION_COLUMN,
    _text_files,
    read_parallel,
    text_split_files,
    write_text_split,
)
from .tokenization import EOS_ID, train_tokenizer

logger = logging.getLogger(__name__)

CACHE_ENV = "VASWANI_MT_CACHE"
FORMAT = 1  # what an entry holds; a change makes every key new
LARGE_SPLIT = 100_000  # pairs from which the cleaning and tokenising passes use worker processes
WORKERS = 2
ENCODE_BATCH = 2_000


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vaswani_mt")


def fingerprint(*parts: Any) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=10).hexdigest()


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def source_identity(source: str | os.PathLike | Mapping, src_lang: str, tgt_lang: str, splits: list[str]) -> list:
    """What identifies the data a run reads: for local files, each file's path, size and modification time (the
    files of the requested splits of a folder); for a Hub id, the id (the Hub's own cache keeps its files)."""
    if isinstance(source, Mapping):
        return [[split, _file_identity(Path(path))] for split, path in sorted(source.items()) if Path(path).is_file()]
    path = Path(source).expanduser()
    if path.is_file():
        return [_file_identity(path)]
    if path.is_dir():
        texts = _text_files(path)
        files = [p for split in splits for p in texts.get(split, {}).values()]
        files += [p for p in sorted(path.iterdir()) if p.suffix.lower() in TABULAR_SUFFIXES and p.stem in splits]
        return [_file_identity(p) for p in sorted(files)]
    return ["hub", str(source)]


@dataclass
class PreparedData:
    """A prepared corpus: the kept pairs' text per split (`translation`, cleaned and preprocessed), their tokens per
    split (`input_ids`, `labels`), the tokenizer, the cleaning counts, and the cache folders it came from."""

    text: DatasetDict
    tokenized: DatasetDict
    tokenizer: PreTrainedTokenizerFast
    report: CleaningReport
    folders: dict[str, Path]


def prepare(data, tokenizer_config, tokenizer: PreTrainedTokenizerFast | None = None,
            cache_dir: str | os.PathLike | None = None) -> PreparedData:
    """The corpus of a run config's `data` section, prepared (or found prepared) in the cache. `tokenizer` (an
    existing one, e.g. a resumed run's) is used as it is; else `tokenizer_config.path`, else the joint BPE learned
    on the training split (`tokenizer_config`: vocab_size, min_frequency, sample)."""
    cache = Path(cache_dir or getattr(data, "cache_dir", None) or default_cache_dir()).expanduser()
    src, tgt = data.source_lang, data.target_lang
    splits = [s for s in (data.train_split, data.valid_split, data.test_split) if s]
    options = CleaningOptions(deduplicate=data.drop_duplicates, filter_splits=(data.train_split,))
    corpus_key = fingerprint(FORMAT, source_identity(data.path, src, tgt, splits), src, tgt, splits, options,
                             data.preprocess)
    corpus = _entry(cache, f"corpus-{corpus_key}", lambda tmp: _build_corpus(tmp, data, splits, options))
    marked = _load_splits(corpus)
    keep = {split: np.load(corpus / f"keep-{split}.npy") for split in marked}
    report = CleaningReport({split: SplitCleaningReport(**counts) for split, counts in
                             json.loads((corpus / "report.json").read_text())["splits"].items()})
    logger.info("data: %s", report.summary())
    folders = {"corpus": corpus}

    if tokenizer is None and tokenizer_config.path is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_config.path)
    if tokenizer is None:
        sample = getattr(tokenizer_config, "sample", None)
        bpe_key = fingerprint(FORMAT, corpus_key, tokenizer_config.vocab_size, tokenizer_config.min_frequency, sample)
        folders["bpe"] = _entry(cache, f"bpe-{bpe_key}", lambda tmp: _learn_bpe(
            tmp, marked[data.train_split], keep[data.train_split], src, tgt, tokenizer_config, sample))
        tokenizer = AutoTokenizer.from_pretrained(folders["bpe"])

    tokens_key = fingerprint(FORMAT, corpus_key, hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode())
                             .hexdigest(), data.max_length)
    folders["tokenized"] = _entry(cache, f"tokenized-{tokens_key}", lambda tmp: _tokenize(
        tmp, marked, keep, tokenizer, src, tgt, data.max_length))
    tokenized = _load_splits(folders["tokenized"]).remove_columns("_truncated")
    text = DatasetDict({split: (dataset if keep[split].all() else dataset.select(np.flatnonzero(keep[split])))
                        .remove_columns(CLEANING_MARKS) for split, dataset in marked.items()})
    return PreparedData(text=text, tokenized=tokenized, tokenizer=tokenizer, report=report, folders=folders)


# --- entries -------------------------------------------------------------------------------------------------------
def _entry(cache: Path, name: str, build) -> Path:
    """The folder of cache entry `name`, built by `build(temporary folder)` unless it is complete already."""
    final = cache / name
    if final.is_dir():
        logger.info("prepared data found: %s", final)
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that prepares %s", final)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():  # the other process finished it
            return final
        for stale in cache.glob(f".{name}.tmp-*"):  # left by a killed preparation (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.info("prepared %s", final)
    return final


def _save_manifest(folder: Path, splits: dict[str, Dataset], **extra: Any) -> None:
    files = {split: [Path(f["filename"]).name for f in dataset.cache_files] for split, dataset in splits.items()}
    (folder / "manifest.json").write_text(json.dumps({"splits": files, **extra}, indent=1) + "\n")


def _load_splits(folder: Path) -> DatasetDict:
    manifest = json.loads((folder / "manifest.json").read_text())
    return DatasetDict({split: concatenate_datasets([Dataset.from_file(str(folder / name)) for name in files])
                        if len(files) > 1 else Dataset.from_file(str(folder / files[0]))
                        for split, files in manifest["splits"].items()})


def _workers(rows: int) -> int | None:
    return min(WORKERS, os.cpu_count() or 1) if rows >= LARGE_SPLIT else None


@contextlib.contextmanager
def _forked_tokenizers() -> Iterator[None]:
    """Worker processes forked after the tokenizers library used its threads would warn and turn them off: say so
    up front (each worker encodes on one thread; the workers are the parallelism)."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


# --- corpus: read and clean ----------------------------------------------------------------------------------------
def _read_splits(tmp: Path, data, splits: list[str]) -> dict[str, Dataset]:
    """The raw splits: a folder of `{split}.{lang}` text files streamed into Arrow files in `tmp`; anything else read
    with `read_parallel`."""
    src, tgt = data.source_lang, data.target_lang
    path = None if isinstance(data.path, Mapping) else Path(str(data.path)).expanduser()
    if path is None or not path.is_dir() or not any(_text_files(path).values()):
        return dict(read_parallel(data.path, src, tgt, splits=splits))
    raw = {}
    for split, (src_path, tgt_path) in text_split_files(path, src, tgt, splits).items():
        target = tmp / f"{split}.raw.arrow"
        with tqdm(total=src_path.stat().st_size, unit="B", unit_scale=True, desc=f"Reading {split}") as bar:
            written = write_text_split(src_path, tgt_path, split, src, tgt, target,
                                       progress=lambda position, _bar=bar: _bar.update(position - _bar.n))
        logger.info("read %s: %d pairs (%s, %s)", split, written, src_path, tgt_path)
        raw[split] = Dataset.from_file(str(target))
    return raw


def _build_corpus(tmp: Path, data, splits: list[str], options: CleaningOptions) -> None:
    src, tgt = data.source_lang, data.target_lang
    raw = _read_splits(tmp, data, splits)
    marked, reports = {}, {}
    for split, dataset in raw.items():
        marked[split] = mark_split(dataset, split, src, tgt, options, num_proc=_workers(len(dataset)),
                                   preprocess=data.preprocess, cache_file_name=str(tmp / f"{split}.arrow"))
        reports[split], keep = judge_split(marked[split], split, options)
        np.save(tmp / f"keep-{split}.npy", keep)
    for leftover in tmp.glob("*.raw.arrow"):
        leftover.unlink()
    _save_manifest(tmp, marked)
    (tmp / "report.json").write_text(json.dumps({"splits": CleaningReport(reports).to_dict()}, indent=1) + "\n")


# --- the tokenizer -------------------------------------------------------------------------------------------------
def _kept_texts(train: Dataset, keep: np.ndarray, src: str, tgt: str, stride: int) -> Iterator[str]:
    """Source and target of every `stride`-th kept pair, read in Arrow batches."""
    positions = np.flatnonzero(keep)[::stride]
    wanted = np.zeros(len(keep), dtype=bool)
    wanted[positions] = True
    start = 0
    for batch in train.select_columns([TRANSLATION_COLUMN]).with_format("arrow").iter(batch_size=20_000):
        column = batch.column(TRANSLATION_COLUMN).combine_chunks()
        mask = pa.array(wanted[start:start + len(column)])
        start += len(column)
        chosen = column.filter(mask)
        for lang in (src, tgt):
            yield from chosen.field(lang).to_pylist()


def _learn_bpe(tmp: Path, train: Dataset, keep: np.ndarray, src: str, tgt: str, tokenizer_config,
               sample: int | None) -> None:
    kept = int(keep.sum())
    stride = max(1, -(-kept // sample)) if sample else 1
    used = len(range(0, kept, stride))
    logger.info("learning a joint BPE of %d tokens on %d of %d training pairs", tokenizer_config.vocab_size, used,
                kept)
    # tokenizers' own progress bars write to stdout: ours counts the sentences it reads (the merges follow, faster)
    texts = tqdm(_kept_texts(train, keep, src, tgt, stride), total=2 * used, unit=" sentences", desc="Learning BPE")
    tokenizer = train_tokenizer(texts, vocab_size=tokenizer_config.vocab_size,
                                min_frequency=tokenizer_config.min_frequency, length=2 * used)
    tokenizer.save_pretrained(tmp)


# --- tokens --------------------------------------------------------------------------------------------------------
TOKEN_FEATURES = Features({"input_ids": Sequence(Value("int32")), "labels": Sequence(Value("int32")),
                           "_truncated": Value("bool")})


def _encode_batch(batch: pa.Table, indices: list[int], backend, src: str, tgt: str, max_length: int | None,
                  keep: np.ndarray | None) -> dict[str, list]:
    """input_ids and labels of a batch's kept pairs: the tokenizer's encoding of each side (ending in </s>),
    truncated to max_length keeping the </s>."""
    column = batch.column(TRANSLATION_COLUMN).combine_chunks()
    if keep is not None:
        column = column.filter(pa.array(keep[indices]))
    result: dict[str, list] = {"_truncated": [False] * len(column)}
    for name, lang in (("input_ids", src), ("labels", tgt)):
        ids = [encoding.ids for encoding in backend.encode_batch(column.field(lang).to_pylist())]
        if max_length is not None:
            for row, sequence in enumerate(ids):
                if len(sequence) > max_length:
                    ids[row] = sequence[: max_length - 1] + [EOS_ID]
                    result["_truncated"][row] = True
        result[name] = ids
    return result


def _tokenize(tmp: Path, marked: DatasetDict, keep: dict[str, np.ndarray], tokenizer, src: str, tgt: str,
              max_length: int | None) -> None:
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be at least 2 (one token and </s>), not {max_length}")
    tokenized, truncated = {}, {}
    for split, dataset in marked.items():
        workers = _workers(len(dataset))
        with _forked_tokenizers() if workers else contextlib.nullcontext():
            tokenized[split] = dataset.select_columns([TRANSLATION_COLUMN]).with_format("arrow").map(
                _encode_batch, batched=True, batch_size=ENCODE_BATCH, with_indices=True,
                fn_kwargs={"backend": tokenizer.backend_tokenizer, "src": src, "tgt": tgt, "max_length": max_length,
                           "keep": None if keep[split].all() else keep[split]},
                remove_columns=[TRANSLATION_COLUMN], features=TOKEN_FEATURES, num_proc=workers,
                cache_file_name=str(tmp / f"{split}.arrow"), load_from_cache_file=False, desc=f"Tokenizing {split}")
        truncated[split] = int(pc.sum(tokenized[split].with_format("arrow")["_truncated"]).as_py() or 0)
        if truncated[split]:
            logger.warning("%s: truncated %d of %d examples to max_length=%d tokens", split, truncated[split],
                           len(tokenized[split]), max_length)
    _save_manifest(tmp, tokenized, truncated=truncated)
