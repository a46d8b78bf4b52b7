"""The prepared-data cache: what names an entry, how an entry is made and found, and what the cache holds
(`vaswani-mt cache` lists it and prunes it).

Three kinds of entry in the cache folder (`data.cache_dir`; default $VASWANI_MT_CACHE, else ~/.cache/vaswani_mt),
each named by a fingerprint of everything it depends on — its inputs, and the code and library versions that shape
it (`code_fingerprint`) — so that a change to either prepares again and the same ones never do:

  corpus-<key>/     every pair of each split, cleaned (and `data.preprocess`ed), with its cleaning marks; which pairs
                    stay (`keep-<split>.npy`); the cleaning counts. Key: the data files (path, size, modification
                    and change times, inode; a Hub dataset: its id and the commit read, `data.sources`), languages,
                    splits, cleaning options, preprocessing.
  bpe-<key>/        the joint BPE learned on the kept training pairs, or an evenly spread sample of them
                    (`tokenizer.sample`). Key: the corpus key, vocabulary size, minimum frequency, sample size.
  tokenized-<key>/  `input_ids` and `labels` of the kept pairs. Key: the corpus key, the tokenizer's content,
                    `data.max_length`.

The code in a key is the shaping code as Python's parser reads it, without docstrings and comments
(`shaping_source`): a release that changes a rule prepares again, one that rewords a docstring does not. Every entry
holds `entry.json` (its kind, when it was made, the code fingerprint, the data and tokenizer it came from): what
`vaswani-mt cache` lists, and how it tells an entry that no current code reads (another fingerprint) from one it does.

An entry is written in a temporary folder beside it and renamed into place once complete (the rename is the commit):
a process killed while preparing leaves only a `.tmp` folder that no run takes for data, and the next preparation of
that entry, or `vaswani-mt cache --prune`, removes it. Who builds and who reads an entry is decided by locks
(`data.locks`): a build in progress is never removed by another process, and an entry in use is never pruned.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import BaseFileLock

from ..files import first_line, new_folder_mode
from .locks import exclusive, in_use, mark_in_use, try_exclusive

logger = logging.getLogger(__name__)

CACHE_ENV = "VASWANI_MT_CACHE"
FORMAT = 2  # what an entry holds (2: with entry.json); a change makes every key new
PACKAGE = Path(__file__).resolve().parents[1]
# Besides its inputs, what makes an entry: the code of the data layer that reads, cleans, learns the BPE, tokenizes,
# truncates and lays out the shards, the preprocessing of model/pipeline_vaswani.py, and the libraries under them
# that shape the result. module -> the top-level functions of it that shape data (None: all of it).
SHAPING_CODE: dict[str, tuple[str, ...] | None] = {
    "data/reading.py": None, "data/cleaning.py": None, "data/tokenization.py": None, "data/tokenizing.py": None,
    "data/shards.py": None, "data/prepared.py": None,
    "model/pipeline_vaswani.py": ("moses_tokenize", "preprocess_text"),
}
SHAPING_LIBRARIES = ("datasets", "pyarrow", "tokenizers", "sacremoses")
KINDS = ("corpus", "bpe", "tokenized")
ENTRY_FILE = "entry.json"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "vaswani_mt")


def cache_folder(data: Any = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache a `data` config section prepares into: `cache_dir`, else its `cache_dir`, else the default."""
    return Path(cache_dir or getattr(data, "cache_dir", None) or default_cache_dir()).expanduser()


def fingerprint(*parts: Any) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True, default=str).encode(), digest_size=10).hexdigest()


