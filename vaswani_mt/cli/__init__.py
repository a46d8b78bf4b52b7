"""`vaswani-mt`: one entry point, one sub-command per job. Each sub-command lives in its own module and is imported
only when used, and the package itself (torch, transformers, datasets) only when a command runs
(`vaswani_mt/__init__.py`), so `vaswani-mt --help` and `--version` stay instant.

The command is its whole process, so it sets, for that process, what can only be set before torch loads: how OpenMP's
waiting threads wait (`PROCESS_ENVIRONMENT`). Only when this process runs the command (its console script,
`python -m vaswani_mt.cli`, `python -m vaswani_mt.cli.<command>`): a program that imports `vaswani_mt.cli` and calls
`main` keeps its environment.
"""

import importlib
import importlib.metadata
import os
import signal
import sys

from .. import _RUNNING_THE_COMMAND, __version__

# GNU OpenMP (torch's Linux wheels) reads these once, when torch loads it, for the whole process and the processes it
# starts: a thread that waits for work spins 10,000 times, not 300,000, before it sleeps. Threads of two processes
# spinning on the same cores keep each other from working: two trainings on 2 cores kept 11-16 % of their speed each,
# with the shorter spin 43-44 %, and a run alone is as fast (docs/speed.md). A value the user set wins.
PROCESS_ENVIRONMENT = {"GOMP_SPINCOUNT": "10000"}


def set_the_process_environment() -> None:
    """`PROCESS_ENVIRONMENT` into `os.environ`, each variable the user has not set already. It lasts for the process
    (nothing can undo it once OpenMP has read it), which is why only the command, the whole process, sets it."""
    for name, value in PROCESS_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


if _RUNNING_THE_COMMAND:  # before any command module imports torch
    set_the_process_environment()

# sub-command -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "prepare": ("vaswani_mt.cli.prepare", "main", "read, clean and tokenise a config's data once, for every run"),
    "cache": ("vaswani_mt.cli.cache", "main", "list the prepared-data cache; --prune removes what no run reads"),
    "train": ("vaswani_mt.cli.train", "main", "train a model with the paper's recipe from a YAML config"),
    "translate": ("vaswani_mt.cli.translate", "main", "translate a file or stdin with a trained model"),
    "export": ("vaswani_mt.cli.export", "main", "export a model for fast inference (CTranslate2)"),
    "attention": ("vaswani_mt.cli.attention", "main", "draw attention heatmaps for a sentence"),
    "demo": ("vaswani_mt.cli.demo", "main", "try a model in a web page: translations, n-best, attention"),
    "average": ("vaswani_mt.cli.average", "main", "average the weights of several checkpoints (§6.1)"),
    "plot-schedule": ("vaswani_mt.cli.plot_schedule", "main", "draw Noam learning-rate curves (§5.3)"),
    "push": ("vaswani_mt.cli.push", "main", "push a trained run to the Hugging Face Hub with its model card"),
    "upgrade": ("vaswani_mt.cli.upgrade", "main", "bring the model code saved beside models up to date"),
}


def usage() -> str:
    lines = ["usage: vaswani-mt <command> [options]   (or: vaswani-mt --version)", "", "commands:"]
    lines += [f"  {name:<14} {help_text}" for name, (_, _, help_text) in COMMANDS.items()]
    lines += ["", "`vaswani-mt <command> --help` describes a command's options."]
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version; from a source tree that is not installed, the package's own."""
    try:
        return importlib.metadata.version("vaswani-mt")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # like an argparse tool missing its required argument: usage on stderr, exit status 2
        print(f"{usage()}\n\nvaswani-mt: error: a command is required", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"vaswani-mt {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vaswani-mt: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    importlib.import_module("vaswani_mt.package")  # the package as `import vaswani_mt` gives it (see its __init__)
    command = getattr(importlib.import_module(module_name), function_name)
    try:
        return int(command(rest) or 0)
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """The program reading our output closed it (`vaswani-mt translate ... | head -1`): stop quietly with the exit
    status of a Unix tool stopped by SIGPIPE (141), instead of a traceback. Standard output is pointed at /dev/null
    so that Python's final flush of it cannot fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
