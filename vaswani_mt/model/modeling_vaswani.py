"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need", as a Hugging Face seq2seq model.

Classes are stacked bottom-up: positions -> attention -> feed-forward -> layers -> encoder/decoder stacks ->
`VaswaniModel` -> `VaswaniForConditionalGeneration`. Section numbers (§) refer to the paper.

This file is copied beside every saved model, and stock transformers runs it with `trust_remote_code=True` wherever
vaswani_mt is not installed, on transformers releases newer than the one that saved it. So it imports nothing from
vaswani_mt but its configuration (relatively) and uses only transformers' public modeling contract; vaswani_mt's
faster decoding loops plug in from the installed package (`VaswaniForConditionalGeneration.decoding_loops`).
"""


import contextlib
import dataclasses
import logging
import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs
from typing_extensions import Unpack  # typing's from Python 3.11; torch requires typing_extensions

from .configuration_vaswani import VaswaniConfig

logger = logging.getLogger(__name__)

# §6.1: "We set the maximum output length during inference to input length + 50".
OUTPUT_LENGTH_MARGIN = 50

# transformers 5.24 renamed the decoder cache `past_key_values` -> `cache`: in the arguments generate() passes to
# `forward`, and in the fields of its output classes. Every forward here takes either name (`one_cache`); outputs carry
# it under the field the installed output classes declare, so no deprecation shim runs.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(Seq2SeqLMOutput)} else "past_key_values"


def one_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """The cache passed under either name (`cache` since transformers 5.24, `past_key_values` before). Where the
    installed transformers calls it `cache`, the old name warns as transformers' own models do."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("pass the decoder cache once, as `cache` or as `past_key_values`, not both")
    if past_key_values is not None and cache is None and CACHE_FIELD == "cache" and not torch.compiler.is_compiling():
        warnings.warn("`past_key_values` is deprecated since transformers 5.24: pass the decoder cache as `cache`",
                      FutureWarning, stacklevel=3)
    return cache if cache is not None else past_key_values


def with_cache(output_class, cache: Cache | None, **fields):
    """An output of `output_class` carrying `cache` under the installed field name."""
    return output_class(**fields, **{CACHE_FIELD: cache})


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: the output embeddings are offset by one position (§3.1), so position i sees
    labels[:i]. Ignored labels (-100) become padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), interleaved as in the
    paper. Computed in float64 so long tables stay exact to float32 precision."""
    positions = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(positions * inv_freq)
    table[:, 1::2] = torch.cos(positions * inv_freq[: dim // 2])
    return table.float()


def position_rows(table: torch.Tensor, seq_len: int, offset: int) -> torch.Tensor:
    """Rows offset .. offset + seq_len of a position table; a ValueError past its end."""
    end = offset + seq_len
    if end > table.shape[0]:
        raise ValueError(
            f"sequence of {end} tokens is longer than max_position_embeddings={table.shape[0]}; "
            "truncate the input (e.g. tokenizer(..., truncation=True)) or use a config with more positions"
        )
    return table[offset:end]


class SinusoidalPositions(nn.Module):
    """Fixed positional encodings (§3.5). A non-persistent buffer: recomputed, never stored in checkpoints."""

    def __init__(self, num_positions: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(num_positions, dim), persistent=False)

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        return position_rows(self.table, seq_len, offset)


class LearnedPositions(nn.Module):
    """Learned positional embeddings, Table 3 row (E): "positional embedding instead of sinusoids" (§3.5 found
    "nearly identical results"). One trained vector per position, stored in checkpoints."""

    def __init__(self, num_positions: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_positions, dim))

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        return position_rows(self.weight, seq_len, offset)


class VaswaniDropout(nn.Dropout):
    """Dropout (§5.4 "Residual Dropout") with a cheaper random mask on CPU.

    torch's CPU dropout draws a Bernoulli sample per element from a scalar generator, slow enough to weigh on a CPU
    training step (docs/speed.md). Here 64 random bits are drawn per 4 elements and each 16-bit slice is compared
    with a threshold, several times faster forward and backward. The drop probability is `p` rounded to a multiple
    of 1/65536 (0.1 -> 0.1000061), and kept values are scaled by exactly 1 / (1 - that probability). A float32 input
    is multiplied by a mask of that scale and 0 (one product forward, one backward); other dtypes, where the scale
    would round, are selected and scaled. The bits come from torch's default generator, so seeding and checkpoint
    resumption work as with nn.Dropout. Other devices and evaluation: nn.Dropout.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not self.training or self.p == 0.0 or self.p == 1.0 or x.device.type != "cpu"
                or torch.compiler.is_compiling()):  # in-place random_ breaks torch.compile graphs
            return super().forward(x)
        dropped = round(self.p * 65536)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= dropped - 32768
        scale = 65536 / (65536 - dropped)
        if x.dtype == torch.float32:
            return x * keep.to(torch.float32).mul_(scale)
        return torch.where(keep, x * scale, 0.0)


