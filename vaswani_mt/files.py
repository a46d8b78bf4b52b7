"""The rules that keep a user's files whole: what a complete checkpoint is, how checkpoints are deleted, how weights
are checked before they are loaded, and how files are written so that a kill or a full disk never leaves a
half-written file that looks finished.

One completeness rule serves every reader of a run's checkpoints (`vaswani-mt train --resume`, `vaswani-mt average
--run-dir`, the averaging at the end of training): :func:`checkpoint_problem`. A checkpoint is complete only if every
file it must have is there, its weights are as long as their header says, and it is not marked as being written.

A checkpoint is deleted by renaming it to ``deleting-checkpoint-<step>`` first and removing that afterwards, so a
kill half-way through a deletion leaves a folder no reader takes for a checkpoint (nothing named
``checkpoint-<step>`` is ever half-deleted). Such leftovers are removed by :func:`remove_incomplete_checkpoints`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Present in a checkpoint folder while it is being written; removed (after fsync) once every file is on disk.
SAVING_MARKER = ".saving"
# A checkpoint being deleted is first renamed to this prefix + its name.
DELETING_PREFIX = "deleting-"
# Files every Trainer checkpoint of a run must have besides its weights (and at least one rng_state*.pth: one per
# process). Without any of them a resumed run would not continue exactly where the checkpoint left off.
CHECKPOINT_FILES = ("config.json", "trainer_state.json", "optimizer.pt", "scheduler.pt", "training_args.bin")
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
# Less space than this available counts as none (`no_space_left`): a file system can refuse a write while it still
# reports a few free blocks, kept for its own metadata.
NO_SPACE_MARGIN = 1 << 20


# --- weights ----------------------------------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # either one makes a folder hold a tokenizer


def weight_files(folder: Path) -> list[Path]:
    """The safetensors file(s) holding a model's weights (a folder or a single file). Raises FileNotFoundError or
    ValueError naming what is missing; pickled weights are never read."""
    folder = Path(folder)
    if folder.is_file():
        if folder.suffix != ".safetensors":
            raise ValueError(f"{folder} is not a .safetensors file (pickled weights are not read)")
        return [folder]
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint {folder} does not exist")
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single]
    index = folder / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, UnicodeDecodeError) as error:
            raise ValueError(f"{index} is not a valid safetensors index (needs a 'weight_map')") from error
        shards = [folder / name for name in shard_names]
        missing = [str(shard) for shard in shards if not shard.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that do not exist: {', '.join(missing)}")
        return shards
    raise FileNotFoundError(
        f"{folder} has neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME} (no model weights; only safetensors are read)"
    )


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (empty, truncated, unreadable header), or None. Reads only the
    header: a file cut short by a kill or a full disk is caught before a library fails on it without naming it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            header_size = int.from_bytes(prefix, "little") if len(prefix) == 8 else None
            if header_size is None or 8 + header_size > size:
                return f"{path} is {'empty' if size == 0 else 'truncated'} ({size} bytes)"
            header = json.loads(handle.read(header_size))
    except OSError as error:
        return f"{path} cannot be read: {error.strerror}"
    except (ValueError, UnicodeDecodeError):
        return f"{path} is not a safetensors file (its header is not valid JSON)"
    if not isinstance(header, dict):
        return f"{path} is not a safetensors file (unexpected header)"
    ends = [entry.get("data_offsets", [0, 0])[1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict)]
    expected = 8 + header_size + max(ends, default=0)
    if size < expected:
        return f"{path} is truncated ({size} of {expected} bytes)"
    return None


def weights_problem(folder: Path) -> str | None:
    """Why the weights of a model folder (or a .safetensors file) cannot be loaded, or None."""
    try:
        files = weight_files(folder)
    except (FileNotFoundError, ValueError) as error:
        return str(error)
    return next((problem for problem in map(safetensors_problem, files) if problem), None)


# --- checkpoints ------------------------------------------------------------------------------------------------


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why `folder` is not a complete checkpoint (one line), or None when it is: THE completeness rule of this project
    (resume, averaging and `vaswani-mt average --run-dir` all use it). Complete: not marked as being written, every
    file of CHECKPOINT_FILES, at least one rng_state*.pth, and whole safetensors weights."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    if (folder / SAVING_MARKER).exists():
        return f"its save did not finish (the {SAVING_MARKER} marker is still there)"
    missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
    if not any(folder.glob("rng_state*.pth")):
        missing.append("rng_state.pth")
    if missing:
        return f"it has no {', '.join(missing)}"
    return weights_problem(folder)


def is_complete_checkpoint(folder: str | os.PathLike) -> bool:
    """A checkpoint whose save finished and that nothing has deleted from since (see `checkpoint_problem`)."""
    return checkpoint_problem(folder) is None


def checkpoint_folders(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of every `checkpoint-<step>` folder, complete or not, by step (900 before 1000)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(match.group(1)), child) for child in output_dir.iterdir()
             if (match := _CHECKPOINT_DIR.match(child.name)) and child.is_dir()]
    return sorted(found)


def checkpoint_step(folder: str | os.PathLike) -> int:
    """The update a `checkpoint-<step>` folder was saved at."""
    match = _CHECKPOINT_DIR.match(Path(folder).name)
    if match is None:
        raise ValueError(f"{folder} is not a checkpoint-<step> folder")
    return int(match.group(1))


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-<step>` folders of a run that are complete (`checkpoint_problem`), oldest first."""
    return [path for _, path in checkpoint_folders(output_dir) if is_complete_checkpoint(path)]


