"""VaswaniForConditionalGeneration behaves as a native Hugging Face seq2seq model."""

import json
import logging

import pytest
import torch
from transformers import AutoModel, AutoModelForSeq2SeqLM, GenerationConfig

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani_mt.model.modeling_vaswani import CACHE_FIELD, sinusoidal_table


def _forward(model, batch, **kwargs):
    with torch.no_grad():
        return model(**batch, **kwargs)


def test_positions_are_the_papers_interleaved_sinusoids_and_not_saved(make_tiny_model, tmp_path):
    table = sinusoidal_table(50, 8)
    pos, i = 7, 1
    assert table[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(pos / 10000 ** (2 * i / 8))).item())
    assert table[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(pos / 10000 ** (2 * i / 8))).item())
    model = make_tiny_model()
    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert not [k for k in f.keys() if "embed_positions" in k]


@pytest.mark.parametrize("norm_style", ["post", "pre"])
def test_eager_and_sdpa_attention_agree_within_1e_5(make_tiny_model, padded_batch, norm_style):
    model = make_tiny_model(norm_style=norm_style)
    assert model.config._attn_implementation == "sdpa"
    sdpa = _forward(model, padded_batch).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    eager = _forward(model, padded_batch).logits
    assert (sdpa - eager).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keys", [1, 7, 15, 16, 33])