# torch's CPU softmax over the last dimension is vectorised only from this many elements per row on (one vector of
# float32: 16 with AVX-512, 8 with AVX2); below it a row takes ~13x longer (docs/speed.md, measured on x86; 8 is
# also taken on other CPUs, where it was not measured: only speed depends on it).
SHORT_ROW = 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


class ShortRowSoftmax(torch.autograd.Function):
    """softmax over the last dimension in float32, computed with whole-tensor element-wise operations: for the
    attention weights of short sentences on CPU, where rows are shorter than `SHORT_ROW`. Backward:
    ``dS = P * (dP - sum(dP * P))``."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor) -> torch.Tensor:
        ctx.scores_dtype = scores.dtype
        scores = scores.float()
        weights = torch.sub(scores, scores.amax(-1, keepdim=True)).exp_()
        weights.div_(weights.sum(-1, keepdim=True))
        ctx.save_for_backward(weights)
        return weights

    @staticmethod
    def backward(ctx, grad_weights: torch.Tensor) -> torch.Tensor:
        (weights,) = ctx.saved_tensors
        grad = grad_weights.float() * weights
        return grad.sub_(weights * grad.sum(-1, keepdim=True)).to(ctx.scores_dtype)


def attention_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax(scores) over the keys, in float32: `ShortRowSoftmax` where torch's CPU kernel is slow, else torch's."""
    if scores.device.type == "cpu" and 0 < scores.shape[-1] < SHORT_ROW:
        return ShortRowSoftmax.apply(scores)
    return F.softmax(scores, dim=-1, dtype=torch.float32)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, softmax(Q K^T / sqrt(d_k)) V (§3.2.1), returning the weights too.

    Takes either mask format transformers builds: additive floats (eager) or booleans with True = may attend
    (sdpa), so it can stand in for sdpa when attention weights are requested. A missing mask on a causal module
    means "causal, no padding" (transformers skips building it then)."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    mask = attention_mask
    if mask is None and module.is_causal and query.shape[-2] > 1:
        q_len, k_len = query.shape[-2], key.shape[-2]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    weights = attention_softmax(scores).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


# Compiled training on a GPU in half precision attends over at most this many keys with sdpa held to its
# memory-efficient kernel (`VaswaniAttention.implementation`).
SHORT_KEYS = 128
# The name `VaswaniAttention.implementation` gives that choice: transformers' sdpa, inside `memory_efficient_kernel()`.
MEMORY_EFFICIENT_SDPA = "sdpa, memory-efficient kernel"


def memory_efficient_kernel():
    """torch's sdpa restricted to its memory-efficient kernel (a context manager torch.compile traces)."""
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])


