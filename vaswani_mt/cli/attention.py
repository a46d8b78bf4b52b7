"""`vaswani-mt attention`: draw the attention heatmaps of one sentence (`vaswani_mt.inference.heatmaps`)."""

from __future__ import annotations

import argparse
import sys

from ..inference.heatmaps import attention_maps, plot_attention, require_matplotlib
from ..inference.translate import TranslateError, load_model_and_tokenizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt attention",
        description="Draw encoder, decoder and encoder-decoder attention heatmaps for one sentence.",
    )
    parser.add_argument("model", help="saved model folder (with its tokenizer)")
    parser.add_argument("sentence", help="source sentence")
    parser.add_argument("--out", required=True, help="folder for the PNG files")
    parser.add_argument("--target", help="translation to analyse (default: the model's greedy translation)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="longest greedy translation when no --target is given (default: source length + 50)")
    parser.add_argument("--layers", type=int, nargs="+", help="layers to draw, from 0 (default: all)")
    parser.add_argument("--heads", type=int, nargs="+", help="heads to draw, from 0 (default: all)")
    parser.add_argument("--device", help="torch device (default: cpu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_matplotlib()
        try:
            model, tokenizer = load_model_and_tokenizer(args.model, args.device or "cpu")
        except TranslateError as error:
            raise ValueError(str(error)) from None
        maps = attention_maps(model, tokenizer, args.sentence, args.target, max_new_tokens=args.max_new_tokens)
        paths = plot_attention(model, tokenizer, args.sentence, args.out, layers=args.layers, heads=args.heads,
                               maps=maps)
    except (ImportError, ValueError) as error:
        print(f"vaswani-mt attention: error: {error}", file=sys.stderr)
        return 1
    print(f"translation: {maps['translation']}", file=sys.stderr)
    for path in paths:
        print(path)
    return 0
