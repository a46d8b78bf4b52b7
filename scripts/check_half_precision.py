"""What does half precision change? A trained model's translations of a test set in float32 and in bfloat16 / float16.

    python scripts/check_half_precision.py runs/NAME                       # Multi30k test2016 en->de, on cuda if any
    python scripts/check_half_precision.py runs/NAME/model --device cpu --dtypes bfloat16 --limit 200

Loads the model (a saved model folder, or a `vaswani-mt train` run folder: its `model/`) as a user does,
`AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=...)`, once per precision, translates the test set with the
model's own decoding defaults (`translate_lines`, vaswani_mt's decoding loops) and prints a markdown table: sacreBLEU
BLEU / chrF against the reference, how many translations differ from float32's, and the time. With `--both-loops`
each precision is also decoded by transformers' own loops (`use_fast_decoding = False`), with and without their
cache, and the script counts the translations on which vaswani_mt's loops differ from transformers' (0 is expected:
where the two would round differently, vaswani_mt hands decoding to transformers; exit code 1 otherwise), and those
on which transformers' loops differ from themselves without the cache (what rounding alone changes).
The CPU model and its bf16 support are printed beside the figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmark_common import MULTI30K, cpu_model, find_model_folder, read_test_set


def translate(folder: Path, dtype, device: str, sources: list[str], fast: bool = True,
              use_cache: bool = True) -> tuple[list[str], float]:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from vaswani_mt.inference.translate import translate_lines

    model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    model.use_fast_decoding = fast
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        hypotheses = list(translate_lines(model, tokenizer, sources, use_cache=use_cache))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return hypotheses, time.perf_counter() - start


def differ(these: list[str], those: list[str]) -> int:
    return sum(a != b for a, b in zip(these, those))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="saved model folder, or a run folder with model/")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test2016.en")
    parser.add_argument("--reference", type=Path, default=MULTI30K / "test2016.de")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], choices=["bfloat16", "float16"])
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--threads", type=int, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--both-loops", action="store_true", help="also decode each half precision with transformers' "
                        "loops and count the translations where the two loops differ")
    args = parser.parse_args(argv)

    import torch

    from vaswani_mt.metrics import corpus_scores
    from vaswani_mt.precision import native_bf16

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = find_model_folder(args.run)
    sources, references = read_test_set(args.source, args.reference, args.limit)

    rows, disagreements, rounding = [], {}, {}
    translate(folder, torch.float32, device, sources[:64])  # warm-up: kernels, allocator, the loops' check
    float32 = None
    for name in ["float32", *args.dtypes]:
        dtype = getattr(torch, name)
        hypotheses, seconds = translate(folder, dtype, device, sources)
        float32 = float32 or hypotheses
        rows.append((name, "vaswani_mt", corpus_scores(hypotheses, references), differ(hypotheses, float32), seconds))
        if args.both_loops:
            theirs, seconds = translate(folder, dtype, device, sources, fast=False)
            rows.append((name, "transformers", corpus_scores(theirs, references), differ(theirs, float32), seconds))
            uncached, _ = translate(folder, dtype, device, sources, fast=False, use_cache=False)
            disagreements[name], rounding[name] = differ(hypotheses, theirs), differ(theirs, uncached)

    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else (
        f"{cpu_model()}, {torch.get_num_threads()} threads, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, native bf16: {native_bf16('cpu')[0]}")
    print(f"model {folder}; {args.source} -> {args.reference}, {len(sources)} sentences; device {device}: {where}")
    print()
    print("| precision | loops | BLEU | chrF2 | translations changed vs float32 | seconds |")
    print("|---|---|---|---|---|---|")
    for name, loops, scores, changed, seconds in rows:
        print(f"| {name} | {loops} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {changed} of {len(sources)} "
              f"| {seconds:.1f} |")
    print()
    print(f"BLEU signature: {rows[0][2]['bleu_signature']}")
    for name, count in disagreements.items():
        print(f"{name}: vaswani_mt's loops and transformers' loops differ on {count} of {len(sources)} translations; "
              f"transformers' loops with and without their cache on {rounding[name]}")
    return 1 if any(disagreements.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
