"""vaswani_mt: the "Attention Is All You Need" Transformer (Vaswani et al. 2017) as a native Hugging Face model.

Importing the package registers the model with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` resolve `model_type="vaswani"`, plugs the fast decoding loops
into the model's generate(), brings back the "translation" pipeline task, and plugs the model card into
`VaswaniTrainer`'s Hub pushes (`vaswani_mt/package.py`). Under the `vaswani-mt` command that happens when a command
runs, so that `vaswani-mt --help` and `--version` answer without importing torch. The layers are in ARCHITECTURE.md.
"""

import os
import sys

# Before anything loads torch, and so OpenMP (GNU's, in torch's Linux wheels): a thread that waits for work spins
# 10,000 times, not 300,000, before it sleeps (a value the user set wins). Threads of two processes spinning on the
# same cores keep each other from working: two trainings on 2 cores kept 11-16 % of their speed each, with the
# shorter spin 43-44 %, and a run alone is as fast (docs/speed.md).
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

__version__ = "0.1.0"


def _started_as_the_command() -> bool:
    """Whether this process is the `vaswani-mt` command: its console script, or `python [options] -m vaswani_mt.cli`
    (read from the interpreter's own arguments, up to the script or module it runs)."""
    if os.path.splitext(os.path.basename(sys.argv[0]))[0] == "vaswani-mt":
        return True
    interpreter_args = iter(getattr(sys, "orig_argv", [])[1:])
    for arg in interpreter_args:
        if arg == "-m":
            return next(interpreter_args, None) == "vaswani_mt.cli"
        if arg in ("-X", "-W", "--check-hash-based-pycs"):  # options with a separate value
            next(interpreter_args, None)
        elif arg == "-c" or not arg.startswith("-"):  # a command string or a script
            return False
    return False


if _started_as_the_command():
    # The command's own entry (vaswani_mt.cli) imports `package` before it runs a command; a name asked for before
    # that brings it in too.
    def __getattr__(name: str):
        from . import package

        try:
            return getattr(package, name)
        except AttributeError:
            raise AttributeError(f"module 'vaswani_mt' has no attribute {name!r}") from None
else:
    from .package import *  # noqa: F403
    from .package import __all__  # noqa: F401
