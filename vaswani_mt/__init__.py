"""vaswani_mt: the "Attention Is All You Need" Transformer (Vaswani et al. 2017) as a native Hugging Face model.

`import vaswani_mt` plugs the package into transformers (`vaswani_mt/package.py`): it registers the model with the
Auto classes, so that `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` resolve `model_type="vaswani"`, plugs the
fast decoding loops into the model's generate(), brings back the "translation" pipeline task, and plugs the model
card into `VaswaniTrainer`'s Hub pushes. That needs torch and transformers, so the import loads them. The public names
(`__all__`) are attributes of the package that load when first asked for (PEP 562), for every caller.

The package's own command, `vaswani-mt`, plugs the package in when a command runs instead (`vaswani_mt.cli`), so that
`vaswani-mt --help` and `--version` answer without importing torch, and so that the command can set what OpenMP reads
when torch loads it. Python imports this package before any code of the command runs, so the package itself tells
that it is starting the command (`_RUNNING_THE_COMMAND`, below), once, as it is imported.

Importing the package changes nothing else in the process: no floating-point mode, environment variable, thread
count, allocator setting or default dtype. What a training run needs, the run sets for itself, and the command sets
what can only be set for a whole process (`vaswani_mt.cli`). The layers are in ARCHITECTURE.md.
"""

import os
import sys
import time

__version__ = "0.1.0"

# The public API: each name is defined in the layer it belongs to; `package.py` imports them all and lists them
# too (its `__all__`; the two lists are the same, tests/test_importing.py), so that this list needs no import.
__all__ = [
    "PRESETS",
    "RunRecord",
    "CleaningOptions",
    "CleaningReport",
    "ConfigError",
    "RunConfig",
    "DataError",
    "NoamLR",
    "TokenBudgetBatchSampler",
    "TranslationPipeline",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTrainer",
    "VaswaniTrainingArguments",
    "average_checkpoints",
    "corpus_scores",
    "find_checkpoints",
    "label_smoothed_cross_entropy",
    "load_metric",
    "load_run_config",
    "load_parallel",
    "make_adam",
    "moses_tokenized_bleu",
    "noam_curve",
    "noam_lr",
    "normalize_text",
    "padding_stats",
    "register_translation_pipeline",
    "save_for_pipeline",
    "tokenize_dataset",
    "train_run",
    "train_tokenizer",
]

_COMMAND_MODULE = "vaswani_mt.cli"


def _running_the_command() -> bool:
    """Whether this interpreter was started to run the `vaswani-mt` command: as its console script (named so in
    `sys.argv[0]`), or as `python -m vaswani_mt.cli` or `python -m vaswani_mt.cli.<command>` (torchrun's and
    accelerate's `-m`). While `python -m` imports the packages of the module it runs, `sys.argv[0]` is "-m" (Python's
    documented placeholder), and that module's name is the interpreter's argument just before the program's own
    (`sys.orig_argv`: `-m NAME` or `-mNAME`). Read as this package is imported: afterwards `sys.argv[0]` is a path."""
    argv = getattr(sys, "argv", None) or [""]
    if os.path.splitext(os.path.basename(argv[0]))[0] == "vaswani-mt":
        return True
    interpreter_argv = getattr(sys, "orig_argv", [])
    if argv[0] != "-m" or len(interpreter_argv) < len(argv):
        return False
    module = interpreter_argv[len(interpreter_argv) - len(argv)]
    if module.startswith("-"):  # -mNAME, or options and -m in one argument (-BmNAME)
        module = module.partition("m")[2]
    return module == _COMMAND_MODULE or module.startswith(_COMMAND_MODULE + ".")


_RUNNING_THE_COMMAND = _running_the_command()

# When the command started (`time.time()`), for its time budget: this import is the first of the package's code a
# command's process runs. Not the process's start, which a shell that waits and then `exec`s the command would predate.
_COMMAND_STARTED = time.time() if _RUNNING_THE_COMMAND else None


def __getattr__(name: str):
    """A public name, loaded when first asked for (PEP 562); `package.py` plugs the package in as it loads."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import package

    value = globals()[name] = getattr(package, name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if not _RUNNING_THE_COMMAND:
    from . import package  # noqa: E402, F401 - plugs the package into transformers (above)
