"""`vaswani-mt translate`: translate a file (or stdin) line by line with a trained model.

    vaswani-mt translate runs/NAME/model --input test.en --output test.hyp.de --reference test.de
    vaswani-mt translate runs/NAME/ct2 ...      # a CTranslate2 export (`vaswani-mt export`): faster on a CPU

Input is read as a stream: at most ``--sort-window`` lines are held at once. Inside that window sentences are sorted
by length and packed into batches of at most ``--max-tokens`` padded source tokens, translated, and written back in
their original order, so arbitrarily long inputs run in bounded memory and line i of the output is always the
translation of line i of the input (an empty line gives an empty line).

The reusable core is :func:`translate_lines` (PyTorch `generate()`); :func:`translate_stream` is its streaming,
batching and ordering for any engine, which `vaswani_mt.inference.export.ExportedModel` uses for CTranslate2 exports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # vaswani_mt/__init__.py registered the model

from ..data.batching import pack_by_token_budget
from ..files import TOKENIZER_FILES, first_line, weights_problem
from ..model.modeling_vaswani import length_penalty_style
from ..model.pipeline_vaswani import encode_source, text_preprocessing
from ..precision import default_device, mps_problem

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 2048
DEFAULT_SORT_WINDOW = 1000


class TranslateError(Exception):
    """A problem with the user's input (files, model folder): reported as one line, exit code 1."""


def translate_lines(
    model,
    tokenizer,
    lines: Iterable[str],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sort_window: int = DEFAULT_SORT_WINDOW,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    truncation: bool = True,
    on_translated: Callable[[int], None] | None = None,
    **generate_kwargs,
) -> Iterator[str]:
    """Translate `lines` (strings without their newline), yielding one translation per line, in order.

    Lazily: reads `sort_window` lines, sorts them by token length, packs them into batches whose padded size
    (sentences x longest source) stays within `max_tokens` (a longer sentence gets a batch of its own), runs
    `model.generate`, yields the window's translations in input order, then reads the next window. So at most
    `sort_window` lines (and their translations) are in memory.

    Decoding defaults are the model's (its saved generation config, e.g. beam 4 and length penalty 0.6; up to source
    length + 50 new tokens, from the padded length of the batch); `num_beams`, `max_new_tokens` and other keyword
    arguments go to `generate()`. Empty or blank lines give "" without a model call. Sources longer than the model's
    `max_position_embeddings` are truncated with a warning (`truncation=False`: ValueError); a `max_new_tokens` above
    it is lowered to it (one warning, before any line is read). `on_translated(n)` is called after each batch with
    the number of lines it finished (for progress bars).
    """
    limit = model.config.max_position_embeddings
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = fitting_new_tokens(max_new_tokens, limit)
    yield from translate_stream(lambda sources: _generate(model, tokenizer, sources, generate_kwargs), tokenizer,
                                lines, limit=limit, max_tokens=max_tokens, sort_window=sort_window,
                                truncation=truncation, on_translated=on_translated,
                                preprocess=text_preprocessing(getattr(model.config, "preprocess", None),
                                                              getattr(model.config, "source_lang", None)))


def translate_stream(
    translate_batch: Callable[[list[list[int]]], list[str]],
    tokenizer,
    lines: Iterable[str],
    *,
    limit: int,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sort_window: int = DEFAULT_SORT_WINDOW,
    truncation: bool = True,
    on_translated: Callable[[int], None] | None = None,
    preprocess: Callable[[str], str] | None = None,
) -> Iterator[str]:
    """The streaming, batching and ordering of `translate_lines`, for any engine: `translate_batch(sources)` turns
    one batch of source token ids (unpadded, longest first, within `max_tokens` padded tokens) into one line of text
    each. Sources longer than `limit` tokens (the engine's positions) are truncated with a warning. `preprocess`:
    what each line goes through before the tokenizer (the model's `text_preprocessing`)."""
    if max_tokens < 1 or sort_window < 1:
        raise ValueError(f"max_tokens and sort_window must be positive, got {max_tokens} and {sort_window}")
    window: list[str] = []
    for line in lines:
        window.append(line)
        if len(window) >= sort_window:
            yield from _translate_window(translate_batch, tokenizer, window, max_tokens, limit, truncation,
                                         on_translated, preprocess)
            window = []
    if window:
        yield from _translate_window(translate_batch, tokenizer, window, max_tokens, limit, truncation, on_translated,
                                     preprocess)


def fitting_new_tokens(requested: int, limit: int) -> int:
    """`requested` new tokens, or `limit` (the model's positions: the longest output it can hold) with one warning.
    Unclamped, generation failed mid-file on the first long enough translation, with an error about the input."""
    if requested <= limit:
        return requested
    logger.warning("max_new_tokens %d is more than the model can hold (max_position_embeddings=%d): translations "
                   "stop at %d tokens", requested, limit, limit)
    return limit


