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
  with ``from_pretrained``. Training state (optimizer, scheduler, RNG, trainer state, the batch of
  its updates, a save-in-progress marker) is not copied: it belongs to the last checkpoint's
  weights, not to the average.

Command line::

    vaswani-mt average --run-dir runs/base --last 5 --output runs/base/averaged
    vaswani-mt average --inputs ckpt-a ckpt-b ckpt-c --output averaged
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from ..files import (
    SAVING_MARKER,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    complete_checkpoints,
    safetensors_problem,
    weight_files,
    write_atomically,
)
from .processes import BATCH_FILE

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
    BATCH_FILE,
    SAVING_MARKER,
)


def _load_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint; a file that is not whole safetensors is named (ValueError), not left to fail
    inside safetensors without its name."""
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(checkpoint):
        problem = safetensors_problem(file)
        if problem is not None:
            raise ValueError(problem)
        tensors.update(load_file(file))
    return tensors


def _load_metadata(checkpoint: Path) -> dict[str, str]:
    with safe_open(weight_files(checkpoint)[0], framework="pt") as f:
        metadata = dict(f.metadata() or {})
    # transformers' from_pretrained checks this entry to know the file was written from torch.
    metadata.setdefault("format", "pt")
    return metadata


def find_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete ``checkpoint-<step>`` folders of a Trainer run, in increasing step order (checkpoint-900 before
    checkpoint-1000). Complete is the rule `vaswani-mt train --resume` uses (`vaswani_mt.files.checkpoint_problem`):
    a folder still being written, or half-deleted, is skipped."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    return complete_checkpoints(run_dir)


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
        write_atomically(save(averaged, metadata=metadata), output_dir / WEIGHTS_NAME)
    return averaged


def _copy_non_weight_files(source: Path, destination: Path) -> None:
    for item in sorted(source.iterdir()):
        if item.is_file() and not any(fnmatch.fnmatch(item.name, pattern) for pattern in _NOT_COPIED):
            shutil.copy2(item, destination / item.name)

