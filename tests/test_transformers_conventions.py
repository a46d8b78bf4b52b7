"""The model keeps transformers' conventions where its own model tests look: half precision, tuples on request, what a
checkpoint lacks, greedy decoding unless the generation config says otherwise, sub-models built alone, a decoder
without encoder states, and the old cache name."""

import functools
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, pipeline
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from test_fast_decoding import loops_that_ran
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani_mt.model.modeling_vaswani import CACHE_FIELD, VaswaniDecoder, VaswaniEncoder

EOS = 3
HALF = [torch.bfloat16, torch.float16]


def _sources():
    input_ids = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, 0, 0]])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}


def _trained_like(make_tiny_model):
    """A tiny model whose </s> logit is raised, so its hypotheses end at different lengths."""
    model = make_tiny_model(final_logits_bias=True)
    model.final_logits_bias[0, EOS] = 2.5
    return model


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_folder_loaded_in_half_precision_generates_as_transformers_loops_do(make_tiny_model, tmp_path, device, dtype,
                                                                               num_beams):
    _trained_like(make_tiny_model).save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype).to(device)
    assert {p.dtype for p in model.parameters()} == {dtype}
    inputs = {k: v.to(device) for k, v in _sources().items()}
    fast = model.generate(**inputs, num_beams=num_beams, max_new_tokens=12)
    model.use_fast_decoding = False
    assert torch.equal(fast, model.generate(**inputs, num_beams=num_beams, max_new_tokens=12))
    logits = model(**inputs, decoder_input_ids=fast).logits
    assert logits.dtype == dtype and torch.isfinite(logits).all()


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_half_precision_model_saves_and_reloads_as_it_was_also_with_dtype_auto(make_tiny_model, tmp_path, dtype):
    model = make_tiny_model().to(dtype)
    model.save_pretrained(tmp_path)
    assert {t.dtype for t in load_file(tmp_path / "model.safetensors").values()} == {dtype}
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype="auto")
    assert reloaded.dtype == dtype
    for (name, mine), theirs in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(mine, theirs), name
    expected = model.generate(**_sources(), max_new_tokens=6)
    assert torch.equal(reloaded.generate(**_sources(), max_new_tokens=6), expected)


def test_the_translation_pipeline_runs_a_folder_in_bfloat16(model_dir):
    translator = pipeline("translation", model=str(model_dir), dtype=torch.bfloat16)
    assert translator.model.dtype == torch.bfloat16
    assert isinstance(translator("a small test", max_new_tokens=5)[0]["translation_text"], str)


@pytest.mark.parametrize("model_class", [VaswaniModel, VaswaniForConditionalGeneration])
@pytest.mark.parametrize("how", ["argument", "config"])
def test_return_dict_false_gives_the_outputs_fields_as_a_tuple(model_class, how, padded_batch):
    torch.manual_seed(0)
    model = model_class(VaswaniConfig.from_preset("tiny")).eval()
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    inputs["decoder_input_ids"] = padded_batch["input_ids"]
    expected = model(**inputs).to_tuple()
    if how == "config":
        model.config.return_dict = False
        got = model(**inputs)
    else:
        got = model(**inputs, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("model_class", [VaswaniModel, VaswaniForConditionalGeneration])
def test_a_checkpoint_without_the_embeddings_reports_them_missing_and_initialises_them(model_class, share, tmp_path):
    model = model_class(VaswaniConfig.from_preset("tiny", share_embeddings=share))
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    embeddings = {name for name in weights if "shared" in name or "embed_tokens" in name}
    assert embeddings
    save_file({k: v for k, v in weights.items() if k not in embeddings}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    reloaded, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
    assert embeddings <= set(info["missing_keys"])
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in reloaded.parameters())
    assert reloaded.get_input_embeddings().weight.std() > 0  # initialised, not left empty
    if share:
        assert reloaded.get_input_embeddings() is reloaded.get_decoder().embed_tokens


def test_a_model_built_from_a_config_decodes_greedily_and_a_saved_generation_config_decides(make_tiny_model,
                                                                                             tmp_path):
    model = _trained_like(make_tiny_model)
    assert model.generation_config.num_beams in (None, 1)
    greedy = model.generate(**_sources(), num_beams=1, max_new_tokens=12)
    assert torch.equal(model.generate(**_sources(), max_new_tokens=12), greedy)
    model.generation_config.num_beams = 4
    model.generation_config.length_penalty = 0.6
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert (reloaded.generation_config.num_beams, reloaded.generation_config.length_penalty) == (4, 0.6)
    beam = model.generate(**_sources(), num_beams=4, length_penalty=0.6, max_new_tokens=12)
    assert torch.equal(reloaded.generate(**_sources(), max_new_tokens=12), beam)


@pytest.mark.parametrize("stack_class", [VaswaniEncoder, VaswaniDecoder])
def test_encoder_and_decoder_build_from_a_config_alone_and_reload(stack_class, tmp_path):
    torch.manual_seed(0)
    stack = stack_class(VaswaniConfig.from_preset("tiny")).eval()
    assert stack.get_input_embeddings().weight.shape == (128, stack.config.d_model)
    stack.save_pretrained(tmp_path)
    reloaded = stack_class.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[5, 6, 7, EOS]])
    assert torch.equal(stack(input_ids=ids).last_hidden_state, reloaded(input_ids=ids).last_hidden_state)


