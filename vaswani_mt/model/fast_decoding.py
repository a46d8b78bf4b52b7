"""vaswani_mt's decoding loops for `VaswaniForConditionalGeneration`: greedy search and beam search that return
exactly what transformers' own loops return, with less work per step; and GNMT's length penalty (§6.1).

This module belongs to the installed package only: it is never copied beside a saved model. `vaswani_mt/__init__.py`
puts `FAST_DECODING` into `VaswaniForConditionalGeneration.decoding_loops`; a folder loaded as remote code (without
the package, or with `trust_remote_code=True`) decodes with transformers' loops alone, so what was saved keeps
decoding right on transformers releases newer than itself. Here the loops reach transformers through its public
`generate(custom_generate=<callable>)`: generate() still does all the preparation (arguments, lengths, logits
processors, stopping criteria, the encoder run, beam expansion) and calls our loop instead of its own, only when
nothing the loop does not cover is asked for (`call_blocker`, `fast_decoding_blocker`).

Where the time goes in transformers' loop on a small model (d_model 256, 64 sentences x beam 4) and what replaces it:
- the encoder-decoder keys/values are stored once per beam and re-gathered every step (`reorder_cache`), although
  a sentence's beams share them: `IncrementalDecoder` computes them once per *sentence*, and the beams of a sentence
  attend to them as a group (§3.2.3 "encoder-decoder attention"), so there is nothing to reorder;
- the self-attention cache grows by `torch.cat` and every row's keys/values are gathered into new tensors at
  every step, as beams are reordered: here they live in preallocated buffers, one slot per position and beam of a
  sentence, and never move; a row attends to the slots of its own history, tracked by a small mask ("lineage")
  that is what gets reordered;
- the decoder forward builds masks and output records each step: a decoding step has one query per row and no
  mask but the source padding (and, in beam search, the lineage mask above), so the step is a few matrix products
  (q, k and v projected by one product);
- min-length logits processors clone and rewrite the whole [rows, vocab] score matrix each step: here the EOS
  column is set to -inf in place;
- beam search decodes every sentence until the last one is done, although a sentence's result is final once its
  early-stop heuristic is satisfied (29 % of the sentence-steps when translating Multi30k test2016): here such
  sentences leave the batch (their caches are compacted when at least 1/8 of the batch is final), unless a logits
  processor or stopping criterion other than min/max length and EOS is in use.
The beam bookkeeping (top-k continuations, finished hypotheses, the early-stop heuristic) calls transformers' own
helpers, so scores, ties and stopping are theirs.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.generation.utils import GenerationMixin

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration

logger = logging.getLogger(__name__)

# transformers' private names the loops rely on — no public API lets a loop reuse the beam bookkeeping — and what
# happens when one is missing or changed:
# * the beam bookkeeping helpers in `BEAM_HELPERS`, called by `beam_search`: checked (present, these parameters)
#   before each fast beam search; on a mismatch, transformers' beam search runs.
# * `generation_config._pad_token_tensor` / `._eos_token_tensor`, set by generate() before the loop: checked per call.
# * `GenerationMixin._sample` / `_beam_search`: called only when generate() hands our loop a call it cannot run
#   after all (`fast_decoding_blocker`), so that transformers' loop runs it.
# * torch's private MKL ops behind `DecodeLinear` (torch.ops.mkl._mkl_*): checked once per process against
#   `F.linear`; plain products otherwise.
# Signatures are not enough (transformers 5.24 kept them and changed what `_get_top_k_continuations` does), so before
# the first fast decoding of a process on each device type, dtype and norm style, `loops_agree_with_transformers`
# decodes a small model of that kind both ways (greedy, beam search, GNMT scoring) and compares the tokens; on any
# difference transformers' loops decode such models for the rest of the process. In half precision the two loops'
# products round differently by their shapes, which a small check model may not show: there transformers' loops
# always decode (`fast_decoding_blocker`). Each fallback logs one
# warning per reason; tests/test_transformers_compat.py removes or changes every name and checks that generate()
# then returns transformers' own result.
BEAM_HELPERS = {
    "_gather_beams": ("tensor", "beam_indices"),
    "_get_running_beams_for_next_iteration": ("topk_log_probs", "topk_running_sequences", "topk_running_beam_indices",
                                              "next_token_hits_stopping_criteria", "num_beams"),
    "_update_finished_beams": ("sequences", "topk_running_sequences", "beam_scores", "topk_log_probs", "beam_indices",
                               "topk_running_beam_indices", "is_early_stop_heuristic_unsatisfied", "is_sent_finished",
                               "next_token_hits_stopping_criteria", "top_num_beam_mask", "num_beams", "cur_len",
                               "decoder_prompt_len", "length_penalty", "early_stopping"),
    "_check_early_stop_heuristic": ("is_early_stop_heuristic_unsatisfied", "running_beam_scores", "beam_scores",
                                    "is_sent_finished", "cur_len", "max_length", "decoder_prompt_len", "early_stopping",
                                    "length_penalty"),
    "_beam_search_has_unfinished_sequences": ("is_early_stop_heuristic_unsatisfied", "is_sent_finished",
                                              "next_token_hits_stopping_criteria", "early_stopping"),
}
_GENERATION_CONFIG_TENSORS = {"greedy": ("_pad_token_tensor",), "beam": ("_pad_token_tensor", "_eos_token_tensor")}
_TRANSFORMERS_LOOPS = {"greedy": "_sample", "beam": "_beam_search"}
_warned: set[str] = set()


class FastDecoding:
    """What the installed package puts into `VaswaniForConditionalGeneration.decoding_loops`: one generate() call,
    decoded by our loop when it can (else by transformers'), scored with the call's length penalty style."""

    def generate(self, model: nn.Module, transformers_generate, inputs, generation_config, style: str, kwargs: dict):
        with gnmt_scoring(model, style):
            if hands_over(model, generation_config, kwargs) is None:
                kwargs = {**kwargs, "custom_generate": decoding_loop}
            return transformers_generate(inputs, generation_config=generation_config, **kwargs)


FAST_DECODING = FastDecoding()

# The generation modes whose loop is transformers' `_sample` or `_beam_search`: generate() may hand such a call to
# our loop, which runs it (greedy, beam search) or passes it on to that transformers loop. Any other mode (assisted
# decoding, the modes transformers loads from the Hub) never reaches our loop.
_LOOPS_OF_MODES = {"greedy_search": "greedy", "sample": "greedy", "beam_search": "beam", "beam_sample": "beam"}
# Generation settings whose effect lives outside the decoding loop or is reproduced here; any other output option
# sends the call to transformers' loop.
_OUTPUT_OPTIONS = ("return_dict_in_generate", "output_scores", "output_logits", "output_attentions",
                   "output_hidden_states")


def hands_over(model: nn.Module, generation_config, kwargs: dict) -> str | None:
    """Why a generate() call stays wholly with transformers (a short reason), or None when generate() may hand its
    decoding loop to ours. What the loop then does is decided on the settings generate() prepared (`decoding_loop`);
    here only what must be known before: a streamer (generate() passes none to a custom loop, and checks it against
    beam search only without one), an assistant, a custom loop of the caller's, and a mode with another loop, judged
    on the model's and the call's generation config alike (generate() merges the two)."""
    if not getattr(model, "use_fast_decoding", True):
        return "use_fast_decoding is off"
    missing = next((name for name in _TRANSFORMERS_LOOPS.values() if not hasattr(GenerationMixin, name)), None)
    if missing is not None:  # our loop could not hand a call back: transformers decodes every call on its own
        _warn_once(f"transformers has no GenerationMixin.{missing} to hand a call back to")
        return f"no GenerationMixin.{missing}"
    for name in ("streamer", "assistant_model", "custom_generate", "synced_gpus"):
        if kwargs.get(name):
            return name
    for config in {id(c): c for c in (model.generation_config, generation_config) if c is not None}.values():
        effective = copy.deepcopy(config)
        effective.update(**kwargs)
        mode = getattr(effective.get_generation_mode(), "value", None)
        if mode not in _LOOPS_OF_MODES:
            return f"generation mode {mode}"
    return None


def decoding_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """The decoding loop generate() runs for a call it handed over (`custom_generate`): ours (greedy or beam search)
    when it covers what generate() prepared, else transformers' loop for the call's mode."""
    mode = getattr(generation_config.get_generation_mode(), "value", None)
    loop = _LOOPS_OF_MODES.get(mode)
    reason = "generation mode %s" % mode if loop is None else fast_decoding_blocker(
        model, input_ids, generation_config, model_kwargs, model_kwargs.pop("synced_gpus", False), loop)
    if reason is None and loops_agree_with_transformers(model):
        if loop == "greedy":
            return greedy_search(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                 **model_kwargs)
        return beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs)
    name = _TRANSFORMERS_LOOPS.get(loop)
    transformers_loop = getattr(GenerationMixin, name, None) if name else None
    if transformers_loop is None:
        raise RuntimeError(f"vaswani_mt cannot decode this call ({reason}) and transformers "
                           f"{transformers.__version__} has no GenerationMixin.{name} to hand it to: set "
                           "model.use_fast_decoding = False")
    return transformers_loop(model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                             generation_config=generation_config, synced_gpus=False, **model_kwargs)


# --- the loops checked against transformers' by what they decode --------------------------------------------------
_agreement: dict[tuple, bool] = {}
_checking: ContextVar[bool] = ContextVar("vaswani_mt_checking_loops", default=False)
# The check model: small enough to decode in milliseconds, big enough that beams differ and hypotheses end early
# and late; random weights from a fixed seed (the caller's random stream is left where it was).
_CHECK_CONFIG = dict(vocab_size=48, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                     dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
_CHECK_CALLS = (dict(num_beams=1), dict(num_beams=3, num_return_sequences=2, length_penalty=1.0),
                dict(num_beams=4, length_penalty=0.6, early_stopping=True, min_new_tokens=3),
                dict(num_beams=4, length_penalty=1.0, length_penalty_style="gnmt"))


def loops_agree_with_transformers(model: nn.Module) -> bool:
    """Whether our loops decode a check model like `model` (its device type, dtype, norm style, head sizes and
    position embedding) exactly as
    transformers' loops do, greedy and beam search; checked once per process, kind of model and set of transformers'
    generation methods. On a difference, one warning, and transformers' loops decode such models from then on."""
    if _checking.get():
        return True  # the check itself decodes with our loops
    config = model.config
    own_head_sizes = config.d_k is not None or config.d_v is not None  # d_k, d_v not d_model / h: Table 3 (B)
    kind = (model.device.type, model.dtype, config.norm_style, own_head_sizes, config.position_embedding)
    key = (transformers.__version__, *map(id, vars(GenerationMixin).values()), *kind)  # a patched helper: again
    if key not in _agreement:
        token = _checking.set(True)
        try:
            _agreement[key] = _decode_check_model(*kind)
            problem = "decode differently from"
        except Exception as error:  # noqa: BLE001 - any failure of the check means: do not use our loops
            _agreement[key], problem = False, f"failed ({type(error).__name__}: {error}) beside"
        finally:
            _checking.reset(token)
        if not _agreement[key]:
            device, dtype, norm_style, own_head_sizes, positions = kind
            _warn_once(f"vaswani_mt's decoding loops {problem} transformers {transformers.__version__}'s own on a "
                       f"check model ({device}, {str(dtype).removeprefix('torch.')}, {norm_style}-norm, "
                       f"{'own d_k/d_v, ' if own_head_sizes else ''}{positions} positions)")
    return _agreement[key]


def _decode_check_model(device_type: str = "cpu", dtype: torch.dtype = torch.float32, norm_style: str = "post",
                        own_head_sizes: bool = False, position_embedding: str = "sinusoidal") -> bool:
    """Our loops and transformers' (with its cache, as generate() runs them without us, and without it, the reference
    that depends on nothing but the model's forward) decode a seeded small model alike. Half-precision models never
    get here: they decode with transformers' loops (`fast_decoding_blocker`)."""
    shape = dict(norm_style=norm_style, position_embedding=position_embedding)
    if own_head_sizes:
        shape.update(d_k=4, d_v=12)  # neither d_model / h = 8 nor equal to each other
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(20170612)
        model = VaswaniForConditionalGeneration(VaswaniConfig(**_CHECK_CONFIG, **shape)).eval()
        source = torch.randint(3, _CHECK_CONFIG["vocab_size"], (3, 7))
    model.to(device=device_type, dtype=dtype)
    source[:, -1] = model.config.eos_token_id
    mask = torch.ones_like(source)
    mask[1, :3] = 0  # one padded source (left padding: the tokenizer's side does not matter to the encoder)
    source[1, :3] = model.config.pad_token_id
    source, mask = source.to(model.device), mask.to(model.device)
    for call in _CHECK_CALLS:
        ours = model.generate(source, attention_mask=mask, max_new_tokens=12, **call)
        model.use_fast_decoding = False
        try:
            for use_cache in (True, False):
                theirs = model.generate(source, attention_mask=mask, max_new_tokens=12, use_cache=use_cache, **call)
                if ours.shape != theirs.shape or not torch.equal(ours, theirs):
                    return False
        finally:
            model.use_fast_decoding = True
    return True


# --- the length penalty of §6.1 ----------------------------------------------------------------------------------
# §6.1 uses GNMT's length penalty (Wu et al. 2016, eq. 14): a finished hypothesis scores log P(Y|X) / lp(Y) with
# lp(Y) = ((5 + |Y|) / 6) ** alpha; transformers divides by |Y| ** alpha. `generation_config.length_penalty_style`
# picks the formula ("transformers", the default, or "gnmt"; alpha is `length_penalty`). Both beam loops, ours and
# transformers', score hypotheses through the model's `_update_finished_beams` and `_check_early_stop_heuristic`
# (transformers' helpers): for a "gnmt" call the model gets its own versions of the two for the call's duration,
# which divide by the GNMT penalty first and pass length_penalty=0 on, so transformers' own division is by
# |Y| ** 0 = 1. |Y| counts the generated tokens, end-of-sentence included.
def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6) ** alpha (GNMT, eq. 14); `length` a number or a tensor."""
    return ((5.0 + length) / 6.0) ** alpha


_gnmt_call: ContextVar[bool] = ContextVar("vaswani_mt_gnmt_call", default=False)


class _GnmtHook:
    """A model's own `name` helper: transformers' helper of the model's class, which scores with GNMT's penalty
    during a "gnmt" generate() call of this thread or task (`_gnmt_call`) and is left as it is otherwise. Holds the
    model, not a bound method, so that copies and pickles of the model carry a hook of their own."""

    def __init__(self, model: nn.Module, name: str):
        self.model, self.name = model, name

    def __call__(self, *args, **kwargs):
        cls = type(self.model)
        helper = inspect.getattr_static(cls, self.name).__get__(self.model, cls)  # bound as the class binds it
        if not _gnmt_call.get():
            return helper(*args, **kwargs)
        return with_gnmt_penalty(self.name, helper, args, kwargs)


@contextmanager
def gnmt_scoring(model: nn.Module, style: str):
    """Inside, beam search on `model` scores finished hypotheses with GNMT's penalty when `style` is "gnmt"."""
    if style != "gnmt":
        yield
        return
    missing = [name for name in _GNMT_HOOKS if not hasattr(GenerationMixin, name)]
    if missing:
        _warn_once(f"transformers has no GenerationMixin.{missing[0]}: the GNMT length penalty cannot be applied, "
                   "beams are scored with length ** length_penalty", prefix="vaswani_mt: ")
        yield
        return
    for name in _GNMT_HOOKS:  # the instance's own attribute wins over the class's method; installed once
        if not isinstance(model.__dict__.get(name), _GnmtHook):
            model.__dict__[name] = _GnmtHook(model, name)
    token = _gnmt_call.set(True)
    try:
        yield
    finally:
        _gnmt_call.reset(token)