def test_attention_softmax_equals_torch_softmax_and_its_gradient_for_short_and_long_rows(dtype, keys):
    """Rows shorter than SHORT_ROW go through ShortRowSoftmax (torch's CPU kernel is slow there), longer ones through
    torch's softmax; both give torch's float32 softmax and gradient, masked keys (the dtype's lowest value, or -inf
    as an additive mask) included, a fully masked row uniform as in torch."""
    from vaswani_mt.model.modeling_vaswani import attention_softmax

    generator = torch.Generator().manual_seed(keys)
    scores = (torch.randn(3, 2, 5, keys, generator=generator) * 4).to(dtype)
    scores[0, :, :, keys // 2:] = torch.finfo(dtype).min  # padding keys (none left out when keys == 1)
    scores[1, 0, 2, :] = torch.finfo(dtype).min  # a row with nothing to attend to
    scores[2, 1, :, 1:] = float("-inf")  # an additive mask's -inf: only the first key left
    grad = torch.randn(3, 2, 5, keys, generator=generator)
    ours, reference = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    weights = attention_softmax(ours)
    expected = torch.softmax(reference, dim=-1, dtype=torch.float32)
    weights.backward(grad)
    expected.backward(grad)
    assert weights.dtype == torch.float32 and ours.grad.dtype == dtype
    assert torch.allclose(weights, expected, atol=1e-6, rtol=1e-5)
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert torch.allclose(ours.grad.float(), reference.grad.float(), atol=tolerance, rtol=tolerance)


class _AttentionKernels(torch.overrides.TorchFunctionMode):
    """While inside: the calls of torch's fused attention (`scaled_dot_product_attention`) and the plain products of
    attention, softmax(Q K^T) V written out: `torch.matmul`s whose operands and result have 4 dimensions (batch,
    heads, positions, keys or features), two per attention call and none elsewhere in the model."""

    def __init__(self):
        super().__init__()
        self.fused = self.products = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "scaled_dot_product_attention":
            self.fused += 1
        elif func is torch.matmul and result.dim() == 4:
            self.products += 1
        return result


def test_training_on_cpu_attends_with_plain_products_and_keeps_sdpas_loss_and_gradients(make_tiny_model,
                                                                                          padded_batch):
    """CPU training (float32 too) takes eager attention, torch's flash-attention kernel being slower there
    (docs/speed.md): every attention call of the forward pass multiplies Q K^T and the weights by V itself and none
    calls torch's fused kernel, which evaluation keeps; without dropout the loss and every gradient are sdpa's to
    float tolerance."""
    model = make_tiny_model(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    calls = model.config.encoder_layers + 2 * model.config.decoder_layers  # self-attention; the decoder's cross too

    def loss_and_gradients(training: bool):
        model.train(training)
        model.zero_grad()
        with _AttentionKernels() as kernels:
            loss = model(**padded_batch).loss
            loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, \
            kernels

    sdpa_loss, sdpa_grads, evaluation = loss_and_gradients(training=False)
    assert (evaluation.fused, evaluation.products) == (calls, 0)  # evaluation keeps transformers' choice: sdpa
    eager_loss, eager_grads, training = loss_and_gradients(training=True)
    assert (training.fused, training.products) == (0, 2 * calls)
    assert torch.allclose(eager_loss, sdpa_loss, atol=1e-6)
    assert eager_grads.keys() == sdpa_grads.keys()
    for name, grad in eager_grads.items():
        assert torch.allclose(grad, sdpa_grads[name], atol=1e-6, rtol=1e-4), name


def test_output_attentions_returns_every_layers_weights_with_masked_keys_at_zero(make_tiny_model, padded_batch):
    model = make_tiny_model()  # sdpa by default: attention weights must still come back
    out = _forward(model, padded_batch, output_attentions=True)
    config = model.config
    src_len, tgt_len = padded_batch["input_ids"].shape[1], padded_batch["labels"].shape[1]
    assert len(out.encoder_attentions) == config.encoder_layers
    assert len(out.decoder_attentions) == len(out.cross_attentions) == config.decoder_layers
    assert out.encoder_attentions[0].shape == (3, config.encoder_attention_heads, src_len, src_len)
    assert out.decoder_attentions[0].shape == (3, config.decoder_attention_heads, tgt_len, tgt_len)
    assert out.cross_attentions[0].shape == (3, config.decoder_attention_heads, tgt_len, src_len)
    for weights in out.encoder_attentions + out.decoder_attentions + out.cross_attentions:
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-5)
    padding = padded_batch["attention_mask"] == 0
    for weights in out.encoder_attentions + out.cross_attentions:
        assert weights.masked_select(padding[:, None, None, :].expand_as(weights)).abs().max() == 0
    future = torch.ones(tgt_len, tgt_len, dtype=torch.bool).triu(1)
    for weights in out.decoder_attentions:
        assert weights[..., future].abs().max() == 0


def test_hidden_states_of_every_layer_are_returned(make_tiny_model, padded_batch):
    out = _forward(make_tiny_model(), padded_batch, output_hidden_states=True)
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == 3  # embeddings + 2 layers


@pytest.mark.parametrize("norm_style", ["post", "pre"])
@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("fast", [True, False], ids=["vaswani_mt loops", "transformers loops"])
def test_generate_gives_identical_output_with_and_without_the_cache(make_tiny_model, padded_batch, norm_style,
                                                                    num_beams, fast):
    model = make_tiny_model(norm_style=norm_style)
    model.use_fast_decoding = fast  # transformers' loops feed the model's own cache back into forward
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    cached = model.generate(**inputs, num_beams=num_beams, max_new_tokens=15, use_cache=True)
    uncached = model.generate(**inputs, num_beams=num_beams, max_new_tokens=15, use_cache=False)
    assert torch.equal(cached, uncached)


def test_the_output_limit_is_the_papers_input_plus_50_unless_one_is_given(make_tiny_model):
    model = make_tiny_model()
    # An untrained model never emits </s> reliably: suppress it to see the length limit.
    source = torch.randint(4, 128, (2, 6))
    out = model.generate(source, num_beams=1, suppress_tokens=[model.config.eos_token_id])
    assert out.shape[1] == 1 + 6 + 50
    assert model.generate(source, num_beams=1, max_new_tokens=5).shape[1] == 6


def test_loss_is_token_mean_and_sum_over_num_items_in_batch(make_tiny_model, padded_batch):
    model = make_tiny_model()
    out = _forward(model, padded_batch)
    labels = padded_batch["labels"]
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 128), labels.reshape(-1))
    assert torch.allclose(out.loss, expected)
    tokens = (labels != -100).sum()
    with_count = _forward(model, padded_batch, num_items_in_batch=tokens * 4)
    assert torch.allclose(with_count.loss, expected / 4)


def _gradients(model, batches, num_items):
    model.zero_grad()
    for batch in batches:
        model(**batch, num_items_in_batch=num_items).loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_gradient_accumulation_equals_one_big_batch(make_tiny_model, padded_batch):
    model = make_tiny_model(dropout=0.0)
    model.train()
    tokens = (padded_batch["labels"] != -100).sum()
    full = _gradients(model, [padded_batch], tokens)
    halves = [{k: v[:2] for k, v in padded_batch.items()}, {k: v[2:] for k, v in padded_batch.items()}]
    accumulated = _gradients(model, halves, tokens)
    assert torch.allclose(full, accumulated, atol=1e-6)


