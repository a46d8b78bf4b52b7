"""`pipeline("translation")` for vaswani_mt models on transformers 5, where the built-in translation task was removed.

Two ways in:

* In a process that imported `vaswani_mt` (which calls :func:`register_translation_pipeline`):
  ``pipeline("translation", model=model, tokenizer=tokenizer)`` or ``pipeline("translation", model="run/final")``.
* Anywhere with stock transformers, no vaswani_mt installed, from a folder written by :func:`save_for_pipeline`:
  ``pipeline("translation", model="run/final", trust_remote_code=True)``. The folder carries this file and a
  ``custom_pipelines`` entry in its config.json, next to the model code.

This file is copied next to checkpoints and loaded by transformers' remote-code machinery, so it imports nothing from
vaswani_mt (not even lazily: transformers checks every import of a remote file before running it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, GenerationConfig, Pipeline

logger = logging.getLogger(__name__)

TASK = "translation"
PIPELINE_FILE = "pipeline_vaswani.py"


# transformers names used here that are not documented API, and what happens without them:
# `transformers.pipelines.REMOVED_TASKS` (removed from only where it exists, see register_translation_pipeline);
# `CONFIG_MAPPING_NAMES` (see _is_builtin_model_type); the class attributes below (`_load_tokenizer`,
# `_pipeline_calls_generate`, `_default_generation_config`, ...), which transformers' own pipelines set and the base
# class reads with defaults: a release that no longer reads one ignores it.


class TranslationPipeline(Pipeline):
    """Translate text with a seq2seq model: ``pipe("A dog runs.")`` -> ``[{"translation_text": "..."}]``.

    Input and output
        A string gives ``[{"translation_text": str}]`` (one record per returned sequence). A list of strings gives one
        record per string, flat (``[{"translation_text": ...}, ...]``) as in transformers 4; with
        ``num_return_sequences > 1`` it gives one list of records per string. ``batch_size=`` (at construction or per
        call) batches sentences through one ``generate()`` call. Generators and datasets stream through the base
        class unchanged (one list of records per item).

    Decoding
        Every keyword that is not a pipeline option goes to ``model.generate()`` (``num_beams``, ``max_new_tokens``,
        ``length_penalty``, ``num_return_sequences``, ``do_sample``, a ``generation_config``, ...). Nothing is added:
        the defaults are the model's own: its saved generation config (what `vaswani-mt train` wrote: the run's beam
        size and length penalty, §6.1's 4 and 0.6 by default; greedy for a model built from a config) and at most
        (source length + 50) new tokens, where the source length is the padded length of the batch.

    Special cases
        * An empty or whitespace-only string translates to ``""`` without running the model.
        * A source longer than the model's ``max_position_embeddings`` tokens is truncated to that length (the
          tokenizer keeps its end-of-sentence token) and a warning naming the lengths is logged on this module's
          logger; pass ``truncation=False`` to raise a ``ValueError`` instead.
        * Left-padding tokenizers are fine: batches are re-aligned to right padding, which the model's absolute
          positions need.

    Pipeline options: ``truncation`` (default True) and ``clean_up_tokenization_spaces`` (default: the tokenizer's
    setting), per call or at construction.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False
    _pipeline_calls_generate = True
    # No pipeline-level generation defaults: the model's generation config and generate() decide (the saved beam
    # size and length penalty, source length + 50 for vaswani_mt). A default max length here would override the paper's.
    _default_generation_config = None

    def __init__(self, *args, **kwargs):
        # Generation keywords given at construction apply to every call. They are kept here rather than left to the
        # base class, whose handling of them differs between transformers 5.x releases (a prepared generation
        # config in 5.17, private per-call merging in 5.23): generate() sees them exactly as passed.
        self.init_generate_kwargs = {key: kwargs.pop(key) for key in list(kwargs) if is_generation_keyword(key)}
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            raise ValueError("TranslationPipeline needs a tokenizer: pass tokenizer=... or a folder that has one")

    def _sanitize_parameters(self, truncation=None, clean_up_tokenization_spaces=None, **generate_kwargs):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    # --- the three stages -------------------------------------------------------------------------------------

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"TranslationPipeline translates strings, got {type(text).__name__}")
        ids = encode_source(self.tokenizer, text, self.model.config.max_position_embeddings, truncation,
                            self.model.config)
        input_ids = torch.tensor([ids], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = right_align(
            model_inputs["input_ids"], model_inputs["attention_mask"], self.tokenizer.pad_token_id
        )
        output = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, **self._call_generate_kwargs(generate_kwargs)
        )
        output_ids = output if isinstance(output, torch.Tensor) else output.sequences
        batch = input_ids.shape[0]
        return {"output_ids": output_ids.reshape(batch, output_ids.shape[0] // batch, *output_ids.shape[1:])}

    def postprocess(self, model_outputs: dict[str, torch.Tensor], clean_up_tokenization_spaces=None):
        decode_kwargs = {"skip_special_tokens": True}
        if clean_up_tokenization_spaces is not None:
            decode_kwargs["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return [
            {"translation_text": self.tokenizer.decode(ids, **decode_kwargs)} for ids in model_outputs["output_ids"][0]
        ]

    # --- calling ----------------------------------------------------------------------------------------------

    def __call__(self, inputs, *args, **kwargs):
        """Translate a string or a list of strings; see the class docstring for the output shapes."""
        if isinstance(inputs, str):
            if not inputs.strip():
                return self._empty_records(kwargs)
            return super().__call__(inputs, *args, **kwargs)
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(text, str) for text in inputs):
            return super().__call__(inputs, *args, **kwargs)  # generators, datasets: the base class streams them
        texts = list(inputs)
        keep = [i for i, text in enumerate(texts) if text.strip()]
        translated = super().__call__([texts[i] for i in keep], *args, **kwargs) if keep else []
        results = [self._empty_records(kwargs) for _ in texts]
        for i, records in zip(keep, translated):
            results[i] = records
        if all(len(records) == 1 for records in results):
            return [records[0] for records in results]  # transformers 4's flat list
        return results

    def _call_generate_kwargs(self, call_kwargs: dict) -> dict:
        """generate() keywords of one call: the call's, on top of the construction's — unless the call passes its
        own `generation_config`, which then replaces the construction's keywords (as in transformers)."""
        if "generation_config" in call_kwargs:
            return dict(call_kwargs)
        return {**self.init_generate_kwargs, **call_kwargs}

    def _empty_records(self, call_kwargs: dict) -> list[dict[str, str]]:
        count = self._call_generate_kwargs(call_kwargs).get("num_return_sequences")
        if count is None:
            count = getattr(self.model.generation_config, "num_return_sequences", None) or 1
        return [{"translation_text": ""} for _ in range(count)]


VaswaniTranslationPipeline = TranslationPipeline  # the name under which it was tried in the notes


def is_generation_keyword(key: str) -> bool:
    """True for `generation_config` and every public `GenerationConfig` attribute (num_beams, max_new_tokens, ...)."""
    return key == "generation_config" or (not key.startswith("_") and key in _GENERATION_KEYS)


_GENERATION_KEYS = frozenset(vars(GenerationConfig()))


def moses_tokenize(text: str, lang: str, lowercase: bool = True) -> str:
    """Lowercase (optionally), then Moses-tokenize for `lang` without escaping ``&<>'"`` to XML entities — the
    Multi30k preprocessing (``lowercase.perl | tokenizer.perl``), done by sacremoses."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise ImportError("this model expects lowercased, Moses-tokenized input (config.preprocess="
                          "'lowercase_moses'), which needs the sacremoses package: pip install sacremoses") from None
    tokenizer = _MOSES_TOKENIZERS.get(lang)
    if tokenizer is None:
        tokenizer = _MOSES_TOKENIZERS[lang] = MosesTokenizer(lang=lang)
    return tokenizer.tokenize(text.lower() if lowercase else text, return_str=True, escape=False)


_MOSES_TOKENIZERS: dict[str, Any] = {}


def preprocess_text(text: str, preprocess: str | None, lang: str | None) -> str:
    """`text` in language `lang` after `preprocess` (a `VaswaniConfig.preprocess` value; None: unchanged)."""
    if preprocess == "lowercase_moses":
        return moses_tokenize(text, lang)
    return text


def text_preprocessing(preprocess: str | None, lang: str | None) -> Callable[[str], str] | None:
    """`preprocess_text` for one language as a function of the text; None when `preprocess` leaves text as it is."""
    return None if preprocess is None else functools.partial(preprocess_text, preprocess=preprocess, lang=lang)


def preprocess_source(text: str, config) -> str:
    """Raw source text as the model saw its training text (`config.preprocess`; unchanged when None)."""
    return preprocess_text(text, getattr(config, "preprocess", None), getattr(config, "source_lang", None))


def encode_source(tokenizer, text: str, max_tokens: int, truncation: bool = True, config=None) -> list[int]:
    """Token ids of one source sentence (with the tokenizer's end-of-sentence token), cut to `max_tokens` with a
    warning when longer (or a `ValueError` when `truncation` is False). With the model's `config`, the text is
    first preprocessed as the training text was (`preprocess_source`)."""
    text = preprocess_source(text, config)
    ids = tokenizer(text)["input_ids"]
    if len(ids) <= max_tokens:
        return ids
    preview = text if len(text) <= 60 else text[:57] + "..."
    if not truncation:
        raise ValueError(
            f"source of {len(ids)} tokens is longer than the model's max_position_embeddings={max_tokens}: {preview!r}"
        )
    logger.warning(
        "source of %d tokens truncated to the model's max_position_embeddings=%d: %r", len(ids), max_tokens, preview
    )
    return tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]


def right_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int | None):
    """The same batch with every row's tokens moved to the left and padding on the right (the model numbers
    positions from the first column, so left padding would shift them)."""
    if attention_mask.shape[0] == 0 or bool(attention_mask[:, 0].all()):
        return input_ids, attention_mask  # already right-padded (or unpadded)
    lengths = attention_mask.sum(dim=1)
    aligned = input_ids.new_full(input_ids.shape, 0 if pad_token_id is None else pad_token_id)
    mask = torch.zeros_like(attention_mask)
    for row, length in enumerate(lengths.tolist()):
        aligned[row, :length] = input_ids[row][attention_mask[row].bool()]
        mask[row, :length] = 1
    return aligned, mask


def register_translation_pipeline() -> None:
    """Make ``pipeline("translation", ...)`` build a :class:`TranslationPipeline` in this process.

    Registers the task with ``AutoModelForSeq2SeqLM`` as its model class through the public
    ``PIPELINE_REGISTRY.register_pipeline``. Recent transformers releases (5.23) also list "translation" in
    ``transformers.pipelines.REMOVED_TASKS`` (a module constant, not documented API) and raise before looking at the
    model: the entry is removed when that dict exists; 5.17 has no such dict and nothing to remove. Idempotent.
    ``translation_xx_to_yy`` task names stay unsupported."""
    import transformers.pipelines as pipelines

    removed_tasks = getattr(pipelines, "REMOVED_TASKS", None)
    if isinstance(removed_tasks, dict):
        removed_tasks.pop(TASK, None)
    registered = pipelines.PIPELINE_REGISTRY.supported_tasks.get(TASK)
    if registered is None or registered.get("impl") is not TranslationPipeline:
        pipelines.PIPELINE_REGISTRY.register_pipeline(
            TASK, pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM
        )


def custom_pipelines_entry() -> dict[str, Any]:
    """The config.json ``custom_pipelines`` value that routes ``pipeline("translation", trust_remote_code=True)``
    to the copy of this file next to the weights."""
    impl = f"{Path(PIPELINE_FILE).stem}.{TranslationPipeline.__name__}"
    return {TASK: {"impl": impl, "pt": ["AutoModelForSeq2SeqLM"]}}


def save_for_pipeline(model=None, tokenizer=None, save_directory: str | os.PathLike = None) -> Path:
    """Make `save_directory` loadable with stock transformers as
    ``pipeline("translation", model=save_directory, trust_remote_code=True)``, where vaswani_mt is not installed.

    Saves `model` and `tokenizer` there when given (either may be None when the folder already holds it, e.g. a
    checkpoint the trainer just wrote), copies this file as ``pipeline_vaswani.py`` and adds ``custom_pipelines``
    to config.json, keeping everything else in it. Safe to call again on the same folder. A model whose class is
    not built into transformers is registered for the Auto classes first, so its code is saved beside the weights
    (``auto_map``). Raises `ValueError` when the folder ends up without a config.json, without an ``auto_map`` for a
    custom model, or without tokenizer files. Returns the folder.

    Note: a folder with ``custom_pipelines`` needs ``trust_remote_code=True`` in ``pipeline()`` even when vaswani_mt
    is imported (transformers checks that before anything else), unless ``pipeline_class=TranslationPipeline`` is
    passed."""
    if save_directory is None:
        raise TypeError("save_for_pipeline() needs save_directory")
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    if model is not None:
        _register_custom_classes(model)
        model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} has no config.json: pass the model to save_for_pipeline(model, ...)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if not _is_builtin_model_type(config.get("model_type")):
        auto_map = config.get("auto_map") or {}
        missing = [name for name in ("AutoConfig", "AutoModelForSeq2SeqLM") if name not in auto_map]
        if missing:
            raise ValueError(
                f"{config_path} has no auto_map entry for {missing}, so stock transformers cannot load the model "
                "code: pass the model to save_for_pipeline(model, ...) (after `import vaswani_mt`)"
            )
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{folder} has no tokenizer files: pass the tokenizer to save_for_pipeline(..., tokenizer)")

    for name, content in pipeline_code_changes(folder, keep_existing=model is None).items():
        tmp = folder / (name + ".tmp")
        tmp.write_bytes(content)
        os.replace(tmp, folder / name)
    return folder


def pipeline_code_changes(folder: str | os.PathLike, keep_existing: bool = True) -> dict[str, bytes]:
    """What makes a saved model folder (with its config.json) work with ``pipeline("translation", model=folder,
    trust_remote_code=True)``, as ``{file name: content}``: this file as ``pipeline_vaswani.py`` and config.json with
    ``custom_pipelines``, each only when the folder lacks it — or, with `keep_existing=False` (a model being saved
    now), also when the folder's pipeline file differs from this one. The one rule behind `save_for_pipeline`, the
    final model of `vaswani-mt train`, the Trainer's Hub pushes and `vaswani-mt push` (which uploads the changes
    without writing them, and keeps a run's own pipeline file: the code its model was saved with)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    changes: dict[str, bytes] = {}
    source, target = Path(__file__).resolve(), folder / PIPELINE_FILE
    if not target.is_file() or (not keep_existing and target.read_bytes() != source.read_bytes()):
        changes[PIPELINE_FILE] = source.read_bytes()
    pipelines = config.get("custom_pipelines") or {}
    if any(pipelines.get(task) != entry for task, entry in custom_pipelines_entry().items()):
        config["custom_pipelines"] = {**pipelines, **custom_pipelines_entry()}
        changes["config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")
    return changes


def _is_builtin_model_type(model_type: str | None) -> bool:
    """Whether transformers ships `model_type` (its code needs no auto_map). CONFIG_MAPPING_NAMES is a module constant
    of transformers' auto classes, not documented API: without it, only our own type counts as not built in."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return model_type is not None and model_type != "vaswani"
    return model_type in CONFIG_MAPPING_NAMES


def _register_custom_classes(model) -> None:
    """Have save_pretrained write `auto_map` and the model code for a model class transformers does not ship."""
    if type(model).__module__.startswith("transformers.") or _is_builtin_model_type(
        getattr(model.config, "model_type", None)
    ):
        return
    if getattr(type(model.config), "_auto_class", None) is None:
        type(model.config).register_for_auto_class()
    if getattr(type(model), "_auto_class", None) is None:
        type(model).register_for_auto_class("AutoModelForSeq2SeqLM")


__all__ = [
    "TranslationPipeline",
    "VaswaniTranslationPipeline",
    "register_translation_pipeline",
    "save_for_pipeline",
    "custom_pipelines_entry",
    "pipeline_code_changes",
    "encode_source",
    "moses_tokenize",
    "preprocess_source",
    "preprocess_text",
    "text_preprocessing",
    "right_align",
]
