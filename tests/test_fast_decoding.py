"""The fast decoding loops (vaswani_mt/model/fast_decoding.py) return exactly what transformers' own greedy and
beam-search loops return, for every setting they take over, and hand everything else to transformers."""

import contextlib
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers.generation.utils import GenerationMixin

import vaswani_mt.model.fast_decoding as fast_decoding
from vaswani_mt.model.fast_decoding import DecodeLinear, IncrementalDecoder, _chunked_topk, _mkl_packing_available

EOS = 3


def _model(make_tiny_model, norm_style="post", vocab_size=128, eos_bias=2.5, seed=0):
    """A tiny random model whose EOS logit is raised, so hypotheses end at different lengths (random models
    otherwise rarely emit EOS and every output would run to the limit)."""
    model = make_tiny_model(seed=seed, norm_style=norm_style, vocab_size=vocab_size, final_logits_bias=True)
    model.final_logits_bias[0, EOS] = eos_bias
    return model


def _sources(vocab_size=128, seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (5, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate((9, 6, 3, 8, 1)):
        attention_mask[row, length:] = 0
    input_ids[attention_mask == 0] = 0
    input_ids[torch.arange(5), attention_mask.sum(1) - 1] = EOS
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@contextlib.contextmanager
def loops_that_ran(model) -> Iterator[list[str]]:
    """The decoding loops that ran for `model` while the block runs, in order: "vaswani_mt" for ours (a decoder built
    for this model: the check of our loops against transformers' decodes a check model of its own, not counted),
    "transformers" for transformers' `_sample` / `_beam_search` on it."""
    ran, build = [], IncrementalDecoder.__init__
    originals = {name: getattr(GenerationMixin, name) for name in ("_sample", "_beam_search")}

    def decoder(self, decoded, *args, **kwargs):
        if decoded is model:
            ran.append("vaswani_mt")
        build(self, decoded, *args, **kwargs)

    def loop(original):
        @functools.wraps(original)  # generate() reads _sample's signature
        def spy(self, *args, **kwargs):
            if self is model:
                ran.append("transformers")
            return original(self, *args, **kwargs)
        return spy

    IncrementalDecoder.__init__ = decoder
    for name, original in originals.items():
        setattr(GenerationMixin, name, loop(original))
    try:
        yield ran
    finally:
        IncrementalDecoder.__init__ = build
        for name, original in originals.items():
            setattr(GenerationMixin, name, original)


def _both(model, inputs, **kwargs):
    """(fast loop output, transformers' loop output) for one generate() call; fails unless our loop decoded the first
    and transformers' the second (a call that fell back would compare transformers' loop with itself)."""
    with loops_that_ran(model) as ran:
        fast = model.generate(**inputs, **kwargs)
    assert ran == ["vaswani_mt"], f"vaswani_mt's decoding loop did not run alone: {ran}"
    model.use_fast_decoding = False
    try:
        with loops_that_ran(model) as ran:
            reference = model.generate(**inputs, **kwargs)
    finally:
        model.use_fast_decoding = True
    assert ran == ["transformers"], f"transformers' decoding loop did not run alone: {ran}"
    return fast, reference


def _transformers_loops_fail(monkeypatch):
    # the check of our loops against transformers' decodes with transformers' loops: taken as passed here
    monkeypatch.setattr(fast_decoding, "loops_agree_with_transformers", lambda model: True)
    for name in ("_beam_search", "_sample"):
        @functools.wraps(getattr(GenerationMixin, name))  # generate() reads _sample's signature
        def fail(*args, **kwargs):
            raise AssertionError("transformers' decoding loop ran")
        monkeypatch.setattr(GenerationMixin, name, fail)


@pytest.mark.parametrize("norm_style", ["post", "pre"])
@pytest.mark.parametrize("early_stopping", [False, True, "never"])
@pytest.mark.parametrize("length_penalty", [0.6, 1.0, -0.5])
def test_beam_search_returns_what_transformers_beam_search_returns(make_tiny_model, norm_style, early_stopping,
                                                                   length_penalty):
    model = _model(make_tiny_model, norm_style)
    fast, reference = _both(model, _sources(), num_beams=4, max_new_tokens=12, early_stopping=early_stopping,
                            length_penalty=length_penalty)
    assert torch.equal(fast, reference)


def test_the_beam_search_check_covers_hypotheses_that_end_early_and_late(make_tiny_model):
    out = _model(make_tiny_model).generate(**_sources(), num_beams=4, length_penalty=0.6, max_new_tokens=12)
    ended = [(row[1:] == EOS).nonzero().flatten() for row in out]
    lengths = {int(e[0]) if len(e) else None for e in ended}
    assert None in lengths or out.shape[1] == 13  # some hypotheses run to the limit ...
    assert len(lengths - {None}) >= 2  # ... and others end at different lengths


@pytest.mark.parametrize("num_beams,num_return_sequences", [(2, 1), (3, 3), (5, 2)])
def test_beam_search_matches_for_other_beam_counts_and_several_returned_sequences(make_tiny_model, num_beams,
                                                                                 num_return_sequences):
    model = _model(make_tiny_model)
    fast, reference = _both(model, _sources(), num_beams=num_beams, num_return_sequences=num_return_sequences,
                            max_new_tokens=10)
    assert fast.shape[0] == 5 * num_return_sequences
    assert torch.equal(fast, reference)


@pytest.mark.parametrize("norm_style", ["post", "pre"])
def test_greedy_search_returns_what_transformers_greedy_search_returns(make_tiny_model, norm_style):
    model = _model(make_tiny_model, norm_style, eos_bias=3.0)
    fast, reference = _both(model, _sources(), num_beams=1, max_new_tokens=12)
    assert torch.equal(fast, reference)
    assert (fast == model.config.pad_token_id).any(), "finished rows are padded: the check covers EOS handling"


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("limit", [{"min_new_tokens": 6}, {"min_length": 5}])
def test_minimum_lengths_are_applied_as_transformers_applies_them(make_tiny_model, num_beams, limit):
    model = _model(make_tiny_model, eos_bias=4.0)
    fast, reference = _both(model, _sources(), num_beams=num_beams, max_new_tokens=10, **limit)
    assert torch.equal(fast, reference)
    first_eos = [(row[1:] == EOS).nonzero().flatten() for row in fast]
    assert all(len(e) == 0 or e[0] >= 4 for e in first_eos)


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("processors", [
    dict(repetition_penalty=1.5, no_repeat_ngram_size=2, bad_words_ids=[[7], [9, 10]]),
    dict(repetition_penalty=1.3),  # alone, it returns a strided score matrix
    dict(no_repeat_ngram_size=2),
    dict(suppress_tokens=[5, 6]),
    dict(sequence_bias={(8,): 2.0}),
    dict(forced_eos_token_id=EOS),
    dict(exponential_decay_length_penalty=(4, 1.5)),
    dict(renormalize_logits=True, repetition_penalty=1.3),
], ids=lambda kwargs: "+".join(kwargs))
def test_other_logits_processors_run_inside_the_fast_loop_unchanged(make_tiny_model, monkeypatch, num_beams,
                                                                    processors):
    model = _model(make_tiny_model)
    kwargs = dict(num_beams=num_beams, max_new_tokens=10, **processors)
    model.use_fast_decoding = False
    reference = model.generate(**_sources(), **kwargs)
    model.use_fast_decoding = True
    _transformers_loops_fail(monkeypatch)
    assert torch.equal(model.generate(**_sources(), **kwargs), reference)


def test_the_fast_loops_replace_transformers_loops_for_the_default_decoding(make_tiny_model, monkeypatch):
    model = _model(make_tiny_model)
    _transformers_loops_fail(monkeypatch)
    assert model.generate(**_sources()).shape[0] == 5  # the paper's beam 4 (generation_config)
    assert model.generate(**_sources(), num_beams=1).shape[0] == 5


@pytest.mark.parametrize("kwargs", [
    dict(return_dict_in_generate=True, output_scores=True),
    dict(do_sample=True),
    dict(use_cache=False),
    dict(decoder_input_ids=torch.tensor([[2, 5]] * 5)),
])
def test_settings_the_fast_loops_do_not_cover_run_transformers_loops(make_tiny_model, monkeypatch, kwargs):
    model = _model(make_tiny_model)
    calls = []
    for name in ("_beam_search", "_sample"):
        original = getattr(GenerationMixin, name)

        @functools.wraps(original)
        def spy(*args, _original=original, **kw):
            calls.append(1)
            return _original(*args, **kw)
        monkeypatch.setattr(GenerationMixin, name, spy)
    torch.manual_seed(0)
    model.generate(**_sources(), num_beams=4, max_new_tokens=5, **kwargs)
    assert calls


def test_a_model_in_training_mode_decodes_with_transformers_loop(make_tiny_model, monkeypatch):
    model = _model(make_tiny_model).train()
    _transformers_loops_fail(monkeypatch)
    with pytest.raises(AssertionError, match="transformers' decoding loop ran"):
        model.generate(**_sources(), max_new_tokens=3)


def test_beam_search_matches_with_a_vocabulary_large_enough_for_the_chunked_top_k(make_tiny_model):
    model = _model(make_tiny_model, vocab_size=2048)
    fast, reference = _both(model, _sources(vocab_size=2048), num_beams=4, max_new_tokens=10)
    assert torch.equal(fast, reference)


@pytest.mark.parametrize("norm_style", ["post", "pre"])
def test_a_beam_that_continues_another_beam_attends_to_that_beams_history_only(make_tiny_model, norm_style):
    # The incremental decoder never moves cached keys/values when beams are reordered; each row's next logits must
    # still be those of a full decoder pass over the row's own token history.
    model, beams = _model(make_tiny_model, norm_style), 3
    sources = {k: v[:2].repeat_interleave(beams, dim=0) for k, v in _sources().items()}
    with torch.no_grad():
        encoded = model.get_encoder()(**sources).last_hidden_state
        decoder = IncrementalDecoder(model, encoded, sources["attention_mask"], beams, max_length=8)
        history = torch.full((2 * beams, 1), model.config.decoder_start_token_id)
        generator = torch.Generator().manual_seed(3)
        for parents in (None, [0, 0, 2, 4, 3, 3], [1, 2, 0, 5, 5, 4], [2, 2, 2, 3, 4, 5]):
            if parents is not None:
                decoder.reorder(torch.tensor(parents))
                history = history[parents]
            logits = decoder.step(history[:, -1])
            full = model(**sources, decoder_input_ids=history).logits[:, -1]
            torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)
            history = torch.cat([history, torch.randint(4, 128, (2 * beams, 1), generator=generator)], dim=1)


def _count_keeps(monkeypatch) -> list:
    """Record the sentence counts IncrementalDecoder.keep is called with."""
    calls, keep = [], IncrementalDecoder.keep

    def spy(self, sentences):
        calls.append(len(sentences))
        return keep(self, sentences)
    monkeypatch.setattr(IncrementalDecoder, "keep", spy)
    return calls


@pytest.mark.parametrize("early_stopping,length_penalty", [(False, 0.6), (True, 0.6), ("never", -0.5)])
def test_sentences_whose_result_is_final_leave_the_batch_without_changing_the_output(make_tiny_model, monkeypatch,
                                                                                    early_stopping, length_penalty):
    keeps = _count_keeps(monkeypatch)
    fast, reference = _both(_model(make_tiny_model), _sources(), num_beams=4, max_new_tokens=12,
                            early_stopping=early_stopping, length_penalty=length_penalty)
    assert keeps and keeps[-1] < 5  # sentences did leave the batch ...
    assert torch.equal(fast, reference)  # ... and the output is transformers' own


def test_sentences_stay_in_the_batch_when_a_logits_processor_may_depend_on_their_position(make_tiny_model,
                                                                                       monkeypatch):
    keeps = _count_keeps(monkeypatch)
    fast, reference = _both(_model(make_tiny_model), _sources(), num_beams=4, max_new_tokens=12,
                            repetition_penalty=1.3)
    assert keeps == []
    assert torch.equal(fast, reference)


def test_the_decoder_keeps_the_state_of_the_sentences_it_goes_on_with(make_tiny_model):
    model, beams = _model(make_tiny_model), 2
    sources = {k: v[:3].repeat_interleave(beams, dim=0) for k, v in _sources().items()}
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        encoded = model.get_encoder()(**sources).last_hidden_state
        whole, part = (IncrementalDecoder(model, encoded, sources["attention_mask"], beams, max_length=6)
                       for _ in range(2))
        tokens = torch.randint(4, 128, (6, 4), generator=generator)
        for step in range(2):
            whole.step(tokens[:, step]), part.step(tokens[:, step])
        whole.reorder(torch.tensor([1, 1, 2, 3, 5, 4])), part.reorder(torch.tensor([1, 1, 2, 3, 5, 4]))
        part.keep(torch.tensor([0, 2]))  # sentences 0 and 2: rows 0, 1, 4, 5
        rows = torch.tensor([0, 1, 4, 5])
        for step in range(2, 4):
            torch.testing.assert_close(part.step(tokens[rows, step]), whole.step(tokens[:, step])[rows])


def test_the_check_script_translates_a_file_with_both_loops_and_reports_them_identical(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    source = tmp_path / "source.txt"
    source.write_text("a dog runs in the snow\ntwo men\n\nthe cat sat on the mat and the dog sat too\n")
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_fast_decoding.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "--source", str(source), "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "identical translations: 4 of 4" in done.stdout


@pytest.mark.parametrize("rows,n,k", [(3, 32000, 8), (64, 8192, 4), (2, 4096 * 4, 12), (5, 1000, 8)])
def test_chunked_top_k_gives_torch_topk_values_and_indices(rows, n, k):
    scores = torch.randn(rows, n, generator=torch.Generator().manual_seed(n))
    scores[0, :100] = float("-inf")  # banned tokens stay out
    values, indices = _chunked_topk(scores, k)
    expected_values, expected_indices = torch.topk(scores, k)
    assert torch.equal(values, expected_values)
    assert torch.equal(indices, expected_indices)


@pytest.mark.skipif(not _mkl_packing_available(), reason="torch without MKL packed GEMM")
@pytest.mark.parametrize("bias", [True, False])
def test_packed_decode_products_equal_plain_linear_products(bias):
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(300, 64, generator=generator), torch.randn(12, 64, generator=generator)
    b = torch.randn(300, generator=generator) if bias else None
    linear = DecodeLinear(weight, b, rows=12)
    assert linear.packed is not None
    torch.testing.assert_close(linear(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: the plain (autocast) product
        assert linear(x).dtype == torch.bfloat16
