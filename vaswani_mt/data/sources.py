"""Where a corpus comes from, and what identifies it in a cache key: local files by their identity on disk, a Hub
dataset by the commit a run reads.

A run pins its Hub dataset: the commit that `data.revision` (default: the main branch) resolves to when the run starts
(`hub_commit`) is the one `datasets.load_dataset(..., revision=<commit>)` reads, the one in the cache key, in the run's
record and card, and the one `--resume` reads again, whatever the Hub has by then. The cache keeps an index of the
last commit it saw of each dataset (`hub-revisions.json`): a fresh run says when the Hub has moved on since, and a
process without the Hub (HF_HUB_OFFLINE=1, no network: a compute node) takes the last commit seen, so it finds what a
process with network (a login node) prepared.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from huggingface_hub import HfApi

from ..files import write_atomically
from .locks import exclusive
from .reading import TABULAR_SUFFIXES, is_hub_dataset_id, text_files

logger = logging.getLogger(__name__)

REVISIONS_FILE = "hub-revisions.json"  # in the cache: "<dataset>@<revision asked>" -> last commit seen, and when
COMMIT = re.compile(r"[0-9a-f]{40}")  # a full commit id: nothing to resolve


def is_hub_source(source) -> bool:
    """Whether `data.path` names a Hub dataset: a Hub id that is not an existing local path."""
    return (not isinstance(source, Mapping) and not Path(str(source)).expanduser().exists()
            and is_hub_dataset_id(str(source)))


def file_identity(path: Path) -> list:
    """Path, size, modification and change times, inode: a file rewritten in place, or replaced by a copy that keeps
    the old modification time (cp -p, rsync -a, tar), is another file."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def source_identity(source: str | os.PathLike | Mapping, splits: list[str], commit: str | None = None) -> list:
    """What identifies the data a run reads: for local files, each file's identity (`file_identity`; the files of
    the requested splits of a folder); for a Hub id, the id and the `commit` read (None: the Hub could not say and
    this cache never saw one: the id alone)."""
    if isinstance(source, Mapping):
        return [[split, file_identity(Path(path))] for split, path in sorted(source.items()) if Path(path).is_file()]
    path = Path(source).expanduser()
    if path.is_file():
        return [file_identity(path)]
    if path.is_dir():
        texts = text_files(path)
        files = [p for split in splits for p in texts.get(split, {}).values()]
        files += [p for p in sorted(path.iterdir()) if p.suffix.lower() in TABULAR_SUFFIXES and p.stem in splits]
        return [file_identity(p) for p in sorted(files)]
    return ["hub", str(source), commit]


def hub_commit(dataset_id: str, cache: Path, revision: str | None = None) -> str | None:
    """The commit of Hub dataset `dataset_id` a new run reads: what `revision` (a branch, tag or commit; None: main)
    resolves to on the Hub now, remembered in the cache's index; without the Hub, the last commit the index knows;
    None if it knows none (the read that follows then says what is wrong, or finds the dataset in `datasets`' own
    cache)."""
    if revision is not None and COMMIT.fullmatch(revision):
        return revision
    try:
        commit = HfApi().dataset_info(dataset_id, revision=revision).sha
    except Exception as error:  # noqa: BLE001 - offline, no network, no such dataset: what the cache knows
        known = _index(cache).get(_index_key(dataset_id, revision))
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
        if known:
            logger.info("data: the Hub does not answer for %s (%s); taking commit %s, the last one this cache saw (%s)",
                        dataset_id, reason, known["commit"], known["seen"])
            return known["commit"]
        logger.info("data: the Hub does not answer for %s (%s) and this cache never saw a commit of it; keyed by "
                    "its id alone", dataset_id, reason)
        return None
    previous = _remember(cache, dataset_id, revision, commit)
    if previous is not None and previous["commit"] != commit:
        logger.info("data: Hub dataset %s is at a new commit, %s (this cache last saw %s, %s): preparing it",
                    dataset_id, commit, previous["commit"], previous["seen"])
    else:
        logger.info("data: Hub dataset %s at commit %s", dataset_id, commit)
    return commit


def _index_key(dataset_id: str, revision: str | None) -> str:
    return f"{dataset_id}@{revision or 'main'}"


def _index(cache: Path) -> dict:
    try:
        return json.loads((cache / REVISIONS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _remember(cache: Path, dataset_id: str, revision: str | None, commit: str) -> dict | None:
    """Record `commit` as the last one seen of the dataset; what was recorded before (None: nothing). A cache this
    process may not write keeps its index as it is."""
    key = _index_key(dataset_id, revision)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with exclusive(cache / f".{REVISIONS_FILE}.lock", "updates the cache's index of Hub commits"):
            index = _index(cache)
            previous = index.get(key)
            index[key] = {"commit": commit, "seen": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            write_atomically((json.dumps(index, indent=1, sort_keys=True) + "\n").encode(), cache / REVISIONS_FILE)
    except Exception as error:  # noqa: BLE001 - a read-only cache: the commit is still pinned for this run
        logger.info("data: cannot record commit %s of %s in %s (%s)", commit, dataset_id, cache, error)
        return _index(cache).get(key)
    return previous


def pinned_revision(path: str, revision: str | None, cache: Path, pinned: Path, resume: bool, world_size: int,
                    process_index: int) -> str | None:
    """The commit of a run's Hub dataset `path`: on a resume, the one the run started with (its `pinned` file), so
    that a new commit upstream never changes a resumed run; else the one `revision` resolves to now, found by
    process 0 and shared with the others (nodes asking apart could see different commits). None: local data, or
    one process that lets `prepare` resolve it."""
    if not is_hub_source(path):
        return None
    if resume and pinned.is_file():
        commit = json.loads(pinned.read_text())["revision"]
        logger.info("data: %s at commit %s, the commit the run started with (%s)", path, commit, pinned)
        return commit
    if world_size == 1:
        return None
    found = [hub_commit(path, cache, revision) if process_index == 0 else None]
    torch.distributed.broadcast_object_list(found, src=0)
    return found[0]


__all__ = ["REVISIONS_FILE", "file_identity", "hub_commit", "is_hub_source", "pinned_revision", "source_identity"]
