"""`vaswani-mt average`: average the weights of several checkpoints (§6.1; `vaswani_mt.recipe.averaging`).

    vaswani-mt average --run-dir runs/base --last 5 --output runs/base/averaged      (or runs/base/checkpoints)
    vaswani-mt average --inputs ckpt-a ckpt-b ckpt-c --output averaged
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..files import WEIGHTS_NAME, checkpoint_folders, checkpoint_problem, complete_checkpoints, last_saves
from ..recipe.averaging import average_checkpoints
from ..run_record import RunFolder


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt average",
        description="Average model weights of several checkpoints (Vaswani et al. 2017, §6.1).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--inputs", nargs="+", metavar="PATH", help="checkpoint folders or .safetensors files, oldest first"
    )
    source.add_argument("--run-dir", metavar="RUN", help="a run folder of `vaswani-mt train` (its checkpoints/), or "
                        "any folder holding checkpoint-<step> folders")
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="N",
        help="with --run-dir: average the N most recent checkpoints (default 5, the paper's base model)",
    )
    parser.add_argument("--output", required=True, metavar="OUT", help="folder for the averaged model")
    return parser


def _last_checkpoints(parser: argparse.ArgumentParser, run_dir: str, count: int) -> list[Path]:
    """The last `count` saves of a run (`vaswani_mt.files.last_saves`); incomplete folders are named on stderr, and
    too few consecutive saves is an error that lists what there is."""
    if not Path(run_dir).is_dir():
        parser.error(f"run directory {run_dir} does not exist")
    if not checkpoint_folders(run_dir) and RunFolder(run_dir).checkpoints.is_dir():
        run_dir = str(RunFolder(run_dir).checkpoints)  # a `vaswani-mt train` run folder
    for _, folder in checkpoint_folders(run_dir):
        problem = checkpoint_problem(folder)
        if problem is not None:
            print(f"vaswani-mt average: skipping {folder.name}: {problem}", file=sys.stderr)
    chosen = last_saves(run_dir, count)
    if not chosen:
        parser.error(f"no complete checkpoint-<step> folders found in {run_dir}")
    if len(chosen) < count:
        available = complete_checkpoints(run_dir)
        parser.error(
            f"asked for the last {count} checkpoints but {run_dir} has only {len(chosen)} consecutive complete "
            f"saves ({', '.join(path.name for path in chosen)}; complete: "
            f"{', '.join(path.name for path in available)})"
        )
    return chosen


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
        inputs = _last_checkpoints(parser, args.run_dir, args.last)
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
