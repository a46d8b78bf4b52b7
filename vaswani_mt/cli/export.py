"""`vaswani-mt export`: write a CTranslate2 export of a trained model (`vaswani_mt.inference.export`)."""

from __future__ import annotations

import argparse
import sys

from ..inference.export import QUANTIZATIONS, export_ctranslate2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt export", description="Export a trained model for fast inference."
    )
    parser.add_argument("--to", choices=["ctranslate2"], default="ctranslate2", help="target format")
    parser.add_argument("model", help="saved model folder (with its tokenizer)")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="weight type, e.g. int8 (default: keep float32)")
    parser.add_argument("--force", action="store_true",
                        help="replace a previous export in the output folder (never any other folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = export_ctranslate2(args.model, args.out, quantization=args.quantization, force=args.force)
    except ImportError as error:
        print(f"vaswani-mt export: error: {error}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"vaswani-mt export: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote CTranslate2 model to {out}", file=sys.stderr)
    return 0
