"""Several runs of one recipe (its seeds): each run's figures, then the mean and spread of its scores, as
docs/results.md and the README's results table give a recipe's result. With --against, an A/B on valid.

    python scripts/seed_summary.py runs/multi30k-en-de-seed1 runs/multi30k-en-de-seed2 runs/multi30k-en-de-seed3
    python scripts/seed_summary.py runs/a-seed1 runs/a-seed2 --against runs/b-seed1 runs/b-seed2

Per run (read from its metrics.json and config.yaml by vaswani_mt.publishing.seeds, as a model card reads its
seeds): its seed, CPU or GPU and precision, updates, minutes (the time budget's whole run, else training's wall
time), the final model's valid BLEU (the one `vaswani-mt train` chose: the average or the best checkpoint), and its
test BLEU where the run read test: cased sacreBLEU, or for a run on lowercased Moses-tokenized text (the literature's
protocol) the lowercased Moses-tokenized BLEU. Then, per score, the mean, the spread (lowest to highest)
and the sample standard deviation. An A/B compares the two sides' mean valid BLEU only: recipes are chosen on valid,
test is read once per final config (docs/recipe.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from vaswani_mt.publishing.seeds import RunFigures, SeedRunError, read_run, run_figures
from vaswani_mt.publishing.seeds import spread as score_spread


def figures(folder: Path) -> RunFigures:
    return run_figures(read_run(folder, scored=False))  # a candidate of an A/B may not have read test


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def spread(values: list[float | None]) -> str:
    """`mean (lowest–highest, sd s, n runs)` of the values a run has."""
    return str(score_spread(values) or "–")


def table(runs: list[RunFigures]) -> list[str]:
    lines = ["| run | seed | machine | updates | minutes | valid BLEU | test BLEU | test lc-tok |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.name} | {run.seed if run.seed is not None else '?'} | {run.machine} | "
                     f"{_number(run.updates, 0)} | {_number(run.minutes, 1)} | {_number(run.valid)} | "
                     f"{_number(run.test)} | {_number(run.test_lctok)} |")
    lines += ["", f"valid BLEU:  {spread([r.valid for r in runs])}"]
    if any(r.test is not None for r in runs):
        lines.append(f"test BLEU:   {spread([r.test for r in runs])}")
    if any(r.test_lctok is not None for r in runs):
        lines.append(f"test lc-tok: {spread([r.test_lctok for r in runs])}")
    return lines


def comparison(a: list[RunFigures], b: list[RunFigures]) -> list[str]:
    valid_a, valid_b = [r.valid for r in a if r.valid is not None], [r.valid for r in b if r.valid is not None]
    if not valid_a or not valid_b:
        return ["A/B: a side has no valid BLEU"]
    difference = statistics.mean(valid_a) - statistics.mean(valid_b)
    lines = [f"A/B on valid: A {spread(valid_a)} against B {spread(valid_b)}: A - B = {difference:+.2f}"]
    if min(len(valid_a), len(valid_b)) < 2 and abs(difference) < 1:
        lines.append("under 1 BLEU apart with one run on a side: run a second seed on each side before choosing")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of one recipe (A of an A/B)")
    parser.add_argument("--against", nargs="+", type=Path, metavar="RUN", help="run folders of the other recipe (B)")
    args = parser.parse_args(argv)
    try:
        a = [figures(folder) for folder in args.runs]
        b = [figures(folder) for folder in args.against or []]
    except SeedRunError as error:
        print(f"seed_summary.py: {error}", file=sys.stderr)
        return 1
    if not b:
        print("\n".join(table(a)))
        return 0
    print("\n".join(["A", *table(a), "", "B", *table(b), "", *comparison(a, b)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
