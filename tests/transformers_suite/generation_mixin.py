"""Stand-in for transformers' `tests/generation/test_utils.py`, which `tests/test_modeling_common.py` imports
`GenerationTesterMixin` from but which the source distribution does not hold.

Ours is small and written for encoder-decoder models: the behaviours of transformers' generation tests that a
translation model must have. Greedy `generate()` is argmax decoding; the cache changes nothing; beam search answers
in the documented shapes; a generation continued from a returned cache equals one run in one go (under the model's
default generation config: a model built from a config decodes greedily); a padded batch translates each source as
it would alone. It also lends `test_bc_cache_name_forward` (in `ModelTesterMixin`) its `_check_caches_are_equal`.
The tester class must set `model_tester` and `all_model_classes`, as for `ModelTesterMixin`.
"""

import dataclasses

import torch
from transformers.generation.utils import GenerateEncoderDecoderOutput
from transformers.testing_utils import torch_device

# transformers 5.24 renamed the cache `past_key_values` -> `cache`, in generate()'s arguments and outputs.
_OUTPUT_FIELDS = {field.name for field in dataclasses.fields(GenerateEncoderDecoderOutput)}
CACHE_NAME = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"


def cache_tensors(cache) -> list[torch.Tensor]:
    """Every key and value tensor of a `DynamicCache` or an `EncoderDecoderCache` (self-attention, then cross)."""
    if hasattr(cache, "self_attention_cache"):
        return cache_tensors(cache.self_attention_cache) + cache_tensors(cache.cross_attention_cache)
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


class GenerationTesterMixin:
    max_new_tokens = 5

    def _generative_models_and_sources(self):
        """(model in eval mode, its source batch) for each generative class of `all_model_classes`."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        source = {name: inputs[name].to(torch_device) for name in ("input_ids", "attention_mask")}
        for model_class in self.all_generative_model_classes:
            yield model_class(config).to(torch_device).eval(), source

    @torch.no_grad()
    def _argmax_decoding(self, model, source, steps: int) -> torch.Tensor:
        """Greedy decoding written out: each step runs the whole target prefix (no cache) and appends the most
        likely token; a sequence that has produced </s> goes on with padding, as `generate()` pads it."""
        config = model.config
        batch_size = source["input_ids"].shape[0]
        target = torch.full((batch_size, 1), config.decoder_start_token_id, device=torch_device)
        finished = torch.zeros(batch_size, dtype=torch.bool, device=torch_device)
        for _ in range(steps):
            logits = model(**source, decoder_input_ids=target, use_cache=False).logits[:, -1]
            next_tokens = logits.argmax(-1).masked_fill(finished, config.pad_token_id)
            target = torch.cat([target, next_tokens[:, None]], dim=-1)
            finished |= next_tokens == config.eos_token_id
            if finished.all():
                break
        return target

    def test_greedy_generate_is_argmax_decoding(self):
        for model, source in self._generative_models_and_sources():
            generated = model.generate(**source, do_sample=False, num_beams=1, max_new_tokens=self.max_new_tokens)
            expected = self._argmax_decoding(model, source, self.max_new_tokens)
            self.assertEqual(generated.tolist(), expected.tolist())

    def test_greedy_generate_with_and_without_cache_agree(self):
        for model, source in self._generative_models_and_sources():
            outputs = {
                use_cache: model.generate(**source, do_sample=False, num_beams=1, max_new_tokens=self.max_new_tokens,
                                          use_cache=use_cache, return_dict_in_generate=True, output_scores=True)
                for use_cache in (True, False)
            }
            self.assertEqual(outputs[True].sequences.tolist(), outputs[False].sequences.tolist())
            for cached, uncached in zip(outputs[True].scores, outputs[False].scores):
                torch.testing.assert_close(cached, uncached, atol=1e-4, rtol=1e-4)

    def test_beam_search_generate_dict_output(self):
        beams = 2
        for model, source in self._generative_models_and_sources():
            output = model.generate(**source, do_sample=False, num_beams=beams, num_return_sequences=beams,
                                    max_new_tokens=self.max_new_tokens, return_dict_in_generate=True,
                                    output_scores=True)
            batch_size = source["input_ids"].shape[0]
            self.assertEqual(output.sequences.shape[0], batch_size * beams)
            self.assertLessEqual(output.sequences.shape[1], self.max_new_tokens + 1)
            self.assertEqual(tuple(output.sequences_scores.shape), (batch_size * beams,))
            self.assertEqual(len(output.scores), output.sequences.shape[1] - 1)
            self.assertTrue(torch.isfinite(output.sequences_scores).all())

    def test_generate_continue_from_past_key_values(self):
        """Three tokens, then three more from the returned cache, equal six in one go. The model's own generation
        config decides the search (nothing but `do_sample=False` is passed): built from a config, it is greedy.
        `min_new_tokens` keeps </s> out, so that no sequence ends early. The continuation passes the whole target so
        far with a `decoder_attention_mask` as long: that is how generate() knows (5.24) that the cache holds all of it
        but the last token (without the mask it takes the ids for new tokens only)."""
        first, second = 3, 3
        for model, source in self._generative_models_and_sources():
            settings = dict(do_sample=False, return_dict_in_generate=True)
            start = model.generate(**source, max_new_tokens=first, min_new_tokens=first, **settings)
            continued = model.generate(**source, decoder_input_ids=start.sequences,
                                       decoder_attention_mask=torch.ones_like(start.sequences),
                                       **{CACHE_NAME: getattr(start, CACHE_NAME)},
                                       max_new_tokens=second, min_new_tokens=second, **settings)
            at_once = model.generate(**source, max_new_tokens=first + second, min_new_tokens=first + second,
                                     **settings)
            self.assertEqual(continued.sequences.tolist(), at_once.sequences.tolist())

    def test_padded_batch_generates_as_each_source_alone(self):
        for model, source in self._generative_models_and_sources():
            input_ids, attention_mask = source["input_ids"].clone(), source["attention_mask"].clone()
            lengths = [input_ids.shape[1] - row % 3 for row in range(input_ids.shape[0])]
            for row, length in enumerate(lengths):
                input_ids[row, length - 1] = model.config.eos_token_id
                input_ids[row, length:] = model.config.pad_token_id
                attention_mask[row, length:] = 0
            batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                                     num_beams=1, max_new_tokens=self.max_new_tokens)
            for row, length in enumerate(lengths):
                alone = model.generate(input_ids=input_ids[row:row + 1, :length],
                                       attention_mask=attention_mask[row:row + 1, :length], do_sample=False,
                                       num_beams=1, max_new_tokens=self.max_new_tokens)[0].tolist()
                padding = [model.config.pad_token_id] * (batched.shape[1] - len(alone))
                self.assertEqual(batched[row].tolist(), alone + padding, msg=f"source {row} (length {length})")

    def _check_caches_are_equal(self, cache, other):
        tensors, other_tensors = cache_tensors(cache), cache_tensors(other)
        self.assertEqual(len(tensors), len(other_tensors))
        for tensor, other_tensor in zip(tensors, other_tensors):
            torch.testing.assert_close(tensor, other_tensor)
