"""What `vaswani-mt train` prints when a run ends: `run_summary`. (Its progress while it runs is
`vaswani_mt.recipe.progress`.)"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..recipe.progress import duration
from ..run_record import RunFolder


def run_summary(metrics: dict, run_dir: Path, seconds: float, languages: tuple[str, str]) -> str:
    """The last thing `vaswani-mt train` prints: where the model is, the test scores with their sacreBLEU
    signatures, the time taken and the commands to run next (with this run's paths and languages)."""
    folder = RunFolder(run_dir)
    run, model = shlex.quote(str(run_dir)), shlex.quote(str(folder.model))
    lines = [f"finished in {duration(seconds)} ({metrics.get('training', {}).get('steps', '?')} updates)",
             f"  model         {folder.model}  ({_chosen(metrics.get('selection', {}))})"]
    test = metrics.get("test")
    if test:
        lines += [f"  {test['split']:<13} BLEU {test['bleu']:.2f}  {test['bleu_signature']}",
                  f"  {'':<13} chrF {test['chrf']:.2f}  {test['chrf_signature']}",
                  f"  {'':<13} lowercased Moses-tokenized BLEU {test['bleu_lowercased_moses_tokenized']:.2f}  "
                  f"{test['bleu_lowercased_moses_tokenized_signature']}",
                  f"  translations  {folder.test_hypotheses}"]
    lines.append(f"  all figures   {folder.record}")
    source, target = languages
    lines += ["next:",
              f"  vaswani-mt translate {model} --input sentences.{source} > sentences.{target}",
              f"  vaswani-mt export --to ctranslate2 {model} {run}/ct2    "
              f"# then: vaswani-mt translate {run}/ct2 ... (faster on a CPU)",
              f"  vaswani-mt push {run} YOUR-NAME/MODEL-NAME --dry-run    # without --dry-run to upload"]
    return "\n".join(lines)


def _chosen(selection: dict) -> str:
    """Which weights the model folder holds: `average of checkpoint-..., ...` or `best checkpoint checkpoint-N`."""
    if selection.get("chosen") == "averaged":
        return "average of " + ", ".join(selection.get("averaged_checkpoints", []))
    best = selection.get("best_checkpoint")
    return "best checkpoint" + (f" {Path(best).name}" if best else "")
