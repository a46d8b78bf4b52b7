"""The locks of the prepared-data cache: who builds an entry, and who is reading one.

- A build lock per entry (`.NAME.lock`, `exclusive`): one process prepares an entry while the others wait, then find
  it. A process that reads an entry holds it for a moment too, so that `vaswani-mt cache --prune` (which holds it
  while it removes) never takes an entry away between a reader finding it and marking it in use.
- An in-use lock per reader (`.in-use/NAME@HOST-PID-TOKEN.lock`, `mark_in_use`), held as long as the `PreparedData`
  that reads the entry lives (a run: its whole length): `vaswani-mt cache` shows the entry in use, `--prune` leaves
  it (`in_use`).

Both are filelock's file locks (flock on Unix, LockFileEx on Windows), on this machine or, through a shared file
system, on several. Only where the file system has no file locks at all (`file_locks_missing`: flock of a fresh file
fails with one of NO_FILE_LOCKS) does a lock file that exists while held (filelock's SoftFileLock) stand in; a process
killed while holding one leaves it behind (delete it to go on). Any other failure to take a lock (a lock file of
another user's that this one may not open, a cache folder it may not write) is a DataError naming the lock file:
falling back to a lock file there would lose the exclusion with the real holder, and a second process could remove
the first one's temporary build.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from filelock import BaseFileLock, FileLock, SoftFileLock, Timeout

from ..files import new_file_mode, new_folder_mode
from .reading import DataError

try:
    import fcntl
except ImportError:  # Windows: filelock locks with LockFileEx, which every local and SMB file system has
    fcntl = None

logger = logging.getLogger(__name__)

# flock's answers that mean "this file system has no file locks" (not "someone holds it"): ENOSYS (Lustre mounted
# without flock, some FUSE file systems), ENOLCK (NFS without a lock manager), EOPNOTSUPP / ENOTSUP (some FUSE and CIFS
# mounts). filelock 3 raises NotImplementedError for ENOSYS alone and takes the others for a held lock, waiting
# without end; filelock 4 falls back by itself on ENOSYS alone: hence the probe of our own.
NO_FILE_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})
IN_USE = ".in-use"  # the cache's folder of in-use locks
_said: set[str] = set()  # folders whose lack of file locks was logged


def _flock(descriptor: int) -> None:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)


def file_locks_missing(folder: Path) -> OSError | None:
    """The error by which the file system of `folder` says it has no file locks (flock of a fresh file failing with
    one of NO_FILE_LOCKS), or None where it locks (Windows: always)."""
    if fcntl is None:
        return None
    try:
        descriptor, name = tempfile.mkstemp(prefix=".lock-probe-", dir=folder)
    except OSError as error:
        raise _lock_error(error, folder) from error
    try:
        _flock(descriptor)
    except OSError as error:
        return error if error.errno in NO_FILE_LOCKS else None
    finally:
        os.close(descriptor)
        os.unlink(name)
    return None


def _lock(path: Path) -> BaseFileLock:
    """A lock on `path` as this file system allows: filelock's FileLock, else a lock file `path.softlock` that exists
    while held. Lock files follow the umask, so a group sharing a cache (umask 002) takes them all."""
    missing = file_locks_missing(path.parent)
    if missing is None:
        return FileLock(path, mode=new_file_mode())
    if str(path.parent) not in _said:
        _said.add(str(path.parent))
        logger.info("%s: no file locks on this file system (%s); using lock files that exist while held",
                    path.parent, os.strerror(missing.errno))
    return SoftFileLock(path.with_suffix(".softlock"), mode=new_file_mode())


def _lock_error(error: OSError, path: Path) -> DataError:
    """One line naming the lock file (or folder) that could not be taken, and what to do."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    hint = ("; it belongs to another user or the cache folder is not yours to write: set data.cache_dir (or "
            "$VASWANI_MT_CACHE) to a folder of your own, or ask its owner" if isinstance(error, PermissionError)
            or error.errno == errno.EROFS else "")
    return DataError(f"cannot take the lock {path}: {reason.lower()}{hint}")


def _acquire(lock: BaseFileLock, timeout: float = -1) -> None:
    try:
        lock.acquire(timeout=timeout)
    except Timeout:  # an OSError (TimeoutError) in filelock 3
        raise
    except OSError as error:
        raise _lock_error(error, Path(lock.lock_file)) from error


@contextlib.contextmanager
def exclusive(path: Path, purpose: str) -> Iterator[None]:
    """Hold the lock `path` (waiting for another process that holds it: said once, with `purpose`)."""
    lock = _lock(path)
    try:
        _acquire(lock, timeout=0)
    except Timeout:
        left_behind = (f" (a lock file a killed process leaves behind: if no process {purpose}, delete "
                       f"{lock.lock_file} to go on)" if isinstance(lock, SoftFileLock) else "")
        logger.info("waiting for another process that %s%s", purpose, left_behind)
        _acquire(lock)
    try:
        yield
    finally:
        lock.release()


def try_exclusive(path: Path) -> BaseFileLock | None:
    """The lock `path`, held, if no other process holds it now; else None."""
    lock = _lock(path)
    try:
        _acquire(lock, timeout=0)
    except Timeout:
        return None
    return lock


def mark_in_use(cache: Path, name: str) -> BaseFileLock | None:
    """An in-use lock of entry `name`, held until released (or until the process ends); None where this process may
    not write lock files there (a cache shared read-only): the entry is then read unmarked."""
    folder = cache / IN_USE
    try:
        folder.mkdir(mode=new_folder_mode(), exist_ok=True)
        lock = _lock(folder / f"{name}@{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.lock")
        _acquire(lock, timeout=0)
    except (OSError, DataError) as error:
        logger.info("%s: cannot mark %s in use (%s); reading it unmarked", cache, name, error)
        return None
    return lock


def in_use(cache: Path, name: str) -> bool:
    """Whether a process reads entry `name` now (holds an in-use lock of it); in-use locks left by processes that
    ended are removed on the way. On a file system without file locks an in-use lock file counts as long as it
    exists."""
    used = False
    for path in sorted((cache / IN_USE).glob(f"{name}@*")):
        if path.suffix == ".softlock":
            used = True
            continue
        lock = FileLock(path)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            used = True
            continue
        except OSError:  # not ours to take: count it as in use
            used = True
            continue
        lock.release()
        with contextlib.suppress(OSError):
            path.unlink()
    return used


__all__ = ["IN_USE", "NO_FILE_LOCKS", "exclusive", "file_locks_missing", "in_use", "mark_in_use", "try_exclusive"]
