"""Which final model holds up on sentences it was not chosen on: a finished run's best checkpoint against the average
of its last weights, the choice made on one half of valid and scored on the other.

    python scripts/selection_rules.py runs/multi30k-en-de runs/multi30k-en-de-s2 runs/multi30k-en-de-s3

A run keeps the average (`averaged/`: its last weights, those of the cool-down's fall) when it scores at least the best
checkpoint's valid BLEU, else the best checkpoint (recipe/selection.py). That checkpoint is the highest of some twenty
validations, so its valid score is biased upward (the winner's curse), and a rule that trusts it may choose worse
weights than the average. Here both candidates translate the run's valid split once (the final model's generation
config and tokenizer; references lowercased and Moses-tokenized where the model writes such text), the split is cut
into its even and odd sentences, and for each half two rules are scored on it:

- "the higher on valid": the checkpoint where it scored higher than the average on the OTHER half, else the average;
- "always the average".

One row per run and half, then the mean difference (the first rule minus the second) over all rows. The best
checkpoint itself was picked on the whole split, both halves included, which favours the first rule: where the
average still wins, it wins. Decide on valid, never on test (docs/recipe.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from averaging_windows import WindowError, run_config, valid_pairs
from benchmark_common import cpu_flags, cpu_model
from transformers import AutoTokenizer, GenerationConfig

from vaswani_mt.files import first_line
from vaswani_mt.inference.engines import target_preprocessing
from vaswani_mt.inference.translate import translate_lines
from vaswani_mt.metrics import corpus_scores
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
from vaswani_mt.run_record import RunFolder, RunRecord

HALVES = ("even", "odd")  # sentences 0, 2, 4, ... and 1, 3, 5, ... of the split


def candidates(run: RunFolder) -> tuple[Path, Path]:
    """The run's best checkpoint and its average, as its selection compared them (metrics.json)."""
    selection = RunRecord.read(run.root).selection  # metrics.json, read as the card reads it
    best = selection.best_checkpoint if selection is not None else None
    if not best:
        raise WindowError(f"{run.record}: no best checkpoint in its selection (has the run finished and validated?)")
    checkpoint = run.checkpoints / Path(best).name  # the record names it where the run was trained
    for folder, what in ((checkpoint, "the best checkpoint"), (run.averaged, "the average of the last weights")):
        if not (folder / "config.json").is_file():
            raise WindowError(f"{folder}: {what} is not on disk")
    return checkpoint, run.averaged


def half_scores(run_dir: Path) -> dict:
    """Both candidates' valid BLEU on each half ("checkpoint", "average": {half: BLEU}), and the checkpoint's name
    ("compared")."""
    run = RunFolder(run_dir)
    if not run.model.is_dir():
        raise WindowError(f"{run.model}: no final model (the run has not finished)")
    checkpoint, averaged = candidates(run)
    sources, references, split = valid_pairs(run_config(run)["data"], None)
    preprocess = target_preprocessing(str(run.model))
    if preprocess is not None:
        references = [preprocess(line) for line in references]
    tokenizer = AutoTokenizer.from_pretrained(run.model)
    generation = GenerationConfig.from_pretrained(run.model)
    scores = {}
    for name, folder in (("checkpoint", checkpoint), ("average", averaged)):
        started = time.perf_counter()
        try:
            model = VaswaniForConditionalGeneration.from_pretrained(folder)
        except (OSError, ValueError, RuntimeError) as error:
            raise WindowError(f"{folder}: cannot load its weights ({first_line(error)})") from None
        model.generation_config = generation
        hypotheses = list(translate_lines(model.eval(), tokenizer, sources))
        scores[name] = {half: corpus_scores(hypotheses[start::2], references[start::2])["bleu"]
                        for start, half in enumerate(HALVES)}
        print(f"  {run.name}, {folder.name}: {split} {corpus_scores(hypotheses, references)['bleu']:.2f} "
              f"in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return {"compared": checkpoint.name, **scores}


def rules_per_half(scores: dict) -> list[tuple]:
    """Per half: what each candidate scored on the other half, the first rule's choice, both rules' BLEU here."""
    rows = []
    for half, other in (HALVES, HALVES[::-1]):
        chosen = "checkpoint" if scores["checkpoint"][other] > scores["average"][other] else "average"
        rows.append((half, scores["checkpoint"][other], scores["average"][other], chosen, scores[chosen][half],
                     scores["average"][half]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="finished run folders of `vaswani-mt train`")
    args = parser.parse_args(argv)
    try:
        scored = [(RunFolder(run).name, half_scores(run)) for run in args.runs]
    except WindowError as error:
        print(f"selection_rules.py: {error}", file=sys.stderr)
        return 1
    flags = sorted(flag for flag in cpu_flags() if flag.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))
    print(f"CPU: {cpu_model()} ({', '.join(flags) or 'no avx2, avx512 or amx'})")
    print("| run | checkpoint | half | other half: checkpoint / average | chosen | this half: the higher on valid | "
          "always the average | difference |")
    print("|---|---|---|---|---|---|---|---|")
    differences = []
    for name, scores in scored:
        for half, checkpoint_other, average_other, chosen, rule, average in rules_per_half(scores):
            differences.append(rule - average)
            print(f"| {name} | {scores['compared']} | {half} | {checkpoint_other:.2f} / {average_other:.2f} | "
                  f"{chosen} | {rule:.2f} | {average:.2f} | {rule - average:+.2f} |")
    wins = sum(d > 0 for d in differences), sum(d == 0 for d in differences), sum(d < 0 for d in differences)
    print(f"mean difference, the higher on valid minus always the average: {statistics.mean(differences):+.2f} BLEU "
          f"over {len(differences)} halves ({wins[0]} higher, {wins[1]} the same, {wins[2]} lower)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
