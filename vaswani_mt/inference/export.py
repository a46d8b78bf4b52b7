"""`vaswani-mt export --to ctranslate2 MODEL OUT [--quantization int8]`: a CTranslate2 model for fast CPU/GPU inference.

Built with CTranslate2's specification API (``TransformerSpec.from_config`` filled from our weights), so it needs no
Hugging Face architecture on the CTranslate2 side. Everything our model computes is represented exactly:

* post-norm (the paper) and pre-norm (``pre_norm=True`` with the stacks' final LayerNorms);
* the paper's interleaved sinusoidal positions, passed as an explicit table (CTranslate2's built-in sinusoids use
  another layout) with ``max_position_embeddings`` rows, which is also the longest sequence the export accepts;
* embedding scaling by sqrt(d_model) (or none), shared or separate source/target embeddings, tied or untied output
  projection (CTranslate2 stores identical arrays once);
* ``final_logits_bias`` as the bias of the output projection;
* q/k/v fused as CTranslate2 expects (self-attention q;k;v, cross-attention q and k;v), biases included.

CTranslate2 is an optional dependency: ``pip install "vaswani-mt[ctranslate2]"``.

The export folder holds the tokenizer and the model's decoding defaults (`DECODING_FILE`: its generation config's
beam size and length penalty, at most source length + 50 tokens), so ``vaswani-mt translate OUT`` translates with CTranslate2 as
``vaswani-mt translate MODEL`` does with PyTorch (`ExportedModel`). From Python::

    translator = ctranslate2.Translator(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)    # with the tokenizer's </s>
    result = translator.translate_batch([tokens], beam_size=4, length_penalty=0.6, min_decoding_length=0,
                                        max_decoding_length=len(tokens) + 50)
    text = tokenizer.decode(tokenizer.convert_tokens_to_ids(result[0].hypotheses[0]), skip_special_tokens=True)

Without ``max_decoding_length`` CTranslate2 decodes up to 256 tokens, which a weak model fills with repetitions.

Speed on CPU: CTranslate2 4.8 uses its AVX2 kernels even on CPUs with AVX-512 unless ``CT2_FORCE_CPU_ISA=AVX512``
is in the process environment before ctranslate2 is used (on this project's Intel machine int8 beam search gained
a few per cent, float32 nothing clear; docs/speed.md); for throughput on few cores, several workers of one
thread (``inter_threads``) beat one worker with several threads.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..model.convert import refuse_other_head_sizes
from ..model.modeling_vaswani import OUTPUT_LENGTH_MARGIN, checked_length_penalty_style, length_penalty_style
from ..model.pipeline_vaswani import text_preprocessing
from .translate import (TranslateError, decoded_lines, decoding_defaults, fitting_new_tokens, load_model_and_tokenizer,
                        translate_stream)

logger = logging.getLogger(__name__)

INSTALL_HINT = 'CTranslate2 export needs the ctranslate2 package: pip install "vaswani-mt[ctranslate2]"'
# Beside model.bin: the decoding defaults of the exported model, which `vaswani-mt translate EXPORT` uses.
DECODING_FILE = "vaswani_decoding.json"
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")

# transformers activation name -> CTranslate2 Activation member name
_ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_fast": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "gelu_python": "GELU",
    "swish": "SWISH",
    "silu": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}


def _import_ctranslate2():
    try:
        import ctranslate2
        import ctranslate2.converters  # noqa: F401
        import ctranslate2.specs  # noqa: F401
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return ctranslate2


class _Weights:
    """float32 numpy copies of tensors, one array per storage, so tied weights stay one array."""

    def __init__(self):
        self._cache: dict[tuple, object] = {}

    def __call__(self, tensor: torch.Tensor):
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if key not in self._cache:
            # a copy: CTranslate2 quantizes the arrays in place, which rewrote a float32 model's own weights
            self._cache[key] = tensor.detach().to("cpu", torch.float32).contiguous().numpy().copy()
        return self._cache[key]


def build_spec(model, tokens: list[str]):
    """The `ctranslate2.specs.TransformerSpec` of a `VaswaniForConditionalGeneration`, with vocabulary `tokens`
    (index = token id) registered as source and target vocabulary."""
    _import_ctranslate2()
    from ctranslate2.converters import utils
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    if config.encoder_attention_heads != config.decoder_attention_heads:
        raise ValueError(
            "CTranslate2's Transformer has one head count for encoder and decoder; this model has "
            f"{config.encoder_attention_heads} and {config.decoder_attention_heads}"
        )
    refuse_other_head_sizes(config, "CTranslate2")
    if config.activation_function not in _ACTIVATIONS:
        raise ValueError(f"activation {config.activation_function!r} has no CTranslate2 equivalent")
    activation = getattr(common_spec.Activation, _ACTIVATIONS[config.activation_function])
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers),
        config.encoder_attention_heads,
        pre_norm=config.norm_style == "pre",
        no_final_norm=False,
        activation=activation,
    )
    weights = _Weights()
    core = model.model
    # CTranslate2 looks positions up in a table: the sinusoids, or each stack's learned table (Table 3 (E))
    learned = config.position_embedding == "learned"
    encoder_positions, decoder_positions = (
        weights(stack.embed_positions.weight if learned else stack.embed_positions.table)
        for stack in (core.encoder, core.decoder))
    scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

    def linear(target, module):
        target.weight = weights(module.weight)
        if module.bias is not None:
            target.bias = weights(module.bias)

    def layer_norm(target, module):
        target.gamma = weights(module.weight)
        target.beta = weights(module.bias)

    def self_attention(target, attention):
        parts = [common_spec.LinearSpec() for _ in range(3)]
        for part, module in zip(parts, (attention.q_proj, attention.k_proj, attention.v_proj)):
            linear(part, module)
        utils.fuse_linear(target.linear[0], parts)
        linear(target.linear[1], attention.out_proj)

    def cross_attention(target, attention):
        query, key, value = (common_spec.LinearSpec() for _ in range(3))
        linear(query, attention.q_proj)
        linear(key, attention.k_proj)
        linear(value, attention.v_proj)
        utils.fuse_linear(target.linear[0], [query])
        utils.fuse_linear(target.linear[1], [key, value])
        linear(target.linear[2], attention.out_proj)

    def ffn(target, module, norm):
        linear(target.linear_0, module.fc1)
        linear(target.linear_1, module.fc2)
        layer_norm(target.layer_norm, norm)

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = weights(core.encoder.embed_tokens.weight)
    encoder.scale_embeddings = scale
    encoder.position_encodings.encodings = encoder_positions
    if core.encoder.layer_norm is not None:
        layer_norm(encoder.layer_norm, core.encoder.layer_norm)
    for target, layer in zip(encoder.layer, core.encoder.layers):
        self_attention(target.self_attention, layer.self_attn)
        layer_norm(target.self_attention.layer_norm, layer.self_attn_layer_norm)
        ffn(target.ffn, layer.ffn, layer.final_layer_norm)

    decoder.embeddings.weight = weights(core.decoder.embed_tokens.weight)
    decoder.scale_embeddings = scale
    decoder.position_encodings.encodings = decoder_positions
    if core.decoder.layer_norm is not None:
        layer_norm(decoder.layer_norm, core.decoder.layer_norm)
    for target, layer in zip(decoder.layer, core.decoder.layers):
        self_attention(target.self_attention, layer.self_attn)
        layer_norm(target.self_attention.layer_norm, layer.self_attn_layer_norm)
        cross_attention(target.attention, layer.encoder_attn)
        layer_norm(target.attention.layer_norm, layer.encoder_attn_layer_norm)
        ffn(target.ffn, layer.ffn, layer.final_layer_norm)
    decoder.projection.weight = weights(model.lm_head.weight)
    bias = getattr(model, "final_logits_bias", None)
    if bias is not None and bool(bias.any()):
        decoder.projection.bias = weights(bias.reshape(-1))

    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def vocabulary(model, tokenizer) -> list[str]:
    """Token strings by id, as long as the model's vocabulary (ids the tokenizer lacks get placeholder names)."""
    size = model.config.vocab_size
    if len(tokenizer) > size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model only {size}")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    tokens += [f"<unused_{i}>" for i in range(len(tokens), size)]
    if len(set(tokens)) != len(tokens):
        duplicates = {t for t in tokens if tokens.count(t) > 1}
        raise ValueError(f"CTranslate2 needs distinct token strings; these repeat: {sorted(duplicates)[:5]}")
    return tokens


