"""transformers' model tests over vaswani_mt, written as a model inside transformers is tested (the shape of
transformers' tests/models/marian/test_modeling_marian.py).

scripts/run_transformers_tests.py copies this file to `tests/models/vaswani/test_modeling_vaswani.py` of a throwaway
tree beside the mixins of the installed transformers' source distribution, where its relative imports resolve; the
project's own pytest run does not collect it (its name does not start with `test_`).

`VaswaniModelTester` builds a tiny config and a batch; `VaswaniModelTest` runs `ModelTesterMixin` (and
`PipelineTesterMixin` where its module imports: in transformers 5.17 it imports `tests/pipelines/`, which the sdist
lacks), our stand-in `GenerationTesterMixin`, `ConfigTester`, and Marian's standalone encoder and decoder checks.
A mixin test that does not apply to an encoder-decoder text model is switched off by a flag or skipped below with
its reason; a test that applies is never skipped because it fails.
"""

import dataclasses
import tempfile
import unittest

import torch
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.testing_utils import torch_device

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani_mt.model.modeling_vaswani import VaswaniDecoder, VaswaniEncoder

from ...generation.test_utils import GenerationTesterMixin
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor

try:
    from ...test_pipeline_mixin import PipelineTesterMixin
except ImportError as error:  # transformers 5.17: the module imports tests/pipelines/*, not in the sdist
    PipelineTesterMixin, PIPELINE_MIXIN_ERROR = None, error

# transformers 5.24 renamed the decoder cache `past_key_values` -> `cache` (arguments and output fields).
CACHE_NAME = "cache" if "cache" in {field.name for field in dataclasses.fields(Seq2SeqLMOutput)} else "past_key_values"
# VaswaniConfig's special ids (vaswani_mt.train_tokenizer: <pad> 0, <unk> 1, <s> 2, </s> 3); the decoder starts at <s>.
PAD, BOS, EOS = 0, 2, 3
FIRST_WORD_ID = 4
# Mixin tests of inputs this model does not take: the mixin passes them without running anything for a class that
# lacks the method, so they are skipped here with the reason. Prefixes: parameterized tests come as NAME_0, NAME_1...,
# and the set of names differs between transformers releases.
NOT_APPLICABLE = {
    "test_get_image_features": "vision: the model reads token ids only (it has no get_image_features)",
    "test_get_video_features": "video: the model reads token ids only (it has no get_video_features)",
    "test_get_audio_features": "audio: the model reads token ids only (it has no get_audio_features)",
    "test_get_text_features": "multimodal: get_text_features is the text tower of a multimodal model",
    "test_multimodal_outputs_are_returned": "multimodal: the model takes no image or video inputs",
    "test_sdpa_can_dispatch_composite_models": "composite models only (sub-configs); this model's SDPA dispatch is "
                                               "test_sdpa_can_dispatch_non_composite_models",
}


