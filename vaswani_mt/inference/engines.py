"""Which engine translates a model folder: a saved model runs with PyTorch `generate()`
(`vaswani_mt.inference.translate`), a CTranslate2 export (`vaswani-mt export`) with CTranslate2
(`vaswani_mt.inference.export`). Both give the same streaming, batching, order and decoding defaults."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from ..files import TOKENIZER_FILES, first_line
from ..model.pipeline_vaswani import text_preprocessing
from .export import DECODING_FILE, ExportedModel, is_export
from .translate import TranslateError, load_model_and_tokenizer, translate_lines


def load_translator(folder: str, device: str | None = None) -> Callable[..., Iterator[str]]:
    """`translate(lines, **options)` (the options of `translate_lines`) for a model folder: a saved model, run with
    PyTorch `generate()`, or a CTranslate2 export (`vaswani-mt export`), run with CTranslate2 — told apart by their
    files. Either way the same streaming, batching, order and decoding defaults; problems are one TranslateError."""
    if is_export(folder):
        return _load_export(folder, device).translate_lines
    model, tokenizer = load_model_and_tokenizer(folder, device)
    return functools.partial(translate_lines, model, tokenizer)


def _load_export(folder: str, device: str | None):
    """A CTranslate2 export (`ExportedModel`), checked as `load_model_and_tokenizer` checks a model folder: a missing
    tokenizer, decoding file, package or device is one TranslateError naming it."""
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise TranslateError(f"{folder} is a CTranslate2 export without its tokenizer (tokenizer.json): export the "
                             "model again with `vaswani-mt export --force`")
    try:
        return ExportedModel(folder, device)
    except (ImportError, ValueError) as error:
        raise TranslateError(str(error)) from None
    except (OSError, RuntimeError) as error:
        raise TranslateError(f"cannot load the CTranslate2 export {folder}: {first_line(error)}") from None


def target_preprocessing(folder: str) -> Callable[[str], str] | None:
    """What a reference translation goes through to be comparable with the output of the model (or CTranslate2
    export) in `folder`: its `preprocess` for the target language; None when the model reads and writes raw text."""
    path = Path(folder) / (DECODING_FILE if is_export(folder) else "config.json")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return text_preprocessing(settings.get("preprocess"), settings.get("target_lang"))


__all__ = ["load_translator", "target_preprocessing"]
