"""Every private transformers (or torch) name vaswani_mt relies on is guarded: when it is missing or changed, the
feature falls back to transformers' own behaviour with one warning — never an exception at import or generate().
Each test removes or changes one name and checks the stock result (the list is in fast_decoding.py and
pipeline_vaswani.py, next to the guards)."""

import functools
import inspect
import logging

import pytest
import torch
from tiny_tokenizer import SENTENCES
from transformers import GenerationConfig, TextStreamer, pipeline
from transformers.generation.utils import GenerationMixin

import vaswani_mt.model.fast_decoding as generation
from vaswani_mt.model.pipeline_vaswani import TranslationPipeline, register_translation_pipeline

LOGGER = "vaswani_mt.model.fast_decoding"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(generation, "_warned", set())


def _inputs(tokenizer):
    return tokenizer(SENTENCES[:5], return_tensors="pt", padding=True)


def _stock(model, inputs, **kwargs):
    """generate() with transformers' own decoding loops."""
    model.use_fast_decoding = False
    try:
        return model.generate(**inputs, **kwargs)
    finally:
        model.use_fast_decoding = True


def _with_an_extra_parameter(function):
    """`function` with one more keyword parameter: the same behaviour, another signature."""
    def changed(*args, new_parameter=None, **kwargs):
        return function(*args, **kwargs)
    changed.__signature__ = inspect.Signature(
        [*inspect.signature(function).parameters.values(),
         inspect.Parameter("new_parameter", inspect.Parameter.KEYWORD_ONLY, default=None)])
    return staticmethod(changed) if "self" not in inspect.signature(function).parameters else changed