def last_saves(output_dir: str | os.PathLike, count: int) -> list[Path]:
    """The complete checkpoints of the last `count` saves of a run, oldest first. Saves are consecutive: walking back
    from the newest checkpoint by the run's save interval (`save_steps` in its trainer_state.json), it stops at the
    first save that is not there, so a checkpoint kept for another reason (the best one, which rotation never
    deletes) never stands in for a later save. Without a usable interval (no step-based saves): the newest `count`
    complete checkpoints."""
    if count < 1:
        return []
    checkpoints = {step: path for step, path in checkpoint_folders(output_dir) if is_complete_checkpoint(path)}
    steps = sorted(checkpoints)
    interval = _save_interval(checkpoints[steps[-1]], steps) if steps else None
    if interval is None:
        return [checkpoints[step] for step in steps[-count:]]
    return consecutive_saves(checkpoints, interval, count)


def consecutive_saves(by_step: dict[int, Path], interval: int, count: int) -> list[Path]:
    """The saves of the last `count` save steps, oldest first: walking back from the newest by `interval` updates
    (the newest may be a run's final update, between two regular saves), stopping at the first step without one."""
    chosen, step = [], max(by_step, default=0)
    while step in by_step and len(chosen) < count:
        chosen.append(by_step[step])
        step -= step % interval or interval
    return chosen[::-1]


def _save_interval(newest: Path, steps: list[int]) -> int | None:
    """The run's `save_steps` when every save but the newest fell on a multiple of it (step-based saves)."""
    try:
        interval = json.loads((newest / "trainer_state.json").read_text(encoding="utf-8")).get("save_steps")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(interval, int) or interval < 1 or any(step % interval for step in steps[:-1]):
        return None
    return interval


def begin_checkpoint(folder: Path) -> None:
    """Mark `folder` as being written (synced), before anything is written into it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SAVING_MARKER).touch()
    fsync_tree(folder)


def finish_checkpoint(folder: Path) -> None:
    """Sync every file of `folder`, then remove its marker: from here on it counts as complete."""
    fsync_tree(folder)
    (folder / SAVING_MARKER).unlink()
    fsync_directory(folder)


def delete_checkpoint(folder: Path) -> None:
    """Delete a checkpoint (or weight snapshot) folder by renaming it first (atomic), then removing the renamed
    folder: a kill at any moment leaves either the whole folder or a `deleting-*` one, never a half-deleted one."""
    trash = folder.with_name(DELETING_PREFIX + folder.name)
    if trash.exists():
        shutil.rmtree(trash)
    folder.rename(trash)
    fsync_directory(folder.parent)
    shutil.rmtree(trash)


def remove_incomplete_checkpoints(output_dir: str | os.PathLike) -> list[str]:
    """Delete what a kill left behind in a run's checkpoint folder: checkpoints whose save did not finish and
    checkpoints whose deletion did not finish. Returns one line per folder removed: the folder and why."""
    output_dir = Path(output_dir)
    removed = []
    for _, folder in checkpoint_folders(output_dir):
        problem = checkpoint_problem(folder)
        if problem is not None:
            delete_checkpoint(folder)
            removed.append(f"{folder}: {problem}")
    for trash in sorted(output_dir.glob(DELETING_PREFIX + "checkpoint-*")) if output_dir.is_dir() else []:
        shutil.rmtree(trash)
        removed.append(f"{trash}: its deletion did not finish")
    return removed


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, best: str | os.PathLike | None,
                       keep: str | os.PathLike | None = None) -> None:
    """Keep at most `limit` complete checkpoints: always the newest, the best one and `keep` (the one just written,
    which is not the newest when a run resumed from an older checkpoint), then the newest others; the rest are
    deleted with `delete_checkpoint`. Same policy as transformers' `save_total_limit` (whose best checkpoint counts
    towards the limit), ordered by step rather than by file time."""
    if not limit or limit <= 0:
        return
    checkpoints = complete_checkpoints(output_dir)
    protected = {checkpoints[-1].name} if checkpoints else set()
    if keep is not None:
        protected.add(Path(keep).name)
    if best is not None:
        protected.add(Path(best).name)
    surplus = len(checkpoints) - max(limit, len(protected))
    for folder in checkpoints:
        if surplus <= 0:
            break
        if folder.name not in protected:
            delete_checkpoint(folder)
            surplus -= 1


# --- writing ----------------------------------------------------------------------------------------------------


def fsync_tree(folder: Path) -> None:
    """Sync every file under `folder`, then the folder itself."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_directory(folder)


