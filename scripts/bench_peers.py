"""Training speed (and, with --race, BLEU after equal minutes) against the toolkits people train translation models
with: fairseq 0.12.2, OpenNMT-py 3.5.1, eole 0.6.4 and sockeye 3.1.34, each in a virtual environment of its own.

    python scripts/bench_peers.py --install            # the peers' environments (several GB), once
    python scripts/bench_peers.py                      # 100 updates each, 3 rounds, systems alternated, both mallocs
    python scripts/bench_peers.py --updates 30 --rounds 1 --systems ours fairseq --malloc keep
    python scripts/bench_peers.py --race 15            # each trains 15 minutes, then translates test2016 (beam 5)

One subword model for the peers: a joint sentencepiece BPE of 10,000 pieces learned on Multi30k train (both sides);
each peer gets the same pieces (binarized or listed the way it reads them). `vaswani-mt train --config
multi30k-en-de` learns its own joint BPE of 10,000 tokens on the same data (it has ~4 % fewer tokens per sentence).

The same model and recipe everywhere: d_model 128, 4+4 layers, 4 heads, FFN 256, dropout 0.2, shared embeddings,
sinusoidal positions, post-norm where the toolkit has it (OpenNMT-py is pre-norm only, eole's decoder too: its
encoder is set to post-norm; sockeye is set to post-norm), label smoothing 0.1, Adam (0.9, 0.98), the Noam /
inverse-square-root schedule with 800 warm-up updates and a peak rate of 2e-3 (ours: `noam_factor 0.64`; each
toolkit's option set so that its own schedule code peaks there: tests/test_bench_peers.py runs it), float32, no
validation while timing. Each system's batch flag is set so that its *measured* target tokens per update
(non-padding, EOS included) come within 5 % of ours (`--batch-*` options to tune; the table prints the measured
figure and flags a miss). Two more systems run each toolkit as it ships for this shape where that differs:
`eole-default` (its encoder pre-norm, as its decoder) and `sockeye-default` (pre-norm, with a warm-up of
`--sockeye-default-warmup` updates to the same peak, one it finishes within a race); fairseq's `transformer` is
post-norm and OpenNMT-py pre-norm as they ship, so their equal-settings runs are their defaults too.

The same process settings for every system: 2 threads (OMP_NUM_THREADS, MKL_NUM_THREADS; ours also
`training.num_threads`), GOMP_SPINCOUNT=10000 (what vaswani_mt sets by itself), and glibc's malloc either as it
comes or keeping freed memory (`--malloc`): `keep` is what `vaswani-mt train` sets on a CPU
(`vaswani_mt.recipe.host_memory`), given to every process as glibc's MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ (ours sets the same values with mallopt); `default` leaves glibc's defaults to every process,
ours included (`OURS_WITHOUT_MALLOC_SETTING` keeps it from setting them); `both` runs every system both ways
(the default of the speed mode; the race's is `keep`). Ours' log says which it had, and the script checks it.

Speed: every system trains `--updates` updates per round, alone (the script waits for other processes to go quiet
before each run and flags a run they disturbed), in the same order each round. Its target tokens/s is the median over
its logged intervals after the first, over all rounds, read from its own log:
  ours       `target tok/s` on the `train: step` lines (train.log); per update from the rate and the time between
             two such lines
  fairseq    `wps` on the train_inner lines (target tokens/s); `wpb` target tokens per update
  OpenNMT-py, eole  the target half of `A/B tok/s` on the Step lines; target tokens per update: the T of their
             `bsz: S/T/N` field (the interval's non-padding target tokens over its batches, one batch per update)
  sockeye    `s/sec` (sentences) on its speed lines x the target tokens per sentence of the training data (its
             `tok/sec` counts padded source tokens); per update: sentences / updates at its checkpoint line
Ours ÷ each toolkit is taken between runs with the same malloc setting. Not in the test suite (it trains the models);
tests/test_bench_peers.py covers the log parsing, the tables, the settings and the schedules.

--race MINUTES: every system trains MINUTES of training time in one run of the script (ours from the checkout it
runs in: the table gives its commit), each stopping itself at the deadline and saving its model there: ours through
`training.max_minutes`, fairseq `--stop-time-hours`, OpenNMT-py and eole when their training loop's batches end
(`RACE_STOP`: they end MINUTES after the first; the toolkit then saves its final checkpoint), sockeye at its
`max_updates` check (`RACE_STOP`: set to the update reached at the deadline; it then saves a checkpoint). Each is
scored from that checkpoint: test2016 translated with its own beam search (beam 5, its default length
normalisation), the output detokenized (sentencepiece decoding; ours: its tokenizer) and scored with sacreBLEU
against the raw references. The table gives the update each system was scored at, read from the checkpoint it
saved, and its last logged update.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import (CPU_FLAGS, MULTI30K, LoadMonitor, cpu_flags, cpu_model, model_flops,  # noqa: E402
                              wait_for_idle)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path(os.environ.get("VASWANI_MT_PEERS_CACHE", Path.home() / ".cache" / "vaswani_mt" / "peers"))
SYSTEMS = ("ours", "fairseq", "opennmt-py", "eole", "eole-default", "sockeye", "sockeye-default")
SPEED_SYSTEMS = ("ours", "fairseq", "opennmt-py", "eole", "sockeye")  # the defaults' speed is their equal run's
# The toolkit (and environment) of each system; `-default`: the toolkit with its own defaults for this shape.
TOOLKIT = {system: system.removesuffix("-default") for system in SYSTEMS}
VOCAB = 10000


class BenchError(Exception):
    """A problem the user can fix; main() prints it as one line and exits non-zero."""


# -- installing ------------------------------------------------------------------------------------------------------
@dataclass
class Install:
    """One peer's environment: what pip installs, in order (each list one pip call)."""

    version: str
    steps: list[list[str]]
    check: str  # a command of the venv that must run once installed


INSTALLS = {
    # fairseq's own pins (hydra-core<1.1, omegaconf<2.1) fail on Python 3.11: its other requirements first, then
    # fairseq itself without dependencies; then patch_fairseq(). Its build environment (pip's default, isolated)
    # has no torch, so the torch C++ extensions are left out: the sdist lacks one of their sources
    # (clib/libbase/balanced_assignment.cpp), and training and beam search need none of them.
    "fairseq": Install("0.12.2", [
        ["torch==2.13.0", "numpy", "hydra-core==1.3.2", "omegaconf==2.3.0", "cython", "regex", "sacrebleu>=1.4.12",
         "bitarray", "tqdm", "cffi", "setuptools<81", "wheel", "sentencepiece"],
        ["--no-deps", "fairseq==0.12.2"],
    ], "fairseq-train --help"),
    # torch<2.3 is the CUDA build on PyPI (it runs on the CPU); numpy 2 breaks it ("Numpy is not available").
    "opennmt-py": Install("3.5.1", [["torch==2.2.2", "numpy==1.26.4", "OpenNMT-py==3.5.1"]], "onmt_train --help"),
    # the `eole` command imports aiohttp, which eole does not declare.
    "eole": Install("0.6.4", [["torch==2.13.0", "eole==0.6.4", "aiohttp"]], "eole train --help"),
    # pins torch<1.14 (the CUDA build of 1.13.1 on PyPI) and numpy<2.
    "sockeye": Install("3.1.34", [["sockeye==3.1.34", "numpy==1.26.4"]], "sockeye-train --help"),
    # sentencepiece and sacreBLEU for the shared subword model and the race's scores.
    "tools": Install("", [["sentencepiece", "sacrebleu"]], "python -c 'import sentencepiece, sacrebleu'"),
}


def venv_of(cache: Path, name: str) -> Path:
    return cache / "venvs" / name


def venv_bin(cache: Path, name: str, command: str) -> str:
    return str(venv_of(cache, name) / "bin" / command)


