"""Every private transformers (or torch) name vaswani_mt relies on is guarded: when it is missing or changed, the
feature falls back to transformers' own behaviour with one warning — never an exception at import or generate().
Each test removes or changes one name and checks the stock result (the list is in generation_vaswani.py and
pipeline_vaswani.py, next to the guards)."""

import inspect
import logging

import pytest
import torch
from transformers import pipeline
from transformers.generation.utils import GenerationMixin

import vaswani_mt.model.generation_vaswani as generation
from tiny_tokenizer import SENTENCES
from vaswani_mt.model.pipeline_vaswani import TranslationPipeline, register_translation_pipeline

LOGGER = "vaswani_mt.model.generation_vaswani"


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


@pytest.mark.parametrize("loop", ["greedy", "beam"])
def test_a_loop_call_with_arguments_of_another_signature_goes_to_transformers_loop_unchanged(model, caplog, loop):
    calls = []

    def transformers_loop(*args, **kwargs):
        calls.append((args, kwargs))
        return "transformers' result"

    args = ("input_ids", "processors", "criteria", "generation_config", False, None, "an extra positional argument")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert generation.decode_or_fall_back(model, loop, transformers_loop, args, {}) == "transformers' result"
    assert calls == [(args, {})]
    assert "arguments the fast loop was not written for" in caplog.text


@pytest.mark.parametrize("num_beams", [1, 4])
def test_an_unknown_keyword_from_transformers_sends_the_call_to_transformers_loop(model, tokenizer, monkeypatch,
                                                                                  num_beams):
    inputs = _inputs(tokenizer)
    expected = _stock(model, inputs, num_beams=num_beams, max_new_tokens=8)
    name = "_sample" if num_beams == 1 else "_beam_search"
    original, stock_loop = getattr(type(model), name), getattr(GenerationMixin, name)
    received = []

    def with_a_new_keyword(self, *args, **kwargs):  # what a newer generate() might pass
        received.append(True)
        return original(self, *args, a_new_option=True, **kwargs)

    def transformers_loop(self, *args, a_new_option=None, **kwargs):
        return stock_loop(self, *args, **kwargs)

    monkeypatch.setattr(type(model), name, with_a_new_keyword)
    monkeypatch.setattr(generation, "greedy_search" if num_beams == 1 else "beam_search",
                        lambda *a, **k: pytest.fail("the fast loop ran with an argument it does not know"))
    # the model's override hands the call to its parent's loop, which here accepts the new keyword
    monkeypatch.setattr(GenerationMixin, name, transformers_loop)
    assert torch.equal(model.generate(**inputs, num_beams=num_beams, max_new_tokens=8), expected)
    assert received


@pytest.mark.parametrize("name", ["_sample", "_beam_search"])
def test_missing_transformers_loops_are_reported_once_before_generate(monkeypatch, caplog, name):
    monkeypatch.delattr(GenerationMixin, name)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        generation.warn_if_loops_unreachable()
        generation.warn_if_loops_unreachable()
    assert caplog.text.count(f"no GenerationMixin.{name}") == 1


@pytest.mark.parametrize("loop,name", [("greedy", "_pad_token_tensor"), ("beam", "_eos_token_tensor")])
def test_a_generation_config_without_the_special_token_tensors_blocks_the_fast_loop(model, loop, name):
    config = model.generation_config
    for attribute in ("_pad_token_tensor", "_eos_token_tensor"):
        setattr(config, attribute, torch.tensor(0))
    delattr(config, name)
    reason = generation.fast_decoding_blocker(model, torch.zeros(2, 1, dtype=torch.long), config,
                                              {"encoder_outputs": object()}, loop=loop)
    assert reason == f"generate() set no generation_config.{name}"


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


@pytest.mark.parametrize("loop,name", [("greedy", "_sample"), ("beam", "_beam_search")])
def test_the_installed_transformers_calls_its_loops_with_the_signature_the_fast_loops_bind(loop, name):
    installed = [p for p in inspect.signature(getattr(GenerationMixin, name)).parameters if p != "self"]
    assert installed == list(generation._LOOP_SIGNATURES[loop].parameters)


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