def test_gradient_checkpointing_gives_the_same_gradients(make_tiny_model, padded_batch):
    model = make_tiny_model(dropout=0.0)
    model.train()
    plain = _gradients(model, [padded_batch], None)
    # transformers 5.24 renamed gradient_checkpointing_enable (kept with a deprecation warning)
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert any(layer.gradient_checkpointing for layer in model.model.decoder.layers)
    checkpointed = _gradients(model, [padded_batch], None)
    assert torch.allclose(plain, checkpointed, atol=1e-6)


def test_decoder_inputs_from_labels_are_shifted_right_behind_the_start_token(make_tiny_model):
    model = make_tiny_model()
    labels = torch.tensor([[5, 6, 3, -100], [7, 3, -100, -100]])
    assert model.prepare_decoder_input_ids_from_labels(labels).tolist() == [[2, 5, 6, 3], [2, 7, 3, 0]]


def test_resize_token_embeddings_keeps_rows_and_ties(make_tiny_model):
    model = make_tiny_model()
    old = model.model.shared.weight.detach().clone()
    model.resize_token_embeddings(140)
    assert model.config.vocab_size == 140
    assert model.lm_head.weight is model.model.shared.weight
    assert model.model.encoder.embed_tokens is model.model.decoder.embed_tokens
    assert torch.equal(model.model.shared.weight[:128], old)
    logits = model(input_ids=torch.tensor([[139, 3]]), decoder_input_ids=torch.tensor([[2]])).logits
    assert logits.shape[-1] == 140


@pytest.mark.parametrize("share,tie", [(True, True), (True, False), (False, True), (False, False)])
def test_save_and_load_keep_weights_ties_and_generation_config_without_pickles(make_tiny_model, tmp_path, share,
                                                                               tie):
    model = make_tiny_model(share_embeddings=share, tie_word_embeddings=tie, norm_style="pre")
    model.generation_config.num_beams = 5
    model.save_pretrained(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.suffix in (".bin", ".pt", ".pkl", ".pth")]
    loaded, info = VaswaniForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert model.state_dict().keys() == loaded.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert (loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight) == tie
    assert (loaded.model.encoder.embed_tokens is loaded.model.decoder.embed_tokens) == share
    assert loaded.generation_config.num_beams == 5


def test_auto_classes_resolve_the_vaswani_model_type(make_tiny_model, tmp_path):
    make_tiny_model().save_pretrained(tmp_path)
    assert type(AutoModelForSeq2SeqLM.from_pretrained(tmp_path)) is VaswaniForConditionalGeneration
    assert type(AutoModel.from_pretrained(tmp_path)) is VaswaniModel
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    assert (tmp_path / "modeling_vaswani.py").exists() and (tmp_path / "configuration_vaswani.py").exists()


