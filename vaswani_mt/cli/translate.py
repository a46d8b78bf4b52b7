"""`vaswani-mt translate`: translate a file (or stdin) line by line with a trained model or a CTranslate2 export.

    vaswani-mt translate runs/NAME/model --input test.en --output test.hyp.de --reference test.de
    vaswani-mt translate runs/NAME/ct2 ...      # a CTranslate2 export (`vaswani-mt export`): faster on a CPU

The work is `vaswani_mt.inference.translate` (streaming, batching, order); this module reads the options and the
files, refuses an --output that would destroy an input, and scores against --reference (for a model trained with
`data.preprocess`, also with multi-bleu.perl's BLEU on the tokenized lowercase output, as `train` scores it).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path
from typing import BinaryIO, TextIO

from ..data.reading import NotUTF8Error, iter_lines
from ..files import describe_os_error, writing
from ..inference.engines import load_translator, target_preprocessing
from ..inference.translate import DEFAULT_MAX_TOKENS, DEFAULT_SORT_WINDOW, TranslateError
from ..metrics import corpus_scores, tokenized_bleu
from ..model.modeling_vaswani import LENGTH_PENALTY_STYLES


def _open_input(path: str | None) -> tuple[BinaryIO, str]:
    if path is None or path == "-":
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb"), path
    except OSError as error:
        raise TranslateError(f"cannot read input {path}: {error.strerror}") from None


def _read_all(path: str, what: str) -> list[str]:
    stream, name = _open_input(path)
    with stream:
        return list(iter_lines(stream, f"{what} {name}"))


class _Output:
    """Writes UTF-8 lines to a file or to stdout (whatever the locale's encoding)."""

    def __init__(self, path: str | None):
        self.close_after = False
        self.name = "<stdout>" if path is None or path == "-" else path
        if path is None or path == "-":
            encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
            if encoding == "utf8" or not hasattr(sys.stdout, "buffer"):
                self.stream: TextIO = sys.stdout
            else:
                self.stream = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=True)
        else:
            try:
                self.stream = open(path, "w", encoding="utf-8", newline="\n")
            except OSError as error:
                raise TranslateError(f"cannot write output {path}: {error.strerror}") from None
            self.close_after = True

    def write(self, line: str) -> None:
        with writing(self.name):  # a full disk is reported with the file's name
            self.stream.write(line + "\n")

    def close(self) -> None:
        with writing(self.name):
            self.stream.flush()
            if self.close_after:
                self.stream.close()