class VaswaniAttention(nn.Module):
    """Multi-head attention (§3.2.2): h parallel scaled dot-product attentions over d_k-dimensional queries and keys
    and d_v-dimensional values (d_k = d_v = d_model / h unless the config sets them, Table 3 (B)), concatenated and
    projected back to d_model. Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention
    (`is_causal`), and encoder-decoder attention (`key_value_states` given)."""

    def __init__(self, config: VaswaniConfig, num_heads: int, is_causal: bool = False, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim, self.value_dim = config.head_sizes(num_heads)  # d_k, d_v
        self.scaling = self.head_dim**-0.5  # §3.2.1: 1/sqrt(d_k) keeps softmax out of its flat regions
        self.is_causal = is_causal  # read by transformers' sdpa wrapper when the mask is skipped
        self.layer_idx = layer_idx  # which cache slot this layer owns
        self.attention_dropout = config.attention_dropout
        self.q_proj = nn.Linear(config.d_model, num_heads * self.head_dim)
        self.k_proj = nn.Linear(config.d_model, num_heads * self.head_dim)
        self.v_proj = nn.Linear(config.d_model, num_heads * self.value_dim)
        self.out_proj = nn.Linear(num_heads * self.value_dim, config.d_model)
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            projection.initialization_role = "attention input"  # read by `_init_weights`

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, heads * size] -> [batch, heads, seq, size]"""
        return x.view(*x.shape[:-1], self.num_heads, -1).transpose(1, 2)

    def _keys_values(self, hidden_states, key_value_states, cache: EncoderDecoderCache | None):
        """Project keys/values, reading and updating the decoder cache. Cross-attention keys/values depend only on
        the encoder output, so they are computed once per generation and reused."""
        is_cross = key_value_states is not None
        own = None
        if cache is not None:
            own = cache.cross_attention_cache if is_cross else cache.self_attention_cache
            if is_cross and cache.is_updated.get(self.layer_idx):
                return own.layers[self.layer_idx].keys, own.layers[self.layer_idx].values
        source = key_value_states if is_cross else hidden_states
        keys, values = self._heads(self.k_proj(source)), self._heads(self.v_proj(source))
        if own is not None:
            keys, values = own.update(keys, values, self.layer_idx)
            if is_cross:
                cache.is_updated[self.layer_idx] = True
        return keys, values

    def implementation(self, query: torch.Tensor, keys: torch.Tensor, output_attentions: bool | None) -> str:
        """transformers' modeling contract: the implementation chosen at load time (sdpa by default, eager, ...); a
        config without it (not built by transformers) gets eager attention, the paper's formula as written. Where
        measured faster (docs/speed.md): plain matrix products (eager) in half precision on a CPU and in place of
        sdpa in CPU training, and sdpa's memory-efficient kernel (`MEMORY_EFFICIENT_SDPA`) in compiled
        half-precision training on a GPU."""
        implementation = getattr(self.config, "_attn_implementation", None) or "eager"
        half = query.dtype in (torch.bfloat16, torch.float16)
        if output_attentions:
            return "eager"  # only eager attention returns the weights
        if query.device.type == "cpu" and (half or (self.training and implementation == "sdpa")):
            # torch's CPU flash-attention backward in bf16 is an order of magnitude slower than eager's bf16 matmuls:
            # it made bf16 autocast training slower than fp32. In float32 training it is slower too (forward and
            # backward of 266 sentences x 4 heads x 15 tokens: 11.8 ms against 6.5 ms).
            return "eager"
        if implementation == "sdpa" and self.training and query.device.type == "cuda" and half \
                and keys.shape[-2] <= SHORT_KEYS and torch.compiler.is_compiling():
            # sdpa's default GPU kernel on an H100/H200 (cuDNN's) works in tiles of 64-128 keys: on a batch of short
            # sentences most of each tile is padding, and it took 13 of a compiled base step's 46 ms on an H200
            # (25-token sentences). The memory-efficient kernel wastes less there (docs/speed.md).
            return MEMORY_EFFICIENT_SDPA
        return implementation

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query = self._heads(self.q_proj(hidden_states))
        keys, values = self._keys_values(hidden_states, key_value_states, cache)
        implementation = self.implementation(query, keys, kwargs.get("output_attentions"))
        kernel = contextlib.nullcontext()
        if implementation == MEMORY_EFFICIENT_SDPA:
            implementation, kernel = "sdpa", memory_efficient_kernel()
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        with kernel:
            output, weights = attention(
                self, query, keys, values, attention_mask,
                dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling, **kwargs,
            )
        return self.out_proj(output.reshape(*hidden_states.shape[:-1], -1)), weights


class VaswaniFeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3): FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = VaswaniDropout(config.activation_dropout)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.fc1.initialization_role = self.fc2.initialization_role = "feed-forward"  # read by `_init_weights`

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation(self.fc1(hidden_states))))


class VaswaniLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the residual connection around each sub-layer (§3.1, §5.4).

    post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))). Normalising after the add keeps every layer
        output at unit scale, but gradients to early layers pass through N LayerNorms, which is why the paper
        needs learning-rate warm-up.
    pre-norm: x + Dropout(Sublayer(LayerNorm(x))). The residual path is an identity from input to output, so
        deep stacks train stably; the stack then needs one final LayerNorm (see `VaswaniStack`).
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.pre_norm = config.norm_style == "pre"
        self.residual_dropout = VaswaniDropout(config.dropout)

    def residual(self, x: torch.Tensor, layer_norm: nn.LayerNorm, sublayer: Callable) -> torch.Tensor:
        if self.pre_norm:
            return x + self.residual_dropout(sublayer(layer_norm(x)))
        return layer_norm(x + self.residual_dropout(sublayer(x)))


class VaswaniEncoderLayer(VaswaniLayer):
    """Encoder layer (§3.1): self-attention, then a feed-forward network, each wrapped in a residual."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = VaswaniAttention(config, config.encoder_attention_heads, is_causal=False, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VaswaniFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        attend = lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0]  # noqa: E731
        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, attend)
        return self.residual(hidden_states, self.final_layer_norm, self.ffn)


