"""Does int8 quantization cost BLEU? CTranslate2 float32 vs int8 exports of a trained model on a test set.

    python scripts/check_int8_bleu.py runs/NAME                      # Multi30k test2016 en->de by default
    python scripts/check_int8_bleu.py runs/NAME/model --source test.en --reference test.de --tolerance 0.5 --hf

Exports the model (a saved model folder, or a `vaswani-mt train` run folder: its `model/`) to CTranslate2 in float32 and int8,
translates the test set with both (the model's defaults: its beam and length penalty, e.g. beam 4 and 0.6 for the
paper's, and up to source length + 50 tokens), and prints a markdown table of sacreBLEU BLEU / chrF (with
signatures) and the int8 - float32 difference.
With `--hf` our own `generate()` (via `vaswani-mt translate`'s core) is scored as well. Exit code 1 when int8 is more
than `--tolerance` BLEU below float32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmark_common import MULTI30K, find_model_folder, read_test_set


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="saved model folder, or a run folder with model/")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test2016.en")
    parser.add_argument("--reference", type=Path, default=MULTI30K / "test2016.de")
    parser.add_argument("--tolerance", type=float, default=0.5, help="allowed BLEU loss of int8 (default 0.5)")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hf", action="store_true", help="also score our generate() (slower)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from vaswani_mt.inference.export import export_ctranslate2, translate_with_ctranslate2
    from vaswani_mt.metrics import corpus_scores

    folder = find_model_folder(args.run)
    sources, references = read_test_set(args.source, args.reference, args.limit)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.set_num_threads(args.threads)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("float32", "int8"):
            out = Path(tmp) / quantization
            export_ctranslate2(folder, out, quantization=None if quantization == "float32" else "int8")
            start = time.perf_counter()
            hypotheses = translate_with_ctranslate2(out, tokenizer, sources, threads=args.threads)
            seconds = time.perf_counter() - start
            rows.append((f"CTranslate2 {quantization}", corpus_scores(hypotheses, references), seconds))
    if args.hf:
        from vaswani_mt.inference.translate import load_model_and_tokenizer, translate_lines

        model, tokenizer = load_model_and_tokenizer(str(folder), "cpu")
        start = time.perf_counter()
        hypotheses = list(translate_lines(model, tokenizer, sources))
        rows.append(("ours (generate)", corpus_scores(hypotheses, references), time.perf_counter() - start))

    decoding = GenerationConfig.from_pretrained(folder)
    print(f"model {folder}; test set {args.source} -> {args.reference}, {len(sources)} sentences; "
          f"beam {decoding.num_beams}, length penalty {decoding.length_penalty}")
    print()
    print("| system | BLEU | chrF2 | seconds (incl. load) | sent/s |")
    print("|---|---|---|---|---|")
    for name, scores, seconds in rows:
        rate = len(sources) / seconds
        print(f"| {name} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {seconds:.1f} | {rate:.1f} |")
    fp32, int8 = rows[0][1], rows[1][1]
    delta = int8["bleu"] - fp32["bleu"]
    print()
    print(f"int8 - float32: {delta:+.2f} BLEU, {int8['chrf'] - fp32['chrf']:+.2f} chrF (tolerance -{args.tolerance})")
    print(f"BLEU signature: {fp32['bleu_signature']}")
    print(f"chrF signature: {fp32['chrf_signature']}")
    if delta < -args.tolerance:
        print(f"FAIL: int8 loses {-delta:.2f} BLEU (> {args.tolerance})")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