def _translate_window(translate_batch, tokenizer, texts, max_tokens, limit, truncation, on_translated, preprocess):
    results = [""] * len(texts)
    todo = [i for i, text in enumerate(texts) if text.strip()]
    if preprocess is not None:
        texts = list(texts)
        for i in todo:
            texts[i] = preprocess(texts[i])
    if on_translated is not None and len(todo) < len(texts):
        on_translated(len(texts) - len(todo))
    encoded = tokenizer([texts[i] for i in todo])["input_ids"] if todo else []
    sources = {}
    for i, ids in zip(todo, encoded):
        sources[i] = ids if len(ids) <= limit else encode_source(tokenizer, texts[i], limit, truncation)
    # Longest first: the most memory-hungry batch runs first, and similar lengths share a batch (little padding).
    order = sorted(todo, key=lambda i: len(sources[i]), reverse=True)
    lengths = [len(sources[i]) if i in sources else 0 for i in range(len(texts))]
    for batch in pack_by_token_budget(order, lengths, None, max_tokens):
        for i, translation in zip(batch, translate_batch([sources[i] for i in batch])):
            results[i] = translation
        if on_translated is not None:
            on_translated(len(batch))
    yield from results


def _generate(model, tokenizer, sources: list[list[int]], generate_kwargs: dict) -> list[str]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    width = max(len(ids) for ids in sources)
    input_ids = torch.full((len(sources), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(sources), width), dtype=torch.long)
    for row, ids in enumerate(sources):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    device = model.device
    with torch.no_grad():
        output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                **generate_kwargs)
    output_ids = output if isinstance(output, torch.Tensor) else output.sequences
    if output_ids.shape[0] != len(sources):
        raise ValueError("translate_lines needs one output per sentence (num_return_sequences=1)")
    return decoded_lines(tokenizer, output_ids.cpu())


def decoded_lines(tokenizer, rows) -> list[str]:
    """The text of each row of token ids, special tokens left out, on one line each (a translation may contain a
    line break, which would shift every following line of the output)."""
    return [" ".join(text.splitlines()) for text in tokenizer.batch_decode(rows, skip_special_tokens=True)]


# --- files ------------------------------------------------------------------------------------------------------


def decoding_defaults(model) -> dict:
    """How `model.generate()` decodes when given nothing, from the model's generation config: ``num_beams``,
    ``length_penalty`` (transformers' 1.0 where the config has none, as a greedy model's saved config does),
    ``length_penalty_style`` ("transformers" or "gnmt") and ``max_new_tokens`` (None: the source length + 50, §6.1,
    never more than ``max_position_embeddings``). The demo shows and uses them; a CTranslate2 export keeps them."""
    generation = model.generation_config
    return {
        "num_beams": int(generation.num_beams or 1),
        "length_penalty": float(generation.length_penalty if generation.length_penalty is not None else 1.0),
        "length_penalty_style": length_penalty_style(generation),
        "max_new_tokens": generation.max_new_tokens,
    }


def load_model_and_tokenizer(folder: str, device: str | None = None):
    """The model (eval mode, on `device`: default cuda, else Apple's GPU (mps), when available, else cpu) and
    tokenizer saved in `folder`. Everything that can be checked is checked before the model loads (the device, the
    files, whole weights), so a bad folder or device is one `TranslateError` naming it, not a traceback from inside a
    library."""
    device = usable_device(device)
    path = Path(folder)
    if not path.is_dir():
        raise TranslateError(f"model folder {folder} does not exist")
    if not (path / "config.json").is_file():
        raise TranslateError(f"{folder} is not a saved model: it has no config.json")
    if not _has_tokenizer(path):
        raise TranslateError(f"{folder} has no tokenizer (tokenizer.json): save the tokenizer with the model")
    problem = weights_problem(path)
    if problem is not None:
        raise TranslateError(problem)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise TranslateError(f"cannot load the tokenizer from {folder}: {error}") from None
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    except (OSError, ValueError, RuntimeError) as error:
        raise TranslateError(f"cannot load the model from {folder}: {first_line(error)}") from None
    return model.to(device).eval(), tokenizer


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def usable_device(name: str | None) -> str:
    """`name` (default: cuda, else Apple's GPU (mps), when available, else cpu) once a tensor could be put there."""
    name = name or default_device()
    if name.split(":")[0] == "mps" and (problem := mps_problem()) is not None:
        raise TranslateError(f"device {name!r} cannot be used: {problem}")
    try:
        torch.empty(0, device=name)
    except (RuntimeError, AssertionError, ValueError, NotImplementedError) as error:
        raise TranslateError(f"device {name!r} cannot be used: {first_line(error)}") from None
    return name


__all__ = ["TranslateError", "decoded_lines", "decoding_defaults", "load_model_and_tokenizer", "usable_device",
           "translate_lines", "translate_stream"]