def _set_special_tokens(spec, model, tokenizer, tokens: list[str]) -> None:
    config = model.config

    def token(token_id, fallback):
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else fallback

    def named(name, default):
        return (getattr(tokenizer, name, None) if tokenizer is not None else None) or default

    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    spec.config.unk_token = named("unk_token", "<unk>")
    spec.config.bos_token = token(config.bos_token_id, named("bos_token", "<s>"))
    spec.config.eos_token = token(eos, named("eos_token", "</s>"))
    spec.config.decoder_start_token = token(config.decoder_start_token_id, spec.config.bos_token)
    if spec.config.unk_token not in tokens:
        raise ValueError(f"the unknown token {spec.config.unk_token!r} is not in the vocabulary")


def export_ctranslate2(model_or_dir, out_dir, quantization: str | None = None, tokenizer=None,
                       force: bool = False, tokens: list[str] | None = None) -> Path:
    """Write a CTranslate2 model of `model_or_dir` (a saved model folder, or a `VaswaniForConditionalGeneration`
    plus `tokenizer=`) to `out_dir`, with the tokenizer saved beside it. Without a tokenizer, `tokens` (the token
    string of every id, e.g. for benchmarks with random weights) gives the vocabulary.

    `quantization`: None (keep float32) or one of CTranslate2's types, e.g. "int8" (weights stored as int8; compute
    type chosen by CTranslate2 at load time). Refuses an existing, non-empty `out_dir` unless `force`, and even then
    replaces only a previous export (`check_output_folder`). Returns `out_dir`.
    """
    _import_ctranslate2()
    from ctranslate2.converters import Converter

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    source = Path(model_or_dir) if isinstance(model_or_dir, (str, Path)) else None
    force = check_output_folder(Path(out_dir), source, force)
    if source is not None:
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is not a saved model folder (no config.json)")
        try:
            model, folder_tokenizer = load_model_and_tokenizer(str(source), "cpu")
        except TranslateError as error:
            raise ValueError(str(error)) from None
        tokenizer = tokenizer if tokenizer is not None else folder_tokenizer
    else:
        model = model_or_dir
        if tokenizer is None and tokens is None:
            raise ValueError("pass tokenizer= when exporting a model object")
    if getattr(model.config, "model_type", None) != "vaswani":
        raise ValueError(f"expected a vaswani model, got model_type={getattr(model.config, 'model_type', None)!r}")
    if tokenizer is not None:
        tokens = vocabulary(model, tokenizer)
    elif len(tokens) != model.config.vocab_size or len(set(tokens)) != len(tokens):
        raise ValueError(f"tokens must be {model.config.vocab_size} distinct strings, got {len(tokens)}")

    class VaswaniConverter(Converter):
        def _load(self):
            spec = build_spec(model, tokens)
            _set_special_tokens(spec, model, tokenizer, tokens)
            return spec

    if length_penalty_style(model.generation_config) == "gnmt":
        logger.warning("CTranslate2 scores beams with length ** length_penalty; this model's GNMT length penalty "
                       "(length_penalty_style='gnmt') has no counterpart there, so the export's beam search may choose "
                       "other translations than generate()")
    out = Path(out_dir)
    with torch.no_grad():
        VaswaniConverter().convert(str(out), quantization=quantization, force=force)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    (out / DECODING_FILE).write_text(json.dumps(export_decoding(model), indent=2) + "\n", encoding="utf-8")
    return out