def shaping_source(path: Path, names: tuple[str, ...] | None = None) -> str:
    """The code of module `path` (only its top-level functions and classes `names`, if given) as Python's parser
    reads it, without docstrings (or any other statement that is a bare string) and comments."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if names is not None:
        tree.body = [node for node in tree.body if getattr(node, "name", None) in names]
    for node in ast.walk(tree):
        if isinstance(getattr(node, "body", None), list):
            node.body = [statement for statement in node.body if not _bare_string(statement)] or [ast.Pass()]
    return ast.dump(tree)


def _bare_string(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def code_fingerprint(package: Path = PACKAGE) -> str:
    """A fingerprint of what shapes prepared data besides its inputs: FORMAT, the code of `SHAPING_CODE` (in
    `package`), the versions of `SHAPING_LIBRARIES` and of the Unicode database (text normalisation)."""
    sources = [hashlib.blake2b(shaping_source(package / name, names).encode(), digest_size=10).hexdigest()
               for name, names in sorted(SHAPING_CODE.items())]
    versions = {name: importlib.metadata.version(name) for name in SHAPING_LIBRARIES}
    return fingerprint(FORMAT, sources, versions, unicodedata.unidata_version)


# --- making and finding an entry -----------------------------------------------------------------------------------
def entry(cache: Path, name: str, build: Callable[[Path], None],
          about: dict) -> tuple[Path, BaseFileLock | None]:
    """The folder of cache entry `name`, built by `build(temporary folder)` unless it is complete already, and the
    in-use lock that this process holds on it (None in a cache it may only read). `about` goes into its entry.json
    (with its kind, FORMAT and the time it was made)."""
    final = cache / name
    cache.mkdir(parents=True, exist_ok=True)
    use = mark_in_use(cache, name)
    if use is None and final.is_dir():  # a cache this process may only read: nothing can be locked, or pruned
        logger.info("prepared data found: %s", final)
        return final, None
    with exclusive(cache / f".{name}.lock", f"prepares {final}"):
        if final.is_dir():  # prepared before, or by the process we waited for
            logger.info("prepared data found: %s", final)
            _used(final)
            return final, use
        for stale in cache.glob(f".{name}.tmp-*"):  # left by a killed preparation (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        os.chmod(tmp, new_folder_mode())  # mkdtemp makes it 0700: the umask decides who else may read it
        try:
            build(tmp)
            (tmp / ENTRY_FILE).write_text(json.dumps(
                {"kind": name.split("-")[0], "format": FORMAT, "created": time.time(), **about}, indent=1) + "\n")
            os.rename(tmp, final)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError) and not error.filename:
                raise _naming_entry(error, final) from error
            raise
    logger.info("prepared %s", final)
    return final, use


def _used(folder: Path) -> None:
    """Mark an entry used now: its folder's modification time is its last use (`vaswani-mt cache`, --older-than)."""
    try:
        os.utime(folder)
    except OSError:  # someone else's entry in a shared cache
        pass


def _naming_entry(error: OSError, entry_folder: Path) -> OSError:
    """The OSError of a write that names no file, naming the cache entry it was preparing: pyarrow's write errors (a
    full disk: "Error writing bytes to file. Detail: [errno 28] No space left on device") carry neither a file name
    nor, from a worker process, an errno, which is read from the message then."""
    number = error.errno
    if number is None:
        found = re.search(r"\[errno (\d+)\]", str(error))
        number = int(found.group(1)) if found else None
    return OSError(number, os.strerror(number) if number else first_line(error), str(entry_folder))


# --- what the cache holds ------------------------------------------------------------------------------------------
@dataclass
class CacheEntry:
    """One entry of the cache, as `vaswani-mt cache` lists it."""

    path: Path
    size: int  # bytes on disk
    last_used: float  # when a preparation last made or read it (seconds since the epoch)
    about: dict = field(default_factory=dict)  # its entry.json ({} for an entry made before entries had one)
    current: bool = False  # made by this installation's code and libraries: a run can still ask for it
    in_use: bool = False  # a process prepares or reads it now

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        return self.name.split("-")[0]

    def data_text(self) -> str:
        """The data it came from: the path or Hub id (with the commit read), the languages."""
        data = self.about.get("data") or {}
        if not data:
            return "?"
        where = str(data.get("path"))
        if data.get("revision"):
            where += f"@{data['revision'][:10]}"
        return f"{where} {'-'.join(data.get('languages') or [])}".strip()

    def tokenizer_text(self) -> str:
        """The tokenizer it came from: none for a corpus, a joint BPE's size, a tokenizer folder."""
        tokenizer = self.about.get("tokenizer")
        if self.kind == "corpus":
            return "-"
        if not tokenizer:
            return "?"
        if tokenizer.get("path"):
            return str(tokenizer["path"])
        text = f"joint BPE of {tokenizer.get('vocab_size')}" if tokenizer.get("vocab_size") else "a run's own"
        return text + (f" ({tokenizer['bpe']})" if tokenizer.get("bpe") else "")

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "path": str(self.path), "size": self.size,
                "last_used": self.last_used, "data": self.data_text(), "tokenizer": self.tokenizer_text(),
                "current": self.current, "in_use": self.in_use}