def _count_lines(path: str) -> int:
    with open(path, "rb") as stream:
        return sum(1 for _ in stream)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt translate",
        description="Translate one sentence per line with a trained model. Output line i translates input line i.",
    )
    parser.add_argument("model", help="a saved model with its tokenizer, e.g. runs/NAME/model (what `vaswani-mt train` "
                                      "writes), or a CTranslate2 export of one (`vaswani-mt export`: faster on a CPU)")
    parser.add_argument("--input", "-i", help="UTF-8 text file, one sentence per line (default: stdin)")
    parser.add_argument("--output", "-o", help="where to write the translations (default: stdout)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help="padded source tokens per batch (default: %(default)s)")
    parser.add_argument("--num-beams", type=int, help="beam size (default: the model's, 4 for the paper's)")
    parser.add_argument("--length-penalty", type=float, metavar="ALPHA",
                        help="the length penalty's alpha (default: the model's, 0.6 for the paper's)")
    parser.add_argument("--length-penalty-style", choices=LENGTH_PENALTY_STYLES,
                        help="transformers: a beam's score / length**alpha; gnmt: / ((5 + length) / 6)**alpha, as "
                             "in the paper (§6.1) (default: the model's)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="longest translation in tokens (default: the model's, source length + 50)")
    parser.add_argument("--reference", "-r", help="reference translations: print sacreBLEU BLEU and chrF to stderr")
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps, Apple's GPU (default: cuda, else mps, when "
                                         "available, else cpu)")
    parser.add_argument("--sort-window", type=int, default=DEFAULT_SORT_WINDOW,
                        help="lines read, sorted by length and batched together (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("max_tokens", "sort_window", "num_beams", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"vaswani-mt translate: error: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    try:
        return _run(args)
    except TranslateError as error:
        print(f"vaswani-mt translate: error: {error}", file=sys.stderr)
        return 1
    except NotUTF8Error as error:  # in --input or --reference, raised as the lines are read
        start, raw = error.start, error.raw_line
        print(f"vaswani-mt translate: error: {error.name}: line {error.line} is not valid UTF-8 ({error.reason} at "
              f"byte {start}: {raw[max(0, start - 10): start + 10]!r}); convert the file, e.g. with iconv",
              file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # the reader went away (`... | head -1`): `vaswani-mt` stops quietly
    except OSError as error:
        print(f"vaswani-mt translate: error: {describe_os_error(error)}", file=sys.stderr)
        return 1


def _refuse_overwriting(args) -> None:
    """Refuse an --output that is the input (same path, link or stdin redirect), the reference, or a file of the
    model, before anything is opened: opening it for writing would empty it before it is read."""
    if args.output in (None, "-") or not os.path.exists(args.output):
        return
    output = os.stat(args.output)
    stdin = args.input in (None, "-")
    for what, source in (("--input", None if stdin else args.input), ("--reference", args.reference),
                         ("stdin", "-" if stdin else None)):
        try:
            same = source is not None and os.path.samestat(
                os.fstat(sys.stdin.fileno()) if source == "-" else os.stat(source), output)
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
            same = False
        if same:
            raise TranslateError(f"--output {args.output} is the same file as {what}"
                                 + ("" if source == "-" else f" {source}")
                                 + ": it would be emptied before it is read; write the translations to another file")
    if Path(args.model).resolve() in Path(args.output).resolve().parents:
        raise TranslateError(f"--output {args.output} is a file of the model folder {args.model}: write the "
                             "translations elsewhere")


def _run(args) -> int:
    _refuse_overwriting(args)
    references = None
    if args.reference:
        references = _read_all(args.reference, "reference")
        if args.input not in (None, "-") and os.path.isfile(args.input):
            count = _count_lines(args.input)
            if count != len(references):
                raise TranslateError(
                    f"--reference {args.reference} has {len(references)} lines but --input {args.input} has {count}"
                )
    translate = load_translator(args.model, args.device)
    decoding = {name: getattr(args, name) for name in ("length_penalty", "length_penalty_style")
                if getattr(args, name) is not None}
    stream, name = _open_input(args.input)
    from tqdm.auto import tqdm

    interactive = sys.stderr.isatty()
    total = _count_lines(args.input) if interactive and args.input not in (None, "-") else None
    progress = tqdm(total=total, unit="sent", desc="translating", disable=not interactive, file=sys.stderr)
    hypotheses = [] if references is not None else None
    output = None
    try:
        translations = translate(  # options the engine refuses are refused here, before --output is opened (emptied)
            iter_lines(stream, name), max_tokens=args.max_tokens, sort_window=args.sort_window,
            num_beams=args.num_beams, max_new_tokens=args.max_new_tokens, on_translated=progress.update, **decoding)
        output = _Output(args.output)
        for translation in translations:
            output.write(translation)
            if hypotheses is not None:
                hypotheses.append(translation)
    finally:
        progress.close()
        if output is not None:
            output.close()
        if stream is not sys.stdin.buffer:
            stream.close()
    if references is not None:
        if len(hypotheses) != len(references):
            raise TranslateError(
                f"--reference {args.reference} has {len(references)} lines but the input had {len(hypotheses)}"
            )
        if not hypotheses:
            raise TranslateError("cannot score an empty input")
        preprocess = target_preprocessing(args.model)
        if preprocess is not None:  # the model writes lowercased, tokenized text: score against such references
            references = [preprocess(reference) for reference in references]
            print("(references lowercased and Moses-tokenized, as the model's output is)", file=sys.stderr)
        scores = corpus_scores(hypotheses, references)
        print(f"BLEU = {scores['bleu']:.2f}  {scores['bleu_signature']}", file=sys.stderr)
        print(f"chrF2 = {scores['chrf']:.2f}  {scores['chrf_signature']}", file=sys.stderr)
        if preprocess is not None:  # the literature's score of such a model: multi-bleu.perl's, no tokenizing again
            literature = tokenized_bleu(hypotheses, references)
            print(f"BLEU, lowercased Moses-tokenized (multi-bleu.perl) = {literature['bleu']:.2f}  "
                  f"{literature['bleu_signature']}", file=sys.stderr)
    return 0