# transformers' helper -> (the parameter the GNMT penalty divides, how transformers counts |Y| from the parameters)
_GNMT_HOOKS = {
    "_update_finished_beams": ("topk_log_probs", lambda a: a["cur_len"] + 1 - a["decoder_prompt_len"]),
    "_check_early_stop_heuristic": ("running_beam_scores", lambda a: (
        a["max_length"] - a["decoder_prompt_len"] if a["early_stopping"] == "never" and a["length_penalty"] > 0
        else a["cur_len"] - a["decoder_prompt_len"])),
}


def with_gnmt_penalty(name: str, transformers_helper, args: tuple, kwargs: dict):
    """transformers' beam helper `name`, scoring with the GNMT penalty (alpha: the call's `length_penalty`).
    A call whose arguments do not bind to the helper's parameters goes to the helper unchanged (with a warning)."""
    parameters = BEAM_HELPERS[name]
    arguments = {**dict(zip(parameters, args)), **kwargs}
    scores, length_of = _GNMT_HOOKS[name]
    if len(args) > len(parameters) or set(arguments) != set(parameters):
        _warn_once(f"GenerationMixin.{name} was called with arguments the GNMT length penalty was not written for; "
                   "beams are scored with length ** length_penalty", prefix="vaswani_mt: ")
        return transformers_helper(*args, **kwargs)
    alpha = float(arguments["length_penalty"])
    arguments[scores] = arguments[scores] / gnmt_length_penalty(length_of(arguments), alpha)
    arguments["length_penalty"] = 0.0
    return transformers_helper(**arguments)


