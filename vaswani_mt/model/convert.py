"""Conversion between `MarianMTModel` (every opus-mt checkpoint) and `VaswaniForConditionalGeneration`.

Marian is the paper's post-norm Transformer with two differences that matter for exactness:

* its sinusoidal table is not interleaved: columns hold all sines, then all cosines, where the paper (§3.5)
  interleaves sin/cos. The two layouts differ by a fixed permutation P of the d_model features. Because
  LayerNorm, residual additions and the feed-forward/attention projections commute with a permutation of the
  features (when their weights are permuted alike), permuting every d_model-sized axis of every weight by P gives
  a model whose hidden states are exactly Marian's, permuted. Logits are unchanged.
* it adds a fixed `final_logits_bias` to the logits; we carry it with `final_logits_bias=True`.

Only post-norm models map back to Marian (Marian has no pre-norm variant).
"""

import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration

# Parameter-name suffixes by which d_model-sized axis they have: input features (columns), output features
# (rows; biases too), or a d_model vector (LayerNorm).
_HIDDEN_IN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight", "embed_tokens.weight",
              "shared.weight", "lm_head.weight")
_HIDDEN_OUT = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias")
_LAYER_NORM = ("layer_norm.weight", "layer_norm.bias")


def interleave_permutation(dim: int) -> torch.Tensor:
    """P with ours[..., j] = marian[..., P[j]]: Marian's [sin..., cos...] columns in the paper's sin/cos order."""
    sines = (dim + 1) // 2
    perm = torch.empty(dim, dtype=torch.long)
    perm[0::2] = torch.arange(sines)
    perm[1::2] = sines + torch.arange(dim // 2)
    return perm


def _permute(name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    if name.endswith(_HIDDEN_IN):
        return tensor[:, perm]
    if name.endswith(_HIDDEN_OUT):
        return tensor[perm]
    if name.endswith(_LAYER_NORM):
        return tensor[perm]
    return tensor


def _marian_name(our_name: str) -> str:
    return our_name.replace(".ffn.fc1.", ".fc1.").replace(".ffn.fc2.", ".fc2.")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr()


def config_from_marian(marian: MarianMTModel) -> VaswaniConfig:
    """The VaswaniConfig of a Marian model's shape. Sharing and tying are read off the modules, not the config:
    in transformers 5, Marian's `tie_word_embeddings=False` also unties the encoder/decoder embeddings."""
    marian_config = marian.config
    encoder_embeddings = marian.model.encoder.embed_tokens.weight
    decoder_embeddings = marian.model.decoder.embed_tokens.weight
    decoder_vocab = marian_config.decoder_vocab_size or marian_config.vocab_size
    if decoder_vocab != marian_config.vocab_size:
        raise ValueError(
            f"this Marian model has separate vocabularies (source {marian_config.vocab_size}, target "
            f"{decoder_vocab}); vaswani_mt models use one joint vocabulary (§5.1)"
        )
    return VaswaniConfig(
        vocab_size=marian_config.vocab_size,
        d_model=marian_config.d_model,
        encoder_layers=marian_config.encoder_layers,
        decoder_layers=marian_config.decoder_layers,
        encoder_attention_heads=marian_config.encoder_attention_heads,
        decoder_attention_heads=marian_config.decoder_attention_heads,
        encoder_ffn_dim=marian_config.encoder_ffn_dim,
        decoder_ffn_dim=marian_config.decoder_ffn_dim,
        activation_function=marian_config.activation_function,
        dropout=float(marian_config.dropout),
        attention_dropout=float(marian_config.attention_dropout),
        activation_dropout=float(marian_config.activation_dropout),
        max_position_embeddings=marian_config.max_position_embeddings,
        norm_style="post",
        scale_embedding=marian_config.scale_embedding,
        share_embeddings=_same_tensor(encoder_embeddings, decoder_embeddings),
        tie_word_embeddings=_same_tensor(marian.lm_head.weight, decoder_embeddings),
        final_logits_bias=True,
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        decoder_start_token_id=marian_config.decoder_start_token_id,
    )


@torch.no_grad()
def from_marian(marian: MarianMTModel) -> VaswaniForConditionalGeneration:
    """A `VaswaniForConditionalGeneration` computing exactly what `marian` computes (same logits, same
    generate() output: its generation config is copied too)."""
    model = VaswaniForConditionalGeneration(config_from_marian(marian))
    source = marian.state_dict()
    perm = interleave_permutation(model.config.d_model)
    for name, tensor in model.state_dict().items():
        marian_name = _marian_name(name)
        if name == "model.shared.weight":  # what the encoder really uses (Marian may keep an unused `shared`)
            marian_name = "model.encoder.embed_tokens.weight"
        if marian_name not in source:
            raise KeyError(f"Marian model has no parameter {marian_name!r} (needed for {name!r})")
        tensor.copy_(_permute(name, source[marian_name], perm))
    model.generation_config = GenerationConfig.from_dict(marian.generation_config.to_dict())
    return model.train(marian.training)


def refuse_other_head_sizes(config: VaswaniConfig, target: str) -> None:
    """A ValueError naming the field where a head's size is not d_model / heads (Table 3 (B)): `target` computes
    every head with d_model / heads dimensions."""
    for heads in (config.encoder_attention_heads, config.decoder_attention_heads):
        for field, size in zip(("d_k", "d_v"), config.head_sizes(heads)):
            if size * heads != config.d_model:
                raise ValueError(f"VaswaniConfig.{field}={size} does not convert to {target}: its heads have "
                                 f"d_model / heads = {config.d_model / heads:g} dimensions")


@torch.no_grad()
def to_marian(model: VaswaniForConditionalGeneration) -> MarianMTModel:
    """The `MarianMTModel` computing exactly what a post-norm `model` computes."""
    config = model.config
    if config.norm_style != "post":
        raise ValueError("only post-norm models convert to Marian (Marian has no pre-norm variant)")
    refuse_other_head_sizes(config, "Marian")
    if config.position_embedding != "sinusoidal":
        raise ValueError(f"VaswaniConfig.position_embedding={config.position_embedding!r} does not convert to Marian: "
                         "Marian's positions are sinusoids")
    marian_config = MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        activation_function=config.activation_function,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_position_embeddings=config.max_position_embeddings,
        scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=config.share_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        forced_eos_token_id=None,
        decoder_start_token_id=config.decoder_start_token_id,
    )
    if config.layer_norm_eps != 1e-5:
        raise ValueError(f"Marian's LayerNorm epsilon is fixed at 1e-5; this model uses {config.layer_norm_eps}")
    marian = MarianMTModel(marian_config)
    ours = model.state_dict()
    inverse = torch.argsort(interleave_permutation(config.d_model))
    for marian_name, tensor in marian.state_dict().items():
        if "embed_positions" in marian_name:
            continue
        if marian_name == "final_logits_bias":
            if "final_logits_bias" in ours:
                tensor.copy_(ours["final_logits_bias"])
            else:
                tensor.zero_()
            continue
        our_name = marian_name.replace(".fc1.", ".ffn.fc1.").replace(".fc2.", ".ffn.fc2.")
        tensor.copy_(_permute(our_name, ours[our_name], inverse))
    marian.generation_config = GenerationConfig.from_dict(model.generation_config.to_dict())
    return marian.train(model.training)


__all__ = ["from_marian", "to_marian", "config_from_marian", "interleave_permutation", "refuse_other_head_sizes"]