def fsync_directory(directory: Path) -> None:
    """Persist renames and new names in `directory` (POSIX); not possible on every platform, hence best effort."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_atomically(data: bytes, target: Path) -> None:
    """Write `data` to `target` so that readers see either the old file or the whole new one: a temporary file in
    the same folder is written and synced, then renamed over `target`. On any error it is removed and `target` is
    untouched; the OSError names `target`."""
    with writing(target):
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                os.chmod(temporary, new_file_mode())  # mkstemp creates 0600; others get the umask's mode
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    fsync_directory(target.parent)


def process_umask() -> int:
    """The process umask (which can only be read by setting it, so it is set and put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the process umask."""
    return 0o666 & ~process_umask()


def new_folder_mode() -> int:
    """The mode `mkdir` gives a new folder: 0o777 less the process umask (`tempfile.mkdtemp` makes 0700)."""
    return 0o777 & ~process_umask()


def share_weights(folder: str | os.PathLike) -> None:
    """Give the safetensors files of a saved model folder the mode any other new file gets (`new_file_mode`).
    safetensors >= 0.8 writes through a temporary file created 0600 and renamed into place (safetensors issue
    #782), so a model saved on a shared machine was readable by its owner only, while its config and tokenizer,
    written with `open()`, followed the umask."""
    mode = new_file_mode()
    for path in Path(folder).glob("*.safetensors"):
        os.chmod(path, mode)


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Report a failure to write `path` as an OSError that names it, e.g. "no space left on device: PATH".

    An OSError keeps its errno and gets the path. torch.save and safetensors report a failed write with errors of
    their own (a RuntimeError, a SafetensorError) that carry no errno and no file name: when one escapes, the file
    system says what happened. No space left there (:func:`no_space_left`) makes it an ENOSPC OSError naming
    `path`; a write of our own beside it that fails (a quota, a read-only or failing disk: :func:`probe_write`)
    gives its errno. Otherwise a SafetensorError, which safetensors raises when it could not write the file (it
    removes its temporary file first, so the disk may have room again by now), becomes an EIO OSError with its first
    line, and a RuntimeError (a CUDA error, a bug) goes on unchanged, with its traceback."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise OSError(error.errno, _reason(error), str(path)) from error
    except (RuntimeError, SafetensorError) as error:
        if no_space_left(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error
        refused = probe_write(path)  # a quota, a read-only or failing disk: a write of our own says which
        if refused is not None:
            raise OSError(refused.errno, _reason(refused), str(path)) from error
        if isinstance(error, SafetensorError):
            raise OSError(errno.EIO, first_line(error), str(path)) from error
        raise


def nearest_folder(path: str | os.PathLike) -> Path:
    """The folder that holds `path`, or would hold it: `path` itself if it is one, else its nearest existing
    parent folder."""
    folder = Path(path).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def probe_write(path: str | os.PathLike, size: int = 1 << 16) -> OSError | None:
    """The OSError a write of `size` bytes (synced, then removed) beside `path` meets, or None when it succeeds."""
    probe = nearest_folder(path) / f".vaswani-mt-write-probe-{os.getpid()}"
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, b"\0" * size)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        return error
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def no_space_left(path: str | os.PathLike) -> bool:
    """Whether the file system that holds `path` (or would: its nearest existing folder) has no space left for an
    unprivileged write: less than `NO_SPACE_MARGIN` bytes available (os.statvfs, through shutil.disk_usage)."""
    folder = nearest_folder(path)
    try:
        return shutil.disk_usage(folder).free < NO_SPACE_MARGIN
    except OSError:  # the file system cannot be asked: nothing is known
        return False


def _reason(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "no space left on device"
    return error.strerror or first_line(error)


def first_line(error: BaseException) -> str:
    """The first non-blank line of an error's message (library errors often run over many lines), or its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def describe_os_error(error: OSError) -> str:
    """One line for an OSError: the reason and the file, e.g. "no space left on device: runs/x/metrics.json"."""
    reason = _reason(error)
    return f"{reason}: {error.filename}" if error.filename else reason


__all__ = [
    "CHECKPOINT_FILES",
    "SAVING_MARKER",
    "checkpoint_problem",
    "checkpoint_step",
    "complete_checkpoints",
    "consecutive_saves",
    "delete_checkpoint",
    "describe_os_error",
    "first_line",
    "is_complete_checkpoint",
    "last_saves",
    "new_file_mode",
    "new_folder_mode",
    "process_umask",
    "no_space_left",
    "remove_incomplete_checkpoints",
    "rotate_checkpoints",
    "safetensors_problem",
    "share_weights",
    "weight_files",
    "weights_problem",
    "write_atomically",
    "writing",
]