def beam_helpers_mismatch() -> str | None:
    """Why transformers' beam bookkeeping helpers (`BEAM_HELPERS`) do not fit the fast beam search, or None.
    Checked once per set of helper functions (a patched or reloaded transformers is checked again)."""
    helpers = tuple(getattr(GenerationMixin, name, None) for name in BEAM_HELPERS)
    if helpers not in _helper_checks:
        _helper_checks[helpers] = _check_beam_helpers()
    return _helper_checks[helpers]


_helper_checks: dict[tuple, str | None] = {}


def _check_beam_helpers() -> str | None:
    for name, expected in BEAM_HELPERS.items():
        method = getattr(GenerationMixin, name, None)
        if method is None:
            return f"transformers has no GenerationMixin.{name}"
        try:
            parameters = tuple(p for p in inspect.signature(method).parameters if p != "self")
        except (TypeError, ValueError):
            return f"GenerationMixin.{name} has no readable signature"
        if parameters != expected:
            return f"GenerationMixin.{name} takes {parameters}, the fast loop was written for {expected}"
    return None


def _warn_once(reason: str, prefix: str = "vaswani_mt: transformers' own decoding loop is used: ") -> None:
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("%s%s", prefix, reason)


# Keyword arguments generate() passes to the loop that the fast loop understands (the rest: transformers' loop).
# `labels` comes along from Seq2SeqTrainer's validation; generate() never uses it. The cache generate() prepares is
# `cache` since transformers 5.24, `past_key_values` before; the fast loop keeps its own.
_KNOWN_MODEL_KWARGS = {"encoder_outputs", "attention_mask", "cache", "past_key_values", "use_cache", "cache_position",
                       "output_attentions", "output_hidden_states", "labels"}


