"""Prepared data: a corpus read, cleaned and tokenised once into Arrow files on disk, which every run, `--resume` and
process of a multi-process run memory-maps instead of redoing the work (what fairseq-preprocess's binarised data is to
fairseq, with `datasets`' Arrow files).

    prepared = prepare(data_config, tokenizer_config)        # `vaswani-mt prepare --config NAME` does the same
    prepared.text["test2016"], prepared.tokenized["train"], prepared.tokenizer, prepared.report

Three kinds of entry in the cache folder (`data.cache_dir`; default $VASWANI_MT_CACHE, else ~/.cache/vaswani_mt),
each named by a fingerprint of everything it depends on — its inputs, and the code and library versions that shape
it (`code_fingerprint`) — so that a change to either prepares again and the same ones never do:

  corpus-<key>/     every pair of each split, cleaned (and `data.preprocess`ed), with its cleaning marks; which pairs
                    stay (`keep-<split>.npy`); the cleaning counts. Key: the data files (path, size, modification
                    and change times, inode; a Hub dataset: its id and the commit it resolves to, the id alone
                    offline), languages, splits, cleaning options, preprocessing.
  bpe-<key>/        the joint BPE learned on the kept training pairs, or an evenly spread sample of them
                    (`tokenizer.sample`). Key: the corpus key, vocabulary size, minimum frequency, sample size.
  tokenized-<key>/  `input_ids` and `labels` of the kept pairs. Key: the corpus key, the tokenizer's content,
                    `data.max_length`.

An entry is written in a temporary folder beside it and renamed into place once complete (the rename is the commit):
a process killed while preparing leaves only a `.tmp` folder that no run takes for data, and the next preparation of
that entry removes it. Processes preparing the same entry at once take turns through a lock file, so the second one
finds the first one's result. Memory barely grows with the corpus (scripts/bench_data_prep.py: +0.24 GiB from 1M to
4.5M pairs): text files are read as a stream of line pairs and written as shard files of SHARD_PAIRS pairs, the
cleaning and tokenising passes read each shard batch by batch with ordinary reads (a memory map's pages would stay
resident) in `data.workers` worker processes for large splits (default: the cores the process may use), and the
token-budget sampler reads the lengths as Arrow columns.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import unicodedata
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, concatenate_datasets
from filelock import FileLock, SoftFileLock, Timeout
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..files import first_line, new_file_mode, new_folder_mode
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
    TABULAR_SUFFIXES,
    TRANSLATION_COLUMN,
    DataError,
    iter_line_pairs,
    read_parallel,
    text_files,
    text_split_files,
    translation_schema,
)
from .tokenization import train_tokenizer
from .tokenizing import check_max_length, truncate

logger = logging.getLogger(__name__)

CACHE_ENV = "VASWANI_MT_CACHE"
FORMAT = 1  # what an entry holds; a change makes every key new
# Besides its inputs, what makes an entry: the code of the data layer (reading, cleaning and its preprocessing,
# the BPE's training, tokenizing and truncating) and the libraries under it that shape the result. Every key holds
# their fingerprint (`code_fingerprint`), so a release that changes a rule prepares the data again.
SHAPING_CODE = ("data/reading.py", "data/cleaning.py", "data/tokenization.py", "data/tokenizing.py",
                "data/prepared.py", "model/pipeline_vaswani.py")
SHAPING_LIBRARIES = ("datasets", "pyarrow", "tokenizers", "sacremoses")
LARGE_SPLIT = 100_000  # pairs from which the cleaning and tokenising passes use worker processes
SHARD_PAIRS = 100_000  # pairs per shard file: what one worker takes at a time
BATCH_PAIRS = 10_000  # pairs per record batch: what a pass holds in memory


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" microseconds, or "max <period>"


def usable_cores() -> int:
    """The cores this process may use, at least 1: its CPU affinity (a job scheduler's or `taskset`'s share, not the
    whole machine's count), capped by a container's CPU quota (`docker --cpus`, a Kubernetes CPU limit: cgroup v2's
    cpu.max), rounded down."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        cores = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, int(quota) // int(period))
    except (OSError, ValueError):  # no cgroup v2 file, or one this does not understand: the affinity alone
        pass
    return max(1, cores)


def check_workers(workers: int | None) -> None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise DataError(f"data.workers must be a positive number of processes or null (the usable cores), got "
                        f"{workers!r}")


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vaswani_mt")


def fingerprint(*parts: Any) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=10).hexdigest()


