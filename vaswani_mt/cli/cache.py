"""`vaswani-mt cache`: what the prepared-data cache holds, and pruning it (`vaswani_mt.data.cache`), in the manner of
`hf cache ls` / `hf cache prune`.

    vaswani-mt cache                                  each entry: size, last use, data and tokenizer, state
    vaswani-mt cache --prune --dry-run                what --prune would remove
    vaswani-mt cache --prune --older-than 30 --yes    entries no current code reads, or unused for 30 days
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..data.cache import cache_folder, entries, leftovers, prune_reason, remove
from ..data.reading import DataError
from ..files import describe_os_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt cache",
        description="List the prepared-data cache (data.cache_dir: default $VASWANI_MT_CACHE, else "
                    "~/.cache/vaswani_mt): each entry's size, last use, the data and tokenizer it came from, whether "
                    "the code of this installation still reads it and whether a process uses it now.",
        epilog="--prune removes the entries no current code reads (made by another version of vaswani-mt or of the "
               "libraries that shape the data), the folders of killed preparations, and with --older-than the "
               "entries unused for that many days; never one in use (its lock decides). A removed entry is only "
               "prepared again by the next run that needs it.")
    parser.add_argument("--cache-dir", help="the cache folder (default: $VASWANI_MT_CACHE, else ~/.cache/vaswani_mt)")
    parser.add_argument("--prune", action="store_true", help="remove entries no current code reads")
    parser.add_argument("--older-than", type=float, metavar="DAYS",
                        help="with --prune: also remove entries unused for more than DAYS days")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --prune: list what would be removed, remove nothing")
    parser.add_argument("-y", "--yes", action="store_true", help="with --prune: do not ask for confirmation")
    parser.add_argument("--json", action="store_true", help="print the entries as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.prune and (args.older_than is not None or args.dry_run or args.yes):
        parser.error("--older-than, --dry-run and --yes go with --prune")
    if args.older_than is not None and args.older_than < 0:
        parser.error(f"--older-than must be >= 0 days, got {args.older_than:g}")
    cache = cache_folder(cache_dir=args.cache_dir)
    if not cache.is_dir():
        print(f"vaswani-mt cache: error: no cache folder {cache}", file=sys.stderr)
        return 1
    try:
        return _prune(parser, cache, args) if args.prune else _list(cache, args.json)
    except DataError as error:
        print(f"vaswani-mt cache: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"vaswani-mt cache: error: {describe_os_error(error)}", file=sys.stderr)
        return 1


def _list(cache, as_json: bool) -> int:
    found, killed = entries(cache), leftovers(cache)
    if as_json:
        print(json.dumps([item.to_json() for item in found], indent=1))
        return 0
    rows = [(item.name, _bytes(item.size), _ago(item.last_used), item.data_text(), item.tokenizer_text(),
             _state(item)) for item in found]
    _table(("ENTRY", "SIZE", "LAST USED", "DATA", "TOKENIZER", "STATE"), rows)
    stale = sum(not item.current for item in found)
    print(f"\n{len(found)} entries, {_bytes(sum(item.size for item in found))} on disk in {cache}"
          + (f"; {stale} no current code reads (`vaswani-mt cache --prune` removes them)" if stale else ""))
    if killed:
        print(f"{len(killed)} folder(s) of killed preparations, {_bytes(sum(k.size for k in killed))} "
              "(`vaswani-mt cache --prune` removes them)")
    return 0


def _prune(parser: argparse.ArgumentParser, cache, args) -> int:
    now = time.time()
    chosen = [(item, reason) for item in entries(cache)
              if (reason := prune_reason(item, args.older_than, now)) is not None]
    busy = [item for item, _ in chosen if item.in_use]
    chosen = [(item, reason) for item, reason in chosen if not item.in_use]
    chosen += [(item, "a killed preparation's folder") for item in leftovers(cache)]
    for item in busy:
        print(f"keeping {item.name}: in use")
    if not chosen:
        print("Nothing to remove.")
        return 0
    total = sum(item.size for item, _ in chosen)
    print(f"About to remove {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} ({_bytes(total)}) from {cache}:")
    _table(("ENTRY", "SIZE", "LAST USED", "WHY"), [(item.name, _bytes(item.size), _ago(item.last_used), reason)
                                                  for item, reason in chosen], indent="  ")
    if args.dry_run:
        print("Dry run: nothing was removed.")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            parser.error("--prune asks before it removes: confirm with --yes (or look first with --dry-run)")
        if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing was removed.")
            return 0
    removed = [item for item, _ in chosen if remove(cache, item)]
    for item, _ in chosen:
        if item not in removed:
            print(f"keeping {item.name}: in use")
    print(f"Removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}; freed "
          f"{_bytes(sum(item.size for item in removed))}.")
    return 0


def _state(item) -> str:
    return ", ".join(word for word, true in (("in use", item.in_use), ("current", item.current),
                                              ("no current code reads it", not item.current)) if true)


def _table(header: tuple, rows: list[tuple], indent: str = "") -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(indent + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


def _bytes(size: float) -> str:
    if size < 1000:
        return f"{size:.0f} B"
    for unit in ("kB", "MB", "GB"):
        size /= 1000
        if size < 1000:
            return f"{size:.1f} {unit}"
    return f"{size / 1000:.1f} TB"


def _ago(when: float) -> str:
    seconds = max(0.0, time.time() - when)
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            count = int(seconds // length)
            return f"{count} {unit}{'' if count == 1 else 's'} ago"
    return "just now"