def entries(cache: Path) -> list[CacheEntry]:
    """The cache's complete entries, each with its size, last use, origin and state (in use: the locks decide)."""
    current = code_fingerprint()
    found = []
    for path in sorted(cache.iterdir()) if cache.is_dir() else []:
        if not path.is_dir() or path.name.split("-")[0] not in KINDS or path.name.startswith("."):
            continue
        try:
            about = json.loads((path / ENTRY_FILE).read_text())
        except (OSError, ValueError):
            about = {}
        found.append(CacheEntry(path=path, size=_size(path), last_used=path.stat().st_mtime, about=about,
                                current=about.get("code") == current, in_use=_in_use_now(cache, path.name)))
    return found


def leftovers(cache: Path) -> list[CacheEntry]:
    """The temporary folders of preparations that were killed (no process holds their entry's build lock)."""
    found = []
    for path in sorted(cache.glob(".*.tmp-*")) if cache.is_dir() else []:
        name = path.name[1:].split(".tmp-")[0]
        if path.is_dir() and not _in_use_now(cache, name, readers=False):
            found.append(CacheEntry(path=path, size=_size(path), last_used=path.stat().st_mtime))
    return found


def prune_reason(item: CacheEntry, older_than_days: float | None = None, now: float | None = None) -> str | None:
    """Why `vaswani-mt cache --prune` removes an entry: no current code reads it, or it went unused for more than
    `older_than_days`; None: it stays (as does any entry in use, whatever its reason)."""
    if not item.current:
        return "made by other code" if item.about else "made before entries recorded their origin"
    if older_than_days is not None and (now or time.time()) - item.last_used > older_than_days * 86400:
        return f"unused for more than {older_than_days:g} days"
    return None


def remove(cache: Path, item: CacheEntry) -> bool:
    """Remove an entry (or a killed preparation's folder) unless a process prepares or reads it: under its build
    lock, with none of its in-use locks held, it is renamed out of the way (a reader from then on prepares it again)
    and deleted. False: it is in use, and stays."""
    name = item.name[1:].split(".tmp-")[0] if item.name.startswith(".") else item.name
    lock = try_exclusive(cache / f".{name}.lock")
    if lock is None:
        return False
    try:
        if item.path == cache / name and in_use(cache, name):
            return False
        doomed = cache / f".{name}.tmp-removed-{secrets.token_hex(4)}"
        os.rename(item.path, doomed)
    finally:
        lock.release()
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _in_use_now(cache: Path, name: str, readers: bool = True) -> bool:
    """Whether a process builds entry `name` (holds its build lock) or, with `readers`, reads it."""
    try:
        lock = try_exclusive(cache / f".{name}.lock")
    except Exception:  # noqa: BLE001 - a lock this process may not take: someone else's, count it as in use
        return True
    if lock is None:
        return True
    lock.release()
    return readers and in_use(cache, name)


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


__all__ = ["CACHE_ENV", "FORMAT", "KINDS", "SHAPING_CODE", "SHAPING_LIBRARIES", "CacheEntry", "cache_folder",
           "code_fingerprint", "default_cache_dir", "entries", "entry", "fingerprint", "leftovers", "prune_reason",
           "remove", "shaping_source"]
