"""§6.1's length penalty: GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (`length_penalty_style="gnmt"`), beside
transformers' |Y| ** alpha, checked against an exhaustive search on a model small enough to enumerate."""

import functools
import itertools
import logging

import pytest
import torch

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.model.fast_decoding import gnmt_length_penalty

VOCAB, EOS, BOS, NEW_TOKENS = 6, 3, 2, 3
# 36 beams hold every 2-token prefix over a 6-token vocabulary, so a 3-token beam search sees every hypothesis.
BEAMS = VOCAB ** (NEW_TOKENS - 1)
SOURCE = torch.tensor([[4, 5, 4, 4, 5, EOS]])


def tiny_model(seed: int) -> VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB, pad_token_id=0, bos_token_id=BOS, eos_token_id=EOS,
                                       decoder_start_token_id=BOS)
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():  # sharper distributions than the initialisation's, so that lengths compete
        model.lm_head.weight.mul_(8.0)
    return model


@functools.cache
def every_hypothesis(seed: int) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Every hypothesis of 1 to NEW_TOKENS tokens (EOS only last; the longest may end without it) with its
    log P(y|x) under `tiny_model(seed)`: those of one length scored in one batch."""
    model, scored = tiny_model(seed), []
    for length in range(1, NEW_TOKENS + 1):
        hypotheses = [tokens for tokens in itertools.product(range(VOCAB), repeat=length)
                      if EOS not in tokens[:-1] and (length == NEW_TOKENS or tokens[-1] == EOS)]
        decoder_input = torch.tensor([[BOS, *tokens[:-1]] for tokens in hypotheses])
        with torch.no_grad():
            logits = model(input_ids=SOURCE.expand(len(hypotheses), -1), decoder_input_ids=decoder_input).logits
        log_p = torch.log_softmax(logits.double(), dim=-1).gather(2, torch.tensor(hypotheses)[..., None]).sum((1, 2))
        scored += zip(hypotheses, log_p.tolist())
    return tuple(scored)


def best_by_brute_force(seed: int, penalty) -> list[int]:
    """The hypothesis of the best log P(y|x) / penalty(|y|) among all of them."""
    return list(max(every_hypothesis(seed), key=lambda scored: scored[1] / penalty(len(scored[0])))[0])


def beam_search(model, source, alpha, fast: bool, **options) -> list[int]:
    model.use_fast_decoding = fast
    output = model.generate(source, num_beams=BEAMS, max_new_tokens=NEW_TOKENS, length_penalty=alpha,
                            early_stopping="never", **options)[0, 1:].tolist()
    return output[:output.index(EOS) + 1] if EOS in output else output


@pytest.mark.parametrize("fast", [True, False], ids=["fast loop", "transformers loop"])
def test_gnmt_beam_search_returns_the_best_hypothesis_of_an_exhaustive_search(fast):
    differs = 0
    for seed in range(6):
        model = tiny_model(seed)
        for alpha in (0.6, 2.0):
            gnmt = best_by_brute_force(seed, lambda n: gnmt_length_penalty(n, alpha))
            plain = best_by_brute_force(seed, lambda n: n ** alpha)
            assert beam_search(model, SOURCE, alpha, fast, length_penalty_style="gnmt") == gnmt, (seed, alpha)
            assert beam_search(model, SOURCE, alpha, fast) == plain, (seed, alpha)
            differs += gnmt != plain
    assert differs, "no case where the two penalties choose differently: the test would not see a mix-up"


def test_the_style_rides_on_the_generation_config_and_survives_save_and_load(tmp_path):
    model, source = tiny_model(1), torch.tensor([[4, 5, 4, 4, 5, EOS]])
    model.generation_config.length_penalty_style, model.generation_config.length_penalty = "gnmt", 2.0
    model.generation_config.num_beams = 4  # a length penalty is a beam search setting: transformers saves it with one
    expected = model.generate(source, max_new_tokens=NEW_TOKENS)
    model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.length_penalty_style == "gnmt"
    assert torch.equal(loaded.generate(source, max_new_tokens=NEW_TOKENS), expected)


def test_an_unknown_length_penalty_style_is_refused_by_name():
    with pytest.raises(ValueError, match="length_penalty_style must be one of"):
        tiny_model(0).generate(torch.tensor([[4, EOS]]), num_beams=2, length_penalty_style="wu")


def test_a_transformers_without_the_beam_helpers_warns_that_the_gnmt_penalty_is_not_applied(monkeypatch, caplog,
                                                                                            make_tiny_model):
    from transformers.generation.utils import GenerationMixin

    import vaswani_mt.model.fast_decoding as generation

    monkeypatch.setattr(generation, "_warned", set())
    monkeypatch.delattr(GenerationMixin, "_check_early_stop_heuristic")
    with caplog.at_level(logging.WARNING), generation.gnmt_scoring(make_tiny_model(), "gnmt"):
        pass
    assert "GNMT length penalty cannot be applied" in caplog.text


def test_a_beam_helper_called_with_other_arguments_runs_unchanged_with_a_warning(monkeypatch, caplog):
    import vaswani_mt.model.fast_decoding as generation

    monkeypatch.setattr(generation, "_warned", set())
    calls = []
    with caplog.at_level(logging.WARNING):
        generation.with_gnmt_penalty("_update_finished_beams", lambda **kw: calls.append(kw), (), {"scores": 1})
    assert calls == [{"scores": 1}] and "not written for" in caplog.text


def test_a_ctranslate2_export_of_a_gnmt_model_says_ctranslate2_has_no_gnmt_penalty(tmp_path, caplog):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.inference.export import export_ctranslate2

    model = tiny_model(0)
    model.generation_config.length_penalty_style = "gnmt"
    with caplog.at_level(logging.WARNING):
        export_ctranslate2(model, tmp_path / "ct2", tokens=["<pad>", "<unk>", "<s>", "</s>", "a", "b"])
    assert "GNMT length penalty" in caplog.text


def test_the_model_card_names_the_length_penalty_the_model_decodes_with():
    from vaswani_mt.publishing.model_card import render_card
    from vaswani_mt.run_record import RunRecord

    gnmt = render_card(RunRecord(name="m", generation_config={"num_beams": 4, "length_penalty": 0.6,
                                                              "length_penalty_style": "gnmt"}))
    plain = render_card(RunRecord(name="m", generation_config={"num_beams": 4, "length_penalty": 0.6}))
    assert "length penalty 0.6 (GNMT's formula, §6.1)" in gnmt and "((5 + length) / 6) ** penalty" in gnmt
    assert "which is not the GNMT formula" in plain and "which is not the GNMT formula" not in gnmt


def test_a_gnmt_call_leaves_later_calls_and_copies_of_the_model_with_transformers_penalty(make_tiny_model):
    import copy

    import torch

    model = make_tiny_model()
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]]), "attention_mask": torch.tensor(
        [[1, 1, 1, 1], [1, 1, 1, 0]])}
    before = model.generate(**inputs, num_beams=4, max_new_tokens=6, length_penalty=2.0)
    model.generate(**inputs, num_beams=4, max_new_tokens=6, length_penalty=2.0, length_penalty_style="gnmt")
    assert torch.equal(model.generate(**inputs, num_beams=4, max_new_tokens=6, length_penalty=2.0), before)
    assert torch.equal(copy.deepcopy(model).generate(**inputs, num_beams=4, max_new_tokens=6, length_penalty=2.0),
                       before)