def fast_decoding_blocker(model: nn.Module, input_ids: torch.Tensor, generation_config, model_kwargs: dict,
                          synced_gpus: bool = False, loop: str = "greedy") -> str | None:
    """Why the fast `loop` ("greedy" or "beam") cannot run a call generate() prepared (a short reason), or None if it
    can. A mismatch with transformers' private API is also logged, once per reason."""
    if not getattr(model, "use_fast_decoding", True):
        return "use_fast_decoding is off"
    mismatch = (beam_helpers_mismatch() if loop == "beam" else None) or next(
        (f"generate() set no generation_config.{name}" for name in _GENERATION_CONFIG_TENSORS[loop]
         if not hasattr(generation_config, name)), None)
    if mismatch is not None:
        _warn_once(mismatch)
        return mismatch
    if model.training:
        return "model in training mode (dropout)"
    if model.dtype in (torch.float16, torch.bfloat16):
        # Half-precision products round by their shape, and ours are shaped otherwise than transformers' (one query
        # row per beam group, fused q/k/v): in bfloat16, 92 (CPU) and 99 (H200) of Multi30k's 1,000 test2016
        # translations differed (docs/inference.md). transformers' loops decode, so the output is theirs.
        return f"{str(model.dtype).removeprefix('torch.')} weights"
    if synced_gpus:
        return "synced_gpus"
    if generation_config.do_sample:
        return "sampling"
    if not generation_config.use_cache:
        return "use_cache=False"
    if getattr(generation_config, "is_assistant", False):
        return "assistant model"
    for option in _OUTPUT_OPTIONS:
        if getattr(generation_config, option, False):
            return option
    unknown = {k for k, v in model_kwargs.items() if v is not None} - _KNOWN_MODEL_KWARGS
    if unknown:
        _warn_once(f"generate() passed model arguments {sorted(unknown)} the fast loop does not know")
        return f"model arguments {sorted(unknown)}"
    if model_kwargs.get("encoder_outputs") is None:
        return "no encoder outputs"
    if input_ids.shape[1] != 1:
        return "a decoder prompt longer than the start token"
    return None