def code_fingerprint() -> str:
    """A fingerprint of what shapes prepared data besides its inputs: FORMAT, the source of `SHAPING_CODE`, the
    versions of `SHAPING_LIBRARIES` and of the Unicode database (text normalisation)."""
    package = Path(__file__).resolve().parents[1]
    sources = [hashlib.blake2b((package / name).read_bytes(), digest_size=10).hexdigest() for name in SHAPING_CODE]
    versions = {name: importlib.metadata.version(name) for name in SHAPING_LIBRARIES}
    return fingerprint(FORMAT, sources, versions, unicodedata.unidata_version)


def _file_identity(path: Path) -> list:
    """Path, size, modification and change times, inode: a file rewritten in place, or replaced by a copy that keeps
    the old modification time (cp -p, rsync -a, tar), is another file."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def source_identity(source: str | os.PathLike | Mapping, src_lang: str, tgt_lang: str, splits: list[str]) -> list:
    """What identifies the data a run reads: for local files, each file's identity (`_file_identity`; the files of
    the requested splits of a folder); for a Hub id, the id and the commit it resolves to now (`hub_revision`), so
    that a new revision prepares again."""
    if isinstance(source, Mapping):
        return [[split, _file_identity(Path(path))] for split, path in sorted(source.items()) if Path(path).is_file()]
    path = Path(source).expanduser()
    if path.is_file():
        return [_file_identity(path)]
    if path.is_dir():
        texts = text_files(path)
        files = [p for split in splits for p in texts.get(split, {}).values()]
        files += [p for p in sorted(path.iterdir()) if p.suffix.lower() in TABULAR_SUFFIXES and p.stem in splits]
        return [_file_identity(p) for p in sorted(files)]
    return ["hub", str(source), hub_revision(str(source))]


def hub_revision(dataset_id: str) -> str | None:
    """The commit the Hub dataset `dataset_id` resolves to now; None where the Hub cannot say (offline,
    HF_HUB_OFFLINE, no such dataset: the id alone then keys it, and the read that follows says what is wrong)."""
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(dataset_id).sha
    except Exception as error:  # noqa: BLE001 - any failure: key by the id, as before
        logger.info("data: the Hub did not give the revision of %s (%s: %s); keyed by its id alone", dataset_id,
                    type(error).__name__, error)
        return None


@dataclass
class PreparedData:
    """A prepared corpus: the kept pairs' text per split (`translation`, cleaned and preprocessed), their tokens per
    split (`input_ids`, `labels`), the tokenizer, the cleaning counts, and the cache folders it came from."""

    text: DatasetDict
    tokenized: DatasetDict
    tokenizer: PreTrainedTokenizerFast
    report: CleaningReport
    folders: dict[str, Path]
    truncated: dict[str, int]  # examples per split cut to data.max_length tokens
    max_length: int | None = None  # data.max_length

    def warn_truncated(self) -> None:
        """One warning per split with examples cut to `max_length` tokens (the callers log it where their user reads:
        `vaswani-mt prepare` on stderr, a run in its train.log too)."""
        for split, count in self.truncated.items():
            if count:
                logger.warning("%s: %d of %d examples are truncated to data.max_length=%d tokens", split, count,
                               len(self.tokenized[split]), self.max_length)


def prepare(data, tokenizer_config, tokenizer: PreTrainedTokenizerFast | None = None,
            cache_dir: str | os.PathLike | None = None) -> PreparedData:
    """The corpus of a run config's `data` section, prepared (or found prepared) in the cache. `tokenizer` (an
    existing one, e.g. a resumed run's) is used as it is; else `tokenizer_config.path`, else the joint BPE learned
    on the training split (`tokenizer_config`: vocab_size, min_frequency, sample)."""
    cache = Path(cache_dir or getattr(data, "cache_dir", None) or default_cache_dir()).expanduser()
    workers = getattr(data, "workers", None)
    check_workers(workers)
    workers = workers or usable_cores()
    src, tgt = data.source_lang, data.target_lang
    splits = [s for s in (data.train_split, data.valid_split, data.test_split) if s]
    options = CleaningOptions(deduplicate=data.drop_duplicates, filter_splits=(data.train_split,))
    code = code_fingerprint()
    corpus_key = fingerprint(code, source_identity(data.path, src, tgt, splits), src, tgt, splits, options,
                             data.preprocess)
    corpus = _entry(cache, f"corpus-{corpus_key}", lambda tmp: _build_corpus(tmp, data, splits, options, workers))
    files = json.loads((corpus / "manifest.json").read_text())["splits"]
    marked = DatasetDict({split: _concatenate(corpus, names) for split, names in files.items()})
    keep = {split: np.load(corpus / f"keep-{split}.npy") for split in marked}
    report = CleaningReport({split: SplitCleaningReport(**counts) for split, counts in
                             json.loads((corpus / "report.json").read_text())["splits"].items()})
    logger.info("data: %s", report.summary())
    folders = {"corpus": corpus}

    if tokenizer is None and tokenizer_config.path is not None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_config.path)
    if tokenizer is None:
        sample = getattr(tokenizer_config, "sample", None)
        bpe_key = fingerprint(code, corpus_key, tokenizer_config.vocab_size, tokenizer_config.min_frequency, sample)
        folders["bpe"] = _entry(cache, f"bpe-{bpe_key}", lambda tmp: _learn_bpe(
            tmp, corpus, files[data.train_split], keep[data.train_split], src, tgt, tokenizer_config, sample))
        tokenizer = AutoTokenizer.from_pretrained(folders["bpe"])

    if not getattr(tokenizer, "is_fast", False):
        raise DataError(f"the tokenizer ({tokenizer_config.path or type(tokenizer).__name__}) is not a fast "
                        "(tokenizers) tokenizer: give tokenizer.path a folder with a tokenizer.json")
    tokens_key = fingerprint(code, corpus_key, hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode())
                             .hexdigest(), data.max_length)
    folders["tokenized"] = _entry(cache, f"tokenized-{tokens_key}", lambda tmp: _tokenize(
        tmp, corpus, files, keep, tokenizer, src, tgt, data.max_length, workers))
    tokenized = _load_splits(folders["tokenized"]).remove_columns("_truncated")
    truncated = json.loads((folders["tokenized"] / "manifest.json").read_text())["truncated"]
    text = DatasetDict({split: (dataset if keep[split].all() else dataset.select(np.flatnonzero(keep[split])))
                        .remove_columns(CLEANING_MARKS) for split, dataset in marked.items()})
    return PreparedData(text=text, tokenized=tokenized, tokenizer=tokenizer, report=report, folders=folders,
                        truncated=truncated, max_length=data.max_length)


# --- entries -------------------------------------------------------------------------------------------------------
def _entry(cache: Path, name: str, build) -> Path:
    """The folder of cache entry `name`, built by `build(temporary folder)` unless it is complete already."""
    final = cache / name
    if final.is_dir():
        logger.info("prepared data found: %s", final)
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f".{name}.lock", final):
        if final.is_dir():  # the other process finished it
            return final
        for stale in cache.glob(f".{name}.tmp-*"):  # left by a killed preparation (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        os.chmod(tmp, new_folder_mode())  # mkdtemp makes it 0700: the umask decides who else may read it
        try:
            build(tmp)
            os.rename(tmp, final)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError) and not error.filename:
                raise _naming_entry(error, final) from error
            raise
    logger.info("prepared %s", final)
    return final


def _naming_entry(error: OSError, entry: Path) -> OSError:
    """The OSError of a write that names no file, naming the cache entry it was preparing: pyarrow's write errors (a
    full disk: "Error writing bytes to file. Detail: [errno 28] No space left on device") carry neither a file name
    nor, from a worker process, an errno, which is read from the message then."""
    number = error.errno
    if number is None:
        found = re.search(r"\[errno (\d+)\]", str(error))
        number = int(found.group(1)) if found else None
    return OSError(number, os.strerror(number) if number else first_line(error), str(entry))


@contextlib.contextmanager
def _locked(path: Path, entry: Path) -> Iterator[None]:
    """Hold the lock file `path` while `entry` is prepared: processes preparing the same entry take turns, on this
    machine or, through a shared file system, on several (filelock: flock, or Windows' locking). Where the file system
    has no such locks (some NFS or Lustre mounts), a lock file that exists while held (filelock's SoftFileLock; a
    process killed while holding it leaves it behind: delete it to go on)."""
    lock = FileLock(path, mode=new_file_mode())  # the umask decides who else may take it: a group's shared cache
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting for another process that prepares %s", entry)
        lock.acquire()
    except (NotImplementedError, OSError) as error:
        logger.info("%s: no file locks on this file system (%s); using a lock file that exists while held",
                    path.parent, error)
        lock = SoftFileLock(path.with_suffix(".softlock"), mode=new_file_mode())
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _load_splits(folder: Path) -> DatasetDict:
    """The splits of an entry, memory-mapped from its shard files (manifest.json lists them in order)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return DatasetDict({split: _concatenate(folder, names) for split, names in manifest["splits"].items()})




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


# --- passes over shard files ---------------------------------------------------------------------------------------
# A large split is kept as shard files of SHARD_PAIRS pairs. A pass (cleaning, tokenising) reads each shard with
# ordinary reads, batch by batch (not through a memory map, whose pages would stay resident for the whole pass), and
# writes the shard's result; the worker processes take whole shards, so the results keep the corpus order.
def _stream_batches(path: Path) -> Iterator[pa.RecordBatch]:
    with pa.OSFile(str(path)) as source:
        yield from pa.ipc.open_stream(source)


def _write_shards(batches, folder: Path, stem: str, schema: pa.Schema) -> list[tuple[str, int]]:
    """Write record batches into `folder/{stem}-00000.arrow`, ... of about SHARD_PAIRS pairs each; (name, pairs) of
    each shard."""
    shards: list[tuple[str, int]] = []
    writer = None
    try:
        for batch in batches:
            if writer is None or shards[-1][1] >= SHARD_PAIRS:
                if writer is not None:
                    writer.close()
                shards.append((f"{stem}-{len(shards):05d}.arrow", 0))
                writer = pa.ipc.new_stream(str(folder / shards[-1][0]), schema)
            writer.write_batch(batch)
            shards[-1] = (shards[-1][0], shards[-1][1] + batch.num_rows)
        if writer is None:  # a split without rows (a Hub split can be empty) still has its shard
            shards.append((f"{stem}-00000.arrow", 0))
            writer = pa.ipc.new_stream(str(folder / shards[-1][0]), schema)
    finally:
        if writer is not None:
            writer.close()
    return shards


def _run_pass(function, jobs: list[tuple], rows: int, desc: str, workers: int) -> list:
    """`function(job)` for every job (one shard each), in up to `workers` processes when there are `rows` >=
    LARGE_SPLIT and several shards; the results in job order. Progress counts pairs."""
    workers = min(workers, len(jobs)) if rows >= LARGE_SPLIT else 1
    with tqdm(total=rows, unit=" pairs", desc=desc) as bar:
        if workers <= 1:
            results = []
            for job in jobs:
                results.append(function(job))
                bar.update(results[-1][0])
            return results
        # a worker that dies (killed, out of memory) breaks the pool with an error instead of a wait without end
        with _forked_tokenizers(), ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            results = []
            for result in pool.map(function, jobs):
                results.append(result)
                bar.update(result[0])
            return results


# --- corpus: read and clean ----------------------------------------------------------------------------------------
def _raw_batches(data, split: str, files, dataset: Dataset | None) -> Iterator[pa.RecordBatch]:
    src, tgt = data.source_lang, data.target_lang
    schema = translation_schema(src, tgt)
    if dataset is not None:  # read by read_parallel (JSON lines, CSV, Parquet, a Hub dataset)
        for batch in dataset.with_format("arrow").iter(batch_size=BATCH_PAIRS):
            yield pa.record_batch([batch.column(TRANSLATION_COLUMN).combine_chunks().cast(schema.field(0).type)],
                                  schema=schema)
        return
    src_path, tgt_path = files
    with tqdm(total=src_path.stat().st_size, unit="B", unit_scale=True, desc=f"Reading {split}") as bar:
        for sources, targets in iter_line_pairs(src_path, tgt_path, split, chunk_size=BATCH_PAIRS,
                                                progress=lambda position: bar.update(position - bar.n)):
            column = pa.StructArray.from_arrays([pa.array(sources, type=pa.string()),
                                                 pa.array(targets, type=pa.string())], names=[src, tgt])
            yield pa.record_batch([column], schema=schema)


def _read_splits(tmp: Path, data, splits: list[str]) -> dict[str, list[tuple[str, int]]]:
    """The raw splits as shard files in `tmp`: a folder of `{split}.{lang}` text files streamed line pair by line
    pair; anything else read with `read_parallel` first."""
    src, tgt = data.source_lang, data.target_lang
    path = None if isinstance(data.path, Mapping) else Path(str(data.path)).expanduser()
    if path is not None and path.is_dir() and any(text_files(path).values()):
        sources = {split: (files, None) for split, files in text_split_files(path, src, tgt, splits).items()}
    else:
        sources = {split: (None, dataset) for split, dataset in
                   read_parallel(data.path, src, tgt, splits=splits, cache_dir=tmp / "read").items()}
    raw = {}
    for split, (files, dataset) in sources.items():
        raw[split] = _write_shards(_raw_batches(data, split, files, dataset), tmp, f"{split}.raw",
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
        for batch in _stream_batches(folder / name):
            result = clean_batch({TRANSLATION_COLUMN: batch.column(0).to_pylist()}, src, tgt, options, preprocess)
            writer.write_table(pa.Table.from_pydict(result, schema=schema))
            rows += batch.num_rows
    (folder / name).unlink()  # the raw shard is not needed any more
    return rows, out


def _build_corpus(tmp: Path, data, splits: list[str], options: CleaningOptions, workers: int) -> None:
    src, tgt = data.source_lang, data.target_lang
    raw = _read_splits(tmp, data, splits)
    shutil.rmtree(tmp / "read", ignore_errors=True)
    files, reports = {}, {}
    for split, shards in raw.items():
        jobs = [(tmp, name, src, tgt, options, data.preprocess) for name, _ in shards]
        results = _run_pass(_clean_shard, jobs, sum(rows for _, rows in shards), f"Cleaning {split}", workers)
        files[split] = [out for _, out in results]
        marked = _concatenate(tmp, files[split])
        reports[split], keep = judge_split(marked, split, options)
        np.save(tmp / f"keep-{split}.npy", keep)
    (tmp / "manifest.json").write_text(json.dumps({"splits": files}, indent=1) + "\n")
    (tmp / "report.json").write_text(json.dumps({"splits": CleaningReport(reports).to_dict()}, indent=1) + "\n")


def _concatenate(folder: Path, names: list[str]) -> Dataset:
    datasets_ = [Dataset.from_file(str(folder / name)) for name in names]
    return datasets_[0] if len(datasets_) == 1 else concatenate_datasets(datasets_)


# --- the tokenizer -------------------------------------------------------------------------------------------------
def _kept_texts(folder: Path, names: list[str], keep: np.ndarray, src: str, tgt: str, stride: int) -> Iterator[str]:
    """Source and target of every `stride`-th kept pair, streamed from the marked shards."""
    wanted = np.zeros(len(keep), dtype=bool)
    wanted[np.flatnonzero(keep)[::stride]] = True
    start = 0
    for name in names:
        for batch in _stream_batches(folder / name):
            chosen = batch.column(0).filter(pa.array(wanted[start:start + batch.num_rows]))
            start += batch.num_rows
            for lang in (src, tgt):
                yield from chosen.field(lang).to_pylist()


def _learn_bpe(tmp: Path, corpus: Path, names: list[str], keep: np.ndarray, src: str, tgt: str, tokenizer_config,
               sample: int | None) -> None:
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
        for batch in _stream_batches(corpus / name):
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
        offsets = np.cumsum([0] + [_rows(corpus / name) for name in names])
        whole = keep[split].all()
        jobs = [(corpus, name, tmp, None if whole else keep[split][offsets[i]:offsets[i + 1]], backend, src, tgt,
                 max_length, tokenizer.eos_token_id) for i, name in enumerate(names)]
        results = _run_pass(_tokenize_shard, jobs, int(offsets[-1]), f"Tokenizing {split}", workers)
        tokenized[split] = [out for _, out, _ in results]
        truncated[split] = sum(count for _, _, count in results)
    (tmp / "manifest.json").write_text(json.dumps({"splits": tokenized, "truncated": truncated}, indent=1) + "\n")


def _rows(path: Path) -> int:
    """Pairs in an Arrow file, from its memory map's batch headers (its data pages are not read)."""
    return Dataset.from_file(str(path)).num_rows
