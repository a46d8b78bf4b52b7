"""Which averaging window scores best on valid: a finished run's last weight snapshots averaged over several
windows (§6.1), each translated and scored the same way, beside the run's own final model.

    python scripts/averaging_windows.py runs/multi30k-en-de --last 1 2 3 5 10
    python scripts/averaging_windows.py runs/multi30k-en-de-lctok-cpu --last 10 --checkpoints 3 5 10

A run with `training.average_every` keeps its last `training.average_last` snapshots (`snapshots/step-<update>`);
its final model is the average of those of the cool-down's fall or the best checkpoint, whichever scored higher on
valid (recipe/selection.py). This reads the run's valid split from its data folder (`{split}.{lang}` files; its
first `data.valid_subset` pairs where the run scored only those), decodes with the final model's generation config
(beam, length penalty) and tokenizer, scores each candidate with sacreBLEU (on lowercased Moses-tokenized references
where the model writes such text, as the run scores valid) and prints one row per window: the weights averaged
(consecutive snapshots, as the run averages them, or checkpoints), their first and last update, valid BLEU. Window 1
is the last snapshot alone. `--checkpoints N` adds wider windows: the average of the run's last N kept checkpoints
(`checkpoints/`, one every `eval_steps`: 10 of them span ~4,500 updates, most of a long run's fall). A window is
chosen on valid, never on test (docs/recipe.md); `--split` scores another split of the folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from benchmark_common import cpu_flags, cpu_model
from transformers import AutoTokenizer, GenerationConfig

from vaswani_mt.files import first_line, last_saves
from vaswani_mt.inference.engines import target_preprocessing
from vaswani_mt.inference.translate import translate_lines
from vaswani_mt.metrics import corpus_scores
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
from vaswani_mt.recipe.averaging import average_checkpoints
from vaswani_mt.recipe.snapshots import last_snapshots
from vaswani_mt.run_record import RunFolder


class WindowError(Exception):
    """A run folder or option this script cannot use; the message names it."""


def run_config(run: RunFolder) -> dict:
    try:
        config = yaml.safe_load(run.config.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise WindowError(f"{run.config}: cannot read the run's config ({first_line(error)})") from None
    if not isinstance(config, dict) or not isinstance(config.get("data"), dict):
        raise WindowError(f"{run.config}: no run config with a data section (not a run of `vaswani-mt train`)")
    return config


def valid_pairs(data: dict, split: str | None) -> tuple[list[str], list[str], str]:
    subset = None if split else data.get("valid_subset")
    split = split or data.get("valid_split")
    files = [Path(data.get("path") or "") / f"{split}.{data.get(lang)}" for lang in ("source_lang", "target_lang")]
    for path in files:
        if not path.is_file():
            raise WindowError(f"{path}: no such file (data.path must be a folder of {{split}}.{{lang}} text files, "
                              f"read from the current folder)")
    try:
        sources, references = (path.read_text(encoding="utf-8").splitlines() for path in files)
    except (OSError, UnicodeDecodeError) as error:
        raise WindowError(f"cannot read the {split} split: {first_line(error)}") from None
    if len(sources) != len(references):
        raise WindowError(f"{files[0]} has {len(sources)} lines but {files[1]} has {len(references)}")
    return sources[:subset], references[:subset], split


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a finished run folder of `vaswani-mt train` with snapshots/")
    parser.add_argument("--last", type=int, nargs="+", default=[1, 2, 3, 5, 10], metavar="N",
                        help="windows: average the last N snapshots (default: 1 2 3 5 10)")
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[], metavar="N",
                        help="also average the last N kept checkpoints (checkpoints/), for each N")
    parser.add_argument("--split", help="the split to score (default: the run's valid split)")
    args = parser.parse_args(argv)
    try:
        rows = windows(args.run, args.last, args.split, args.checkpoints)
    except WindowError as error:
        print(f"averaging_windows.py: {error}", file=sys.stderr)
        return 1
    flags = sorted(flag for flag in cpu_flags() if flag.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))
    print(f"CPU: {cpu_model()} ({', '.join(flags) or 'no avx2, avx512 or amx'}); run {args.run}")
    print("| candidate | weights averaged | updates | valid BLEU |")
    print("|---|---|---|---|")
    for name, count, span, bleu in rows:
        print(f"| {name} | {count} | {span} | {bleu:.2f} |")
    return 0


def windows(run_dir: Path, lasts: Sequence[int], split: str | None,
            checkpoint_counts: Sequence[int] = ()) -> list[tuple[str, str, str, float]]:
    run = RunFolder(run_dir)
    if any(n < 1 for n in [*lasts, *checkpoint_counts]):
        raise WindowError("--last and --checkpoints take window sizes of at least 1")
    if not run.model.is_dir():
        raise WindowError(f"{run.model}: no final model (the run has not finished)")
    config = run_config(run)
    every = (config.get("training") or {}).get("average_every")
    if not isinstance(every, int) or every < 1:
        raise WindowError(f"{run.config}: no training.average_every, so the run kept no weight snapshots")
    snapshots = last_snapshots(run.snapshots, every, max(lasts))
    if len(snapshots) < max(lasts):
        raise WindowError(f"--last {max(lasts)}: {run.snapshots} holds {len(snapshots)} consecutive snapshots")
    widest = max(checkpoint_counts, default=0)
    checkpoints = last_saves(run.checkpoints, widest)
    if len(checkpoints) < widest:
        raise WindowError(f"--checkpoints {widest}: {run.checkpoints} holds {len(checkpoints)} consecutive checkpoints")
    sources, references, split = valid_pairs(config["data"], split)
    preprocess = target_preprocessing(str(run.model))
    if preprocess is not None:
        references = [preprocess(line) for line in references]
    tokenizer = AutoTokenizer.from_pretrained(run.model)
    generation = GenerationConfig.from_pretrained(run.model)

    def score(model) -> float:
        model.generation_config = generation
        started = time.perf_counter()
        hypotheses = list(translate_lines(model.eval(), tokenizer, sources))
        bleu = corpus_scores(hypotheses, references)["bleu"]
        print(f"  {split}: {bleu:.2f} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        return bleu

    rows = []
    final = VaswaniForConditionalGeneration.from_pretrained(run.model)
    print(f"the run's final model ({run.model}):", file=sys.stderr)
    rows.append(("the run's final model", "–", "–", score(final)))
    candidates = [(f"last {count}", snapshots[-count:]) for count in lasts]
    candidates += [(f"last {count} checkpoint{'s' * (count > 1)}", checkpoints[-count:]) for count in checkpoint_counts]
    for name, chosen in candidates:
        print(f"the average of {', '.join(p.name for p in chosen)}:", file=sys.stderr)
        with tempfile.TemporaryDirectory() as folder:
            try:
                average_checkpoints(chosen, output_dir=folder)
            except (OSError, ValueError) as error:
                raise WindowError(f"cannot average {', '.join(p.name for p in chosen)}: {first_line(error)}") from None
            model = VaswaniForConditionalGeneration.from_pretrained(folder)
        steps = [int(p.name.rsplit("-", 1)[1]) for p in chosen]
        span = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}–{steps[-1]:,}"
        rows.append((name, str(len(chosen)), span, score(model)))
    return rows


if __name__ == "__main__":
    sys.exit(main())
