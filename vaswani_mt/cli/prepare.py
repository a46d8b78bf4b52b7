"""`vaswani-mt prepare`: prepare a run config's data ahead of training (`vaswani_mt.data.prepared`): read, clean,
learn the joint BPE, tokenise, into the cache that `vaswani-mt train` then finds.

    vaswani-mt prepare --config wmt14-en-de-base --data.path data/wmt14-en-de
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ..data.prepared import prepare
from ..data.reading import DataError
from ..files import describe_os_error
from ..recipe.config import ConfigError, load_run_config, parse_overrides, shipped_config_names
from ..recipe.progress import LOG_FORMAT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt prepare",
        description="Read, clean and tokenise a run config's data once, into the cache every later run, --resume "
                    "and process reads memory-mapped (data.cache_dir, default $VASWANI_MT_CACHE or "
                    "~/.cache/vaswani_mt).",
        epilog="Any config key can be overridden with a dotted option, as with `vaswani-mt train`, e.g. "
               "--data.path data/wmt14-en-de --tokenizer.sample 1000000",
    )
    parser.add_argument("--config", required=True,
                        help="a YAML file or a shipped config name (" + ", ".join(shipped_config_names()) + ")")
    parser.add_argument("--quick", action="store_true", help="apply the config's 'quick' section")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known, rest = build_parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT,
                        stream=sys.stderr)
    started = time.perf_counter()
    try:
        config = load_run_config(known.config, parse_overrides(rest), quick=known.quick)
        prepared = prepare(config.data, config.tokenizer)
        prepared.warn_truncated()
    except (ConfigError, DataError) as error:
        print(f"vaswani-mt prepare: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"vaswani-mt prepare: error: {describe_os_error(error)}", file=sys.stderr)
        return 1
    pairs = ", ".join(f"{split} {len(dataset)}" for split, dataset in prepared.tokenized.items())
    print(f"prepared in {time.perf_counter() - started:.1f} s: {pairs} pairs; tokenizer of {len(prepared.tokenizer)} "
          "tokens")
    for name, folder in prepared.folders.items():
        print(f"  {name:<10} {folder}")
    if prepared.revision:
        print(f"  {'data':<10} {config.data.path} at commit {prepared.revision}")
    return 0