def run_logged(command: list[str], log: Path, env: dict | None = None, what: str = "") -> None:
    """Run `command`, appending its output to `log`; BenchError with the log's last lines when it fails."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise BenchError(f"{what or command[0]} failed (exit {result.returncode}; {log}): {tail}")


def install(cache: Path, names: list[str]) -> None:
    (cache / "logs").mkdir(parents=True, exist_ok=True)
    for name in ["tools", *names]:
        spec, venv = INSTALLS[name], venv_of(cache, name)
        log = cache / "logs" / f"install-{name}.log"
        print(f"installing {' '.join(filter(None, (name, spec.version)))} into {venv} (log: {log})", file=sys.stderr)
        if not (venv / "bin" / "python").exists():
            run_logged([sys.executable, "-m", "venv", str(venv)], log, what=f"creating the venv of {name}")
            run_logged([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "pip"], log,
                       what=f"upgrading pip in {name}'s venv")
        for packages in spec.steps:
            run_logged([str(venv / "bin" / "python"), "-m", "pip", "install", *packages], log,
                       what=f"pip install for {name}")
        if name == "fairseq":
            changed = patch_fairseq(site_packages(venv) / "fairseq")
            print(f"  fairseq: {changed} dataclass defaults now use default_factory", file=sys.stderr)
        check = spec.check.split(" ", 1)
        run_logged(["bash", "-c", f"{venv / 'bin' / check[0]} {check[1]} > /dev/null"], log,
                   what=f"checking {name} ({spec.check})")
    print(f"installed; {describe_installs(cache)}", file=sys.stderr)


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise BenchError(f"{venv} has no lib/python3*/site-packages: run --install")
    return found[0]


# -- fairseq 0.12.2 on Python 3.11 ------------------------------------------------------------------------------------
def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass")


def _instance_default(value: ast.expr | None, classes: set[str]) -> bool:
    """`SomeConfig()` / `SomeConfig(x=1)` / `module.SomeConfig()` where SomeConfig is one of `classes`."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in classes


def dataclass_names(source: str) -> set[str]:
    """The names of the classes a module defines under @dataclass."""
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and any(map(_is_dataclass_decorator, node.decorator_list))}


def _factory(source: str, call: ast.Call) -> str:
    """`default_factory=C` for `C()`, `default_factory=lambda: C(x=1)` for a call with arguments."""
    if not call.args and not call.keywords:
        return f"default_factory={ast.get_source_segment(source, call.func)}"
    return f"default_factory=lambda: {ast.get_source_segment(source, call)}"


def rewrite_dataclass_defaults(source: str, classes: set[str]) -> tuple[str, int]:
    """The module's text with every dataclass field whose default is an instance of a dataclass among `classes`
    (`x: C = C()`, `x: C = field(default=C())`: Python 3.11 refuses an unhashable default as mutable) written as
    `x: C = field(default_factory=C)` (a call with arguments: a lambda), and
    `field` imported from dataclasses if the module lacks it. Returns (text, fields changed); running it again on its
    own output changes nothing."""
    tree = ast.parse(source)
    edits = []  # (start line, start col, end line, end col, replacement)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or not any(map(_is_dataclass_decorator, node.decorator_list)):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.AnnAssign) or statement.value is None:
                continue
            value = statement.value
            if _instance_default(value, classes):  # x: C = C()
                edits.append((value.lineno, value.col_offset, value.end_lineno, value.end_col_offset,
                              f"field({_factory(source, value)})"))
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
                for keyword in value.keywords:  # x: C = field(default=C())
                    if keyword.arg == "default" and _instance_default(keyword.value, classes):
                        edits.append((keyword.lineno, keyword.col_offset, keyword.end_lineno, keyword.end_col_offset,
                                      _factory(source, keyword.value)))
    if not edits:
        return source, 0
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def position(line: int, col: int) -> int:  # ast columns are UTF-8 byte offsets
        return offsets[line - 1] + len(lines[line - 1].encode()[:col].decode())

    text = source
    for start_line, start_col, end_line, end_col, replacement in sorted(edits, reverse=True):
        text = text[:position(start_line, start_col)] + replacement + text[position(end_line, end_col):]
    imports_field = any(isinstance(n, ast.ImportFrom) and n.module == "dataclasses" and
                        any(a.name == "field" and a.asname is None for a in n.names) for n in tree.body)
    if not imports_field:
        after = 0  # the import goes after the docstring and `from __future__` imports
        for statement in tree.body:
            docstring = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            future = isinstance(statement, ast.ImportFrom) and statement.module == "__future__"
            if not (docstring or future):
                break
            after = statement.end_lineno
        lines = text.splitlines(keepends=True)
        lines.insert(after, "from dataclasses import field\n")
        text = "".join(lines)
    return text, len(edits)


# `Config.__dataclass_fields__[k].default` (fairseq/dataclass/initialize.py hands it to hydra): MISSING once the
# field has a default_factory, so it becomes the factory's product where there is one.
FIELD_DEFAULT = re.compile(r"(\w+)\.__dataclass_fields__\[(\w+)\]\.default(?!_)")
FIELD_DEFAULT_FIX = (r"(lambda f: f.default_factory() if callable(f.default_factory) else f.default)"
                     r"(\1.__dataclass_fields__[\2])")


def patch_fairseq(package: Path) -> int:
    """Rewrite fairseq's dataclass defaults for Python 3.11 (`rewrite_dataclass_defaults`) in every module of the
    installed package, and the reads of a field's `.default` (`FIELD_DEFAULT`); idempotent. Returns the number of
    changes."""
    if not (package / "__init__.py").is_file():
        raise BenchError(f"no fairseq package at {package}")
    sources = {path: path.read_text(encoding="utf-8") for path in sorted(package.rglob("*.py"))}
    sources = {path: source for path, source in sources.items() if "dataclass" in source}
    classes = set().union(*map(dataclass_names, sources.values()))
    changed = 0
    for path, source in sources.items():
        text, count = rewrite_dataclass_defaults(source, classes)
        text, reads = FIELD_DEFAULT.subn(FIELD_DEFAULT_FIX, text)
        count += reads
        if count:
            path.write_text(text, encoding="utf-8")
            changed += count
    return changed


def describe_installs(cache: Path) -> str:
    return ", ".join(f"{name} {'ready' if (venv_of(cache, name) / 'bin' / 'python').exists() else 'missing'}"
                     for name in INSTALLS)


def python_of(cache: Path, name: str) -> str:
    python = venv_of(cache, name) / "bin" / "python"
    if not python.exists():
        raise BenchError(f"{name} is not installed in {venv_of(cache, name)}: run with --install first")
    return str(python)


# -- the shared data ---------------------------------------------------------------------------------------------------
SPLITS = ("train", "valid", "test2016")
PREPARE_SUBWORDS = r"""
import json, sys, collections, sentencepiece as spm
raw, root, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
spm.SentencePieceTrainer.train(input=f"{raw}/train.en,{raw}/train.de", model_prefix=f"{root}/spm", vocab_size=vocab,
                               model_type="bpe", character_coverage=1.0, num_threads=2, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=f"{root}/spm.model")
counts, stats = collections.Counter(), {}
for split in ("train", "valid", "test2016"):
    for lang in ("en", "de"):
        with open(f"{raw}/{split}.{lang}", encoding="utf-8") as f:
            lines = f.read().rstrip("\n").split("\n")
        pieces = [sp.encode(line, out_type=str) for line in lines]
        with open(f"{root}/sp/{split}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(" ".join(p) + "\n" for p in pieces)
        if split == "train":
            counts.update(piece for p in pieces for piece in p)
            stats[f"tokens_per_sentence_{lang}"] = sum(map(len, pieces)) / len(pieces) + 1  # and EOS
with open(f"{root}/vocab.txt", "w", encoding="utf-8") as f:  # piece<TAB>count, most frequent first
    f.writelines(f"{piece}\t{count}\n" for piece, count in counts.most_common())
json.dump(stats, open(f"{root}/stats.json", "w"))
"""
DECODE_AND_SCORE = r"""
import json, sys, sacrebleu, sentencepiece as spm
model, hypotheses, references, pieces = sys.argv[1:5]
sp = spm.SentencePieceProcessor(model_file=model)
with open(hypotheses, encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
if pieces == "pieces":
    lines = [sp.decode_pieces(line.split()) for line in lines]
    with open(hypotheses + ".detok", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
with open(references, encoding="utf-8") as f:
    refs = f.read().rstrip("\n").split("\n")
if len(lines) != len(refs):
    sys.exit(f"{hypotheses}: {len(lines)} translations for {len(refs)} references")
metric = sacrebleu.BLEU()
bleu = metric.corpus_score(lines, [refs])
print(json.dumps({"bleu": bleu.score, "signature": str(metric.get_signature())}))
"""


@dataclass
class Data:
    raw: Path  # the Multi30k folder: {train,valid,test2016}.{en,de}
    root: Path  # what this script made of it

    @property
    def pieces(self) -> Path:
        return self.root / "sp"

    @property
    def fairseq_bin(self) -> Path:
        return self.root / "fairseq-bin"

    def target_tokens_per_sentence(self) -> float:
        return self.tokens_per_sentence("de")

    def tokens_per_sentence(self, lang: str) -> float:
        import json

        return json.loads((self.root / "stats.json").read_text())[f"tokens_per_sentence_{lang}"]


