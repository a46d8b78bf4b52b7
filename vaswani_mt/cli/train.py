"""`vaswani-mt train`: the paper's recipe end to end, from a YAML config to a scored, saved model.

    vaswani-mt train --config multi30k-en-de [--quick] [--resume] [--output-dir DIR] [--training.max_steps 300 ...]

The run itself is `vaswani_mt.recipe.run.train_run` (its docstring lists the steps and the run folder); this command
reads the options, sets up the log on stderr, calls it and reports: errors in one line with exit code 2 (config,
data) or 1 (files), and at the end a summary (`vaswani_mt.cli.reporting.run_summary`): the model folder, the test
scores with their signatures, the time taken and the commands to run next. What it prints goes to stderr (and the
run's train.log); stdout stays empty. On a terminal, labelled progress bars; in a log file, one progress line per
logging step and per translation pass (`vaswani_mt.recipe.progress`).

Runs the same under `torchrun --nproc_per_node N` or `accelerate launch --multi_gpu --num_processes N` (see
docs/training.md); `--resume` continues from the last complete checkpoint after a crash or kill.
"""

import argparse
import logging
import os
import sys
import time

from .. import _COMMAND_STARTED, package  # noqa: F401 - run as `-m vaswani_mt.cli.train`, plugged in too
from ..data.reading import DataError
from ..files import describe_os_error, writing
from ..recipe.config import ConfigError, load_run_config, parse_overrides, shipped_config_names
from ..recipe.progress import LOG_FORMAT
from ..recipe.run import train_run
from ..run_record import RunFolder
from .reporting import run_summary

logger = logging.getLogger("vaswani_mt.train")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt train", description="Train a Transformer with the paper's recipe.",
        epilog="Any config key can be overridden with a dotted option, e.g. --training.max_steps 300 "
               "--model.config.norm_style pre --data.path ../shared/data/multi30k",
    )
    parser.add_argument("--config", required=True,
                        help="a YAML file or a shipped config name (" + ", ".join(shipped_config_names()) + ")")
    parser.add_argument("--quick", action="store_true",
                        help="apply the config's 'quick' section: a few minutes on a CPU")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output-dir from its last checkpoint")
    parser.add_argument("--output-dir", help="run folder (overrides output_dir)")
    return parser


def command_started() -> float:
    """When the command started (`time.time()`), where a time budget counts from: as this process began running
    `vaswani-mt` (`vaswani_mt._COMMAND_STARTED`: Python's imports, torch's included, count); now where another program
    calls `main`."""
    return time.time() if _COMMAND_STARTED is None else _COMMAND_STARTED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known, rest = build_parser().parse_known_args(argv)
    is_main = os.environ.get("RANK", "0") == "0"  # torchrun and accelerate launch number the processes
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING, format=LOG_FORMAT, force=True,
                        handlers=[logging.StreamHandler(sys.stderr)])
    started, started_at = time.perf_counter(), command_started()  # training.budget_minutes counts from the latter
    try:
        overrides = parse_overrides(rest)
        if known.output_dir:
            overrides["output_dir"] = known.output_dir
        config = load_run_config(known.config, overrides, quick=known.quick)
        run = RunFolder(config.output_dir)
        finished_before = known.resume and run.record.is_file()
        record = train_run(config, resume=known.resume, command="vaswani-mt train " + " ".join(argv),
                           started=started_at)
        if is_main and not finished_before:
            languages = (config.data.source_lang, config.data.target_lang)
            summary = run_summary(record.to_json(), run.root, time.perf_counter() - started, languages)
            logger.info(summary)
            with writing(run.log), open(run.log, "a", encoding="utf-8") as log:
                log.write(summary + "\n")
    except (ConfigError, DataError) as error:
        print(f"vaswani-mt train: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"vaswani-mt train: error: {describe_os_error(error)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