class VaswaniDecoderLayer(VaswaniLayer):
    """Decoder layer (§3.1): masked self-attention, encoder-decoder attention, feed-forward; each in a residual."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = VaswaniAttention(config, config.decoder_attention_heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VaswaniAttention(config, config.decoder_attention_heads, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VaswaniFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor | None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        # The cache comes under the installed transformers' name, which its gradient checkpointing clears.
        cache = one_cache(cache, past_key_values)
        self_attend = lambda x: self.self_attn(  # noqa: E731
            x, attention_mask=attention_mask, cache=cache, **kwargs)[0]
        cross_attend = lambda x: self.encoder_attn(  # noqa: E731
            x, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache,
            **kwargs)[0]
        hidden_states = self.residual(hidden_states, self.self_attn_layer_norm, self_attend)
        if encoder_hidden_states is not None:  # a decoder used alone (a language model) has nothing to attend to
            hidden_states = self.residual(hidden_states, self.encoder_attn_layer_norm, cross_attend)
        return self.residual(hidden_states, self.final_layer_norm, self.ffn)


class VaswaniPreTrainedModel(PreTrainedModel):
    config: VaswaniConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True  # attention runs through ALL_ATTENTION_FUNCTIONS on transformers' masks
    _supports_flex_attn = False
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Weight matrices as `config.initialization` says: Xavier-uniform with zero biases (the Annotated
        Transformer), or fairseq's transformer's (query/key/value Xavier with gain 1/sqrt(2), feed-forward layers and
        those biases as torch's `nn.Linear` starts them); token embeddings N(0, d_model^-0.5) so that, scaled by
        sqrt(d_model) (§3.4), they start at unit variance like the positional encodings they are added to."""
        if isinstance(module, nn.Linear):
            role = getattr(module, "initialization_role", None)
            if getattr(self.config, "initialization", "xavier") == "fairseq" and role is not None:
                bound = module.in_features**-0.5  # torch's nn.Linear bias
                if role == "feed-forward":  # torch's nn.Linear weight: Kaiming-uniform, a = sqrt(5)
                    init.kaiming_uniform_(module.weight, a=math.sqrt(5))
                else:
                    init.xavier_uniform_(module.weight, gain=2**-0.5)
                if module.bias is not None:
                    init.uniform_(module.bias, -bound, bound)
                return
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, SinusoidalPositions):
            init.copy_(module.table, sinusoidal_table(*module.table.shape))
        elif isinstance(module, LearnedPositions):  # as token embeddings (fairseq's learned positions too)
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
        elif isinstance(module, VaswaniForConditionalGeneration) and module.final_logits_bias is not None:
            init.zeros_(module.final_logits_bias)

    def mark_tied_weights_as_initialized(self, loading_info, *args, **kwargs):
        """transformers' loading step that spares tied weights from initialisation, then the tied weights' source
        (`shared.weight`) put back among the missing keys when the checkpoint lacks it. The stacks share the embedding
        *module*, so marking its other names marks the source too, and transformers drops marked keys of custom-code
        models from the missing ones: the embedding stayed on the meta device, unreported. Without this hook (a
        transformers that no longer calls it) loading is transformers' own."""
        missing = set(loading_info.missing_keys)
        super().mark_tied_weights_as_initialized(loading_info, *args, **kwargs)
        sources = set(getattr(self, "all_tied_weights_keys", {}).values())
        lost = (missing & sources) - set(loading_info.missing_keys)
        if lost:
            loading_info.missing_keys = set(loading_info.missing_keys) | lost