def export_decoding(model) -> dict:
    """What `vaswani-mt translate EXPORT` needs to decode as `model.generate()` does: `decoding_defaults`, the output
    limit when none is fixed (the padded source length + `length_margin`, at most `max_position_embeddings`), and the
    raw input's preprocessing when the model has one."""
    defaults = {**decoding_defaults(model), "length_margin": OUTPUT_LENGTH_MARGIN,
                "max_position_embeddings": model.config.max_position_embeddings}
    if getattr(model.config, "preprocess", None):  # what raw input goes through first (VaswaniConfig.preprocess)
        defaults.update(preprocess=model.config.preprocess, source_lang=model.config.source_lang,
                        target_lang=getattr(model.config, "target_lang", None))
    return defaults


# Files a CTranslate2 export of ours holds: the converter's and the tokenizer's. Anything else in a folder means it is
# not (only) an export, and --force must not delete it.
_EXPORT_FILES = re.compile(r"^(model\.bin|config\.json|" + re.escape(DECODING_FILE) + r"|\w*vocabulary\.(json|txt)"
                           r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|chat_template\.\w+)$")


def check_output_folder(out: Path, source: Path | None, force: bool) -> bool:
    """Refuse an output folder whose replacement would destroy work: the model folder itself or a folder holding it
    (CTranslate2's --force deletes the folder first), a file, or, with `force`, any non-empty folder that is not a
    previous export (only model.bin, config.json, vocabularies and tokenizer files). Returns the `force` to pass to
    CTranslate2 (True for an existing empty folder: nothing to lose)."""
    if source is not None and (out.resolve() == source.resolve() or out.resolve() in source.resolve().parents):
        what = "the model folder" if out.resolve() == source.resolve() else "a folder holding the model folder"
        raise ValueError(f"output folder {out} is {what} {source}: the export would delete the model; choose a new "
                         "folder")
    if not out.exists():
        return force
    if not out.is_dir():
        raise ValueError(f"output {out} exists and is not a folder")
    entries = sorted(out.iterdir())
    if not entries:
        return True
    if not force:
        raise ValueError(f"output folder {out} already exists: pass --force to replace a previous export")
    others = [entry.name for entry in entries if entry.is_dir() or not _EXPORT_FILES.match(entry.name)]
    if others or not (out / "model.bin").is_file():
        listed = ", ".join(others[:5]) if others else "no model.bin"
        raise ValueError(f"--force replaces only a previous CTranslate2 export, and {out} is not one ({listed}); "
                         "choose another folder")
    return True