class VaswaniModelTester:
    def __init__(self, parent, batch_size=13, seq_length=7, is_training=True, vocab_size=99, hidden_size=16,
                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, hidden_act="relu",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=100):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.pad_token_id, self.bos_token_id, self.eos_token_id, self.decoder_start_token_id = PAD, BOS, EOS, BOS

    def get_config(self) -> VaswaniConfig:
        return VaswaniConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function=self.hidden_act,
            dropout=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
        )

    def prepare_config_and_inputs(self):
        """Sources of words (no special ids) ending in </s>, as the tokenizer makes them; targets of words."""
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(FIRST_WORD_ID)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(FIRST_WORD_ID)
        inputs_dict = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(self.pad_token_id),
            "decoder_attention_mask": decoder_input_ids.ne(self.pad_token_id),
        }
        return self.get_config(), inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(self, decoder, inputs_dict, encoder_hidden_states=None):
        """Three more target tokens through the cache of the first seven give what all ten give without it."""
        decoder = decoder.to(torch_device).eval()
        input_ids = inputs_dict["decoder_input_ids"].to(torch_device)
        attention_mask = inputs_dict["decoder_attention_mask"].to(torch_device)
        encoder = {}
        if encoder_hidden_states is not None:
            encoder = {"encoder_hidden_states": encoder_hidden_states.to(torch_device),
                       "encoder_attention_mask": inputs_dict["attention_mask"].to(torch_device)}
        first = decoder(input_ids, attention_mask=attention_mask, use_cache=True, **encoder)
        next_tokens = ids_tensor((self.batch_size, 3), self.vocab_size).clamp(FIRST_WORD_ID).to(torch_device)
        next_mask = ids_tensor((self.batch_size, 3), 2).to(torch_device)
        all_ids = torch.cat([input_ids, next_tokens], dim=-1)
        all_mask = torch.cat([attention_mask.to(next_mask.dtype), next_mask], dim=-1)
        without_cache = decoder(all_ids, attention_mask=all_mask, use_cache=False, **encoder).last_hidden_state
        with_cache = decoder(next_tokens, attention_mask=all_mask, use_cache=True,
                             **{CACHE_NAME: first[CACHE_NAME]}, **encoder).last_hidden_state
        self.parent.assertEqual(with_cache.shape, (self.batch_size, 3, self.hidden_size))
        torch.testing.assert_close(with_cache, without_cache[:, -3:], atol=1e-3, rtol=1e-3)

    def check_encoder_decoder_model_standalone(self, config, inputs_dict):
        """The encoder and the decoder of a VaswaniModel, saved and loaded back as VaswaniEncoder / VaswaniDecoder,
        compute what they computed inside the model."""
        model = VaswaniModel(config).to(torch_device).eval()
        inputs_dict = {name: tensor.to(torch_device) for name, tensor in inputs_dict.items()}
        outputs = model(**inputs_dict)
        with tempfile.TemporaryDirectory() as folder:
            model.encoder.save_pretrained(folder)
            encoder = VaswaniEncoder.from_pretrained(folder).to(torch_device).eval()
        encoder_state = encoder(inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"])[0]
        torch.testing.assert_close(encoder_state, outputs.encoder_last_hidden_state, atol=1e-3, rtol=1e-3)
        with tempfile.TemporaryDirectory() as folder:
            model.decoder.save_pretrained(folder)
            decoder = VaswaniDecoder.from_pretrained(folder).to(torch_device).eval()
        decoder_state = decoder(
            input_ids=inputs_dict["decoder_input_ids"], attention_mask=inputs_dict["decoder_attention_mask"],
            encoder_hidden_states=encoder_state, encoder_attention_mask=inputs_dict["attention_mask"],
        )[0]
        torch.testing.assert_close(decoder_state, outputs.last_hidden_state, atol=1e-3, rtol=1e-3)


def skip_not_applicable(test_case: type) -> type:
    """Class decorator: every test of `test_case` whose name starts with a key of NOT_APPLICABLE skipped with its
    reason (as a model test file of transformers overrides such a test with `@unittest.skip(reason=...)`)."""
    for name in dir(test_case):
        test = getattr(test_case, name)
        reason = next((why for prefix, why in NOT_APPLICABLE.items() if name.startswith(prefix)), None)
        if reason is not None and callable(test):  # parameterized leaves None under the name it expanded
            setattr(test_case, name, unittest.skip(reason)(test))
    return test_case


def _test_case_bases() -> tuple[type, ...]:
    pipeline_mixin = (PipelineTesterMixin,) if PipelineTesterMixin is not None else ()
    return (ModelTesterMixin, GenerationTesterMixin, *pipeline_mixin, unittest.TestCase)


@skip_not_applicable
class VaswaniModelTest(*_test_case_bases()):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    pipeline_model_mapping = {"feature-extraction": VaswaniModel, "translation": VaswaniForConditionalGeneration}
    is_encoder_decoder = True
    # test_can_init_all_missing_weights dates a model by a "# Copyright YEAR" line atop its config file and skips it
    # as "not prioritized" without one from 2023 on; ours has none, and _init_weights must cover every weight (5.24).
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = VaswaniModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VaswaniConfig, vocab_size=99, d_model=16,
                                          encoder_attention_heads=4, decoder_attention_heads=4)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_pipeline_mixin_imports(self):
        if PipelineTesterMixin is None:
            self.skipTest(f"PipelineTesterMixin does not import from this sdist: {PIPELINE_MIXIN_ERROR}")

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                _, info = model_class.from_pretrained(folder, output_loading_info=True)
            self.assertEqual(sorted(info["missing_keys"]), [], msg=model_class.__name__)

    def test_encoder_decoder_model_standalone(self):
        self.model_tester.check_encoder_decoder_model_standalone(*self.model_tester.prepare_config_and_inputs())

    def test_decoder_model_past_with_large_inputs(self):
        """Marian's check: the decoder of a model, used alone (no encoder states), with and without its cache."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs()
        decoder = VaswaniModel(config).decoder
        self.model_tester.create_and_check_decoder_model_past_large_inputs(decoder, inputs_dict)

    def test_decoder_built_from_config_past_with_encoder_states(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs()
        encoder_states = floats_tensor((self.model_tester.batch_size, self.model_tester.seq_length, config.d_model))
        self.model_tester.create_and_check_decoder_model_past_large_inputs(VaswaniDecoder(config), inputs_dict,
                                                                           encoder_hidden_states=encoder_states)

    def test_encoder_and_decoder_built_from_config(self):
        config, inputs_dict = self.model_tester.prepare_config_and_inputs()
        inputs_dict = {name: tensor.to(torch_device) for name, tensor in inputs_dict.items()}
        encoder = VaswaniEncoder(config).to(torch_device).eval()
        decoder = VaswaniDecoder(config).to(torch_device).eval()
        encoder_state = encoder(inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"])[0]
        decoder_state = decoder(inputs_dict["decoder_input_ids"], encoder_hidden_states=encoder_state,
                                encoder_attention_mask=inputs_dict["attention_mask"])[0]
        shape = (self.model_tester.batch_size, self.model_tester.seq_length, config.d_model)
        self.assertEqual((tuple(encoder_state.shape), tuple(decoder_state.shape)), (shape, shape))
        self.assertIsNot(encoder.get_input_embeddings(), decoder.get_input_embeddings())