class VaswaniStack(VaswaniPreTrainedModel):
    """What encoder and decoder stacks share: token embeddings scaled by sqrt(d_model) (§3.4), plus positional
    encodings (§3.5: sinusoids; or learned, Table 3 (E), one table per stack), then dropout (§5.4); and the final
    LayerNorm of pre-norm stacks."""

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config)
        # A stack built alone (`VaswaniEncoder(config)`, `VaswaniDecoder.from_pretrained(...)`) owns its embeddings.
        if embed_tokens is None:
            embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        positions = LearnedPositions if config.position_embedding == "learned" else SinusoidalPositions
        self.embed_positions = positions(config.max_position_embeddings, config.d_model)
        self.embed_dropout = VaswaniDropout(config.dropout)
        # Pre-norm layers leave their residual sum unnormalised; normalise once at the top of the stack.
        pre_norm = config.norm_style == "pre"
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if pre_norm else None

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def embed(self, input_ids, inputs_embeds, offset: int = 0) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids / inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        # A sinusoidal table stays float32 (exact); a half-precision model adds it in its own dtype.
        positions = self.embed_positions(inputs_embeds.shape[1], offset).to(inputs_embeds.dtype)
        return self.embed_dropout(inputs_embeds * self.embed_scale + positions)

    def final_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states if self.layer_norm is None else self.layer_norm(hidden_states)


class VaswaniEncoder(VaswaniStack):
    """N encoder layers (§3.1) over the embedded source."""

    _can_record_outputs = {"hidden_states": VaswaniEncoderLayer, "attentions": VaswaniAttention}

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config, embed_tokens)
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        # A check on the values (a host sync, and a graph break under torch.compile): eager mode only.
        if (attention_mask is not None and attention_mask.dim() == 2 and not torch.compiler.is_compiling()
                and not attention_mask.any(dim=-1).all()):
            empty = (~attention_mask.bool().any(dim=-1)).nonzero().flatten().tolist()
            raise ValueError(
                f"source sequence(s) {empty} in the batch are empty (attention_mask is all 0); every source needs at "
                "least one token, e.g. the </s> the tokenizer appends"
            )
        hidden_states = self.embed(input_ids, inputs_embeds)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.final_norm(hidden_states))


class VaswaniDecoder(VaswaniStack):
    """N decoder layers (§3.1) over the embedded, right-shifted target, attending to the encoder output."""

    _can_record_outputs = {
        "hidden_states": VaswaniDecoderLayer,
        "attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config, embed_tokens)
        self.layers = nn.ModuleList([VaswaniDecoderLayer(config, i) for i in range(config.decoder_layers)])
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        cache = one_cache(cache, past_key_values)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        if not use_cache:
            cache = None
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, inputs_embeds, offset=past_length)
        # the cache goes in the 4th place, whose name is `past_key_values` before transformers 5.24 and `cache` since
        causal_mask = create_causal_mask(
            self.config, hidden_states, attention_mask, cache.self_attention_cache if cache is not None else None
        )
        cross_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states, causal_mask, encoder_hidden_states,  # positional: gradient checkpointing needs it
                encoder_attention_mask=cross_mask, **{CACHE_FIELD: cache}, **kwargs,
            )
        return with_cache(BaseModelOutputWithPastAndCrossAttentions, cache,
                          last_hidden_state=self.final_norm(hidden_states))