def _translator(ctranslate2, model_dir, **options):
    """A `ctranslate2.Translator` (on the CPU unless `device=` says otherwise) that leaves torch's thread count
    alone: creating one sets the calling thread's OpenMP thread count to its `intra_threads`, which torch (same
    OpenMP runtime) then uses too — a translator with 1 thread silently made every later torch operation in the
    process single-threaded."""
    threads = torch.get_num_threads()
    options.setdefault("device", "cpu")
    translator = ctranslate2.Translator(str(model_dir), **options)
    torch.set_num_threads(threads)
    return translator


def _decoding_file(folder) -> dict | None:
    """The decoding defaults an export was saved with (`DECODING_FILE`), or None for a folder without them."""
    path = Path(folder) / DECODING_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def translate_with_ctranslate2(model_dir, tokenizer, texts: list[str], *, beam_size: int | None = None,
                               length_penalty: float | None = None, max_batch_tokens: int = 2048,
                               compute_type: str = "default", threads: int = 0, **options) -> list[str]:
    """Translate `texts` with an exported model, decoding as our `generate()` does by default: the export's own
    beams and length penalty (`DECODING_FILE`; §6.1's beam 4 and 0.6 for a folder without one), at most (longest
    source + 50) tokens, and an immediate </s> allowed (``min_decoding_length=0``; CTranslate2's default is 1). Raw
    text first goes through the preprocessing the model was trained with (e.g. ``lowercase_moses``), as
    `vaswani-mt translate EXPORT` does. Empty strings give "". Extra keyword arguments go to
    ``Translator.translate_batch``.

    CTranslate2's beam search stops once `beam_size` hypotheses are finished, i.e. it equals transformers'
    ``generate(early_stopping=True)``; with transformers' default (``early_stopping=False``) generate() may search
    a few steps longer and, rarely, return a better-scoring hypothesis."""
    ctranslate2 = _import_ctranslate2()
    decoding = _decoding_file(model_dir) or {}
    beam_size = beam_size or decoding.get("num_beams", 4)
    length_penalty = decoding.get("length_penalty", 0.6) if length_penalty is None else length_penalty
    preprocess = text_preprocessing(decoding.get("preprocess"), decoding.get("source_lang")) or (lambda text: text)
    translator = _translator(ctranslate2, model_dir, compute_type=compute_type, intra_threads=threads)
    keep = [i for i, text in enumerate(texts) if text.strip()]
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(preprocess(texts[i])).input_ids) for i in keep]
    results = [""] * len(texts)
    if not sources:
        return results
    options.setdefault("max_decoding_length", max(len(s) for s in sources) + OUTPUT_LENGTH_MARGIN)
    options.setdefault("min_decoding_length", 0)
    outputs = translator.translate_batch(
        sources, beam_size=beam_size, length_penalty=length_penalty, max_batch_size=max_batch_tokens,
        batch_type="tokens", **options,
    )
    for i, output in zip(keep, outputs):
        ids = tokenizer.convert_tokens_to_ids(output.hypotheses[0])
        results[i] = tokenizer.decode(ids, skip_special_tokens=True)
    return results