def test_source_longer_than_the_position_table_is_a_clear_error(make_tiny_model):
    model = make_tiny_model()
    too_long = torch.randint(4, 128, (1, model.config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="longer than max_position_embeddings=128"):
        model(input_ids=too_long, decoder_input_ids=torch.tensor([[2]]))


def test_source_of_only_eos_works_and_an_all_padding_source_is_a_clear_error(make_tiny_model):
    model = make_tiny_model()
    only_eos = torch.tensor([[3, 0, 0], [9, 10, 3]])
    mask = (only_eos != 0).long()
    out = model.generate(only_eos, attention_mask=mask, max_new_tokens=4)
    assert out.shape[0] == 2
    mask[0] = 0
    with pytest.raises(ValueError, match=r"source sequence\(s\) \[0\] in the batch are empty"):
        model.generate(only_eos, attention_mask=mask, max_new_tokens=4)


def test_generation_config_is_a_plain_generation_config(make_tiny_model):
    assert isinstance(make_tiny_model().generation_config, GenerationConfig)


def test_generate_refuses_an_empty_batch_naming_it(make_tiny_model):
    with pytest.raises(ValueError, match=r"batch of token ids .* shape \(0, 5\)"):
        make_tiny_model().generate(input_ids=torch.zeros(0, 5, dtype=torch.long))


def test_generate_refuses_token_ids_outside_the_vocabulary_naming_the_id(make_tiny_model):
    model = make_tiny_model()
    too_large = torch.tensor([[5, model.config.vocab_size + 3, 3]])
    with pytest.raises(ValueError, match=f"token id {model.config.vocab_size + 3}, outside the model's vocabulary"):
        model.generate(input_ids=too_large)
    with pytest.raises(ValueError, match="token id -1"):
        model.generate(input_ids=torch.tensor([[5, -1, 3]]))


def _next_step(model, padded_batch, **cache):
    """Logits of the second target position, fed one position at a time through a cache given as `cache`."""
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    start = torch.full((3, 1), model.config.decoder_start_token_id)
    first = model(**inputs, decoder_input_ids=start, use_cache=True)
    given = getattr(first, CACHE_FIELD)
    return model(**inputs, decoder_input_ids=torch.full((3, 1), 5), use_cache=True,
                 **{name: given for name in cache}), given


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_forward_takes_the_cache_under_either_name_and_returns_it_under_the_installed_one(make_tiny_model,
                                                                                          padded_batch, name):
    model = make_tiny_model()
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    full = model(**inputs, decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id, 5]] * 3))
    step, _ = _next_step(model, padded_batch, **{name: True})
    assert torch.allclose(step.logits[:, -1], full.logits[:, -1], atol=1e-5)
    assert getattr(step, CACHE_FIELD).get_seq_length() == 2
    assert CACHE_FIELD in step.keys()  # set under the installed field: no deprecation shim renames it


def test_two_different_caches_under_both_names_are_refused(make_tiny_model, padded_batch):
    model = make_tiny_model()
    _, given = _next_step(model, padded_batch, cache=True)
    _, other = _next_step(model, padded_batch, cache=True)
    with pytest.raises(ValueError, match="not both"):
        model(**{k: padded_batch[k] for k in ("input_ids", "attention_mask")}, decoder_input_ids=torch.full((3, 1), 5),
              cache=given, past_key_values=other)


def test_the_trainer_ignores_the_cache_under_both_names_at_evaluation(make_tiny_model):
    assert {"cache", "past_key_values"} <= set(make_tiny_model().config.keys_to_ignore_at_inference)


def test_checkpointed_decoder_layers_get_the_cache_under_the_name_transformers_clears(make_tiny_model, padded_batch,
                                                                               monkeypatch):
    from vaswani_mt.model.modeling_vaswani import VaswaniAttention

    model = make_tiny_model(dropout=0.0).train()
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    seen, forward = [], VaswaniAttention.forward

    def spy(self, *args, cache=None, **kwargs):
        seen.append(cache)
        return forward(self, *args, cache=cache, **kwargs)
    monkeypatch.setattr(VaswaniAttention, "forward", spy)
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    model(**inputs, decoder_input_ids=torch.full((3, 4), 5), use_cache=True).logits.sum().backward()
    assert seen and all(cache is None for cache in seen)  # transformers clears it under the name it knows


def test_without_the_package_loops_a_gnmt_call_says_once_that_the_package_applies_the_gnmt_penalty(
        make_tiny_model, padded_batch, monkeypatch, caplog):
    import vaswani_mt.model.modeling_vaswani as modeling

    monkeypatch.setattr(modeling, "_warned", set())
    model = make_tiny_model()
    model.decoding_loops = None  # as in a folder loaded as remote code
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    with caplog.at_level(logging.WARNING, logger=modeling.__name__):
        for _ in range(2):
            model.generate(**inputs, num_beams=4, max_new_tokens=5, length_penalty_style="gnmt")
    assert caplog.text.count("length_penalty_style='gnmt' is applied by the vaswani_mt package") == 1


