"""Prepared data: a corpus read, cleaned and tokenised once into Arrow files on disk, which every run, `--resume` and
process of a multi-process run memory-maps instead of redoing the work (what fairseq-preprocess's binarised data is to
fairseq, with `datasets`' Arrow files).

    prepared = prepare(data_config, tokenizer_config)        # `vaswani-mt prepare --config NAME` does the same
    prepared.text["test2016"], prepared.tokenized["train"], prepared.tokenizer, prepared.report, prepared.revision

This module holds the preparation itself: `prepare` and the passes that read, clean, learn the BPE and tokenise. The
cache it fills and its keys are `data.cache` (with the list of its three kinds of entry), where the data comes from
and what identifies it (a Hub dataset's commit included) `data.sources`, the worker processes `data.workers`, the
locks `data.locks`, the shard files `data.shards`.

Memory barely grows with the corpus (scripts/bench_data_prep.py: +0.24 GiB from 1M to 4.5M pairs): text files are
read as a stream of line pairs and written as shard files of SHARD_PAIRS pairs, the cleaning and tokenising passes
read each shard batch by batch with ordinary reads (a memory map's pages would stay resident) in `data.workers` worker
processes for large splits (default: the cores the process may use), and the token-budget sampler reads the lengths
as Arrow columns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict
from filelock import BaseFileLock
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from . import shards
from .cache import CACHE_ENV, cache_folder, code_fingerprint, default_cache_dir, entry, fingerprint
from .cleaning import (
    CLEANING_MARKS,
    CleaningOptions,
    CleaningReport,
    SplitCleaningReport,
    clean_batch,
    judge_split,
    marked_features,
)
from .reading import (
    TRANSLATION_COLUMN,
    DataError,
    iter_line_pairs,
    read_parallel,
    text_files,
    text_split_files,
    translation_schema,
)
from .shards import concatenate, load_splits, stream_batches, write_shards
from .shards import rows as shard_rows
from .sources import hub_commit, is_hub_source, source_identity
from .tokenization import train_tokenizer
from .tokenizing import check_max_length, truncate
from .workers import run_pass, usable_cores, workers_problem

logger = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """A prepared corpus: the kept pairs' text per split (`translation`, cleaned and preprocessed), their tokens per
    split (`input_ids`, `labels`), the tokenizer, the cleaning counts, the cache folders it came from, and the commit
    of the Hub dataset it was read from. While it lives, its cache entries are marked in use (`vaswani-mt cache`
    shows them so, `--prune` leaves them); `release()` ends that earlier."""

    text: DatasetDict
    tokenized: DatasetDict
    tokenizer: PreTrainedTokenizerFast
    report: CleaningReport
    folders: dict[str, Path]
    truncated: dict[str, int]  # examples per split cut to data.max_length tokens
    max_length: int | None = None  # data.max_length
    revision: str | None = None  # the Hub dataset's commit read; None: local files, or a commit no one knew
    in_use: list[BaseFileLock] = field(default_factory=list, repr=False)

    def warn_truncated(self) -> None:
        """One warning per split with examples cut to `max_length` tokens (the callers log it where their user reads:
        `vaswani-mt prepare` on stderr, a run in its train.log too)."""
        for split, count in self.truncated.items():
            if count:
                logger.warning("%s: %d of %d examples are truncated to data.max_length=%d tokens", split, count,
                               len(self.tokenized[split]), self.max_length)

    def release(self) -> None:
        """Stop marking the cache entries in use (they may be pruned from then on)."""
        for lock in self.in_use:
            lock.release()
        self.in_use.clear()


def prepare(data, tokenizer_config, tokenizer: PreTrainedTokenizerFast | None = None,
            cache_dir: str | os.PathLike | None = None, revision: str | None = None) -> PreparedData:
    """The corpus of a run config's `data` section, prepared (or found prepared) in the cache. `tokenizer` (an
    existing one, e.g. a resumed run's) is used as it is; else `tokenizer_config.path`, else the joint BPE learned
    on the training split (`tokenizer_config`: vocab_size, min_frequency, sample, split_punctuation). `revision`: the commit of a Hub
    dataset to read (a resumed run's); None: the one `data.revision` (default: main) resolves to now."""
    cache = cache_folder(data, cache_dir)
    workers = getattr(data, "workers", None)
    if problem := workers_problem(workers):
        raise DataError(f"data.{problem}")
    workers = workers or usable_cores()
    src, tgt = data.source_lang, data.target_lang
    splits = [s for s in (data.train_split, data.valid_split, data.test_split) if s]
    options = CleaningOptions(deduplicate=data.drop_duplicates, filter_splits=(data.train_split,))
    if is_hub_source(data.path):
        revision = revision or hub_commit(str(data.path), cache, getattr(data, "revision", None))
    else:
        revision = None
    code = code_fingerprint()
    corpus_key = fingerprint(code, source_identity(data.path, splits, revision), src, tgt, splits, options,
                             data.preprocess)
    origin = {"path": data.path if isinstance(data.path, Mapping) else str(data.path), "revision": revision,
              "languages": [src, tgt], "splits": splits, "preprocess": data.preprocess}
    in_use = []

    def cached(name: str, build, **about) -> Path:
        folder, lock = entry(cache, name, build, {"code": code, "data": origin, **about})
        in_use.extend([lock] if lock is not None else [])
        return folder

    corpus = cached(f"corpus-{corpus_key}", lambda tmp: _build_corpus(tmp, data, splits, options, workers, revision))
    files = json.loads((corpus / "manifest.json").read_text())["splits"]
    marked = DatasetDict({split: concatenate(corpus, names) for split, names in files.items()})
    keep = {split: np.load(corpus / f"keep-{split}.npy") for split in marked}
    report = CleaningReport({split: SplitCleaningReport(**counts) for split, counts in
                             json.loads((corpus / "report.json").read_text())["splits"].items()})
    logger.info("data: %s", report.summary())
    folders = {"corpus": corpus}

    origin_of_tokenizer = {"path": tokenizer_config.path} if tokenizer is None and tokenizer_config.path else None
    if tokenizer is None and tokenizer_config.path is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_config.path)
    if tokenizer is None:
        sample = getattr(tokenizer_config, "sample", None)
        split_punctuation = getattr(tokenizer_config, "split_punctuation", True)
        bpe_key = fingerprint(code, corpus_key, tokenizer_config.vocab_size, tokenizer_config.min_frequency, sample,
                              split_punctuation)
        learned = {"vocab_size": tokenizer_config.vocab_size, "min_frequency": tokenizer_config.min_frequency,
                   "sample": sample, "split_punctuation": split_punctuation}
        folders["bpe"] = cached(f"bpe-{bpe_key}", lambda tmp: _learn_bpe(
            tmp, corpus, files[data.train_split], keep[data.train_split], src, tgt, tokenizer_config, sample,
            split_punctuation),
            corpus=corpus.name, tokenizer=learned)
        tokenizer = AutoTokenizer.from_pretrained(folders["bpe"])
        origin_of_tokenizer = {**learned, "bpe": folders["bpe"].name}

    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"the tokenizer ({tokenizer_config.path or type(tokenizer).__name__}) is not a fast "
                        "(tokenizers) tokenizer: give tokenizer.path a folder with a tokenizer.json")
    tokens_key = fingerprint(code, corpus_key, hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode())
                             .hexdigest(), data.max_length)
    folders["tokenized"] = cached(f"tokenized-{tokens_key}", lambda tmp: _tokenize(
        tmp, corpus, files, keep, tokenizer, src, tgt, data.max_length, workers),
        corpus=corpus.name, tokenizer=origin_of_tokenizer or {"vocab_size": len(tokenizer)},
        max_length=data.max_length)
    tokenized = load_splits(folders["tokenized"]).remove_columns("_truncated")
    truncated = json.loads((folders["tokenized"] / "manifest.json").read_text())["truncated"]
    text = DatasetDict({split: (dataset if keep[split].all() else dataset.select(np.flatnonzero(keep[split])))
                        .remove_columns(CLEANING_MARKS) for split, dataset in marked.items()})
    return PreparedData(text=text, tokenized=tokenized, tokenizer=tokenizer, report=report, folders=folders,
                        truncated=truncated, max_length=data.max_length, revision=revision, in_use=in_use)


