"""The model equals implementations nobody here wrote: torch.nn.Transformer and transformers' MarianMTModel."""

import math

import pytest
import torch
from torch import nn
from transformers import MarianConfig, MarianMTModel

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.model.convert import from_marian, to_marian
from vaswani_mt.model.modeling_vaswani import sinusoidal_table


def _copy_attention(ours, theirs: nn.MultiheadAttention):
    q, k, v = theirs.in_proj_weight.chunk(3)
    qb, kb, vb = theirs.in_proj_bias.chunk(3)
    for proj, weight, bias in ((ours.q_proj, q, qb), (ours.k_proj, k, kb), (ours.v_proj, v, vb),
                               (ours.out_proj, theirs.out_proj.weight, theirs.out_proj.bias)):
        proj.weight.copy_(weight)
        proj.bias.copy_(bias)


def _copy(module, source):
    module.weight.copy_(source.weight)
    module.bias.copy_(source.bias)


@torch.no_grad()
def _model_from_torch_transformer(reference: nn.Transformer, config: VaswaniConfig) -> VaswaniForConditionalGeneration:
    model = VaswaniForConditionalGeneration(config).eval()
    for ours, theirs in zip(model.model.encoder.layers, reference.encoder.layers):
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy(ours.ffn.fc1, theirs.linear1)
        _copy(ours.ffn.fc2, theirs.linear2)
        _copy(ours.self_attn_layer_norm, theirs.norm1)
        _copy(ours.final_layer_norm, theirs.norm2)
    for ours, theirs in zip(model.model.decoder.layers, reference.decoder.layers):
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.encoder_attn, theirs.multihead_attn)
        _copy(ours.ffn.fc1, theirs.linear1)
        _copy(ours.ffn.fc2, theirs.linear2)
        _copy(ours.self_attn_layer_norm, theirs.norm1)
        _copy(ours.encoder_attn_layer_norm, theirs.norm2)
        _copy(ours.final_layer_norm, theirs.norm3)
    if config.norm_style == "pre":
        _copy(model.model.encoder.layer_norm, reference.encoder.norm)
        _copy(model.model.decoder.layer_norm, reference.decoder.norm)
    return model


def _torch_transformer(norm_style: str, config: VaswaniConfig) -> nn.Transformer:
    torch.manual_seed(0)
    reference = nn.Transformer(
        d_model=config.d_model, nhead=config.encoder_attention_heads, num_encoder_layers=config.encoder_layers,
        num_decoder_layers=config.decoder_layers, dim_feedforward=config.encoder_ffn_dim, dropout=0.1,
        batch_first=True, norm_first=(norm_style == "pre"),
    ).eval()
    for p in reference.parameters():  # non-trivial LayerNorm parameters and biases, so that copying is tested
        p.data.add_(0.1 * torch.randn_like(p))
    if norm_style == "post":  # the paper's post-norm stacks end in the last layer's own LayerNorm
        reference.encoder.norm = None
        reference.decoder.norm = None
    return reference