def test_compiled_half_precision_training_on_a_gpu_attends_over_short_keys_with_the_memory_efficient_kernel(
        make_tiny_model, monkeypatch):
    """sdpa's default GPU kernel wastes most of its tiles on short sentences; compiled, its memory-efficient kernel is
    faster there (docs/speed.md). Everywhere else the implementation transformers chose stays."""
    from types import SimpleNamespace

    from vaswani_mt.model.modeling_vaswani import MEMORY_EFFICIENT_SDPA, SHORT_KEYS

    attention = make_tiny_model().train().model.encoder.layers[0].self_attn
    compiling = [True]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling[0])

    def chosen(device="cuda", dtype=torch.bfloat16, keys=25, output_attentions=None):
        query = SimpleNamespace(device=torch.device(device), dtype=dtype)
        return attention.implementation(query, SimpleNamespace(shape=(2, 4, keys, 8)), output_attentions)

    assert attention.config._attn_implementation == "sdpa"
    assert chosen() == chosen(dtype=torch.float16) == chosen(keys=SHORT_KEYS) == MEMORY_EFFICIENT_SDPA
    assert chosen(keys=SHORT_KEYS + 1) == chosen(dtype=torch.float32) == "sdpa"
    assert chosen(device="cpu") == chosen(device="cpu", dtype=torch.float32) == "eager"  # CPU training: eager
    assert chosen(output_attentions=True, keys=1000) == "eager"  # as before
    compiling[0] = False
    assert chosen() == "sdpa"  # not compiled, sdpa's kernels are the faster
    compiling[0] = True
    attention.eval()
    assert chosen() == "sdpa"


def test_the_memory_efficient_choice_runs_transformers_sdpa_inside_that_kernel_restriction(
        make_tiny_model, monkeypatch):
    """The choice is carried out, not only named: transformers' sdpa function runs while torch's sdpa is held to
    its memory-efficient kernel, and returns what sdpa returns unrestricted."""
    from torch.nn.attention import SDPBackend

    from vaswani_mt.model import modeling_vaswani as modeling

    attention = make_tiny_model().eval().model.encoder.layers[0].self_attn
    hidden = torch.randn(2, 5, attention.config.d_model)
    expected = attention(hidden)[0]
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def restricted_here(*args, **kwargs):  # on the CPU the memory-efficient kernel does not exist: sdpa unrestricted
        backends = torch.backends.cuda
        seen.append(backends.mem_efficient_sdp_enabled() and not backends.flash_sdp_enabled()
                    and not backends.math_sdp_enabled())
        with torch.nn.attention.sdpa_kernel([SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
            return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", restricted_here)
    monkeypatch.setattr(modeling.VaswaniAttention, "implementation", lambda *a: modeling.MEMORY_EFFICIENT_SDPA)
    torch.testing.assert_close(attention(hidden)[0], expected)
    assert seen == [True]


def _uniform_bound(tensor: torch.Tensor) -> float:
    return tensor.abs().max().item()


@pytest.mark.parametrize("initialization", ["xavier", "fairseq"])
def test_a_new_model_starts_its_weight_matrices_as_its_initialization_says(initialization):
    """"xavier": Xavier-uniform, zero biases everywhere. "fairseq": as fairseq's transformer, query/key/value Xavier
    with gain 1/sqrt(2) and feed-forward layers as torch's nn.Linear starts them (bound 1/sqrt(fan_in)), their
    biases too; attention output projections Xavier with zero bias either way."""
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("mini", vocab_size=1000, initialization=initialization)
    layer = VaswaniForConditionalGeneration(config).model.decoder.layers[0]
    d, ffn = config.d_model, config.decoder_ffn_dim
    xavier = (6 / (d + d)) ** 0.5
    fairseq = initialization == "fairseq"
    for attention in (layer.self_attn, layer.encoder_attn):
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            bound = xavier * (2**-0.5 if fairseq else 1.0)
            assert 0.97 * bound < _uniform_bound(projection.weight) <= bound
            assert (_uniform_bound(projection.bias) > 0.9 * d**-0.5) if fairseq else not projection.bias.any()
        assert 0.97 * xavier < _uniform_bound(attention.out_proj.weight) <= xavier
        assert not attention.out_proj.bias.any()
    for fc, fan_in, fan_out in ((layer.ffn.fc1, d, ffn), (layer.ffn.fc2, ffn, d)):
        bound = fan_in**-0.5 if fairseq else (6 / (fan_in + fan_out)) ** 0.5
        assert 0.97 * bound < _uniform_bound(fc.weight) <= bound
        assert (_uniform_bound(fc.bias) > 0.9 * fan_in**-0.5) if fairseq else not fc.bias.any()


def test_a_saved_model_loads_its_own_weights_whatever_its_initialization(tmp_path):
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", initialization="fairseq"))
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.initialization == "fairseq"
    for (name, saved), again in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(saved, again), name
