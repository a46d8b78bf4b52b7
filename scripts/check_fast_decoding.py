"""Our decoding loops against transformers' own on a real test set: same translations? how much faster?

    python scripts/check_fast_decoding.py runs/NAME                  # Multi30k test2016 (English side) by default
    python scripts/check_fast_decoding.py runs/NAME/model --source test.en --limit 200

Translates the source file twice through `vaswani-mt translate`'s core (token batches, the model's default decoding:
its saved beam size and length penalty, up to source length + 50 tokens): once with `generate()` as shipped (the loops of
vaswani_mt/model/fast_decoding.py), once with `model.use_fast_decoding = False` (transformers' loops). Prints both
times, the speed-up and how many translations are identical. Exit code 1 when any translation differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import MULTI30K, find_model_folder, read_text_lines  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="saved model folder, or a run folder with model/")
    parser.add_argument("--source", type=Path, default=MULTI30K / "test2016.en")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from vaswani_mt.inference.translate import load_model_and_tokenizer, translate_lines

    torch.set_num_threads(args.threads)
    folder = find_model_folder(args.run)
    sources = read_text_lines(args.source)[: args.limit]
    model, tokenizer = load_model_and_tokenizer(str(folder), "cpu")
    translations, seconds = {}, {}
    for fast in (True, False):
        model.use_fast_decoding = fast
        start = time.perf_counter()
        translations[fast] = list(translate_lines(model, tokenizer, sources))
        seconds[fast] = time.perf_counter() - start
    same = sum(a == b for a, b in zip(translations[True], translations[False]))
    print(f"model {folder}; {args.source}, {len(sources)} sentences; {args.threads} threads")
    print(f"ours {seconds[True]:.1f} s, transformers' loops {seconds[False]:.1f} s: "
          f"{seconds[False] / seconds[True]:.2f}x; identical translations: {same} of {len(sources)}")
    return 0 if same == len(sources) else 1


if __name__ == "__main__":
    sys.exit(main())