class VaswaniModel(VaswaniPreTrainedModel):
    """Encoder-decoder without the output projection. With `share_embeddings` the encoder, the decoder (and, when
    tied, the output projection) use one matrix `shared` (§3.4): shared by module identity, so that sharing does
    not depend on `tie_word_embeddings`."""

    # With share_embeddings the checkpoint stores only `shared.weight`; the stacks' names are tied to it
    # (`_tied_weights_keys`), so transformers reports them missing only when the checkpoint lacks `shared.weight` too.
    _keys_to_ignore_on_load_missing = None

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        if config.share_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            source_embeddings = target_embeddings = self.shared
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"
            }
        else:
            self.shared = None
            source_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            target_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = VaswaniEncoder(config, source_embeddings)
        self.decoder = VaswaniDecoder(config, target_embeddings)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.config.share_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        # The stacks answer with output objects here; `can_return_tuple` makes the tuple a caller asked for.
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            cache=one_cache(cache, past_key_values), inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            return_dict=True, **kwargs,
        )
        return with_cache(
            Seq2SeqModelOutput, getattr(decoder_outputs, CACHE_FIELD),
            last_hidden_state=decoder_outputs.last_hidden_state,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def _second_names_of_shared_parameters(module: nn.Module) -> set[str]:
    """Every name of a parameter but the first, for parameters registered under several names (tied weights)."""
    seen, names = set(), set()
    for name, parameter in module.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            names.add(name)
        seen.add(id(parameter))
    return names


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """A ValueError naming the problem for a batch generate() cannot translate: no sentences, or token ids outside
    the vocabulary (an embedding lookup would fail with an index error deep inside torch, or a device assert)."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(
            f"generate() needs a batch of token ids [sentences, tokens], got shape {tuple(input_ids.shape)}"
        )
    if input_ids.numel():
        low, high = torch.stack(torch.aminmax(input_ids)).tolist()  # one device sync
        if low < 0 or high >= vocab_size:
            raise ValueError(f"input_ids hold token id {high if high >= vocab_size else low}, outside the model's "
                             f"vocabulary of {vocab_size} ids (0..{vocab_size - 1}): was another tokenizer used?")


def check_loss_arguments(logits: torch.Tensor, labels: torch.Tensor, epsilon: float, pad_token_id: int | None) -> None:
    """The ValueError of `label_smoothed_cross_entropy` for arguments it cannot use."""
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon!r}")
    if logits.dim() < 1 or logits.shape[:-1] != labels.shape:
        raise ValueError(
            "logits must have shape labels.shape + (vocab_size,); got logits "
            f"{tuple(logits.shape)} and labels {tuple(labels.shape)}"
        )
    if pad_token_id is not None and not 0 <= pad_token_id < logits.shape[-1]:
        raise ValueError(f"pad_token_id {pad_token_id} is outside the vocabulary of size {logits.shape[-1]}")
    if epsilon > 0.0 and logits.shape[-1] - (2 if pad_token_id is not None else 1) < 1:
        raise ValueError(
            f"label smoothing needs at least one class besides the target and padding; vocab_size={logits.shape[-1]}"
        )


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.1,
    ignore_index: int = -100,
    pad_token_id: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy (§5.4: ε_ls = 0.1), the one loss of the package: training uses it with
    ε (`vaswani_mt.recipe.loss`, whose docstring derives it, computes the same block by block on CPU), the model's
    own `loss` (given `labels`) with ε = 0.

    The smoothed target puts ``1 - ε`` on the label and ``δ = ε / (V - 2)`` on every other class but padding
    (``ε / (V - 1)`` without ``pad_token_id``), computed as
    ``(1 - ε - δ) NLL + δ Σ_c -log p_c - δ (-log p_pad)`` per counted token, without a ``V``-sized target.

    Args:
        logits: ``[..., V]`` unnormalised scores (any float dtype; computed in float32).
        labels: ``[...]`` target ids, ``ignore_index`` (and ``pad_token_id``) at positions to skip.
        epsilon: smoothing mass ε in [0, 1); 0 gives plain cross-entropy.
        ignore_index: label value of positions that do not count.
        pad_token_id: if given, the padding class receives no smoothing mass and positions
            labelled with it are skipped too.

    Returns:
        ``(loss_sum, nll_sum, num_tokens)``: the smoothed loss and the plain negative
        log-likelihood, both float32 sums over the counted positions, and the number of counted
        positions as a 0-dim int64 tensor (kept on-device: no host sync).
    """
    check_loss_arguments(logits, labels, epsilon, pad_token_id)
    vocab_size = logits.shape[-1]
    # float32 log_softmax even for bf16/fp16 logits: low-precision log-probabilities of a large
    # vocabulary lose most of their mantissa to the log-sum-exp.
    log_probs = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab_size)
    targets = labels.reshape(-1)
    if pad_token_id is not None:
        targets = targets.masked_fill(targets == pad_token_id, ignore_index)
    counted = targets != ignore_index
    num_tokens = counted.sum()

    # nll_loss is exactly what cross_entropy(reduction="sum") uses, so epsilon=0 matches it bitwise.
    nll_sum = F.nll_loss(log_probs, targets, ignore_index=ignore_index, reduction="sum")
    if epsilon == 0.0:
        return nll_sum, nll_sum, num_tokens

    delta = epsilon / (vocab_size - (2 if pad_token_id is not None else 1))

    # masked_fill (not multiplication by the mask) keeps ignored rows at exactly zero even when
    # they hold -inf log-probabilities, and gives them zero gradient.
    neg_sum_all_classes = -log_probs.sum(dim=-1).masked_fill(~counted, 0.0).sum()
    loss_sum = (1.0 - epsilon - delta) * nll_sum + delta * neg_sum_all_classes
    if pad_token_id is not None:
        neg_pad_log_prob = -log_probs[:, pad_token_id].masked_fill(~counted, 0.0).sum()
        loss_sum = loss_sum - delta * neg_pad_log_prob
    return loss_sum, nll_sum, num_tokens


