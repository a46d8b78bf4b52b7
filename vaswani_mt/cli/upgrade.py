"""`vaswani-mt upgrade`: replace the model code saved beside models with the installed package's
(`vaswani_mt.publishing.model_code`).

    vaswani-mt upgrade runs/multi30k-en-de            (the run's model/, checkpoints and averages)
    vaswani-mt upgrade ./downloaded-hub-repo --dry-run
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..files import describe_os_error
from ..publishing.model_code import model_folders, upgrade


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt upgrade",
        description="Replace the model code saved beside models (modeling_vaswani.py, configuration_vaswani.py, "
                    "pipeline_vaswani.py) with the installed vaswani_mt's, so that stock transformers decodes them "
                    "right with trust_remote_code=True. Weights, config and tokenizer are left as they are.",
        epilog="A model pushed to the Hub: download it (hf download REPO_ID --local-dir DIR), upgrade DIR, upload it "
               "again (hf upload REPO_ID DIR).",
    )
    parser.add_argument("folders", nargs="+", metavar="FOLDER", help="a model folder, or a folder holding some "
                        "(a run folder of `vaswani-mt train`)")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    parser.add_argument("--check", action="store_true", help="like --dry-run, and exit with 1 when a folder's code "
                        "is not current")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        folders = [folder for path in args.folders for folder in model_folders(path)]
    except ValueError as error:
        print(f"vaswani-mt upgrade: error: {error}", file=sys.stderr)
        return 2
    outdated = 0
    for folder in folders:
        try:
            changes = upgrade(folder, dry_run=args.dry_run or args.check)
        except OSError as error:
            print(f"vaswani-mt upgrade: error: {describe_os_error(error)}", file=sys.stderr)
            return 1
        outdated += not changes.current
        print(("would change " if (args.dry_run or args.check) and not changes.current else "") + changes.describe())
    return 1 if args.check and outdated else 0