def is_export(folder) -> bool:
    """Whether `folder` is a CTranslate2 model folder (what `vaswani-mt export` writes) rather than a saved model."""
    return (Path(folder) / "model.bin").is_file()


class ExportedModel:
    """A CTranslate2 export, ready to translate as `vaswani-mt translate` translates with a saved model: the same
    streaming, batching and order (`translate.translate_stream`), and the exported model's own decoding
    defaults (`DECODING_FILE`), so a float32 export returns what `generate()` returns.

    `device`: "cpu", "cuda" or "cuda:N" (default: cuda when CTranslate2 sees a GPU). On the CPU it computes with
    torch's thread count (`OMP_NUM_THREADS`, `torch.set_num_threads`). Raises ValueError naming what is missing."""

    def __init__(self, folder, device: str | None = None, compute_type: str = "default"):
        ctranslate2 = _import_ctranslate2()
        folder = Path(folder)
        self.decoding = _decoding_file(folder)
        if self.decoding is None:
            raise ValueError(f"{folder} has no {DECODING_FILE} (the model's decoding defaults): export the model "
                             "again with `vaswani-mt export --force`")
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        kind, index = _ctranslate2_device(ctranslate2, device)
        self.translator = _translator(ctranslate2, folder, device=kind, device_index=index,
                                      compute_type=compute_type, intra_threads=torch.get_num_threads())

    def translate_lines(self, lines: Iterable[str], *, num_beams: int | None = None,
                        max_new_tokens: int | None = None, length_penalty: float | None = None,
                        length_penalty_style: str | None = None, **stream_options) -> Iterator[str]:
        """`translate.translate_lines` with this export in place of `generate()`: the same options and
        results (`max_tokens`, `sort_window`, `truncation`, `on_translated`). CTranslate2 has only transformers'
        length penalty (score / length**alpha): `length_penalty_style="gnmt"` is a TranslateError."""
        if checked_length_penalty_style(length_penalty_style) != "transformers":
            raise TranslateError(f"length_penalty_style {length_penalty_style!r}: CTranslate2 has only "
                                 "score / length**alpha ('transformers'); translate with the saved model instead")
        limit = self.decoding["max_position_embeddings"]
        fixed = max_new_tokens or self.decoding["max_new_tokens"]
        fixed = fitting_new_tokens(fixed, limit) if fixed else None
        options = {"beam_size": num_beams or self.decoding["num_beams"], "min_decoding_length": 0,
                   "length_penalty": self.decoding["length_penalty"] if length_penalty is None else length_penalty}

        def translate_batch(sources: list[list[int]]) -> list[str]:
            longest = max(len(ids) for ids in sources)
            length = fixed or min(longest + self.decoding["length_margin"], limit)
            tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in sources]
            results = self.translator.translate_batch(tokens, max_decoding_length=length, **options)
            return self._texts(result.hypotheses[0] for result in results)

        preprocess = text_preprocessing(self.decoding.get("preprocess"), self.decoding.get("source_lang"))
        return translate_stream(translate_batch, self.tokenizer, lines, limit=limit,
                                preprocess=preprocess, **stream_options)

    def _texts(self, hypotheses: Iterable[list[str]]) -> list[str]:
        return decoded_lines(self.tokenizer, [self.tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses])


def _ctranslate2_device(ctranslate2, name: str | None) -> tuple[str, int]:
    """CTranslate2's (device, index) for a torch-style device name: cpu, cuda or cuda:N."""
    gpus = ctranslate2.get_cuda_device_count()
    if name is None:
        return ("cuda", 0) if gpus else ("cpu", 0)
    kind, _, index = name.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind == "cuda" and (index.isdigit() or not index):
        if int(index or 0) < gpus:
            return "cuda", int(index or 0)
        raise ValueError(f"device {name!r} cannot be used: CTranslate2 sees {gpus} CUDA device(s)")
    raise ValueError(f"device {name!r} cannot be used: CTranslate2 runs on cpu, cuda or cuda:N")


__all__ = ["DECODING_FILE", "ExportedModel", "INSTALL_HINT", "build_spec", "export_ctranslate2", "export_decoding",
           "is_export", "translate_with_ctranslate2", "vocabulary"]