@pytest.mark.parametrize("name", sorted(generation.BEAM_HELPERS))
def test_a_changed_beam_helper_sends_beam_search_to_transformers_loop_with_one_warning(model, tokenizer, monkeypatch,
                                                                                       caplog, name):
    inputs = _inputs(tokenizer)
    expected = _stock(model, inputs, num_beams=4, max_new_tokens=10)
    monkeypatch.setattr(GenerationMixin, name, _with_an_extra_parameter(getattr(GenerationMixin, name)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = model.generate(**inputs, num_beams=4, max_new_tokens=10)
        second = model.generate(**inputs, num_beams=4, max_new_tokens=10)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and name in warnings[0]


@pytest.mark.parametrize("name", sorted(generation.BEAM_HELPERS))
def test_a_missing_beam_helper_is_reported_as_the_reason(monkeypatch, name):
    monkeypatch.delattr(GenerationMixin, name)
    assert name in generation.beam_helpers_mismatch()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_an_unknown_keyword_from_transformers_sends_the_call_to_transformers_loop(model, tokenizer, monkeypatch,
                                                                                  num_beams):
    inputs = _inputs(tokenizer)
    expected = _stock(model, inputs, num_beams=num_beams, max_new_tokens=8)
    name = "_sample" if num_beams == 1 else "_beam_search"
    stock_generate, stock_loop = GenerationMixin.generate, getattr(GenerationMixin, name)
    received = []

    def newer_generate(self, *args, custom_generate=None, **kwargs):  # hands custom loops a keyword ours does not know
        if callable(custom_generate):
            ours = custom_generate

            @functools.wraps(ours)
            def custom_generate(*loop_args, **loop_kwargs):
                received.append(True)
                return ours(*loop_args, a_new_option=True, **loop_kwargs)
        return stock_generate(self, *args, custom_generate=custom_generate, **kwargs)

    @functools.wraps(stock_loop)
    def transformers_loop(self, *args, a_new_option=None, **kwargs):  # the newer transformers' loop knows it
        return stock_loop(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", newer_generate)
    monkeypatch.setattr(GenerationMixin, name, transformers_loop)
    monkeypatch.setattr(generation, "loops_agree_with_transformers", lambda model: True)
    monkeypatch.setattr(generation, "greedy_search" if num_beams == 1 else "beam_search",
                        lambda *a, **k: pytest.fail("the fast loop ran with an argument it does not know"))
    assert torch.equal(model.generate(**inputs, num_beams=num_beams, max_new_tokens=8), expected)
    assert received


@pytest.mark.parametrize("num_beams,name", [(1, "_sample"), (4, "_beam_search")])
def test_a_call_handed_back_to_a_transformers_without_its_loop_is_one_clear_error(model, monkeypatch, num_beams,
                                                                                     name):
    monkeypatch.delattr(GenerationMixin, name)
    config = GenerationConfig(num_beams=num_beams, use_cache=True)
    with pytest.raises(RuntimeError, match=f"no GenerationMixin.{name}.*use_fast_decoding"):
        generation.decoding_loop(model, torch.zeros(2, 1, dtype=torch.long), None, None, config,
                                 an_unknown_argument=1)


def _ranking_changed(get_top_k_continuations):
    """transformers' top-k continuation step with another behaviour and the same signature (as 5.24 changed its
    sampled branch): every seventh token of the vocabulary loses 3 nats before the selection."""
    @functools.wraps(get_top_k_continuations)
    def changed(self, accumulated_log_probs, *args, **kwargs):
        penalty = (torch.arange(accumulated_log_probs.shape[-1]) % 7 == 5).to(accumulated_log_probs.dtype) * 3.0
        return get_top_k_continuations(self, accumulated_log_probs - penalty, *args, **kwargs)
    return changed


def test_a_transformers_helper_that_changed_behaviour_sends_beam_search_to_transformers_loop_with_one_warning(
        model, tokenizer, monkeypatch, caplog):
    inputs = _inputs(tokenizer)
    monkeypatch.setattr(GenerationMixin, "_get_top_k_continuations",
                        _ranking_changed(GenerationMixin._get_top_k_continuations))
    expected = _stock(model, inputs, num_beams=4, max_new_tokens=10)  # what this transformers decodes
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = model.generate(**inputs, num_beams=4, max_new_tokens=10)
        second = model.generate(**inputs, num_beams=4, max_new_tokens=10)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "decode differently" in warnings[0]


@pytest.mark.parametrize("shape", [dict(norm_style="post"), dict(norm_style="pre"), dict(d_k=4, d_v=16),
                                   dict(position_embedding="learned"),
                                   dict(d_k=4, d_v=16, position_embedding="learned", norm_style="pre")],
                         ids=["post", "pre", "d_k-d_v", "learned", "d_k-d_v-learned-pre"])
def test_our_loops_and_the_installed_transformers_decode_the_check_model_alike_on_the_cpu(monkeypatch,
                                                                                         make_tiny_model, shape):
    """The check runs on a check model of the kind asked for (its head sizes and position embedding too), with our
    loops and transformers' alike."""
    monkeypatch.setattr(generation, "_agreement", {})
    decoded, build = [], generation.IncrementalDecoder.__init__

    def decoder(self, model, *args, **kwargs):
        decoded.append(model.config)
        build(self, model, *args, **kwargs)
    monkeypatch.setattr(generation.IncrementalDecoder, "__init__", decoder)
    assert generation.loops_agree_with_transformers(make_tiny_model(**shape))
    assert len(generation._agreement) == 1
    assert len(decoded) == len(generation._CHECK_CALLS)  # our loops decoded the check model, once per call
    for config in decoded:
        assert config.norm_style == shape.get("norm_style", "post")
        assert config.position_embedding == shape.get("position_embedding", "sinusoidal")
        assert (config.d_k is not None, config.d_v is not None) == ("d_k" in shape, "d_v" in shape)


def test_each_device_dtype_norm_style_head_size_and_position_kind_is_checked_once_with_its_own_check_model(
        monkeypatch, make_tiny_model):
    checked = []
    monkeypatch.setattr(generation, "_agreement", {})
    monkeypatch.setattr(generation, "_decode_check_model", lambda *kind: checked.append(kind) or True)
    for model in (make_tiny_model(), make_tiny_model(), make_tiny_model(norm_style="pre"),
                  make_tiny_model().to(torch.bfloat16), make_tiny_model(d_k=4), make_tiny_model(d_v=4, d_k=4),
                  make_tiny_model(position_embedding="learned")):
        assert generation.loops_agree_with_transformers(model)
    assert checked == [("cpu", torch.float32, "post", False, "sinusoidal"), ("cpu", torch.float32, "pre", False,
                       "sinusoidal"), ("cpu", torch.bfloat16, "post", False, "sinusoidal"),
                       ("cpu", torch.float32, "post", True, "sinusoidal"),
                       ("cpu", torch.float32, "post", False, "learned")]


def test_a_kind_of_model_whose_check_disagrees_decodes_with_transformers_loops_alone(monkeypatch, make_tiny_model,
                                                                                   caplog):
    monkeypatch.setattr(generation, "_agreement", {})
    monkeypatch.setattr(generation, "_warned", set())
    monkeypatch.setattr(generation, "_decode_check_model", lambda device, dtype, norm, *shape: norm == "post")
    monkeypatch.setattr(generation, "greedy_search", lambda *a, **k: pytest.fail("our greedy search ran"))
    model = make_tiny_model(norm_style="pre")
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 3]])}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = model.generate(**inputs, max_new_tokens=5)
    model.use_fast_decoding = False
    assert torch.equal(out, model.generate(**inputs, max_new_tokens=5))
    assert "(cpu, float32, pre-norm, sinusoidal positions)" in caplog.text