def matmul_rate(size: int = 2048, repetitions: int = 5) -> float:
    """This CPU's float32 matrix-product rate in GFLOP/s on THREADS threads: torch.mm of two size x size matrices,
    the median of `repetitions` after a warm-up."""
    import torch

    torch.set_num_threads(THREADS)
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    seconds = []
    for _ in range(repetitions):
        started = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(seconds) / 1e9


def share_of_the_cpu(data: Data, ours_rate: float, args) -> str:
    """Ours' model FLOPs per second against the CPU's own float32 matrix-product rate: FLOPs per target token from
    `model_flops` at the training data's mean source and target lengths (the shared subword model's, and EOS)."""
    from vaswani_mt import VaswaniConfig

    config = VaswaniConfig.from_preset("mini", vocab_size=VOCAB)
    source, target = data.tokens_per_sentence("en"), data.tokens_per_sentence("de")
    per_token = model_flops(config, 1, source, target) / target
    wait_for_idle(args.idle_threshold, args.max_wait)
    cpu = matmul_rate()
    ours = ours_rate * per_token / 1e9
    return (f"float32 matrix products on this CPU: {cpu:.0f} GFLOP/s (torch.mm 2048 x 2048 x 2048, {THREADS} threads, "
            f"median of 5); ours: {ours:.0f} GFLOP/s of model FLOPs ({per_token / 1e6:.1f} MFLOP per target token at "
            f"{source:.1f} source and {target:.1f} target tokens per sentence) = {100 * ours / cpu:.0f} % of it")