# --- corpus: read and clean ----------------------------------------------------------------------------------------
def _raw_batches(data, split: str, files, dataset: Dataset | None) -> Iterator[pa.RecordBatch]:
    src, tgt = data.source_lang, data.target_lang
    schema = translation_schema(src, tgt)
    if dataset is not None:  # read by read_parallel (JSON lines, CSV, Parquet, a Hub dataset)
        for batch in dataset.with_format("arrow").iter(batch_size=shards.BATCH_PAIRS):
            yield pa.record_batch([batch.column(TRANSLATION_COLUMN).combine_chunks().cast(schema.field(0).type)],
                                  schema=schema)
        return
    src_path, tgt_path = files
    with tqdm(total=src_path.stat().st_size, unit="B", unit_scale=True, desc=f"Reading {split}") as bar:
        for sources, targets in iter_line_pairs(src_path, tgt_path, split, chunk_size=shards.BATCH_PAIRS,
                                                progress=lambda position: bar.update(position - bar.n)):
            column = pa.StructArray.from_arrays([pa.array(sources, type=pa.string()),
                                                 pa.array(targets, type=pa.string())], names=[src, tgt])
            yield pa.record_batch([column], schema=schema)


def _read_splits(tmp: Path, data, splits: list[str], revision: str | None) -> dict[str, list[tuple[str, int]]]:
    """The raw splits as shard files in `tmp`: a folder of `{split}.{lang}` text files streamed line pair by line
    pair; anything else read with `read_parallel` first (a Hub dataset at commit `revision`)."""
    src, tgt = data.source_lang, data.target_lang
    path = None if isinstance(data.path, Mapping) else Path(str(data.path)).expanduser()
    if path is not None and path.is_dir() and any(text_files(path).values()):
        sources = {split: (files, None) for split, files in text_split_files(path, src, tgt, splits).items()}
    else:
        sources = {split: (None, dataset) for split, dataset in
                   read_parallel(data.path, src, tgt, splits=splits, cache_dir=tmp / "read",
                                 **({"revision": revision} if revision else {})).items()}
    raw = {}
    for split, (files, dataset) in sources.items():
        raw[split] = write_shards(_raw_batches(data, split, files, dataset), tmp, f"{split}.raw",
                                  translation_schema(src, tgt))
        if files is not None:
            logger.info("read %s: %s, %s", split, *files)
    return raw