def test_the_check_of_our_loops_leaves_the_global_random_stream_alone(monkeypatch, make_tiny_model):
    model = make_tiny_model()
    monkeypatch.setattr(generation, "_agreement", {})
    torch.manual_seed(5)
    generation.loops_agree_with_transformers(model)
    after_check = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), after_check)


@pytest.mark.parametrize("loop,name", [("greedy", "_pad_token_tensor"), ("beam", "_eos_token_tensor")])
def test_a_generation_config_without_the_special_token_tensors_blocks_the_fast_loop(model, loop, name):
    config = model.generation_config
    for attribute in ("_pad_token_tensor", "_eos_token_tensor"):
        setattr(config, attribute, torch.tensor(0))
    delattr(config, name)
    reason = generation.fast_decoding_blocker(model, torch.zeros(2, 1, dtype=torch.long), config,
                                              {"encoder_outputs": object()}, loop=loop)
    assert reason == f"generate() set no generation_config.{name}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_half_precision_model_decodes_with_transformers_loops_on_every_device(model, tokenizer, monkeypatch, device,
                                                                                dtype):
    monkeypatch.setattr(generation, "greedy_search", lambda *a, **k: pytest.fail("our greedy search ran"))
    monkeypatch.setattr(generation, "beam_search", lambda *a, **k: pytest.fail("our beam search ran"))
    model.to(device=device, dtype=dtype)
    inputs = _inputs(tokenizer).to(device)
    for num_beams in (1, 4):
        assert torch.equal(model.generate(**inputs, num_beams=num_beams, max_new_tokens=8),
                           _stock(model, inputs, num_beams=num_beams, max_new_tokens=8))
    config = model.generation_config
    config._pad_token_tensor = config._eos_token_tensor = torch.tensor(0)
    reason = generation.fast_decoding_blocker(model, torch.zeros(2, 1, dtype=torch.long), config,
                                              {"encoder_outputs": object()}, loop="beam")
    assert reason == f"{str(dtype)[6:]} weights"


@pytest.mark.parametrize("loop", ["_sample", "_beam_search"])
def test_without_a_transformers_loop_to_hand_back_to_generate_stays_with_transformers(model, monkeypatch, caplog, loop):
    monkeypatch.setattr(generation, "_warned", set())
    monkeypatch.delattr(GenerationMixin, loop)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert generation.hands_over(model, model.generation_config, {}) == f"no GenerationMixin.{loop}"
    assert f"transformers has no GenerationMixin.{loop}" in caplog.text


def test_packed_mkl_products_that_compute_something_else_are_not_used(model, tokenizer, monkeypatch):
    inputs = _inputs(tokenizer)
    expected = model.generate(**inputs, num_beams=4, max_new_tokens=10)
    if not hasattr(torch.ops.mkl, "_mkl_linear"):
        pytest.skip("this torch build has no MKL packed products")
    monkeypatch.setattr(generation, "_mkl_packing_works", None)
    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", lambda x, packed, weight, bias, rows: torch.zeros(
        x.shape[0], weight.shape[0]))
    assert generation._mkl_packing_available() is False
    assert torch.equal(model.generate(**inputs, num_beams=4, max_new_tokens=10), expected)
    assert torch.equal(_stock(model, inputs, num_beams=4, max_new_tokens=10), expected)


def test_missing_packed_mkl_ops_give_plain_products(monkeypatch):
    monkeypatch.setattr(generation, "_mkl_packing_works", None)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert generation._mkl_packing_available() is False
    weight, x = torch.randn(6, 4), torch.randn(3, 4)
    linear = generation.DecodeLinear(weight, None, rows=3)
    assert linear.packed is None and torch.equal(linear(x), torch.nn.functional.linear(x, weight))


@pytest.mark.parametrize("has_removed_tasks", [True, False])
def test_the_translation_task_registers_with_and_without_removed_tasks(model, tokenizer, monkeypatch,
                                                                       has_removed_tasks):
    import transformers.pipelines as pipelines

    if not has_removed_tasks:  # transformers 5.17 has no such dict: registering needs none
        with monkeypatch.context() as patched:
            patched.delattr(pipelines, "REMOVED_TASKS", raising=False)
            register_translation_pipeline()
            assert pipelines.PIPELINE_REGISTRY.supported_tasks["translation"]["impl"] is TranslationPipeline
        return
    # transformers 5.23 lists "translation" as removed and raises before looking at the model
    monkeypatch.setattr(pipelines, "REMOVED_TASKS", {"translation": "removed"}, raising=False)
    register_translation_pipeline()
    pipe = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=6)
    assert isinstance(pipe, TranslationPipeline)
    expected = tokenizer.decode(model.generate(**tokenizer([SENTENCES[0]], return_tensors="pt").to(model.device),
                                               num_beams=1, max_new_tokens=6)[0], skip_special_tokens=True)
    assert pipe(SENTENCES[0]) == [{"translation_text": expected}]