@pytest.mark.parametrize("position_embedding", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_style", ["post", "pre"])
def test_logits_equal_torch_nn_transformer_with_padding_on_both_sides(norm_style, position_embedding, padded_batch):
    """Learned positions (Table 3 (E)) too: each stack's table added to the embeddings fed to torch's Transformer."""
    config = VaswaniConfig.from_preset("tiny", norm_style=norm_style, position_embedding=position_embedding)
    reference = _torch_transformer(norm_style, config)
    model = _model_from_torch_transformer(reference, config)
    src, src_mask = padded_batch["input_ids"], padded_batch["attention_mask"].bool()
    labels = padded_batch["labels"]
    tgt = model.prepare_decoder_input_ids_from_labels(labels)
    tgt_mask = torch.ones_like(tgt, dtype=torch.bool)
    tgt_mask[:, 1:] = labels[:, :-1] != -100

    with torch.no_grad():
        ours = model(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                     decoder_attention_mask=tgt_mask.long()).logits
        embedding = model.model.shared.weight

        def embed(ids, stack):
            table = (stack.embed_positions.weight if position_embedding == "learned"
                     else sinusoidal_table(64, config.d_model))
            return embedding[ids] * math.sqrt(config.d_model) + table[: ids.shape[1]]

        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        hidden = reference(embed(src, model.model.encoder), embed(tgt, model.model.decoder), tgt_mask=causal,
                           src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask,
                           memory_key_padding_mask=~src_mask, tgt_is_causal=True)
        theirs = hidden @ embedding.T

    real = tgt_mask  # padded target positions carry no prediction
    assert (ours[real] - theirs[real]).abs().max() < 1e-5


def _random_marian(**overrides) -> MarianMTModel:
    torch.manual_seed(0)
    settings = dict(  # shaped like an opus-mt checkpoint: swish, scaled embeddings, pad = last id
        vocab_size=96, decoder_vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
        max_position_embeddings=256, pad_token_id=95, eos_token_id=0, decoder_start_token_id=95,
        forced_eos_token_id=0, scale_embedding=True, activation_function="swish",
    )
    config = MarianConfig(**{**settings, **overrides})
    marian = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in marian.named_parameters():
            if "embed_positions" not in name:  # keep Marian's sinusoid table: it is not a learned weight
                p.add_(0.05 * torch.randn_like(p))
        marian.final_logits_bias.normal_()
    return marian


def _marian_batch():
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(1, 95, (4, 11), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    attention_mask[3, 4:] = 0
    input_ids[attention_mask == 0] = 95
    decoder_input_ids = torch.randint(1, 95, (4, 6), generator=generator)
    return input_ids, attention_mask, decoder_input_ids


@pytest.mark.parametrize("variant", [
    dict(),
    dict(scale_embedding=False, activation_function="relu"),
    dict(tie_word_embeddings=False),
    dict(share_encoder_decoder_embeddings=False),
])
def test_from_marian_keeps_logits_and_beam_search_output(variant):
    marian = _random_marian(**variant)
    model = from_marian(marian)
    input_ids, attention_mask, decoder_input_ids = _marian_batch()
    with torch.no_grad():
        theirs = marian(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    assert (ours - theirs).abs().max() < 1e-5
    generate = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=12)
    assert torch.equal(model.generate(**generate), marian.generate(**generate))


def test_to_marian_inverts_from_marian_and_converts_our_own_models(make_tiny_model, padded_batch):
    marian = _random_marian()
    back = to_marian(from_marian(marian))
    for name, tensor in marian.state_dict().items():
        assert torch.equal(tensor, back.state_dict()[name]), name

    model = make_tiny_model()
    marian = to_marian(model).eval()
    batch = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(padded_batch["labels"])
    with torch.no_grad():
        ours = model(**batch, decoder_input_ids=decoder_input_ids).logits
        theirs = marian(**batch, decoder_input_ids=decoder_input_ids).logits
    assert (ours - theirs).abs().max() < 1e-5


def test_to_marian_refuses_pre_norm_models(make_tiny_model):
    with pytest.raises(ValueError, match="post-norm"):
        to_marian(make_tiny_model(norm_style="pre"))


def _count_trainable_parameters(model: nn.Module) -> int:
    # parameters() yields each shared tensor once; Marian's sinusoid tables are frozen parameters, ours a buffer
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("preset,paper_millions", [("base", 65), ("big", 213)])
def test_parameter_counts_match_marian_and_the_paper_table_3(preset, paper_millions):
    config = VaswaniConfig.from_preset(preset, vocab_size=37000)
    with torch.device("meta"):
        ours = _count_trainable_parameters(VaswaniForConditionalGeneration(config))
        marian = _count_trainable_parameters(MarianMTModel(MarianConfig(
            vocab_size=37000, decoder_vocab_size=37000, d_model=config.d_model,
            encoder_layers=6, decoder_layers=6, encoder_attention_heads=config.encoder_attention_heads,
            decoder_attention_heads=config.decoder_attention_heads, encoder_ffn_dim=config.encoder_ffn_dim,
            decoder_ffn_dim=config.decoder_ffn_dim, pad_token_id=0, decoder_start_token_id=0,
        )))
    assert ours == marian
    assert abs(ours / 1e6 - paper_millions) / paper_millions < 0.05, ours