class DecodeLinear:
    """x W^T + b for the fixed number of rows of a decoding step. On CPU in float32 with MKL, the weight is packed
    once per generate() for that row count (MKL's packed GEMM, what torch.compile's CPU freezing uses): ~15 %
    faster per product on the small shape, same results to float32 rounding. Elsewhere plain `F.linear`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
        self.weight, self.bias, self.rows, self.packed = weight, bias, rows, None
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and _mkl_packing_available():
            try:
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
            except RuntimeError:  # an MKL build without packed GEMM: plain products
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.rows)
        return F.linear(x, self.weight, self.bias)


def _mkl_packing_available() -> bool:
    """Whether torch's private packed-GEMM ops exist and compute x W^T + b (checked once per process on a small
    product against `F.linear`); False sends every product to `F.linear`."""
    global _mkl_packing_works
    if _mkl_packing_works is None:
        _mkl_packing_works = False
        try:
            if torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"):
                # fixed values: the global random stream must not move (seeded runs, bitwise resume)
                weight, bias = torch.arange(128.0).sin().view(8, 16), torch.arange(8.0).cos()
                x = torch.arange(64.0).cos().view(4, 16)
                packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 4)
                result = torch.ops.mkl._mkl_linear(x, packed, weight, bias, 4)
                _mkl_packing_works = bool(torch.allclose(result, F.linear(x, weight, bias), atol=1e-5))
        except (RuntimeError, AttributeError, TypeError):
            _mkl_packing_works = False
    return _mkl_packing_works


_mkl_packing_works: bool | None = None


def _linear(module: nn.Linear, rows: int) -> DecodeLinear:
    return DecodeLinear(module.weight, module.bias, rows)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Attention weights over the last dimension, computed in float32 (as the model's attention does) and
    returned in the scores' dtype."""
    if scores.dtype == torch.float32:
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)