def _clean_shard(job: tuple) -> tuple[int, str]:
    """Clean one raw shard into its marked shard (`clean_batch`); (pairs, the marked shard's name)."""
    folder, name, src, tgt, options, preprocess = job
    schema = pa.schema(marked_features(src, tgt).arrow_schema)
    out, rows = name.replace(".raw-", "-"), 0
    with pa.ipc.new_stream(str(folder / out), schema) as writer:
        for batch in stream_batches(folder / name):
            result = clean_batch({TRANSLATION_COLUMN: batch.column(0).to_pylist()}, src, tgt, options, preprocess)
            writer.write_table(pa.Table.from_pydict(result, schema=schema))
            rows += batch.num_rows
    (folder / name).unlink()  # the raw shard is not needed any more
    return rows, out


def _build_corpus(tmp: Path, data, splits: list[str], options: CleaningOptions, workers: int,
                  revision: str | None) -> None:
    src, tgt = data.source_lang, data.target_lang
    raw = _read_splits(tmp, data, splits, revision)
    shutil.rmtree(tmp / "read", ignore_errors=True)
    files, reports = {}, {}
    for split, pieces in raw.items():
        jobs = [(tmp, name, src, tgt, options, data.preprocess) for name, _ in pieces]
        results = run_pass(_clean_shard, jobs, sum(rows for _, rows in pieces), f"Cleaning {split}", workers)
        files[split] = [out for _, out in results]
        marked = concatenate(tmp, files[split])
        reports[split], keep = judge_split(marked, split, options)
        np.save(tmp / f"keep-{split}.npy", keep)
    (tmp / "manifest.json").write_text(json.dumps({"splits": files}, indent=1) + "\n")
    (tmp / "report.json").write_text(json.dumps({"splits": CleaningReport(reports).to_dict()}, indent=1) + "\n")


# --- the tokenizer -------------------------------------------------------------------------------------------------
def _kept_texts(folder: Path, names: list[str], keep: np.ndarray, src: str, tgt: str, stride: int) -> Iterator[str]:
    """Source and target of every `stride`-th kept pair, streamed from the marked shards."""
    wanted = np.zeros(len(keep), dtype=bool)
    wanted[np.flatnonzero(keep)[::stride]] = True
    start = 0
    for name in names:
        for batch in stream_batches(folder / name):
            chosen = batch.column(0).filter(pa.array(wanted[start:start + batch.num_rows]))
            start += batch.num_rows
            for lang in (src, tgt):
                yield from chosen.field(lang).to_pylist()