def test_a_decoder_without_encoder_states_skips_cross_attention_and_its_cache_gives_the_same_output():
    torch.manual_seed(0)
    decoder = VaswaniDecoder(VaswaniConfig.from_preset("tiny")).eval()
    ids = torch.tensor([[2, 5, 6, 7, 8]])
    cross_calls = []
    for layer in decoder.layers:
        layer.encoder_attn.register_forward_hook(lambda *args: cross_calls.append(1))
    with torch.no_grad():
        whole = decoder(input_ids=ids, use_cache=False).last_hidden_state
        first = decoder(input_ids=ids[:, :3], use_cache=True)
        rest = decoder(input_ids=ids[:, 3:], use_cache=True, **{CACHE_FIELD: getattr(first, CACHE_FIELD)})
    assert cross_calls == []
    assert torch.allclose(torch.cat([first.last_hidden_state, rest.last_hidden_state], 1), whole, atol=1e-6)


def _empty_cache():
    return EncoderDecoderCache(DynamicCache(), DynamicCache())


def test_the_old_cache_name_warns_where_transformers_renamed_it_and_gives_the_same_cache(make_tiny_model,
                                                                                        padded_batch):
    model = make_tiny_model()
    inputs = {"input_ids": padded_batch["input_ids"], "attention_mask": padded_batch["attention_mask"],
              "decoder_input_ids": padded_batch["input_ids"][:, :4], "use_cache": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = model(**inputs, past_key_values=_empty_cache())
    renamed = CACHE_FIELD == "cache"  # transformers >= 5.24
    assert any("`past_key_values` is deprecated" in str(w.message) for w in caught) == renamed
    new = model(**inputs, **{CACHE_FIELD: _empty_cache()})
    assert getattr(old, CACHE_FIELD).get_seq_length() == getattr(new, CACHE_FIELD).get_seq_length() == 4
    assert torch.equal(old.logits, new.logits)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_static_cache_decodes_as_the_dynamic_one_in_transformers_loops_and_as_our_loops_decode(make_tiny_model,
                                                                                                 num_beams):
    """transformers' loops with their static cache and with their dynamic one; ours keep their own preallocated
    buffers whatever `cache_implementation` says (what a static cache is: sized for max_length once), and decode as
    transformers' static-cache loop does."""
    model = _trained_like(make_tiny_model)
    decode = functools.partial(model.generate, **_sources(), num_beams=num_beams, max_new_tokens=12)
    model.use_fast_decoding = False
    with loops_that_ran(model) as ran:
        dynamic, static = decode(), decode(cache_implementation="static")
    assert ran == ["transformers", "transformers"]
    assert torch.equal(static, dynamic)
    model.use_fast_decoding = True
    with loops_that_ran(model) as ran:
        ours = decode(cache_implementation="static")
    assert ran == ["vaswani_mt"]
    assert torch.equal(ours, static)
