"""Data preparation at the paper's scale: time to data ready, peak memory, and the second run, on a generated corpus.

    python scripts/bench_data_prep.py                       # 1M and 4.5M pairs (WMT14's size), in /tmp
    python scripts/bench_data_prep.py --pairs 200000 --work /tmp/prep-small   # a quick check
    python scripts/bench_data_prep.py --pairs 1000000 --workers 1 4 8 16      # data.workers: how it scales

The corpus: each training pair is two Multi30k pairs joined with a space (random pairs, fixed seed), like WMT14
En-De's 4.5M pairs in number and size (~1.2 GB for 4.5M); valid and test are Multi30k's valid and test2016. For each
size, `vaswani-mt prepare --config wmt14-en-de-base` (its 37k joint BPE learned on a 1M-pair sample, as the shipped
config says) runs in a fresh process with an empty cache, then again with the cache it filled (what a second run,
`--resume` and every extra process of a multi-process run do), with `data.workers` at its default (the usable cores)
or at each of `--workers`. Measured: wall time to "data ready", and the peak resident memory of the process tree (the
preparing process and its worker processes, summed, sampled every 0.2 s).

The limit it is compared with: the raw `tokenizers` encode speed of the same BPE on the same text
(`Tokenizer.encode_batch` of both sides on the usable cores' threads), i.e. what tokenising alone would take at best.
The targets (issue #34): data ready in <= 6 min for 4.5M pairs (~1.6x the limit on a 2-core AMD EPYC), peak RSS
<= 3.5 GB and growing < 0.5 GB from 1M to 4.5M pairs, second run <= 30 s. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import cpu_model  # noqa: E402

from vaswani_mt.data.prepared import usable_cores  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


def generate(folder: Path, pairs: int, seed: int = 0) -> None:
    """train.{en,de} of `pairs` joined Multi30k pairs; valid/test from Multi30k. Kept when already there."""
    if (folder / "done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    en = (MULTI30K / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
    de = (MULTI30K / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
    rng = random.Random(seed)
    with (open(folder / "train.en", "w", encoding="utf-8") as fen,
          open(folder / "train.de", "w", encoding="utf-8") as fde):
        for start in range(0, pairs, 100_000):
            picks = [(rng.randrange(len(en)), rng.randrange(len(en))) for _ in range(min(100_000, pairs - start))]
            fen.write("".join(f"{en[a]} {en[b]}\n" for a, b in picks))
            fde.write("".join(f"{de[a]} {de[b]}\n" for a, b in picks))
    for split, name in (("valid", "valid"), ("test", "test2016")):
        for lang in ("en", "de"):
            shutil.copy(MULTI30K / f"{name}.{lang}", folder / f"{split}.{lang}")
    (folder / "done").write_text("")


def run_prepare(corpus: Path, cache: Path, sample: int, workers: int | None = None) -> dict:
    """`vaswani-mt prepare` in a fresh process: wall seconds and the peak RSS of its process tree (bytes)."""
    command = [sys.executable, "-m", "vaswani_mt.cli", "prepare", "--config", "wmt14-en-de-base",
               "--data.path", str(corpus), "--data.cache_dir", str(cache), "--tokenizer.sample", str(sample),
               "--data.workers", "null" if workers is None else str(workers)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, main_peak, stop = [0], [0], threading.Event()

    def sample_memory() -> None:
        parent = psutil.Process(process.pid)
        while not stop.wait(0.2):
            try:
                tree = [parent, *parent.children(recursive=True)]
                rss = [p.memory_info().rss for p in tree]
            except psutil.Error:
                continue
            peak[0], main_peak[0] = max(peak[0], sum(rss)), max(main_peak[0], rss[0])

    watcher = threading.Thread(target=sample_memory, daemon=True)
    watcher.start()
    out, err = process.communicate()
    stop.set()
    watcher.join()
    seconds = time.perf_counter() - started
    if process.returncode:
        raise SystemExit(f"prepare failed ({process.returncode}):\n{err[-3000:]}")
    return {"seconds": seconds, "peak_rss": peak[0], "main_peak_rss": main_peak[0], "summary": out.strip()}


def encode_limit(corpus: Path, cache: Path, sample_pairs: int = 200_000) -> float:
    """Pairs per second of `Tokenizer.encode_batch` (both sides, a thread per usable core) with the prepared BPE, on
    the corpus's first `sample_pairs` training pairs, as they come from the files."""
    from tokenizers import Tokenizer

    bpe = next(cache.glob("bpe-*"))
    tokenizer = Tokenizer.from_file(str(bpe / "tokenizer.json"))
    with open(corpus / "train.en", encoding="utf-8") as fen, open(corpus / "train.de", encoding="utf-8") as fde:
        en = [line.rstrip("\n") for _, line in zip(range(sample_pairs), fen)]
        de = [line.rstrip("\n") for _, line in zip(range(sample_pairs), fde)]
    sample_pairs = len(en)  # a corpus smaller than the sample: all of it
    code = (f"import os, sys, time, json; os.environ['RAYON_NUM_THREADS'] = '{usable_cores()}'\n"
            "from tokenizers import Tokenizer\n"
            "t = Tokenizer.from_file(sys.argv[1]); data = json.load(open(sys.argv[2]))\n"
            "t.encode_batch(data[0][:2000]); start = time.perf_counter()\n"
            "t.encode_batch(data[0]); t.encode_batch(data[1]); print(time.perf_counter() - start)\n")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump([en, de], handle)
    try:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
        seconds = float(subprocess.run([sys.executable, "-c", code, str(bpe / "tokenizer.json"), handle.name],
                                       capture_output=True, text=True, env=env, check=True).stdout)
    finally:
        os.unlink(handle.name)
    del tokenizer
    return sample_pairs / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000])
    parser.add_argument("--sample", type=int, default=1_000_000, help="tokenizer.sample (BPE learned on this many)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vaswani-mt-bench-data")
    parser.add_argument("--workers", type=int, nargs="+", default=[None],
                        help="data.workers values to time, each with an empty cache (default: data.workers' default, "
                             "the usable cores)")
    parser.add_argument("--keep", action="store_true", help="keep the generated corpora and caches")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, {usable_cores()} usable; corpus from {MULTI30K}")
    rows = []
    for pairs in args.pairs:
        corpus = args.work / f"corpus-{pairs}"
        generate(corpus, pairs)
        size = sum(f.stat().st_size for f in corpus.glob("train.*"))
        for workers in args.workers:
            cache = args.work / f"cache-{pairs}-{workers or 'default'}"
            shutil.rmtree(cache, ignore_errors=True)
            first = run_prepare(corpus, cache, args.sample, workers)
            second = run_prepare(corpus, cache, args.sample, workers)
            limit = encode_limit(corpus, cache)
            rows.append((pairs, workers or usable_cores(), size, first, second, limit))
            print(f"{pairs:,} pairs ({size / 1e9:.2f} GB), {rows[-1][1]} workers: data ready in "
                  f"{first['seconds'] / 60:.2f} min, peak RSS {first['peak_rss'] / 2**30:.2f} GiB (preparing process "
                  f"{first['main_peak_rss'] / 2**30:.2f}); second run {second['seconds']:.1f} s; encode limit "
                  f"{limit:,.0f} pairs/s = {pairs / limit / 60:.2f} min; "
                  f"ratio {first['seconds'] / (pairs / limit):.2f}x", flush=True)
            if not args.keep:
                shutil.rmtree(cache, ignore_errors=True)
    print()
    print(f"| pairs | workers | train text | data ready | vs encode limit | peak RSS (tree) | second run |  "
          f"(CPU: {cpu_model()}, {usable_cores()} usable cores)")
    print("|---|---|---|---|---|---|---|")
    for pairs, workers, size, first, second, limit in rows:
        print(f"| {pairs:,} | {workers} | {size / 1e9:.2f} GB | {first['seconds'] / 60:.2f} min | "
              f"{first['seconds'] / (pairs / limit):.2f}x ({limit:,.0f} pairs/s) | {first['peak_rss'] / 2**30:.2f} GiB "
              f"| {second['seconds']:.1f} s |")
    if len(args.pairs) > 1 and len(args.workers) == 1:
        growth = (rows[-1][3]["peak_rss"] - rows[0][3]["peak_rss"]) / 2**30
        print(f"peak RSS growth from {rows[0][0]:,} to {rows[-1][0]:,} pairs: {growth:+.2f} GiB")
    print("targets: 4.5M pairs ready in <= 6 min (~1.6x the encode limit), peak RSS <= 3.5 GB growing < 0.5 GB from "
          "1M to 4.5M, second run <= 30 s")
    if not args.keep:
        for pairs in args.pairs:
            shutil.rmtree(args.work / f"corpus-{pairs}", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
