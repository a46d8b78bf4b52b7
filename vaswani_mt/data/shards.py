"""Shard files: how a prepared split is kept on disk. A split is a list of Arrow stream files of about SHARD_PAIRS pairs
each (a cache entry's manifest.json lists them in order); a pass reads a shard batch by batch with ordinary reads (a
memory map's pages would stay resident for the whole pass), and a run memory-maps the shards as one `Dataset`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
from datasets import Dataset, DatasetDict, concatenate_datasets

SHARD_PAIRS = 100_000  # pairs per shard file: what one worker takes at a time
BATCH_PAIRS = 10_000  # pairs per record batch: what a pass holds in memory


def stream_batches(path: Path) -> Iterator[pa.RecordBatch]:
    with pa.OSFile(str(path)) as source:
        yield from pa.ipc.open_stream(source)


def write_shards(batches: Iterable[pa.RecordBatch], folder: Path, stem: str,
                 schema: pa.Schema) -> list[tuple[str, int]]:
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


def concatenate(folder: Path, names: list[str]) -> Dataset:
    """The shards `names` of `folder`, memory-mapped as one Dataset."""
    parts = [Dataset.from_file(str(folder / name)) for name in names]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def load_splits(folder: Path) -> DatasetDict:
    """The splits of an entry, memory-mapped from its shard files (manifest.json lists them in order)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return DatasetDict({split: concatenate(folder, names) for split, names in manifest["splits"].items()})


def rows(path: Path) -> int:
    """Pairs in an Arrow file, from its memory map's batch headers (its data pages are not read)."""
    return Dataset.from_file(str(path)).num_rows


__all__ = ["BATCH_PAIRS", "SHARD_PAIRS", "concatenate", "load_splits", "rows", "stream_batches", "write_shards"]