def _learn_bpe(tmp: Path, corpus: Path, names: list[str], keep: np.ndarray, src: str, tgt: str, tokenizer_config,
               sample: int | None, split_punctuation: bool) -> None:
    kept = int(keep.sum())
    stride = max(1, -(-kept // sample)) if sample else 1
    used = len(range(0, kept, stride))
    logger.info("learning a joint BPE of %d tokens on %d of %d training pairs", tokenizer_config.vocab_size, used,
                kept)
    # ours counts the sentences read; tokenizers' own bars (which also show the merges) write to stdout, so only on
    # a terminal
    texts = tqdm(_kept_texts(corpus, names, keep, src, tgt, stride), total=2 * used, unit=" sentences",
                 desc="Learning BPE")
    tokenizer = train_tokenizer(texts, vocab_size=tokenizer_config.vocab_size,
                                min_frequency=tokenizer_config.min_frequency, length=2 * used,
                                split_punctuation=split_punctuation,
                                show_progress=sys.stdout.isatty() and sys.stderr.isatty())
    tokenizer.save_pretrained(tmp)


# --- tokens --------------------------------------------------------------------------------------------------------
TOKEN_SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32())),
                          ("_truncated", pa.bool_())])


def _encode(pairs: pa.StructArray, backend, src: str, tgt: str, max_length: int | None,
            eos_id: int | None) -> pa.Table:
    """input_ids and labels of pairs: the tokenizer's encoding of each side (ending in </s>), truncated to max_length
    keeping the </s> (`eos_id`, the tokenizer's)."""
    truncated = np.zeros(len(pairs), dtype=bool)
    columns = {}
    for name, lang in (("input_ids", src), ("labels", tgt)):
        ids = [encoding.ids for encoding in backend.encode_batch(pairs.field(lang).to_pylist())]
        truncated |= np.array(truncate(ids, max_length, eos_id), dtype=bool)
        columns[name] = pa.array(ids, type=pa.list_(pa.int32()))
    return pa.table({**columns, "_truncated": pa.array(truncated)}, schema=TOKEN_SCHEMA)


def _tokenize_shard(job: tuple) -> tuple[int, str, int]:
    """Tokenise the kept pairs of one marked shard; (pairs read, the token shard's name, pairs truncated)."""
    corpus, name, out_folder, keep, backend, src, tgt, max_length, eos_id = job
    out, rows, truncated = name.replace(".arrow", ".tokens.arrow"), 0, 0
    with pa.ipc.new_stream(str(out_folder / out), TOKEN_SCHEMA) as writer:
        for batch in stream_batches(corpus / name):
            pairs = batch.column(0)
            if keep is not None:
                pairs = pairs.filter(pa.array(keep[rows:rows + batch.num_rows]))
            rows += batch.num_rows
            table = _encode(pairs, backend, src, tgt, max_length, eos_id)
            truncated += int(pc.sum(table.column("_truncated")).as_py() or 0)
            writer.write_table(table)
    return rows, out, truncated


def _tokenize(tmp: Path, corpus: Path, files: dict[str, list[str]], keep: dict[str, np.ndarray], tokenizer,
              src: str, tgt: str, max_length: int | None, workers: int) -> None:
    check_max_length(max_length)
    # the encoding `tokenizer(source, text_target=target, truncation=False)` gives: whole sentences, no padding
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    tokenized, truncated = {}, {}
    for split, names in files.items():
        offsets = np.cumsum([0] + [shard_rows(corpus / name) for name in names])
        whole = keep[split].all()
        jobs = [(corpus, name, tmp, None if whole else keep[split][offsets[i]:offsets[i + 1]], backend, src, tgt,
                 max_length, tokenizer.eos_token_id) for i, name in enumerate(names)]
        results = run_pass(_tokenize_shard, jobs, int(offsets[-1]), f"Tokenizing {split}", workers)
        tokenized[split] = [out for _, out, _ in results]
        truncated[split] = sum(count for _, _, count in results)
    (tmp / "manifest.json").write_text(json.dumps({"splits": tokenized, "truncated": truncated}, indent=1) + "\n")


__all__ = ["CACHE_ENV", "PreparedData", "default_cache_dir", "prepare", "usable_cores"]