class IncrementalDecoder:
    """The decoder of one generate() call, run one position at a time for `rows` = sources x beams rows.

    Holds the cross-attention keys/values per source sentence and the self-attention keys/values of every position
    each of a sentence's beams has computed (preallocated, written once); which of them make up a row's history is
    `lineage`, so reordering beams moves a [rows, positions x beams] mask instead of every layer's keys/values.
    The price: each row's self-attention scores run over positions x beams slots instead of positions (a few small
    products per step; the gather it replaces moved every layer's whole cache). Measured on the small shape with
    256 rows: 1.75x transformers' loop at beam 4, still 1.6x at beams 16 and 32."""

    def __init__(self, model: nn.Module, encoder_hidden_states: torch.Tensor, encoder_attention_mask,
                 rows_per_source: int, max_length: int):
        decoder = model.model.decoder
        self.model, self.decoder, self.layers = model, decoder, list(decoder.layers)
        self.rows_per_source = rows_per_source
        # generate() repeats each source once per beam (repeat_interleave): keep one copy per sentence.
        sources = encoder_hidden_states[::rows_per_source]
        self.num_sources, source_len = sources.shape[:2]
        self.rows = self.num_sources * rows_per_source
        first = self.layers[0].self_attn
        self.heads, self.head_dim, self.value_dim = first.num_heads, first.head_dim, first.value_dim  # h, d_k, d_v
        self.cross_bias = None
        if encoder_attention_mask is not None:
            keep = encoder_attention_mask[::rows_per_source].bool()
            if not keep.all():
                bias = torch.zeros(keep.shape, dtype=sources.dtype, device=sources.device)
                self.cross_bias = bias.masked_fill(~keep, float("-inf"))[:, None, None, :]  # [src, 1, 1, S]
        self.cross_kv, self.linears, self.cache = [], [], []
        rows, beams = self.rows, rows_per_source
        for layer in self.layers:
            attn = layer.encoder_attn
            keys, values = self._source_heads(attn.k_proj(sources)), self._source_heads(attn.v_proj(sources))
            # stored as the products want them (K transposed), so no step copies them
            self.cross_kv.append((keys.transpose(-1, -2).contiguous(), values.contiguous()))
            sa = layer.self_attn
            qkv = DecodeLinear(torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]),
                               torch.cat([sa.q_proj.bias, sa.k_proj.bias, sa.v_proj.bias]), rows)
            self.linears.append({
                "qkv": qkv, "self_out": _linear(sa.out_proj, rows), "cross_q": _linear(attn.q_proj, rows),
                "cross_out": _linear(attn.out_proj, rows), "fc1": _linear(layer.ffn.fc1, rows),
                "fc2": _linear(layer.ffn.fc2, rows),
            })
            # position t of beam j of a sentence sits in slot t * beams + j; never moved (see `reorder`)
            shape = (self.num_sources, self.heads, max_length * beams)
            self.cache.append((sources.new_empty(*shape, self.head_dim), sources.new_empty(*shape, self.value_dim)))
        # Which slots each row may attend to: its own ancestors (0) or another hypothesis' (-inf). None for greedy
        # search: one row per sentence, every slot is its own.
        self.lineage = self.new_slots = None
        if beams > 1:
            self.lineage = sources.new_full((rows, max_length * beams), -math.inf)
            self.new_slots = torch.full((beams, beams), -math.inf, dtype=sources.dtype, device=sources.device)
            self.new_slots.fill_diagonal_(0.0).unsqueeze_(0)  # [1, beams, beams]: each row sees its own new slot
        self.lm_head = _linear(model.lm_head, rows)
        self.length = 0  # positions held in the self-attention cache

    def _source_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[src, S, heads * size] -> [src, heads, S, size]"""
        return x.view(*x.shape[:2], self.heads, -1).transpose(1, 2)

    def _self_attention(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Masked self-attention (§3.2.3) of the newest position over all previous ones (no causal mask needed: the
        future is not computed yet). The beams of a sentence attend as a group over every slot the sentence's
        hypotheses have written; `lineage` hides the slots that are not the row's own history, so the softmax
        weights and the output equal attention over the row's own keys."""
        attn, t, beams = self.layers[i].self_attn, self.length, self.rows_per_source
        sizes = (self.heads * self.head_dim,) * 2 + (self.heads * self.value_dim,)
        q, k, v = (part.view(self.num_sources, beams, self.heads, -1).transpose(1, 2)
                   for part in self.linears[i]["qkv"](x).split(sizes, dim=-1))
        keys, values = self.cache[i]  # sized for max_length: generate() never feeds more positions
        new, used = slice(t * beams, (t + 1) * beams), (t + 1) * beams
        keys[:, :, new], values[:, :, new] = k, v
        scores = torch.matmul(q, keys[:, :, :used].transpose(-1, -2)) * attn.scaling  # [src, heads, beams, used]
        if self.lineage is not None:
            scores = scores + self.lineage[:, :used].view(self.num_sources, 1, beams, used)
        out = torch.matmul(_softmax(scores), values[:, :, :used])
        return self.linears[i]["self_out"](out.transpose(1, 2).reshape(self.rows, -1))

    def _cross_attention(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Encoder-decoder attention (§3.2.3): the beams of a sentence form the query rows of one attention over
        that sentence's keys/values."""
        attn = self.layers[i].encoder_attn
        q = self.linears[i]["cross_q"](x).view(self.num_sources, self.rows_per_source, self.heads, self.head_dim)
        q = q.transpose(1, 2)
        keys_t, values = self.cross_kv[i]
        scores = torch.matmul(q, keys_t) * attn.scaling  # [src, heads, beams, S]
        if self.cross_bias is not None:
            scores = scores + self.cross_bias
        out = torch.matmul(_softmax(scores), values)
        return self.linears[i]["cross_out"](out.transpose(1, 2).reshape(self.rows, -1))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns the next-token logits [rows, vocab]."""
        decoder, t, beams = self.decoder, self.length, self.rows_per_source
        if self.lineage is not None:
            self.lineage.view(self.num_sources, beams, -1)[:, :, t * beams: (t + 1) * beams] = self.new_slots
        x = decoder.embed(tokens[:, None], None, offset=self.length)[:, 0]  # §3.4-3.5, as the decoder embeds
        for i, layer in enumerate(self.layers):  # eval mode: the residuals' dropout is the identity
            x = layer.residual(x, layer.self_attn_layer_norm, lambda h: self._self_attention(i, h))
            x = layer.residual(x, layer.encoder_attn_layer_norm, lambda h: self._cross_attention(i, h))
            x = layer.residual(x, layer.final_layer_norm, lambda h: self._feed_forward(i, layer, h))
        self.length += 1
        logits = self.lm_head(decoder.final_norm(x))
        if self.model.final_logits_bias is not None:
            logits = logits + self.model.final_logits_bias
        return logits

    def _feed_forward(self, i: int, layer, x: torch.Tensor) -> torch.Tensor:
        """§3.3, as `VaswaniFeedForward` in eval mode."""
        return self.linears[i]["fc2"](layer.ffn.activation(self.linears[i]["fc1"](x)))

    def reorder(self, rows: torch.Tensor) -> None:
        """Row r continues the hypothesis that was row `rows[r]` (beam search; always a row of the same sentence).
        Nothing in the caches moves: row r inherits the other row's lineage, i.e. which of the sentence's
        self-attention slots are its history. (Moving the keys/values instead — what a per-row cache needs — was
        13 % of a beam-4 decoding.)"""
        if self.lineage is None:
            raise ValueError("reorder() needs beams: this decoder has one row per sentence")
        used = self.length * self.rows_per_source
        self.lineage[:, :used] = self.lineage[rows, :used]

    def keep(self, sentences: torch.Tensor) -> None:
        """Go on with these sentences only (indices among the current ones, in order); their rows keep their
        order. Copies what has been computed for them and re-packs the products for the new row count."""
        beams, used = self.rows_per_source, self.length * self.rows_per_source
        self.num_sources, self.rows = len(sentences), len(sentences) * beams
        self.cross_kv = [(keys_t[sentences], values[sentences]) for keys_t, values in self.cross_kv]
        if self.cross_bias is not None:
            self.cross_bias = self.cross_bias[sentences]
        for i, (keys, values) in enumerate(self.cache):
            kept = tuple(buffer.new_empty((self.num_sources, *buffer.shape[1:])) for buffer in (keys, values))
            kept[0][:, :, :used], kept[1][:, :, :used] = keys[sentences, :, :used], values[sentences, :, :used]
            self.cache[i] = kept
        if self.lineage is not None:
            self.lineage = self.lineage.view(-1, beams, self.lineage.shape[-1])[sentences].flatten(0, 1)
        self.linears = [{name: DecodeLinear(f.weight, f.bias, self.rows) for name, f in products.items()}
                        for products in self.linears]
        self.lm_head = DecodeLinear(self.lm_head.weight, self.lm_head.bias, self.rows)


class _EosBan:
    """The min-length logits processors (`min_length`, `min_new_tokens`), applied in place: EOS gets -inf while
    the hypothesis is shorter than the minimum. None when another kind of processor is present (then the
    processor list runs as transformers runs it)."""

    def __init__(self, processors: LogitsProcessorList):
        self.rules = []
        for p in processors:
            if isinstance(p, MinLengthLogitsProcessor):
                self.rules.append((p.min_length, p.eos_token_id))
            elif isinstance(p, MinNewTokensLengthLogitsProcessor):
                self.rules.append((p.prompt_length_to_skip + p.min_new_tokens, p.eos_token_id))
            else:
                raise TypeError(type(p).__name__)

    @classmethod
    def of(cls, processors: LogitsProcessorList):
        try:
            return cls(processors)
        except TypeError:
            return None

    def __call__(self, length: int, scores: torch.Tensor) -> torch.Tensor:
        for min_length, eos in self.rules:
            if length < min_length:
                scores[:, eos.to(scores.device)] = -math.inf
        return scores


def _processor(logits_processor: LogitsProcessorList):
    """(sequences, scores) -> scores: in-place EOS bans when that is all the list does, else the list itself."""
    ban = _EosBan.of(logits_processor)
    if ban is None:
        return logits_processor
    return lambda sequences, scores: ban(sequences.shape[-1], scores)


def _chunked_topk(scores: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)` over the last dimension of a [rows, n] matrix, in about a pass over it.

    torch.topk on a long row (n = beams x vocabulary) runs at a fraction of memory speed. The k best entries lie in
    the k chunks with the best maxima (each of them sits in a chunk whose maximum is at least as good), so: one
    max-reduction per chunk, top-k chunks, then top-k of their k x chunk entries. Same values and order; among
    exactly equal scores the index chosen may differ from torch.topk's (which documents no order for ties)."""
    rows, n = scores.shape
    if n % chunk or n < 8 * k * chunk:
        return torch.topk(scores, k)
    best_chunks = scores.view(rows, n // chunk, chunk).amax(dim=-1).topk(k).indices
    candidates = (best_chunks[..., None] * chunk + torch.arange(chunk, device=scores.device)).view(rows, -1)
    values, positions = scores.gather(1, candidates).topk(k)
    return values, candidates.gather(1, positions)


def _top_k_continuations(model, accumulated_log_probs, running_sequences, running_beam_indices, cur_len: int,
                         prompt_len: int, beams_to_keep: int, num_beams: int):
    """`GenerationMixin._get_top_k_continuations` without sampling, with `_chunked_topk` for the selection of the
    `beams_to_keep` best (beam, token) continuations of each sentence."""
    batch_size = accumulated_log_probs.shape[0]
    topk_log_probs, topk_indices = _chunked_topk(accumulated_log_probs, beams_to_keep)
    vocab_size = accumulated_log_probs.shape[-1] // num_beams
    topk_current_beam_indices = topk_indices // vocab_size
    topk_running_beam_indices = model._gather_beams(running_beam_indices, topk_current_beam_indices)
    topk_running_sequences = model._gather_beams(running_sequences, topk_current_beam_indices)
    topk_running_sequences[:, :, cur_len] = topk_indices % vocab_size
    batch_offset = torch.arange(batch_size, device=topk_indices.device).view(-1, 1) * num_beams
    topk_running_beam_indices[:, :, cur_len - prompt_len] = topk_current_beam_indices + batch_offset
    return topk_log_probs, topk_running_sequences, topk_running_beam_indices


def _final_sentences(is_early_stop_heuristic_unsatisfied, is_sent_finished, beam_scores) -> torch.Tensor:
    """[sentences] True where beam search can no longer change what it returns for the sentence. Once a sentence's
    early-stop heuristic is satisfied (it never becomes unsatisfied again), transformers gives its new candidates a
    score below -1e9, so they can only displace placeholder slots (-1e9); with every slot holding a finished
    hypothesis of a higher score, the sentence's hypotheses are final — transformers keeps decoding it, to no effect."""
    return ~is_early_stop_heuristic_unsatisfied[:, 0] & is_sent_finished.all(dim=1) & (beam_scores > -1.0e9).all(dim=1)


def _decoder_for(model, generation_config, model_kwargs, rows_per_source: int) -> IncrementalDecoder:
    encoder_outputs = model_kwargs["encoder_outputs"]
    hidden = encoder_outputs[0] if isinstance(encoder_outputs, (tuple, list)) else encoder_outputs.last_hidden_state
    return IncrementalDecoder(model, hidden, model_kwargs.get("attention_mask"), rows_per_source,
                              generation_config.max_length)


def greedy_search(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
                  stopping_criteria: StoppingCriteriaList, generation_config, streamer=None, **model_kwargs):
    """`GenerationMixin._sample` without sampling: the arg-max token each step; finished rows get padding."""
    pad_token_id = generation_config._pad_token_tensor
    has_eos_stopping_criteria = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    process = _processor(logits_processor)
    decoder = _decoder_for(model, generation_config, model_kwargs, rows_per_source=1)
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    while True:
        scores = process(input_ids, decoder.step(input_ids[:, -1]).to(dtype=torch.float32))
        next_tokens = torch.argmax(scores, dim=-1)
        if has_eos_stopping_criteria:
            next_tokens = next_tokens * unfinished + pad_token_id * (1 - unfinished)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        unfinished = unfinished & ~stopping_criteria(input_ids, None)
        if streamer is not None:
            streamer.put(next_tokens.cpu())
        if unfinished.max() == 0:
            break
    if streamer is not None:
        streamer.end()
    return input_ids


def beam_search(model, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
                stopping_criteria: StoppingCriteriaList, generation_config, **model_kwargs):
    """`GenerationMixin._beam_search` (deterministic), step for step: the same candidate selection, finished-beam
    updates and early-stop heuristic (transformers' own helpers), with `IncrementalDecoder` for the model."""
    pad_token_id, eos_token_id = generation_config._pad_token_tensor, generation_config._eos_token_tensor
    early_stopping, length_penalty = generation_config.early_stopping, generation_config.length_penalty
    max_length, num_beams = generation_config.max_length, generation_config.num_beams
    num_return_sequences = generation_config.num_return_sequences
    batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
    prompt_len, device = cur_len, input_ids.device

    n_eos_tokens = eos_token_id.shape[0] if eos_token_id is not None else 0
    beams_to_keep = max(2, 1 + n_eos_tokens) * num_beams
    top_num_beam_mask = torch.zeros(beams_to_keep, dtype=torch.bool, device=device)
    top_num_beam_mask[:num_beams] = True
    # transformers' fill value, including its precedence: (pad or eos[0]) if eos is set, else -1
    fill = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1
    running_sequences = torch.full((batch_size, num_beams, max_length), fill, dtype=torch.int64, device=device)
    running_sequences[:, :, :cur_len] = input_ids.view(batch_size, num_beams, -1)
    sequences = running_sequences.clone()
    running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
    running_beam_scores[:, 1:] = -1e9  # only the first beam's continuations count at step 1
    beam_scores = torch.full((batch_size, num_beams), -1e9, dtype=torch.float, device=device)
    is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
    is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
    running_beam_indices = torch.full((batch_size, num_beams, max_length - cur_len), -1, dtype=torch.int32,
                                      device=device)
    beam_indices = running_beam_indices.clone()

    process = _processor(logits_processor)
    decoder = _decoder_for(model, generation_config, model_kwargs, rows_per_source=num_beams)
    # Sentences whose result is final leave the batch (see `_final_sentences`), when nothing per-sentence depends on
    # a sentence's position in the batch: only min-length processors and max-length/EOS stopping criteria.
    may_drop = _EosBan.of(logits_processor) is not None and all(
        isinstance(c, (MaxLengthCriteria, EosTokenCriteria)) for c in stopping_criteria)
    active = torch.arange(batch_size, device=device)  # the sentences still decoded (indices into the batch)
    results = None  # (sequences, beam_indices) of the whole batch, once a sentence has left it
    n_active = batch_size
    identity = torch.arange(n_active * num_beams, device=device)
    while True:
        flat_running = running_sequences[:, :, :cur_len].reshape(n_active * num_beams, cur_len)
        logits = decoder.step(flat_running[:, -1]).to(dtype=torch.float32)
        log_probs = process(flat_running, F.log_softmax(logits, dim=-1))
        # in place: log_probs is this step's own tensor (same sum as transformers' out-of-place add); reshape, not
        # view: a logits processor may return a strided tensor (repetition_penalty does)
        log_probs = log_probs.reshape(n_active, num_beams, -1).add_(running_beam_scores[:, :, None])
        log_probs = log_probs.reshape(n_active, -1)

        topk_log_probs, topk_running_sequences, topk_running_beam_indices = _top_k_continuations(
            model, log_probs, running_sequences, running_beam_indices, cur_len, prompt_len, beams_to_keep, num_beams
        )
        next_token_hits_stopping_criteria = stopping_criteria(
            topk_running_sequences[:, :, : cur_len + 1].reshape(n_active * beams_to_keep, -1), None
        ).view(n_active, beams_to_keep)
        running_sequences, running_beam_scores, running_beam_indices = model._get_running_beams_for_next_iteration(
            topk_log_probs=topk_log_probs, topk_running_sequences=topk_running_sequences,
            topk_running_beam_indices=topk_running_beam_indices,
            next_token_hits_stopping_criteria=next_token_hits_stopping_criteria, num_beams=num_beams,
        )
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences, topk_running_sequences=topk_running_sequences, beam_scores=beam_scores,
            topk_log_probs=topk_log_probs, beam_indices=beam_indices,
            topk_running_beam_indices=topk_running_beam_indices,
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            is_sent_finished=is_sent_finished, next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
            top_num_beam_mask=top_num_beam_mask, num_beams=num_beams, cur_len=cur_len,
            decoder_prompt_len=prompt_len, length_penalty=length_penalty, early_stopping=early_stopping,
        )
        rows = running_beam_indices[..., cur_len - prompt_len].reshape(-1).to(torch.long)
        cur_len += 1
        is_early_stop_heuristic_unsatisfied = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            running_beam_scores=running_beam_scores, beam_scores=beam_scores, is_sent_finished=is_sent_finished,
            cur_len=cur_len, max_length=max_length, decoder_prompt_len=prompt_len, early_stopping=early_stopping,
            length_penalty=length_penalty,
        )
        if not model._beam_search_has_unfinished_sequences(
            is_early_stop_heuristic_unsatisfied, is_sent_finished, next_token_hits_stopping_criteria, early_stopping
        ):
            break
        if not torch.equal(rows, identity):
            decoder.reorder(rows)
        if may_drop:
            final = _final_sentences(is_early_stop_heuristic_unsatisfied, is_sent_finished, beam_scores)
            if final.sum() * 8 >= n_active:  # worth copying the caches for (and re-packing the products)
                if results is None:
                    results = (sequences, beam_indices)
                else:
                    results[0][active[final]], results[1][active[final]] = sequences[final], beam_indices[final]
                kept = (~final).nonzero().flatten()
                active, n_active = active[kept], len(kept)
                (running_sequences, running_beam_scores, running_beam_indices, sequences, beam_scores, beam_indices,
                 is_sent_finished, is_early_stop_heuristic_unsatisfied) = (
                    t[kept] for t in (running_sequences, running_beam_scores, running_beam_indices, sequences,
                                      beam_scores, beam_indices, is_sent_finished, is_early_stop_heuristic_unsatisfied))
                decoder.keep(kept)
                identity = torch.arange(n_active * num_beams, device=device)

    if results is not None:
        results[0][active], results[1][active] = sequences, beam_indices
        sequences, beam_indices = results
    sequences = sequences[:, :num_return_sequences].reshape(batch_size * num_return_sequences, -1)
    beam_indices = beam_indices[:, :num_return_sequences].reshape(batch_size * num_return_sequences, -1)
    generated = int((beam_indices + 1).bool().sum(dim=1).max())
    return sequences[:, : prompt_len + generated]
