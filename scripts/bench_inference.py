"""Generation speed: our model vs `MarianMTModel` with identical weights, and the CTranslate2 export (fp32, int8).

    python scripts/bench_inference.py            # 5 repetitions
    python scripts/bench_inference.py --quick    # 2 repetitions, short idle waits: checks that it runs

Setup (as in /work/shared/notes/benchmarks.md): the "small" shape (d_model 256, 3+3 layers, 4 heads, FFN 1024,
vocab 8000), random weights, 64 source sentences of 15 tokens, exactly 40 new tokens each (min = max new tokens, so
</s> cannot end a hypothesis early), KV cache on, greedy and beam 4, torch with 2 threads. The Marian model is
`vaswani_mt.model.convert.to_marian(ours)`: same function, same weights, and the script checks that both produce identical
tokens. Rows:
- `ours`: our `generate()` as shipped (the fast decoding loops of vaswani_mt/model/fast_decoding.py);
- `ours, transformers loop`: the same model with `use_fast_decoding = False` (transformers' own loops);
- `ct2-float32` / `ct2-int8`: the CTranslate2 export, run the way CTranslate2 recommends for throughput on 2 cores:
  2 translation workers of 1 thread each (`inter_threads=2, intra_threads=1`), batches of 32 sentences; and
  `... 1x2`: one worker with 2 threads (`intra_threads=2`), the whole batch at once; and on a CPU with AVX-512,
  `... avx512`: the 2x1 setting with `CT2_FORCE_CPU_ISA=AVX512` (CTranslate2 4.8 dispatches its own kernels to
  AVX2 unless told otherwise; its documented switch).
CTranslate2 runs in worker processes of its own (children of the benchmark, one per ISA setting, timed from here,
their CPU time counted as the benchmark's; idle while the others run): a live Translator in the same process
slowed torch's generate() by ~25 % on this machine, even while idle, which flattered every ratio to Marian. Each
repetition runs every system once (A B A B ...), after waiting for other processes to go quiet; disturbed
repetitions are redone. Prints a markdown table of medians (sentences/s), min–max and ratios to Marian.

Targets of the project (issue): ours beam 4 >= 1.5x Marian; CTranslate2 >= 2.3x Marian (fp32) and >= 2.8x (int8).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import HELPER_PIDS, SMALL_SHAPE, cpu_model, fmt_range, measure  # noqa: E402

SENTENCES, SOURCE_TOKENS, NEW_TOKENS = 64, 15, 40


def build_models(seed: int = 0):
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.model.convert import to_marian

    torch.manual_seed(seed)
    ours = VaswaniForConditionalGeneration(VaswaniConfig(**SMALL_SHAPE)).eval()
    marian = to_marian(ours).eval()
    return ours, marian


def make_inputs(vocab_size: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (SENTENCES, SOURCE_TOKENS), generator=generator)
    input_ids[:, -1] = 3  # </s>
    return input_ids, torch.ones_like(input_ids)


def hf_runner(model, input_ids, attention_mask, beams: int):
    kwargs = dict(num_beams=beams, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS, use_cache=True,
                  do_sample=False, length_penalty=1.0)

    def run():
        with torch.inference_mode():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    return run


# CTranslate2 settings compared: (label suffix, intra_threads, inter_threads, max_batch_size)
CT2_SETTINGS = (("", 1, 2, SENTENCES // 2), (" 1x2", 2, 1, SENTENCES))
# ... and in a second worker with CTranslate2's kernels forced to AVX-512 (the ISA is fixed per process)
CT2_AVX512_SETTINGS = ((" avx512", 1, 2, SENTENCES // 2),)


def cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def ct2_worker(folder: Path, avx512: bool) -> int:
    """`--ct2-worker FOLDER [--ct2-avx512]`: load the exports in FOLDER (float32/, int8/, sources.json) with every
    setting of the group (the parent sets CTranslate2's ISA in the environment), then answer one JSON request per
    stdin line ({"quantization", "suffix", "beams", "tokens"}) with one JSON line."""
    import ctranslate2

    sources = json.loads((folder / "sources.json").read_text())
    settings = CT2_AVX512_SETTINGS if avx512 else CT2_SETTINGS
    translators = {(q, suffix): (ctranslate2.Translator(str(folder / q), device="cpu", intra_threads=intra,
                                                         inter_threads=inter), max_batch)
                   for q in ("float32", "int8") for suffix, intra, inter, max_batch in settings}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        translator, max_batch = translators[(request["quantization"], request["suffix"])]
        results = translator.translate_batch(sources, beam_size=request["beams"], min_decoding_length=NEW_TOKENS,
                                             max_decoding_length=NEW_TOKENS, max_batch_size=max_batch,
                                             length_penalty=1.0, return_scores=False)
        reply = {"tokens": [r.hypotheses[0] for r in results]} if request.get("tokens") else {}
        print(json.dumps(reply), flush=True)
    return 0


class CT2Worker:
    """The parent's handle on the `--ct2-worker` process."""

    def __init__(self, folder: Path, avx512: bool = False):
        env = {k: v for k, v in os.environ.items() if k != "CT2_FORCE_CPU_ISA"}  # default rows: CTranslate2's choice
        if avx512:
            env["CT2_FORCE_CPU_ISA"] = "AVX512"
        command = [sys.executable, __file__, "--ct2-worker", str(folder)] + (["--ct2-avx512"] if avx512 else [])
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        HELPER_PIDS.add(self.process.pid)
        self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the CTranslate2 worker exited with code {self.process.wait()} (its error is above)")
        return json.loads(line)

    def request(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def runner(self, quantization: str, suffix: str, beams: int):
        return lambda: self.request(quantization=quantization, suffix=suffix, beams=beams)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        HELPER_PIDS.discard(self.process.pid)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions and short idle waits (a smoke run)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--idle-threshold", type=float, default=0.1, help="max cores other processes may use")
    parser.add_argument("--max-wait", type=float,
                        help="seconds to wait for an idle machine (default 120, --quick 10)")
    parser.add_argument("--max-redo", type=int, default=3, help="redos of a disturbed repetition")
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    parser.add_argument("--ct2-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ct2-avx512", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ct2_worker:
        return ct2_worker(args.ct2_worker, args.ct2_avx512)
    if args.quick:
        args.repetitions, args.max_redo = 2, 1
    if args.max_wait is None:
        args.max_wait = 10.0 if args.quick else 120.0
    torch.set_num_threads(args.threads)

    ours, marian = build_models()
    input_ids, attention_mask = make_inputs(ours.config.vocab_size)
    systems = {}
    hf_loop = copy.deepcopy(ours)
    hf_loop.use_fast_decoding = False
    for beams, mode in ((1, "greedy"), (4, "beam4")):
        systems[f"ours {mode}"] = hf_runner(ours, input_ids, attention_mask, beams)
        systems[f"ours, transformers loop {mode}"] = hf_runner(hf_loop, input_ids, attention_mask, beams)
        systems[f"marian {mode}"] = hf_runner(marian, input_ids, attention_mask, beams)

    # Same tokens from all three (the conversion is exact): checked once per mode, outside the timing.
    identical = {}
    for mode in ("greedy", "beam4"):
        a, b, c = (systems[f"{name} {mode}"]() for name in ("ours", "marian", "ours, transformers loop"))
        identical[mode] = torch.equal(a, b) and torch.equal(a, c)
        assert a.shape[1] == NEW_TOKENS + 1, a.shape

    ct2_match, workers, ct2_settings = {}, [], CT2_SETTINGS
    tmp = tempfile.TemporaryDirectory()
    if not args.no_ct2:
        from vaswani_mt.inference.export import export_ctranslate2

        tokens = ["<pad>", "<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(4, ours.config.vocab_size)]
        folder = Path(tmp.name)
        (folder / "sources.json").write_text(json.dumps([[tokens[i] for i in row] for row in input_ids.tolist()]))
        for quantization in ("float32", "int8"):
            export_ctranslate2(ours, folder / quantization, quantization=None if quantization == "float32" else "int8",
                               tokens=tokens)
        workers = [(CT2Worker(folder), CT2_SETTINGS)]
        if cpu_has_avx512():
            try:
                workers.append((CT2Worker(folder, avx512=True), CT2_AVX512_SETTINGS))
            except RuntimeError as error:
                print(f"skipping the AVX-512 rows of CTranslate2: {error}", file=sys.stderr)
        ct2_settings = [setting for _, settings in workers for setting in settings]
        for (worker, settings), quantization in itertools.product(workers, ("float32", "int8")):
            for suffix, *_ in settings:
                for beams, mode in ((1, "greedy"), (4, "beam4")):
                    systems[f"ct2-{quantization}{suffix} {mode}"] = worker.runner(quantization, suffix, beams)
                    if quantization == "float32":
                        hf = systems[f"ours {mode}"]()[:, 1:].tolist()
                        got = worker.request(quantization=quantization, suffix=suffix, beams=beams, tokens=True)
                        got = [[tokens.index(t) for t in row] for row in got["tokens"]]
                        ct2_match[f"{suffix.strip() or '2x1'} {mode}"] = sum(g == h for g, h in zip(got, hf))

    print(f"CPU: {cpu_model()}; torch {torch.__version__}, {args.threads} threads; {SENTENCES} sentences x "
          f"{SOURCE_TOKENS} tokens, "
          f"{NEW_TOKENS} new tokens; {args.repetitions} repetitions", file=sys.stderr)
    for system in systems.values():  # warm-up
        system()
    results = measure(systems, args.repetitions, args.idle_threshold, args.max_wait, args.max_redo,
                      log=lambda m: print(m, file=sys.stderr))

    def rate(name):
        return [SENTENCES / s for s in results[name].seconds]

    print()
    print(f"CPU: {cpu_model()}")
    print("| system | mode | sent/s (median) | min–max | vs Marian | disturbed reps |")
    print("|---|---|---|---|---|---|")
    for mode in ("greedy", "beam4"):
        base = SENTENCES / results[f"marian {mode}"].median()
        for prefix in ("marian", "ours, transformers loop", "ours", *(f"ct2-{q}{suffix}" for q in ("float32", "int8")
                                                                      for suffix, *_ in ct2_settings)):
            name = f"{prefix} {mode}"
            if name not in results:
                continue
            median = SENTENCES / results[name].median()
            print(f"| {prefix} | {mode} | {median:.1f} | {fmt_range(rate(name))} | {median / base:.2f}x | "
                  f"{results[name].disturbed}/{len(results[name].seconds)} |")
    print()
    print(f"ours == ours with transformers' loop == Marian, token for token: greedy {identical['greedy']}, "
          f"beam 4 {identical['beam4']}")
    if ct2_match:
        print("CTranslate2 fp32 == ours (sentences of " + str(SENTENCES) + "): "
              + ", ".join(f"{k} {v}" for k, v in ct2_match.items()))
    disturbed = sum(t.disturbed for t in results.values())
    if disturbed:
        print(f"WARNING: {disturbed} timed runs were disturbed by other processes even after redoing; "
              "treat the figures as rough")
    print("targets: ours beam4 >= 1.5x Marian; CT2 >= 2.3x Marian (fp32), >= 2.8x (int8)")
    for worker, _ in workers:
        worker.close()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