def prepare(cache: Path, raw: Path, systems: list[str]) -> Data:
    """The shared sentencepiece model, the pieces of every split, and fairseq's binarized copy; made once."""
    for split in SPLITS:
        for lang in ("en", "de"):
            if not (raw / f"{split}.{lang}").is_file():
                raise BenchError(f"no {split}.{lang} in {raw} (--data expects Multi30k's {{train,valid,test2016}}"
                                 ".{en,de})")
    data = Data(raw, cache / "data" / f"{raw.name}-spm{VOCAB // 1000}k")
    log = cache / "logs" / "prepare.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if not (data.root / "stats.json").is_file():
        print(f"learning the shared subword model ({VOCAB} pieces) into {data.root}", file=sys.stderr)
        data.pieces.mkdir(parents=True, exist_ok=True)
        run_logged([python_of(cache, "tools"), "-c", PREPARE_SUBWORDS, str(raw), str(data.root), str(VOCAB)], log,
                   what="learning the subword model")
    if "fairseq" in systems and not (data.fairseq_bin / "dict.de.txt").is_file():
        print(f"binarizing for fairseq into {data.fairseq_bin}", file=sys.stderr)
        shutil.rmtree(data.fairseq_bin, ignore_errors=True)
        run_logged([venv_bin(cache, "fairseq", "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
                    "--trainpref", str(data.pieces / "train"), "--validpref", str(data.pieces / "valid"),
                    "--testpref", str(data.pieces / "test2016"), "--destdir", str(data.fairseq_bin),
                    "--joined-dictionary", "--workers", "2"], log, what="fairseq-preprocess")
    return data


# -- one training run per system ---------------------------------------------------------------------------------------
WARMUP, PEAK_LR, NOAM_FACTOR = 800, 2e-3, 0.64  # 0.64 * 128**-0.5 * 800**-0.5 = 2.0e-3
# sockeye's inv-sqrt-decay is base_lr * min(1, t / warmup) / sqrt(max(t, warmup)): its base rate for the same
# peak is PEAK_LR * sqrt(warm-up) (sockeye.lr_scheduler.LearningRateSchedulerInvSqrtDecay; job_sockeye).
# sockeye-default's warm-up: sockeye made 450 updates in a 15-minute race on 2 Zen 4 cores (docs/speed.md), so 800
# was never finished; 200 leaves room on slower CPUs.
SOCKEYE_DEFAULT_WARMUP = 200
THREADS = 2
SPIN_COUNT = "10000"  # GOMP_SPINCOUNT: what vaswani_mt sets by itself (docs/speed.md, "Two runs on one CPU")
MALLOCS = ("keep", "default")
# Each system's batch flag, set so that its measured target tokens per update match ours at max_tokens 4096 (about
# 3,850 with our BPE) within 5 %: fairseq 3,874, OpenNMT-py and eole 3,834, sockeye 3,841 on Multi30k train (the
# flags count different things: padding, source or target, length buckets).
DEFAULT_BATCH = {"ours": 4096, "fairseq": 4860, "opennmt-py": 4670, "eole": 4670, "sockeye": 3800}


@dataclass
class Job:
    system: str
    command: list[str]
    env: dict
    folder: Path
    start_pattern: str  # a log line that says training has begun (the race's safety stop counts from there)
    config: str | None = None  # a YAML config the command reads, written to folder/config.yaml
    malloc: str = "keep"


def malloc_env(malloc: str) -> dict:
    """glibc's environment for `malloc`: "keep", the thresholds `vaswani-mt train` sets with mallopt on a CPU
    (vaswani_mt.recipe.host_memory); "default", none (glibc's own)."""
    if malloc == "default":
        return {}
    from vaswani_mt.recipe.host_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


def peer_env(malloc: str = "keep", extra: dict | None = None) -> dict:
    """The environment of every system's process: the same threads, OpenMP spin count and malloc settings."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "GLIBC_TUNABLES") and not name.startswith("MALLOC_")}
    env.update({"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS), "GOMP_SPINCOUNT": SPIN_COUNT,
                "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1", **malloc_env(malloc)})
    return {**env, **(extra or {})}


# `vaswani-mt train` with glibc's malloc as it comes (`--malloc default`): its call of mallopt does nothing.
OURS_WITHOUT_MALLOC_SETTING = r"""
import sys
from vaswani_mt.recipe import host_memory
if not hasattr(host_memory, "set_malloc_thresholds"):
    sys.exit("bench_peers.py: vaswani_mt.recipe.host_memory has no set_malloc_thresholds to leave out")
host_memory.set_malloc_thresholds = lambda *thresholds: False
from vaswani_mt.cli import main
sys.argv[0] = "vaswani-mt"
sys.exit(main(sys.argv[1:]))
"""
OURS_KEEPS_MEMORY = "malloc keeps freed memory"  # in ours' log when mallopt took the setting (recipe/run.py)


def job_ours(data: Data, folder: Path, batch: int, updates: int | None, minutes: float | None,
             extra: list[str], malloc: str = "keep") -> Job:
    overrides = {
        "data.path": str(data.raw), "training.precision": "fp32", "training.num_threads": THREADS,
        "training.max_tokens": batch, "training.budget_minutes": "null", "training.warmup_steps": WARMUP,
        "training.noam_factor": NOAM_FACTOR, "training.cooldown_steps": 0, "training.label_smoothing": 0.1,
        "training.logging_steps": 10, "training.average_last": 0, "training.average_every": "null",
        "training.keep_checkpoints": 1,
        "training.eval_steps": 10 ** 7, "data.valid_subset": 100, "data.test_split": "null",
        "model.config.dropout": 0.2,
    }
    if updates:
        overrides["training.max_steps"] = updates
        overrides["data.valid_subset"] = 8  # the validation at the end is not timed
    else:
        overrides["training.max_minutes"] = minutes
    command = ([sys.executable, "-m", "vaswani_mt.cli"] if malloc == "keep"
               else [sys.executable, "-c", OURS_WITHOUT_MALLOC_SETTING])
    command += ["train", "--config", "multi30k-en-de", "--output-dir", str(folder / "run")]
    for key, value in overrides.items():
        command += [f"--{key}", str(value)]
    env = peer_env(malloc, {"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"})
    return Job("ours", command + extra, env, folder, r"train: \d+ updates? to go", malloc=malloc)


def job_fairseq(cache: Path, data: Data, folder: Path, batch: int, updates: int | None,
                minutes: float | None, malloc: str = "keep") -> Job:
    shape = []
    for side in ("encoder", "decoder"):
        shape += [f"--{side}-embed-dim", "128", f"--{side}-ffn-embed-dim", "256", f"--{side}-layers", "4",
                  f"--{side}-attention-heads", "4"]
    command = [venv_bin(cache, "fairseq", "fairseq-train"), str(data.fairseq_bin), "--task", "translation",
               "--source-lang", "en", "--target-lang", "de", "--arch", "transformer", *shape,
               "--share-all-embeddings", "--dropout", "0.2", "--criterion", "label_smoothed_cross_entropy",
               "--label-smoothing", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
               "--lr", str(PEAK_LR), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(WARMUP),
               "--warmup-init-lr", "1e-7", "--max-tokens", str(batch), "--cpu", "--seed", "1", "--num-workers", "0",
               "--log-format", "simple", "--log-interval", "10", "--disable-validation",
               "--save-dir", str(folder / "checkpoints"), "--no-epoch-checkpoints"]
    if updates:
        command += ["--max-update", str(updates), "--no-save"]
    else:  # it saves checkpoint_last.pt where it stops (and at the end of each epoch, as it does by default)
        command += ["--stop-time-hours", f"{minutes / 60:.6f}"]
    return Job("fairseq", command, peer_env(malloc), folder, r"Start iterating over samples", malloc=malloc)


def onmt_config(data: Data, folder: Path, batch: int, updates: int, save_every: int, eole: bool,
                as_shipped: bool = False) -> str:
    """The YAML config of OpenNMT-py (eole: its successor's layout) for the shared shape and recipe; `as_shipped`:
    eole's encoder pre-norm, as it ships (the equal-settings run sets it to post-norm)."""
    import json

    vocab = str(data.root / "vocab.txt")
    corpus = {"corpus_1": {"path_src": str(data.pieces / "train.en"), "path_tgt": str(data.pieces / "train.de")},
              "valid": {"path_src": str(data.pieces / "valid.en"), "path_tgt": str(data.pieces / "valid.de")}}
    common = {"src_vocab": vocab, "tgt_vocab": vocab, "share_vocab": True, "src_vocab_size": VOCAB + 10,
              "tgt_vocab_size": VOCAB + 10, "data": corpus, "seed": 1, "report_every": 10, "overwrite": True}
    training = {"train_steps": updates, "valid_steps": 10 ** 7, "save_checkpoint_steps": save_every,
                "keep_checkpoint": 2, "batch_type": "tokens", "batch_size": batch, "accum_count": [1],
                "normalization": "tokens", "optim": "adam", "adam_beta1": 0.9, "adam_beta2": 0.98,
                "learning_rate": NOAM_FACTOR, "decay_method": "noam", "warmup_steps": WARMUP,
                "label_smoothing": 0.1, "dropout": [0.2], "attention_dropout": [0.0], "max_grad_norm": 0,
                "param_init_glorot": True, "param_init": 0.0, "num_workers": 0, "bucket_size": 32768}
    if not eole:
        model = {"encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": 4, "dec_layers": 4,
                 "hidden_size": 128, "word_vec_size": 128, "transformer_ff": 256, "heads": 4,
                 "position_encoding": True, "share_embeddings": True, "share_decoder_embeddings": True,
                 "save_model": str(folder / "model"), "model_dtype": "fp32"}
        return json.dumps({**common, **training, **model}, indent=1)
    training.pop("param_init_glorot"), training.pop("param_init")
    training.update(param_init_method="xavier_uniform", model_path=str(folder / "model"), compute_dtype="fp32")
    model = {"architecture": "transformer", "hidden_size": 128, "layers": 4, "heads": 4, "transformer_ff": 256,
             "embeddings": {"word_vec_size": 128, "position_encoding_type": "SinusoidalInterleaved"},
             "share_embeddings": True, "share_decoder_embeddings": True, "add_qkvbias": True, "add_ffnbias": True,
             "add_final_linear_bias": True, "layer_norm": "standard"}
    if not as_shipped:
        model["encoder"] = {"encoder_layer_style": "postnorm"}
    return json.dumps({**common, "training": training, "model": model}, indent=1)


# The race's stop (module docstring), run in the toolkit's own interpreter before its command:
#   RACE_STOP MINUTES batches MODULE ENTRY ARGS...  OpenNMT-py, eole: MODULE.Trainer's training loop gets its batches
#       through `_accum_batches`; they end MINUTES after the first, and the toolkit saves its final checkpoint;
#   RACE_STOP MINUTES updates MODULE ENTRY ARGS...  sockeye: after the update that reaches the deadline its
#       `max_updates` is that update, so it makes its checkpoint there and stops.
# ENTRY: the toolkit's command as `module:function` (its console script's), called with ARGS as its argv.
RACE_STOP = r"""
import importlib, sys, time
seconds, how, module, entry = float(sys.argv[1]) * 60, sys.argv[2], sys.argv[3], sys.argv[4]
sys.argv = [entry.split(":")[0]] + sys.argv[5:]
trainers = importlib.import_module(module)
deadline = None
def reached():
    global deadline
    if deadline is None:
        deadline = time.monotonic() + seconds
    return time.monotonic() >= deadline
if how == "batches":
    batches = trainers.Trainer._accum_batches
    def until_the_deadline(self, iterator):
        for item in batches(self, iterator):
            if reached():
                return
            yield item
    trainers.Trainer._accum_batches = until_the_deadline
else:
    import sockeye.constants
    sockeye.constants.MEASURE_SPEED_EVERY = 10
    step = trainers.EarlyStoppingTrainer._step
    def step_until_the_deadline(self, batch):
        if deadline is None:  # the clock starts with the first update
            reached()
        done = step(self, batch)
        if reached():
            self.config.max_updates = self.state.updates
        return done
    trainers.EarlyStoppingTrainer._step = step_until_the_deadline
function = importlib.import_module(entry.split(":")[0])
sys.exit(getattr(function, entry.split(":")[1])())
"""
RACE_ENTRY = {"opennmt-py": ("batches", "onmt.trainer", "onmt.bin.train:main"),
              "eole": ("batches", "eole.trainer", "eole.bin.main:main"),
              "sockeye": ("updates", "sockeye.training", "sockeye.train:main")}


def race_command(cache: Path, system: str, minutes: float, arguments: list[str]) -> list[str]:
    """`system`'s training command stopping itself after `minutes` of training (RACE_STOP)."""
    toolkit = TOOLKIT[system]
    how, module, entry = RACE_ENTRY[toolkit]
    return [python_of(cache, toolkit), "-c", RACE_STOP, f"{minutes:g}", how, module, entry, *arguments]


def job_onmt(cache: Path, data: Data, folder: Path, batch: int, updates: int | None, minutes: float | None,
             system: str, malloc: str = "keep") -> Job:
    eole = TOOLKIT[system] == "eole"
    # speed runs save nothing; a race saves once, where it stops
    config = onmt_config(data, folder, batch, updates or 10 ** 7, 10 ** 7, eole, as_shipped=system == "eole-default")
    arguments = (["train"] if eole else []) + ["-config", str(folder / "config.yaml")]
    if minutes:
        command = race_command(cache, system, minutes, arguments)
    elif eole:
        command = [venv_bin(cache, "eole", "eole"), *arguments]
    else:
        command = [venv_bin(cache, "opennmt-py", "onmt_train"), *arguments]
    return Job(system, command, peer_env(malloc), folder, r"Start training loop", config, malloc=malloc)


def job_sockeye(cache: Path, data: Data, folder: Path, batch: int, updates: int | None, minutes: float | None,
                system: str = "sockeye", malloc: str = "keep", default_warmup: int = SOCKEYE_DEFAULT_WARMUP) -> Job:
    as_shipped = system == "sockeye-default"  # its pre-norm layers, a warm-up it finishes in a race
    warmup = default_warmup if as_shipped else WARMUP
    arguments = ["--source", str(data.pieces / "train.en"), "--target", str(data.pieces / "train.de"),
                 "--validation-source", str(data.pieces / "valid.en"),
                 "--validation-target", str(data.pieces / "valid.de"), "--output", str(folder / "model"),
                 "--overwrite-output", "--shared-vocab", "--weight-tying-type", "src_trg_softmax",
                 "--num-layers", "4:4", "--transformer-model-size", "128", "--num-embed", "128:128",
                 "--transformer-attention-heads", "4", "--transformer-feed-forward-num-hidden", "256",
                 *([] if as_shipped else ["--transformer-preprocess", "", "--transformer-postprocess", "drn"]),
                 "--transformer-dropout-prepost", "0.2", "--transformer-dropout-attention", "0",
                 "--transformer-dropout-act", "0", "--label-smoothing", "0.1", "--optimizer", "adam",
                 "--optimizer-betas", "0.9:0.98", "--optimizer-eps", "1e-9",
                 "--initial-learning-rate", str(PEAK_LR * warmup ** 0.5),
                 "--learning-rate-scheduler-type", "inv-sqrt-decay", "--learning-rate-warmup", str(warmup),
                 "--batch-type", "word", "--batch-size", str(batch), "--max-seq-len", "128", "--use-cpu",
                 "--seed", "1", "--decode-and-evaluate", "0", "--keep-last-params", "2",
                 "--checkpoint-interval", str(10 ** 7)]  # a race makes its checkpoint where it stops
    if updates:
        arguments += ["--max-updates", str(updates)]
    else:
        arguments += ["--max-updates", str(10 ** 7), "--max-num-checkpoint-not-improved", "-1"]
    if minutes:
        command = race_command(cache, system, minutes, arguments)
    else:
        command = [python_of(cache, "sockeye"), "-c", SOCKEYE_TRAIN, *arguments]
    return Job(system, command, peer_env(malloc), folder, r"Training started", malloc=malloc)


# sockeye logs its speed every 50 updates (sockeye.constants.MEASURE_SPEED_EVERY): every 10, as the others.
SOCKEYE_TRAIN = r"""
import sys
import sockeye.constants
sockeye.constants.MEASURE_SPEED_EVERY = 10
from sockeye.train import main
sys.argv[0] = "sockeye-train"
main()
"""


# -- each toolkit's own learning-rate schedule -------------------------------------------------------------------------
# Run in the toolkit's interpreter: its own option parsing of the job's command or config and its own schedule code
# give the rate of each of updates 1..N as its training loop sets it. argv: JSON {"command", "config", "updates"}.
SCHEDULE_PROBES = {
    # fairseq's Trainer: step_update(0) when it builds the scheduler, then step_update(n) after update n.
    "fairseq": r"""
import json, sys, torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.lr_scheduler import build_lr_scheduler
job = json.loads(sys.argv[1])
cfg = convert_namespace_to_omegaconf(
    options.parse_args_and_arch(options.get_training_parser(), input_args=job["command"][1:]))
optimizer = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer)
scheduler.step_update(0)
rates = []
for update in range(1, job["updates"] + 1):
    rates.append(optimizer.get_lr())
    scheduler.step_update(update)
print(json.dumps(rates))
""",
    # OpenNMT-py's own parsing of the config, its Optimizer.from_opt; each step() sets the rate of learning_rate().
    "opennmt-py": r"""
import json, sys, torch
from onmt.opts import train_opts
from onmt.utils.optimizers import Optimizer
from onmt.utils.parse import ArgumentParser
job = json.loads(sys.argv[1])
parser = ArgumentParser(description="train")
train_opts(parser)
opt = parser.parse_args(["-config", job["config"]])
optimizer = Optimizer.from_opt(torch.nn.Linear(1, 1), opt)
rates = []
for update in range(job["updates"]):
    rates.append(optimizer.learning_rate())
    optimizer.step()
print(json.dumps(rates))
""",
    # eole's `train` command's config, its Optimizer.from_config; as OpenNMT-py's.
    "eole": r"""
import argparse, json, sys, torch
from eole.bin.run.train import Train
from eole.utils.optimizers import Optimizer
job = json.loads(sys.argv[1])
parser = argparse.ArgumentParser()
Train.add_args(parser)
config = Train.build_config(parser.parse_args(["-config", job["config"]]))
optimizer = Optimizer.from_config(torch.nn.Linear(1, 1), config)
rates = []
for update in range(job["updates"]):
    rates.append(optimizer.learning_rate())
    optimizer.step()
print(json.dumps(rates))
""",
    # sockeye-train's own arguments and get_lr_scheduler, called as sockeye.train calls it; its trainer steps the
    # scheduler before each update (sockeye.training.EarlyStoppingTrainer._step).
    "sockeye": r"""
import argparse, json, sys, torch
from sockeye import arguments, lr_scheduler
job = json.loads(sys.argv[1])
parser = arguments.ConfigArgumentParser(description="sockeye-train")
arguments.add_train_cli_args(parser)
args = parser.parse_args(job["command"][job["command"].index("--source"):])
scheduler_class, kwargs = lr_scheduler.get_lr_scheduler(
    args.learning_rate_scheduler_type, args.initial_learning_rate, args.learning_rate_reduce_factor,
    args.learning_rate_reduce_num_not_improved, args.learning_rate_warmup, args.max_updates)
optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=args.initial_learning_rate)
scheduler = scheduler_class(optimizer, **kwargs)
rates = []
for update in range(job["updates"]):
    scheduler.step()
    rates.append(optimizer.param_groups[0]["lr"])
print(json.dumps(rates))
""",
}


def learning_rates(cache: Path, job: Job, updates: int) -> list[float]:
    """The rate of each of `updates` updates as the system's own code sets it from the job's command or config (ours:
    `vaswani-mt train`'s config loading and the trainer's `NoamLR`; a toolkit: SCHEDULE_PROBES in its environment)."""
    import json

    if job.system == "ours":
        return ours_learning_rates(job.command, updates)
    config = None
    if job.config is not None:
        job.folder.mkdir(parents=True, exist_ok=True)
        config = str(job.folder / "config.yaml")
        Path(config).write_text(job.config)
    toolkit = TOOLKIT[job.system]
    probe = {"command": job.command, "config": config, "updates": updates}
    done = subprocess.run([python_of(cache, toolkit), "-c", SCHEDULE_PROBES[toolkit], json.dumps(probe)],
                          capture_output=True, text=True, env=peer_env())
    if done.returncode:
        raise BenchError(f"{job.system}'s schedule: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours_learning_rates(command: list[str], updates: int) -> list[float]:
    import torch

    from vaswani_mt import VaswaniConfig
    from vaswani_mt.cli.train import build_parser
    from vaswani_mt.recipe.config import load_run_config, parse_overrides
    from vaswani_mt.recipe.schedule import NoamLR, make_adam

    known, rest = build_parser().parse_known_args(command[command.index("train") + 1:])
    config = load_run_config(known.config, parse_overrides(rest))
    model = VaswaniConfig.from_preset(config.model.preset, **config.model.config)
    optimizer = make_adam([torch.nn.Parameter(torch.zeros(1))])
    scheduler = NoamLR(optimizer, d_model=model.d_model, warmup_steps=config.training.warmup_steps,
                       factor=config.training.noam_factor)
    rates = []
    for _ in range(updates):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


# -- reading the logs --------------------------------------------------------------------------------------------------
@dataclass
class Interval:
    """One logged interval: the update it ended at, target tokens/s over it, target tokens per update in it."""

    update: int
    tokens_per_second: float
    tokens_per_update: float | None


def _number(text: str) -> float:
    return float(text.replace(",", ""))


OURS_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*train: step (\d+)/\d+, .*?([\d,.]+) target tok/s")


def parse_ours(text: str) -> list[Interval]:
    """`train: step 20/100, loss 9.1, lr ..., 3,456 target tok/s, elapsed ...` (vaswani_mt.recipe.progress); the
    tokens per update from the rate and the time between two such lines (their timestamps, to the millisecond)."""
    from datetime import datetime

    intervals, previous = [], None
    for line in text.splitlines():
        if match := OURS_LINE.search(line):
            when = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
            step, rate = int(match[2]), _number(match[3])
            per_update = None
            if previous is not None and step > previous[1]:
                per_update = rate * (when - previous[0]).total_seconds() / (step - previous[1])
            if step > 1:  # the Trainer also logs the first update alone: it starts the first interval
                intervals.append(Interval(step, rate, per_update))
            previous = (when, step)
    return intervals


FAIRSEQ_FIELD = re.compile(r"(\w+)=([-+\d.e]+|None)")


def parse_fairseq(text: str) -> list[Interval]:
    """train_inner lines of `--log-format simple`: `wps` (target tokens/s), `wpb` (target tokens per update)."""
    intervals = []
    for line in text.splitlines():
        if "| train_inner |" in line:
            fields = dict(FAIRSEQ_FIELD.findall(line))
            intervals.append(Interval(int(fields["num_updates"]), float(fields["wps"]), float(fields["wpb"])))
    return intervals


ONMT_LINE = re.compile(r"Step (\d+)/\s*\d+;.*?bsz:\s*(\d+)/\s*(\d+)/\s*(\d+);\s*(\d+)/\s*(\d+) tok/s")


def parse_onmt(text: str) -> list[Interval]:
    """OpenNMT-py's and eole's Step lines: `bsz: S/T/N` (per update: source, target tokens, sentences) and
    `A/B tok/s` (source / target tokens per second)."""
    return [Interval(int(m[1]), float(m[6]), float(m[3])) for m in map(ONMT_LINE.search, text.splitlines()) if m]


SOCKEYE_CHECKPOINT = re.compile(r"Checkpoint \[\d+\]\s+Updates=(\d+) Epoch=\d+ Samples=(\d+)")
SOCKEYE_LINE = re.compile(r"E=\d+ B=(\d+)\s+s/sec=([\d.]+) tok/sec=([\d.]+) u/sec=([\d.]+)")


def parse_sockeye(text: str, target_tokens_per_sentence: float) -> list[Interval]:
    """sockeye's speed lines (`E=0 B=20 s/sec=.. tok/sec=.. u/sec=..`, over the interval since the last one):
    sentences/s x the training data's target tokens per sentence (its `tok/sec` counts padded source tokens);
    sentences per update = sentences/s / updates/s, or where a checkpoint line says `Updates=U Epoch=E Samples=S`,
    S / U (exact). B counts batches: one per update here."""
    intervals = []
    for match in map(SOCKEYE_LINE.search, text.splitlines()):
        if match:
            samples, updates = float(match[2]), float(match[4])
            intervals.append(Interval(int(match[1]), samples * target_tokens_per_sentence,
                                      samples / updates * target_tokens_per_sentence if updates else None))
    if checkpoint := SOCKEYE_CHECKPOINT.findall(text):  # exact counts; u/sec has 2 decimals only
        updates, samples = map(int, checkpoint[-1])
        for interval in intervals:
            interval.tokens_per_update = samples / updates * target_tokens_per_sentence
    return intervals


def parse_log(system: str, text: str, target_tokens_per_sentence: float = 0.0) -> list[Interval]:
    toolkit = TOOLKIT[system]
    if toolkit == "ours":
        return parse_ours(text)
    if toolkit == "fairseq":
        return parse_fairseq(text)
    if toolkit in ("opennmt-py", "eole"):
        return parse_onmt(text)
    return parse_sockeye(text, target_tokens_per_sentence)


# -- the checkpoint each system saved where it stopped -----------------------------------------------------------------
OURS_STOPPED = re.compile(r"training\.max_minutes \([\d.]+\) reached at update (\d+)")
FAIRSEQ_SAVED = re.compile(r"Saved checkpoint (\S+) \(epoch \d+ @ (\d+) updates")
SOCKEYE_CHECKPOINT_NUMBER = re.compile(r"Checkpoint \[(\d+)\]\s+Updates=(\d+)")


@dataclass
class Stop:
    """What a race scores: the model (a checkpoint, or ours' run folder) and the update it was saved at."""

    model: Path
    update: int
    checkpoint: int | None = None  # sockeye's checkpoint number


def stop_checkpoint(system: str, folder: Path, log: str) -> Stop:
    """The model `system` saved where it stopped in `folder` (its training output `log`), and its update: ours, the
    final model of its run (its selection's checkpoint: the one saved at `training.max_minutes`); fairseq,
    checkpoint_last.pt, at the update of its last "Saved checkpoint" line; OpenNMT-py and eole, their newest
    checkpoint, named by its update; sockeye, its newest parameters, whose checkpoint line gives the update."""
    import json

    toolkit = TOOLKIT[system]
    if toolkit == "ours":
        update = None
        if (record := folder / "run" / "metrics.json").is_file():
            selected = (json.loads(record.read_text()).get("selection") or {}).get("best_checkpoint") or ""
            if match := re.search(r"checkpoint-(\d+)", str(selected)):
                update = int(match[1])
        if update is None and (stopped := OURS_STOPPED.findall(log)):
            update = int(stopped[-1])
        if update is None:
            raise BenchError(f"ours: no update of its final model in {folder}")
        return Stop(folder / "run" / "model", update)
    if toolkit == "fairseq":
        saved = FAIRSEQ_SAVED.findall(log)
        if not saved:
            raise BenchError(f"fairseq saved no checkpoint ({folder / 'train.out'})")
        return Stop(folder / "checkpoints" / "checkpoint_last.pt", int(saved[-1][1]))
    if toolkit == "opennmt-py":
        model = latest(folder.glob("model_step_*.pt"), r"model_step_(\d+)\.pt$")
        return Stop(model, int(re.search(r"(\d+)\.pt$", model.name)[1]))
    if toolkit == "eole":
        model = latest((folder / "model").glob("step_*"), r"step_(\d+)$")
        return Stop(model, int(model.name.split("_")[1]))
    params = latest((folder / "model").glob("params.0*"), r"params\.(\d+)$")
    number = int(params.name.split(".")[1])
    updates = {int(n): int(u) for n, u in SOCKEYE_CHECKPOINT_NUMBER.findall(log)}
    if number not in updates:
        raise BenchError(f"sockeye: no checkpoint line for {params} ({folder / 'train.out'})")
    return Stop(params, updates[number], number)


# -- running -----------------------------------------------------------------------------------------------------------
def make_job(system: str, args, data: Data, folder: Path, updates: int | None, minutes: float | None,
             malloc: str = "keep") -> Job:
    toolkit = TOOLKIT[system]
    batch = getattr(args, f"batch_{toolkit.replace('-', '_')}")
    if toolkit == "ours":
        return job_ours(data, folder, batch, updates, minutes, shlex.split(args.ours_override), malloc)
    if toolkit == "fairseq":
        return job_fairseq(args.cache_dir, data, folder, batch, updates, minutes, malloc)
    if toolkit in ("opennmt-py", "eole"):
        return job_onmt(args.cache_dir, data, folder, batch, updates, minutes, system, malloc)
    return job_sockeye(args.cache_dir, data, folder, batch, updates, minutes, system, malloc,
                       args.sockeye_default_warmup)


def run_job(job: Job, deadline_minutes: float | None = None) -> tuple[int, str]:
    """Run a job in its folder, its output in folder/train.out. With `deadline_minutes` (a race, where every system
    stops itself at the deadline and saves): stopped (SIGTERM, then SIGKILL) only if it still runs RACE_MARGIN
    minutes after the deadline, counted from when its log says training began. Returns (exit status, log text)."""
    shutil.rmtree(job.folder, ignore_errors=True)
    job.folder.mkdir(parents=True)
    if job.config is not None:
        (job.folder / "config.yaml").write_text(job.config)
    out = job.folder / "train.out"
    with open(out, "w") as log:
        log.write("$ " + " ".join(job.command) + "\n")
        log.flush()
        process = subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT, env=job.env, cwd=REPO,
                                   start_new_session=True)
        started, began = time.monotonic(), None
        pattern = re.compile(job.start_pattern)
        while process.poll() is None:
            time.sleep(1.0)
            if deadline_minutes is None:
                continue
            if began is None and (pattern.search(out.read_text(errors="replace"))
                                  or time.monotonic() - started > 300):
                began = time.monotonic()
            if began is not None and time.monotonic() - began > (deadline_minutes + RACE_MARGIN) * 60:
                print(f"  {job.system}: still running {RACE_MARGIN} minutes after its deadline: stopped",
                      file=sys.stderr)
                stop(process)
    return process.returncode, out.read_text(errors="replace")


RACE_MARGIN = 10  # minutes after the deadline before a system that did not stop itself is stopped


def stop(process: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


@dataclass
class Result:
    system: str
    malloc: str = "keep"
    intervals: list[Interval] = field(default_factory=list)  # after each run's first
    runs: int = 0
    disturbed: int = 0

    def rate(self) -> float:
        return statistics.median(i.tokens_per_second for i in self.intervals)

    def per_update(self) -> float | None:
        values = [i.tokens_per_update for i in self.intervals if i.tokens_per_update]
        return statistics.median(values) if values else None


def check_ours_malloc(job: Job, text: str) -> None:
    """Ours' log says whether malloc keeps freed memory: it must be what the job asked for."""
    if job.system == "ours" and (OURS_KEEPS_MEMORY in text) != (job.malloc == "keep"):
        raise BenchError(f"ours ran with malloc {'keeping' if job.malloc == 'default' else 'not keeping'} freed "
                         f"memory, asked for {job.malloc!r} ({job.folder / 'train.out'})")


def speed(args, data: Data) -> dict[tuple[str, str], Result]:
    """Every system, `--rounds` times, in turn; each system with each of the malloc settings one after the other."""
    results = {(system, malloc): Result(system, malloc) for system in args.systems for malloc in args.mallocs}
    target_per_sentence = data.target_tokens_per_sentence()
    monitor = LoadMonitor()
    for round_ in range(args.rounds):
        for system in args.systems:
            for malloc in args.mallocs:
                for attempt in range(args.max_redo + 1):
                    load_before = wait_for_idle(args.idle_threshold, args.max_wait)
                    job = make_job(system, args, data, args.work_dir / "speed" / malloc / system, args.updates, None,
                                   malloc)
                    monitor.start()
                    status, text = run_job(job)
                    load = monitor.other_cores()
                    if status:
                        tail = " | ".join(text.strip().splitlines()[-3:])
                        raise BenchError(f"{system} failed (exit {status}; {job.folder / 'train.out'}): {tail}")
                    check_ours_malloc(job, text)
                    intervals = parse_log(system, text, target_per_sentence)
                    if len(intervals) < 2:
                        raise BenchError(f"{system}: {len(intervals)} logged intervals in "
                                         f"{job.folder / 'train.out'}; need 2 or more (more --updates)")
                    quiet = load < args.idle_threshold and load_before < args.idle_threshold
                    if quiet or attempt == args.max_redo:
                        break
                result = results[system, malloc]
                result.intervals += intervals[1:]
                result.runs += 1
                result.disturbed += not quiet
                rates = [i.tokens_per_second for i in intervals[1:]]
                print(f"  round {round_ + 1}/{args.rounds} {system:<15} malloc {malloc:<7} median "
                      f"{statistics.median(rates):8,.0f} target tok/s over {len(rates)} intervals, other load "
                      f"{load:.2f} cores{'' if quiet else ' (disturbed)'}", file=sys.stderr)
    return results


def versions(cache: Path, systems: list[str]) -> dict[str, tuple[str, str]]:
    """(toolkit version, torch version) per system, from its own environment; ours: its version and commit."""
    found = {}
    for toolkit in dict.fromkeys(TOOLKIT[system] for system in systems):
        python = sys.executable if toolkit == "ours" else python_of(cache, toolkit)
        module = {"ours": "vaswani_mt", "opennmt-py": "onmt"}.get(toolkit, toolkit)
        code = (f"import importlib.metadata as m, torch\ntry:\n import {module} as x; v = getattr(x, '__version__', '')"
                f"\nexcept Exception: v = ''\nprint(v or m.version({toolkit!r}), torch.__version__)")
        env = peer_env("default", {"PYTHONPATH": str(REPO)} if toolkit == "ours" else None)
        result = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
        words = result.stdout.split()
        found[toolkit] = (words[0], words[1]) if result.returncode == 0 and len(words) == 2 else ("?", "?")
    if "ours" in found:
        found["ours"] = (f"{found['ours'][0]} {commit()}".strip(), found["ours"][1])
    return {system: found[TOOLKIT[system]] for system in systems}


def commit() -> str:
    """The checkout's commit, and whether files differ from it (ours runs from the checkout)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                             cwd=REPO)
    if head.returncode:
        return ""
    return head.stdout.strip() + (" with uncommitted changes" if changed.stdout.strip() else "")


def cpu_line() -> str:
    flags = cpu_flags()
    shown = " ".join(f"{flag}{'+' if flag in flags else '-'}" for flag in CPU_FLAGS)
    return f"CPU {cpu_model()}, {os.cpu_count()} cores ({shown}); {THREADS} threads, float32"


def settings_line(mallocs) -> str:
    """The process settings every system ran with."""
    described = {"keep": "malloc keeps freed memory (" + " ".join(f"{k}={v}" for k, v in malloc_env("keep").items())
                         + "; ours also by mallopt)",
                 "default": "glibc's malloc as it comes (no MALLOC_* variables; ours' mallopt left out)"}
    return (f"every system: OMP_NUM_THREADS={THREADS} MKL_NUM_THREADS={THREADS} GOMP_SPINCOUNT={SPIN_COUNT}; "
            + " / ".join(described[m] for m in mallocs))


NAMES = {"ours": "vaswani_mt", "fairseq": "fairseq", "opennmt-py": "OpenNMT-py", "eole": "eole",
         "eole-default": "eole, as shipped", "sockeye": "sockeye", "sockeye-default": "sockeye, as shipped"}
# Where each system puts its layer norm (the equal-settings runs: post-norm where the toolkit has it).
LAYERS = {"ours": "post-norm", "fairseq": "post-norm (its default)", "opennmt-py": "pre-norm (its only)",
          "eole": "encoder post-norm, decoder pre-norm (its only)", "eole-default": "pre-norm (its default)",
          "sockeye": "post-norm", "sockeye-default": "pre-norm (its default)"}


def speed_table(args, results: dict[tuple[str, str], Result], found: dict) -> list[str]:
    """One row per system and malloc setting; ours ÷ it between runs with the same setting; then each system's
    speed with malloc keeping freed memory over its speed without, where both ran."""
    lines = ["| system | version | torch | malloc | target tok/s (median) | min–max | target tokens per update | "
             "batch flag | ours ÷ it, same malloc | runs (disturbed) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (system, malloc), result in results.items():
        ours = results.get(("ours", malloc))
        reference = ours.per_update() if ours else None
        rates = [i.tokens_per_second for i in result.intervals]
        per_update = result.per_update()
        off = ""
        if reference and per_update and abs(per_update / reference - 1) > 0.05:
            off = f" ({per_update / reference - 1:+.0%} vs ours)"
        ratio = "–" if system == "ours" or not ours else f"{ours.rate() / result.rate():.2f}×"
        toolkit = TOOLKIT[system]
        lines.append(f"| {NAMES[system]} | {found[system][0]} | {found[system][1]} | {malloc} | {result.rate():,.0f} | "
                     f"{min(rates):,.0f}–{max(rates):,.0f} | {per_update or 0:,.0f}{off} | "
                     f"{BATCH_FLAGS[toolkit]} {getattr(args, 'batch_' + toolkit.replace('-', '_'))} | {ratio} | "
                     f"{result.runs} ({result.disturbed}) |")
    both = [system for system in dict.fromkeys(s for s, _ in results)
            if (system, "keep") in results and (system, "default") in results]
    if both:
        lines += ["", "| system | malloc keeps ÷ glibc's default |", "|---|---|"]
        lines += [f"| {NAMES[system]} | {results[system, 'keep'].rate() / results[system, 'default'].rate():.2f}× |"
                  for system in both]
    return lines


BATCH_FLAGS = {"ours": "training.max_tokens", "fairseq": "--max-tokens", "opennmt-py": "batch_size (tokens)",
               "eole": "batch_size (tokens)", "sockeye": "--batch-size (word)"}


# -- the race: equal minutes, then test2016 with beam 5 ----------------------------------------------------------------
def latest(paths, pattern: str) -> Path:
    """The path whose name's number (the `pattern` group) is largest."""
    numbered = [(int(m[1]), p) for p in paths if (m := re.search(pattern, p.name))]
    if not numbered:
        raise BenchError(f"no checkpoint matching {pattern}")
    return max(numbered)[1]


# fairseq-interactive, without the encoder's "BetterTransformer" path that fairseq 0.12.2 takes for a post-norm model
# loaded from a checkpoint: its call of torch._transformer_encoder_layer_fwd fails on torch 2.x ("Mask Type should be
# defined"). The layers compute the same through their ordinary path.
FAIRSEQ_INTERACTIVE = r"""
import sys
from fairseq.modules import transformer_layer
load = transformer_layer.TransformerEncoderLayerBase._load_from_state_dict
def load_without_fast_path(self, *args, **kwargs):
    load(self, *args, **kwargs)
    self.load_to_BT = False
transformer_layer.TransformerEncoderLayerBase._load_from_state_dict = load_without_fast_path
from fairseq_cli.interactive import cli_main
sys.argv[0] = "fairseq-interactive"
cli_main()
"""


@dataclass
class TestSet:
    raw: Path  # source sentences
    pieces: Path  # the same in the shared sentencepiece pieces
    reference: Path


def test_set(args, data: Data) -> TestSet:
    """test2016, or (--test-lines N) its first N lines, for a quick check of the whole path."""
    full = TestSet(data.raw / "test2016.en", data.pieces / "test2016.en", data.raw / "test2016.de")
    if not args.test_lines:
        return full
    folder = args.work_dir / "race" / f"test2016-first-{args.test_lines}"
    folder.mkdir(parents=True, exist_ok=True)
    part = TestSet(folder / "test2016.en", folder / "test2016.sp.en", folder / "test2016.de")
    for source, target in zip((full.raw, full.pieces, full.reference), (part.raw, part.pieces, part.reference)):
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:args.test_lines]
        target.write_text("".join(lines), encoding="utf-8")
    return part


def translate_command(system: str, args, data: Data, test: TestSet, folder: Path, stopped: Stop,
                      output: Path) -> list[str]:
    """`system`'s own beam search (beam 5) over the test set with the model it saved where it stopped."""
    cache, source, toolkit = args.cache_dir, str(test.pieces), TOOLKIT[system]
    if toolkit == "ours":
        return [sys.executable, "-m", "vaswani_mt.cli", "translate", str(stopped.model), "--input",
                str(test.raw), "--output", str(output), "--num-beams", "5"]
    if toolkit == "fairseq":  # reads the pieces from --input; prints H-<id> lines
        return [python_of(cache, "fairseq"), "-c", FAIRSEQ_INTERACTIVE, str(data.fairseq_bin), "--path",
                str(stopped.model), "--source-lang", "en", "--target-lang", "de",
                "--input", source, "--beam", "5", "--batch-size", "64", "--buffer-size", "64", "--cpu"]
    if toolkit == "opennmt-py":
        return [venv_bin(cache, "opennmt-py", "onmt_translate"), "-model", str(stopped.model), "-src", source,
                "-output", str(output), "-beam_size", "5", "-batch_size", "64"]
    if toolkit == "eole":
        return [venv_bin(cache, "eole", "eole"), "predict", "-model_path", str(stopped.model), "-src", source,
                "-output", str(output), "-beam_size", "5", "-batch_size", "64"]
    return [venv_bin(cache, "sockeye", "sockeye-translate"), "--models", str(folder / "model"), "--checkpoints",
            str(stopped.checkpoint), "--input", source, "--output", str(output),
            "--beam-size", "5", "--batch-size", "64", "--use-cpu"]


@dataclass
class RaceResult:
    """One system's race: the update its model was saved at, its last logged update, target tokens per update,
    BLEU, its warm-up."""

    system: str
    malloc: str
    scored_update: int
    last_logged: int
    per_update: float
    bleu: float
    warmup: int = WARMUP


def race_table(minutes: float, test_name: str, results: list[RaceResult], found: dict) -> list[str]:
    lines = [f"| system | version | layers | warm-up | malloc | updates in {minutes:g} min: scored (last logged) | "
             f"target tokens per update | BLEU ({test_name}, beam 5) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {NAMES[r.system]} | {found[r.system][0]} | {LAYERS[r.system]} | {r.warmup:,} | {r.malloc} | "
                     f"{r.scored_update:,} ({r.last_logged:,}) | {r.per_update:,.0f} | {r.bleu:.2f} |")
    return lines


def race(args, data: Data) -> list[str]:
    """Every system, one after the other, in this one run of the script (module docstring); the table."""
    import json

    found = versions(args.cache_dir, args.systems)
    test_name = f"first {args.test_lines} lines of test2016" if args.test_lines else "test2016"
    signature, test, results = "", test_set(args, data), []
    for malloc in args.mallocs:
        for system in args.systems:
            folder = args.work_dir / "race" / malloc / system
            wait_for_idle(args.idle_threshold, args.max_wait)
            print(f"  {system}: training {args.race:g} minutes (malloc {malloc})", file=sys.stderr)
            job = make_job(system, args, data, folder, None, args.race, malloc)
            status, text = run_job(job, args.race)
            check_ours_malloc(job, text)
            intervals = parse_log(system, text, data.target_tokens_per_sentence())
            if not intervals:
                raise BenchError(f"{system} logged no training (exit {status}; {folder / 'train.out'})")
            stopped = stop_checkpoint(system, folder, text)
            output = folder / "test2016.hyp"
            command = translate_command(system, args, data, test, folder, stopped, output)
            print(f"  {system}: translating {test_name} with its model of update {stopped.update}", file=sys.stderr)
            log = folder / "translate.out"
            env = peer_env(malloc, {"PYTHONPATH": str(REPO)} if system == "ours" else None)
            if TOOLKIT[system] == "fairseq":  # its hypotheses: the H-<id> lines of its output, in pieces
                env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # torch >= 2.6 loads only tensors by default
                run_logged(command, log, env=env, what="fairseq-interactive")
                hypotheses = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", log.read_text(encoding="utf-8"), re.M))
                output.write_text("".join(hypotheses[str(i)] + "\n" for i in range(len(hypotheses))),
                                  encoding="utf-8")
            else:
                run_logged(command, log, env=env, what=f"{system}'s translation")
            scored = subprocess.run([python_of(args.cache_dir, "tools"), "-c", DECODE_AND_SCORE,
                                     str(data.root / "spm.model"), str(output), str(test.reference),
                                     "text" if system == "ours" else "pieces"], capture_output=True, text=True)
            if scored.returncode:
                raise BenchError(f"scoring {system}: {scored.stderr.strip().splitlines()[-1]}")
            score = json.loads(scored.stdout)
            signature = score["signature"]
            per_update = statistics.median([i.tokens_per_update for i in intervals if i.tokens_per_update] or [0])
            warmup = args.sockeye_default_warmup if system == "sockeye-default" else WARMUP
            results.append(RaceResult(system, malloc, stopped.update, intervals[-1].update, per_update,
                                      score["bleu"], warmup))
            print(f"  {system}: BLEU {score['bleu']:.2f}", file=sys.stderr)
    return [f"vaswani_mt at {found.get('ours', ('', ''))[0] or 'its checkout'}; {settings_line(args.mallocs)}",
            *race_table(args.race, test_name, results, found), "",
            f"sacreBLEU {signature}, detokenized output against the raw references; each system scored with the "
            "model it saved where it stopped"]


# -- the command -------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install", action="store_true", help="create the peers' environments and exit")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                        help="environments and prepared data (default: $VASWANI_MT_PEERS_CACHE or %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="the runs' folders (default: CACHE/runs)")
    parser.add_argument("--data", type=Path, default=MULTI30K, help="Multi30k: {train,valid,test2016}.{en,de}")
    parser.add_argument("--systems", nargs="+", metavar="SYSTEM",
                        help=f"any of {', '.join(SYSTEMS)} (default: {', '.join(SPEED_SYSTEMS)}; --race: all)")
    parser.add_argument("--updates", type=int, default=100, help="updates per timed run (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per system, alternated (default 3)")
    parser.add_argument("--malloc", choices=("keep", "default", "both"),
                        help="glibc's malloc for every system: keep freed memory (what `vaswani-mt train` sets), "
                             "its defaults, or both, each system both ways (default: both; --race: keep)")
    parser.add_argument("--race", type=float, metavar="MINUTES",
                        help="train each system MINUTES, then translate test2016 with beam 5 and print BLEU")
    parser.add_argument("--test-lines", type=int, help="--race: translate only the first N test lines (a check)")
    parser.add_argument("--sockeye-default-warmup", type=int, default=SOCKEYE_DEFAULT_WARMUP,
                        help="the warm-up of sockeye-default, to the same peak rate (default %(default)s)")
    for system in DEFAULT_BATCH:
        parser.add_argument(f"--batch-{system}", type=int, default=DEFAULT_BATCH[system],
                            help=f"{NAMES[system]}'s {BATCH_FLAGS[system]} (default %(default)s)")
    parser.add_argument("--ours-override", default="", metavar="OPTIONS",
                        help='more `vaswani-mt train` options, e.g. --ours-override="--training.seed 2"')
    parser.add_argument("--idle-threshold", type=float, default=0.1, help="max cores other processes may use")
    parser.add_argument("--max-wait", type=float, default=120.0, help="seconds to wait for an idle machine")
    parser.add_argument("--max-redo", type=int, default=1, help="reruns of a run other processes disturbed")
    args = parser.parse_args(argv)
    try:
        args.systems = args.systems or list(SYSTEMS if args.race is not None else SPEED_SYSTEMS)
        unknown = [s for s in args.systems if s not in SYSTEMS]
        if unknown:
            raise BenchError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
        if args.updates < 20 or args.rounds < 1 or (args.race is not None and args.race <= 0):
            raise BenchError("--updates must be at least 20 (two logged intervals), --rounds and --race positive")
        if any(getattr(args, f"batch_{s.replace('-', '_')}") <= 0 for s in DEFAULT_BATCH):
            raise BenchError("batch sizes must be positive")
        if args.sockeye_default_warmup < 1:
            raise BenchError("--sockeye-default-warmup must be positive")
        malloc = args.malloc or ("keep" if args.race is not None else "both")
        args.mallocs = list(MALLOCS) if malloc == "both" else [malloc]
        args.work_dir = args.work_dir or args.cache_dir / "runs"
        if args.install:
            install(args.cache_dir, list(dict.fromkeys(TOOLKIT[s] for s in args.systems if s != "ours")))
            return 0
        data = prepare(args.cache_dir, args.data, args.systems)
        print(cpu_line())
        if args.race is not None:
            print("\n".join(race(args, data)))
            return 0
        found = versions(args.cache_dir, args.systems)
        print("; ".join(f"{NAMES[s]} {v} (torch {t})" for s, (v, t) in found.items()))
        print(f"{args.updates} updates per run, {args.rounds} rounds, median target tok/s over the logged intervals "
              "after each run's first")
        results = speed(args, data)
        print(cpu_line())
        print(settings_line(args.mallocs))
        print("\n".join(speed_table(args, results, found)))
        for malloc in args.mallocs:
            if ("ours", malloc) in results:
                print(f"malloc {malloc}: {share_of_the_cpu(data, results['ours', malloc].rate(), args)}")
        if any(r.disturbed for r in results.values()):
            print("WARNING: some runs were disturbed by other processes; treat the figures as rough")
        return 0
    except BenchError as error:
        print(f"bench_peers.py: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