# How a finished hypothesis is scored (generation_config.length_penalty_style, alpha = length_penalty): "transformers"
# divides log P(Y|X) by |Y| ** alpha; "gnmt" by GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14), as §6.1 does.
LENGTH_PENALTY_STYLES = ("transformers", "gnmt")
_warned: set[str] = set()


def length_penalty_style(generation_config) -> str:
    """The config's `length_penalty_style` ("transformers" when unset); ValueError for an unknown one."""
    return checked_length_penalty_style(getattr(generation_config, "length_penalty_style", None))


def checked_length_penalty_style(style: str | None) -> str:
    style = style or "transformers"
    if style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, got {style!r}")
    return style


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The translation model: `VaswaniModel` plus the pre-softmax linear projection (§3.4), a loss and
    `generate()`.

    With `labels` (padding = -100) the loss is the token-level cross-entropy. When the Trainer passes
    `num_items_in_batch` (the label-token count of the whole accumulated, all-process batch) the loss is
    sum / num_items_in_batch, so gradient accumulation and multi-process training equal one big batch.
    """

    _keys_to_ignore_on_load_missing = [r"final_logits_bias"]
    # The installed vaswani_mt puts its decoding loops here (`vaswani_mt.model.fast_decoding`): the same output as
    # transformers' loops, faster, and GNMT's length penalty. A folder loaded as remote code keeps None: transformers'
    # own loops decode. `use_fast_decoding = False` on a model hands every call to transformers' loops.
    decoding_loops = None
    use_fast_decoding = True

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        target_embeddings = "model.shared.weight" if config.share_embeddings else "model.decoder.embed_tokens.weight"
        self._tied_weights_keys = {"lm_head.weight": target_embeddings}
        if config.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        else:
            self.final_logits_bias = None
        self.post_init()
        self.list_tied_names()  # post_init ties them, but a later transformers may not call tie_weights there
        # Decoding defaults (the paper's beam 4, §6.1) are not set here: as for every transformers model, they belong
        # to the saved generation_config.json, which `vaswani-mt train` writes; a model built from a config decodes
        # greedily, as transformers expects.

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def tie_weights(self, *args, **kwargs):
        """`PreTrainedModel.tie_weights`, then the tied names listed (`list_tied_names`)."""
        super().tie_weights(*args, **kwargs)
        self.list_tied_names()

    def list_tied_names(self) -> None:
        """Set `_keys_to_ignore_on_save` to the other names of tied weights (one tensor under several names, saved
        once under its first), as the weights are tied now: listed, the Trainer's load_best_model_at_end re-ties them
        instead of reporting "missing keys". Done after every tying and before every save, so a model untied after
        construction saves its own output projection."""
        self._keys_to_ignore_on_save = _second_names_of_shared_parameters(self)

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs):
        """`GenerationMixin.generate`, with the paper's output limit (§6.1) as the default: at most
        source length + 50 new tokens (never more than `max_position_embeddings`), per batch from the padded
        source length. An explicit `max_length` / `max_new_tokens` (argument or generation config) wins.
        `length_penalty_style="gnmt"` (argument or generation config) scores beams with GNMT's length penalty, the
        one §6.1 uses, instead of transformers' length ** length_penalty (with the vaswani_mt package installed)."""
        gen_config = generation_config if generation_config is not None else self.generation_config
        style = kwargs.pop("length_penalty_style", None)  # a setting transformers does not know: kept out of its way
        style = checked_length_penalty_style(style) if style is not None else length_penalty_style(gen_config)
        limits = (kwargs.get("max_length"), kwargs.get("max_new_tokens"), gen_config.max_length,
                  gen_config.max_new_tokens)
        source = inputs if inputs is not None else kwargs.get("input_ids")
        if source is not None:
            check_token_ids(source, self.config.vocab_size)
        if all(limit is None for limit in limits) and source is not None:
            kwargs["max_new_tokens"] = min(source.shape[-1] + OUTPUT_LENGTH_MARGIN, self.config.max_position_embeddings)
        if self.decoding_loops is not None:
            return self.decoding_loops.generate(self, super().generate, inputs, generation_config, style, kwargs)
        if style == "gnmt" and "gnmt" not in _warned:
            _warned.add("gnmt")
            logger.warning("vaswani_mt: length_penalty_style='gnmt' is applied by the vaswani_mt package (pip install "
                           "vaswani-mt; load the model without trust_remote_code); here beams are scored with "
                           "transformers' length ** length_penalty")
        return super().generate(inputs, generation_config=generation_config, **kwargs)

    def save_pretrained(self, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, leaving out the second names of tied weights as they are tied now
        (`list_tied_names`) and keeping `generation_config.length_penalty_style`: transformers drops the settings it
        does not know when it reloads a generation config marked as derived from the model config."""
        if getattr(self.generation_config, "length_penalty_style", None) is not None:
            self.generation_config._from_model_config = False
        self.list_tied_names()
        return super().save_pretrained(*args, **kwargs)

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        if not self.config.share_embeddings:
            raise NotImplementedError(
                "resize_token_embeddings needs share_embeddings=True (one joint vocabulary, §5.1)"
            )
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.final_logits_bias is not None:
            old = self.final_logits_bias
            bias = old.new_zeros(1, embeddings.num_embeddings)
            keep = min(old.shape[1], bias.shape[1])
            bias[:, :keep] = old[:, :keep]
            self.final_logits_bias = bias
        return embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        if labels is not None:
            use_cache = False  # training: whole target at once, nothing to cache
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            cache=one_cache(cache, past_key_values), inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, return_dict=True, **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        loss = None if labels is None else self.token_loss(logits, labels, num_items_in_batch)
        return with_cache(
            Seq2SeqLMOutput, getattr(outputs, CACHE_FIELD),
            loss=loss,
            logits=logits,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    @staticmethod
    def token_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """Cross-entropy (`label_smoothed_cross_entropy` with ε = 0) summed over label tokens (-100 ignored), divided
        by `num_items_in_batch` when given, else by this batch's label-token count."""
        total, _, count = label_smoothed_cross_entropy(logits, labels.to(logits.device), epsilon=0.0)
        if num_items_in_batch is None:
            num_items_in_batch = count.clamp(min=1)
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "VaswaniPreTrainedModel",
    "VaswaniModel",
    "VaswaniForConditionalGeneration",
    "VaswaniEncoder",
    "VaswaniDecoder",
    "sinusoidal_table",
    "shift_tokens_right",
    "label_smoothed_cross_entropy",
    "check_loss_arguments",
    "CACHE_FIELD",
    "LENGTH_PENALTY_STYLES",
]
