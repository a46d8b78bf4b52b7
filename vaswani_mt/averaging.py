"""Checkpoint averaging (Vaswani et al. 2017, §6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints." This module averages the weights of Hugging Face Trainer checkpoints
(``checkpoint-<step>`` folders holding ``model.safetensors``) or bare ``.safetensors`` files.

* Floating-point tensors are averaged in float64 and cast back to their dtype, so averaging N
  copies of one checkpoint returns it bit for bit.
* Integer/bool tensors (counters, index buffers) cannot be averaged; they must be identical.
* Only safetensors are read (no pickle). Sharded checkpoints (``model.safetensors.index.json``)
  are read shard by shard; the output is always one ``model.safetensors``.
* The output folder gets the averaged weights, written atomically, plus the non-weight files
  (config, generation config, tokenizer, remote code, ...) of the LAST checkpoint, so it loads
  with ``from_pretrained``. Training state (optimizer, scheduler, RNG, trainer state) is not
  copied: it belongs to the last checkpoint's weights, not to the average.

Command line::

    python -m vaswani_mt.averaging --run-dir runs/base --last 5 --output runs/base/averaged
    python -m vaswani_mt.averaging --inputs ckpt-a ckpt-b ckpt-c --output averaged
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")

# Files of a Trainer checkpoint that are NOT copied into the averaged model folder: the weights
# themselves (replaced by the average) and the resumable training state of the last checkpoint.
_NOT_COPIED = (
    "model*.safetensors",
    WEIGHTS_INDEX_NAME,
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "optimizer*.pt",
    "optimizer*.bin",
    "scheduler*.pt",
    "scaler*.pt",
    "rng_state*.pth",
    "trainer_state.json",
    "training_args.bin",
)


def _weight_files(checkpoint: Path) -> list[Path]:
    """The safetensors file(s) holding a checkpoint's weights (a folder or a single file)."""
    if checkpoint.is_file():
        if checkpoint.suffix != ".safetensors":
            raise ValueError(f"{checkpoint} is not a .safetensors file (pickled weights are not read)")
        return [checkpoint]
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    single = checkpoint / WEIGHTS_NAME
    if single.is_file():
        return [single]
    index = checkpoint / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as error:
            raise ValueError(f"{index} is not a valid safetensors index (needs a 'weight_map')") from error
        shards = [checkpoint / name for name in shard_names]
        missing = [str(shard) for shard in shards if not shard.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that do not exist: {', '.join(missing)}")
        return shards
    raise FileNotFoundError(
        f"{checkpoint} has neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME} "
        "(only safetensors checkpoints can be averaged)"
    )


def _load_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(checkpoint):
        tensors.update(load_file(file))
    return tensors


def _load_metadata(checkpoint: Path) -> dict[str, str]:
    with safe_open(_weight_files(checkpoint)[0], framework="pt") as f:
        metadata = dict(f.metadata() or {})
    # transformers' from_pretrained checks this entry to know the file was written from torch.
    metadata.setdefault("format", "pt")
    return metadata


def _is_complete(checkpoint: Path) -> bool:
    try:
        _weight_files(checkpoint)
    except (FileNotFoundError, ValueError):
        return False
    return True


def find_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """``checkpoint-<step>`` folders of a Trainer run that hold weights, in increasing step order.

    Steps sort numerically (checkpoint-900 before checkpoint-1000). Folders still being written
    (no weights yet, or a shard index whose shards are missing) are skipped.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    found: list[tuple[int, Path]] = []
    for child in run_dir.iterdir():
        match = _CHECKPOINT_DIR.match(child.name)
        if match and child.is_dir() and _is_complete(child):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def _check_compatible(
    reference: dict[str, torch.Tensor],
    reference_path: Path,
    candidate: dict[str, torch.Tensor],
    candidate_path: Path,
) -> None:
    """Raise ValueError naming the key and both files if two checkpoints cannot be averaged."""
    only_reference = sorted(reference.keys() - candidate.keys())
    only_candidate = sorted(candidate.keys() - reference.keys())
    if only_reference or only_candidate:
        details = []
        if only_reference:
            details.append(f"only in {reference_path}: {', '.join(only_reference)}")
        if only_candidate:
            details.append(f"only in {candidate_path}: {', '.join(only_candidate)}")
        raise ValueError(
            f"checkpoints {reference_path} and {candidate_path} have different tensor names; " + "; ".join(details)
        )
    for key, ref_tensor in reference.items():
        tensor = candidate[key]
        if tensor.shape != ref_tensor.shape:
            raise ValueError(
                f"tensor {key!r} has shape {tuple(ref_tensor.shape)} in {reference_path} "
                f"but {tuple(tensor.shape)} in {candidate_path}"
            )
        if tensor.dtype != ref_tensor.dtype:
            raise ValueError(
                f"tensor {key!r} has dtype {ref_tensor.dtype} in {reference_path} "
                f"but {tensor.dtype} in {candidate_path}"
            )
        if not ref_tensor.is_floating_point() and not torch.equal(tensor, ref_tensor):
            raise ValueError(
                f"non-floating-point tensor {key!r} ({ref_tensor.dtype}) differs between "
                f"{reference_path} and {candidate_path}; it cannot be averaged"
            )


def average_checkpoints(
    paths: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike | None = None,
) -> dict[str, torch.Tensor]:
    """Average the weights of ``paths`` (checkpoint folders or ``.safetensors`` files) (§6.1).

    Returns the averaged state dict. With ``output_dir``, also writes it there as
    ``model.safetensors`` (atomically) next to the non-weight files of the last path, if that
    is a folder.
    """
    checkpoints = [Path(p) for p in paths]
    if not checkpoints:
        raise ValueError("no checkpoints given to average")
    if output_dir is not None:
        output_dir = Path(output_dir)
        if any(c.is_dir() and c.resolve() == output_dir.resolve() for c in checkpoints):
            raise ValueError(f"output directory {output_dir} is one of the input checkpoints; choose another")

    reference = _load_weights(checkpoints[0])
    # Running float64 sums: one checkpoint in memory at a time besides the accumulator.
    sums = {key: t.to(torch.float64) for key, t in reference.items() if t.is_floating_point()}
    for checkpoint in checkpoints[1:]:
        weights = _load_weights(checkpoint)
        _check_compatible(reference, checkpoints[0], weights, checkpoint)
        for key, total in sums.items():
            total += weights[key].to(torch.float64)
        del weights

    count = len(checkpoints)
    averaged = {
        key: (sums[key] / count).to(tensor.dtype) if key in sums else tensor
        for key, tensor in reference.items()
    }

    if output_dir is not None:
        metadata = _load_metadata(checkpoints[-1])
        output_dir.mkdir(parents=True, exist_ok=True)
        if checkpoints[-1].is_dir():
            _copy_non_weight_files(checkpoints[-1], output_dir)
        _write_atomically(save(averaged, metadata=metadata), output_dir / WEIGHTS_NAME)
    return averaged


def _copy_non_weight_files(source: Path, destination: Path) -> None:
    for item in sorted(source.iterdir()):
        if item.is_file() and not any(fnmatch.fnmatch(item.name, pattern) for pattern in _NOT_COPIED):
            shutil.copy2(item, destination / item.name)


def _write_atomically(data: bytes, target: Path) -> None:
    """Write ``data`` to ``target`` so that readers see either the old file or the whole new one.

    A temporary file in the same directory (same filesystem, so ``os.replace`` is an atomic
    rename) is written and fsynced first; on any error it is removed and ``target`` is untouched.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    """Persist the rename itself (POSIX); not possible on every platform, hence best effort."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt average",
        description="Average model weights of several checkpoints (Vaswani et al. 2017, §6.1).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--inputs", nargs="+", metavar="PATH", help="checkpoint folders or .safetensors files, oldest first"
    )
    source.add_argument("--run-dir", metavar="RUN", help="Trainer output dir holding checkpoint-<step> folders")
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="N",
        help="with --run-dir: average the N most recent checkpoints (default 5, the paper's base model)",
    )
    parser.add_argument("--output", required=True, metavar="OUT", help="folder for the averaged model")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (argparse exits with 2 on bad usage)."""
    parser = _build_parser()
    args = parser.parse_args(argv)

    if args.run_dir is None and args.last is not None:
        parser.error("--last only applies to --run-dir")
    if args.run_dir is not None:
        if args.last is None:
            args.last = 5  # §6.1: base models average the last 5 checkpoints
        if args.last < 1:
            parser.error(f"--last must be >= 1, got {args.last}")
        try:
            available = find_checkpoints(args.run_dir)
        except FileNotFoundError as error:
            parser.error(str(error))
        if not available:
            parser.error(f"no complete checkpoint-<step> folders (with {WEIGHTS_NAME}) found in {args.run_dir}")
        if len(available) < args.last:
            parser.error(
                f"asked for the last {args.last} checkpoints but {args.run_dir} has only {len(available)}: "
                + ", ".join(path.name for path in available)
            )
        inputs = available[-args.last :]
    else:
        inputs = [Path(p) for p in args.inputs]

    try:
        averaged = average_checkpoints(inputs, output_dir=args.output)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    print(
        f"averaged {len(averaged)} tensors over {len(inputs)} checkpoints "
        f"({', '.join(str(p) for p in inputs)}) into {Path(args.output) / WEIGHTS_NAME}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
