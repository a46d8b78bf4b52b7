"""`vaswani-mt push`: upload a trained run (its model and model card) to the Hugging Face Hub
(`vaswani_mt.publishing.hub`)."""

from __future__ import annotations

import argparse
import sys

from ..model.pipeline_vaswani import pipeline_code_changes
from ..publishing.hub import (PushError, check_run_folder, check_seed_runs, demo_files, push_run, split_repo_id,
                              upload_plan)
from ..publishing.model_card import render_model_card
from ..publishing.model_code import code_changes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt push",
        description="Upload a trained run (its model/ folder and a model card) to the Hugging Face Hub.",
        epilog="Log in first with `hf auth login` or set HF_TOKEN. The model then loads anywhere with "
               "AutoModelForSeq2SeqLM.from_pretrained(REPO_ID, trust_remote_code=True).",
    )
    parser.add_argument("run_dir", help="the run folder written by `vaswani-mt train` (with model/ and metrics.json)")
    parser.add_argument("repo_id", help="<user or organization>/<model name> (a bare name means your user)")
    parser.add_argument("--private", action="store_true", help="create the repo as private (no effect if it exists)")
    parser.add_argument("--token", help="a Hub token with write access (default: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--license", help="the weights' licence, a Hub licence id such as apache-2.0 (default: "
                                          "'other', described by the training data's terms)")
    parser.add_argument("--license-name", help="with --license other: a short id for the licence")
    parser.add_argument("--license-link", help="with --license other: a URL (or file in the repo) with its text")
    parser.add_argument("--dataset", help="the Hub id of the training data for the card's metadata (default: from "
                                          "the run config)")
    parser.add_argument("--demo", action="store_true",
                        help="also upload app.py and requirements.txt: the page of `vaswani-mt demo` for a Hugging "
                             "Face Space (Gradio SDK) or `python app.py` (default: the model repo gets neither)")
    parser.add_argument("--demo-requirement", metavar="SPEC",
                        help="with --demo: the requirements.txt line that installs vaswani-mt, which is not on PyPI, "
                             "e.g. 'vaswani-mt[demo] @ git+https://github.com/OWNER/vaswani_mt' (default: "
                             "vaswani-mt[demo])")
    parser.add_argument("--message", default="Upload vaswani_mt model and model card", help="the commit message")
    parser.add_argument("--seed-runs", nargs="+", default=[], metavar="RUN",
                        help="run folders of the same config with other seeds (training.seed): the card gives the "
                             "recipe's mean and spread of test BLEU over them and this run")
    parser.add_argument("--dry-run", action="store_true", help="check the run and print the card and the files; "
                                                               "upload nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.demo_requirement is not None and not args.demo:
        print("vaswani-mt push: error: --demo-requirement goes with --demo", file=sys.stderr)
        return 2
    try:
        model_dir = check_run_folder(args.run_dir)
        check_seed_runs(args.run_dir, args.seed_runs)
        demo = demo_files(args.repo_id, args.demo_requirement) if args.demo else {}
        if not code_changes(model_dir).current:
            print(f"vaswani-mt push: warning: the model code in {model_dir} is not this vaswani-mt's (saved by another "
                  f"version); `vaswani-mt upgrade {args.run_dir}` replaces it before the push", file=sys.stderr)
        if args.dry_run:
            namespace, _ = split_repo_id(args.repo_id)
            print(render_model_card(args.run_dir, args.repo_id if namespace else None, license=args.license,
                                    license_name=args.license_name, license_link=args.license_link,
                                    dataset=args.dataset, seed_runs=args.seed_runs))
            files = [path for path, _ in upload_plan(model_dir)] + list(pipeline_code_changes(model_dir)) + list(demo)
            print("files: " + ", ".join(sorted(set(files) | {"README.md"})), file=sys.stderr)
            print(f"dry run: nothing was uploaded; without --dry-run these files and the card above would go to "
                  f"{args.repo_id}", file=sys.stderr)
            return 0
        url = push_run(args.run_dir, args.repo_id, private=args.private, token=args.token,
                       commit_message=args.message, license=args.license, license_name=args.license_name,
                       license_link=args.license_link, dataset=args.dataset, demo=args.demo,
                       demo_requirement=args.demo_requirement, seed_runs=args.seed_runs)
    except PushError as error:
        print(f"vaswani-mt push: error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"pushed {args.run_dir} to {url}")
    return 0