# -- the Trainer ------------------------------------------------------------------------------------------------

def _trainer(model, tokenizer, tmp_path):
    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    args = VaswaniTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_tokens=64)
    return VaswaniTrainer(model=model, args=args, processing_class=tokenizer)


@pytest.mark.parametrize("name", ["_save_checkpoint", "_save", "_push_from_checkpoint"])
def test_a_missing_trainer_hook_is_named_at_construction_without_an_exception(model, tokenizer, tmp_path,
                                                                              monkeypatch, caplog, name):
    from transformers import Seq2SeqTrainer

    from vaswani_mt.recipe.trainer import TRAINER_PRIVATE_HOOKS

    assert name in TRAINER_PRIVATE_HOOKS
    owner = next(cls for cls in Seq2SeqTrainer.__mro__ if name in vars(cls))
    monkeypatch.delattr(owner, name)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.recipe.trainer"):
        _trainer(model, tokenizer, tmp_path)
    assert f"has no {name}" in caplog.text


def test_training_batches_keep_the_columns_the_trainers_own_loaders_keep(model, tokenizer, tmp_path):
    from datasets import Dataset

    trainer = _trainer(model, tokenizer, tmp_path)
    dataset = Dataset.from_dict({"input_ids": [[5, 6, 3]], "labels": [[7, 3]], "translation": [{"en": "a"}],
                                 "attention_mask": [[1, 1, 1]], "id": [0]})
    kept = trainer._model_columns(dataset).column_names
    assert sorted(kept) == ["attention_mask", "input_ids", "labels"]
    stock = getattr(trainer, "_remove_unused_columns", None)  # transformers' private equivalent, where it exists
    if stock is not None:
        assert sorted(stock(dataset, description="training").column_names) == sorted(kept)


def test_the_mkl_self_check_leaves_the_global_random_stream_alone(monkeypatch):
    monkeypatch.setattr(generation, "_mkl_packing_works", None)
    torch.manual_seed(5)
    generation._mkl_packing_available()
    after_check = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), after_check)


def test_without_the_config_mapping_constant_a_vaswani_folder_still_needs_its_auto_map(monkeypatch):
    import transformers.models.auto.configuration_auto as configuration_auto

    from vaswani_mt.model.pipeline_vaswani import _is_builtin_model_type

    assert _is_builtin_model_type("marian") and not _is_builtin_model_type("vaswani")
    monkeypatch.delattr(configuration_auto, "CONFIG_MAPPING_NAMES")
    assert _is_builtin_model_type("marian") and not _is_builtin_model_type("vaswani")


def test_a_generation_config_without_the_beam_size_decodes_as_transformers_merges_it(model, tokenizer):
    inputs = _inputs(tokenizer)
    config = GenerationConfig(max_new_tokens=6)  # num_beams and use_cache come from the model's generation config
    assert model.generation_config.num_beams == 4
    assert torch.equal(model.generate(**inputs, generation_config=config),
                       _stock(model, inputs, generation_config=config))


def test_a_streamer_stays_with_transformers_which_refuses_it_with_beam_search(model, tokenizer):
    streamer = TextStreamer(tokenizer)
    with pytest.raises(ValueError, match="streamer"):
        model.generate(**_inputs(tokenizer), num_beams=4, max_new_tokens=4, streamer=streamer)


def test_greedy_decoding_with_a_streamer_streams_what_it_returns(model, tokenizer, capsys):
    inputs = tokenizer(SENTENCES[:1], return_tensors="pt")
    output = model.generate(**inputs, num_beams=1, max_new_tokens=6,
                            streamer=TextStreamer(tokenizer, skip_special_tokens=True))
    assert torch.equal(output, _stock(model, inputs, num_beams=1, max_new_tokens=6))
    assert capsys.readouterr().out.strip() == tokenizer.decode(output[0], skip_special_tokens=True).strip()


def test_a_failing_check_of_our_loops_hands_decoding_to_transformers_with_one_warning(model, tokenizer, monkeypatch,
                                                                                    caplog):
    monkeypatch.setattr(generation, "_agreement", {})
    monkeypatch.setattr(generation, "_decode_check_model", lambda *kind: 1 / 0)
    monkeypatch.setattr(generation, "beam_search", lambda *a, **k: pytest.fail("our beam search ran"))
    inputs = _inputs(tokenizer)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert torch.equal(model.generate(**inputs, max_new_tokens=6), _stock(model, inputs, max_new_tokens=6))
    assert "failed (ZeroDivisionError" in caplog.text
