"""What `vaswani-mt demo` computes, without its web page (`vaswani_mt.inference.demo`, no gradio needed): the n-best
list and its scores are generate()'s, the attention maps are those of the chosen hypothesis' own tokens, drawn by the
same code as `vaswani-mt attention`, and bad input is one clear sentence."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import with_the_recipes_decoding
from tiny_tokenizer import SENTENCES

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.inference import heatmaps
from vaswani_mt.inference.demo import (
    EMPTY_TEXT,
    MAX_LINES,
    DemoError,
    decoding_defaults,
    describe_decoding,
    hypothesis_attention,
    length_penalty_divisor,
    load_demo_model,
    source_lines,
    translate_nbest,
)
from vaswani_mt.inference.heatmaps import attention_maps, figure_png, heatmap_figure
from vaswani_mt.model.pipeline_vaswani import moses_tokenize

EOS, PAD = 3, 0
REPO_ROOT = Path(__file__).resolve().parents[1]


def stopping_model(tokenizer, seed=0, **overrides):
    """A tiny random model whose end-of-sentence logit is raised, so hypotheses end, at different lengths (a random
    model rarely emits </s>, and every hypothesis would run to the length limit)."""
    torch.manual_seed(seed)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), final_logits_bias=True, **overrides)
    model = VaswaniForConditionalGeneration(config).eval()
    model.final_logits_bias[0, EOS] = 3.5
    return with_the_recipes_decoding(model)


@pytest.fixture
def model(tokenizer):
    return stopping_model(tokenizer)


def generate_nbest(model, tokenizer, lines, **kwargs):
    """generate() itself, on the same right-padded batch, asked for the whole beam with its scores."""
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    return model.generate(**batch, num_return_sequences=kwargs.get("num_beams", model.generation_config.num_beams),
                          output_scores=True, return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("style", ["transformers", "gnmt"])
def test_the_nbest_scores_equal_what_generate_returns(model, tokenizer, style):
    model.generation_config.length_penalty_style = style
    lines = SENTENCES[:3]
    results = translate_nbest(model, tokenizer, "\n".join(lines), num_beams=4, length_penalty=0.8)
    output = generate_nbest(model, tokenizer, lines, num_beams=4, length_penalty=0.8)
    transition = model.compute_transition_scores(output.sequences, output.scores, output.beam_indices,
                                                 normalize_logits=False)
    hypotheses = [hypothesis for result in results for hypothesis in result.hypotheses]

    assert [len(result.hypotheses) for result in results] == [4, 4, 4]
    assert [h.rank for h in hypotheses] == [1, 2, 3, 4] * 3
    assert [h.score for h in hypotheses] == output.sequences_scores.tolist()  # length-normalised: generate's own
    for row, hypothesis in enumerate(hypotheses):
        generated = output.sequences[row, 1:].tolist()
        assert generated[: hypothesis.length] == hypothesis.token_ids
        assert hypothesis.token_ids[-1] == EOS or hypothesis.length == len(generated)  # ended, or ran to the limit
        assert set(generated[hypothesis.length:]) <= {PAD, EOS}  # transformers fills finished rows with either
        assert hypothesis.text == tokenizer.decode(hypothesis.token_ids, skip_special_tokens=True)
        assert hypothesis.log_prob == pytest.approx(transition[row].sum().item(), abs=1e-5)
        assert hypothesis.score == pytest.approx(
            hypothesis.log_prob / length_penalty_divisor(hypothesis.length, 0.8, style), rel=1e-5)
    assert len({h.length for h in hypotheses}) > 2, "hypotheses of several lengths: the test covers their ends"
    for result in results:  # best first
        assert [h.score for h in result.hypotheses] == sorted((h.score for h in result.hypotheses), reverse=True)


def test_the_log_probability_is_the_models_probability_of_the_hypothesis_tokens(model, tokenizer):
    results = translate_nbest(model, tokenizer, "\n".join(SENTENCES[3:5]), num_beams=3)
    for result in results:
        for hypothesis in result.hypotheses:
            assert hypothesis.log_prob == pytest.approx(_rescored(model, result, hypothesis), abs=1e-4)


def _rescored(model, result, hypothesis) -> float:
    """log P(hypothesis | source) from one forward pass over the hypothesis' tokens."""
    decoder_input = [model.config.decoder_start_token_id] + hypothesis.token_ids[:-1]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([result.source_ids]),
                       decoder_input_ids=torch.tensor([decoder_input])).logits[0]
    return torch.log_softmax(logits.double(), -1)[torch.arange(hypothesis.length), hypothesis.token_ids].sum().item()


def test_the_best_hypothesis_is_the_translation_generate_gives_with_the_models_defaults(model, tokenizer):
    lines = SENTENCES[:4]
    results = translate_nbest(model, tokenizer, "\n".join(lines))
    expected = model.generate(**tokenizer(lines, padding=True, return_tensors="pt"))  # the fast loop, defaults
    assert [len(result.hypotheses) for result in results] == [decoding_defaults(model)["num_beams"]] * 4
    for result, ids in zip(results, expected.tolist()):
        assert result.hypotheses[0].token_ids == ids[1: ids.index(EOS) + 1]
        assert result.translation == tokenizer.decode(ids, skip_special_tokens=True)


def test_greedy_decoding_gives_one_hypothesis_scored_with_the_same_formula(model, tokenizer):
    results = translate_nbest(model, tokenizer, SENTENCES[0] + "\n" + SENTENCES[1], num_beams=1, length_penalty=1.0)
    expected = model.generate(**tokenizer(SENTENCES[:2], padding=True, return_tensors="pt"), num_beams=1)
    for result, ids in zip(results, expected.tolist()):
        (hypothesis,) = result.hypotheses
        assert hypothesis.token_ids == ids[1: ids.index(EOS) + 1 if EOS in ids else len(ids)]
        assert hypothesis.log_prob == pytest.approx(_rescored(model, result, hypothesis), abs=1e-4)
        assert hypothesis.score == pytest.approx(hypothesis.log_prob / hypothesis.length)


def test_a_hypothesis_that_reaches_the_maximum_length_keeps_all_its_tokens(model, tokenizer):
    results = translate_nbest(model, tokenizer, SENTENCES[1], num_beams=2, max_new_tokens=2)
    for hypothesis in results[0].hypotheses:
        assert 1 <= hypothesis.length <= 2
        assert hypothesis.length == 2 or hypothesis.token_ids[-1] == EOS


def test_lines_are_translated_together_and_keep_their_line_numbers(model, tokenizer):
    text = f"{SENTENCES[0]}\n\n   \n{SENTENCES[2]}\n"
    results = translate_nbest(model, tokenizer, text, num_beams=2)
    assert [(result.line, result.source) for result in results] == [(1, SENTENCES[0]), (4, SENTENCES[2])]
    assert results[1].source_ids == tokenizer(SENTENCES[2])["input_ids"]
    assert results[1].source_tokens == tokenizer.convert_ids_to_tokens(results[1].source_ids)


@pytest.mark.parametrize("text", ["", "   ", "\n\n \t\n", None])
def test_an_empty_text_is_one_clear_message(model, tokenizer, text):
    with pytest.raises(DemoError) as error:
        translate_nbest(model, tokenizer, text)
    assert str(error.value) == EMPTY_TEXT == "Type a sentence to translate (one per line): the text is empty."


def test_a_sentence_longer_than_the_model_holds_is_named_with_its_length_and_the_limit(tokenizer):
    model = stopping_model(tokenizer, max_position_embeddings=16)
    too_long = " ".join(["dog"] * 30)
    with pytest.raises(DemoError, match=r"^Line 2 is \d+ tokens long, more than this model holds "
                                        r"\(max_position_embeddings = 16 tokens\): shorten it or split it"):
        translate_nbest(model, tokenizer, f"a dog .\n{too_long}")


def test_too_many_lines_and_bad_settings_are_refused_by_name(model, tokenizer):
    with pytest.raises(DemoError, match=f"{MAX_LINES + 1} sentences are more than the demo translates at once"):
        source_lines(model, tokenizer, "\n".join(["a dog ."] * (MAX_LINES + 1)))
    with pytest.raises(DemoError, match="beam size must be a whole number from 1 to 16, not 0"):
        translate_nbest(model, tokenizer, "a dog .", num_beams=0)
    with pytest.raises(DemoError, match="maximum length must be a whole number of tokens from 1 to 128"):
        translate_nbest(model, tokenizer, "a dog .", max_new_tokens=129)
    with pytest.raises(DemoError, match="length penalty must be a number"):
        translate_nbest(model, tokenizer, "a dog .", length_penalty=float("nan"))
    assert len(translate_nbest(model, tokenizer, "a dog .", num_beams=3.0)[0].hypotheses) == 3  # a slider's float


def test_a_model_trained_on_preprocessed_text_gets_and_shows_the_lowercased_tokenized_input(model, tokenizer):
    raw = "A Dog's ball, in the Park!"
    plain = translate_nbest(model, tokenizer, moses_tokenize(raw, "en"), num_beams=2)
    model.config.preprocess, model.config.source_lang = "lowercase_moses", "en"
    (result,) = translate_nbest(model, tokenizer, raw, num_beams=2)
    assert result.source == raw
    assert result.model_input == "a dog 's ball , in the park !"
    assert result.source_ids == plain[0].source_ids
    assert [h.token_ids for h in result.hypotheses] == [h.token_ids for h in plain[0].hypotheses]
    assert [h.score for h in result.hypotheses] == [h.score for h in plain[0].hypotheses]


def test_the_attention_of_a_hypothesis_is_that_of_its_exact_tokens(model, tokenizer):
    (result,) = translate_nbest(model, tokenizer, SENTENCES[5], num_beams=3)
    hypothesis = result.hypotheses[2]
    maps = hypothesis_attention(model, tokenizer, result, rank=3)
    decoder_input = [model.config.decoder_start_token_id] + hypothesis.token_ids[:-1]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([result.source_ids]), decoder_input_ids=torch.tensor([decoder_input]),
                    output_attentions=True)
    assert maps["target_tokens"] == hypothesis.tokens
    assert maps["source_tokens"] == result.source_tokens
    assert torch.equal(maps["cross"], torch.stack([a[0] for a in out.cross_attentions]))
    assert torch.equal(maps["decoder"], torch.stack([a[0] for a in out.decoder_attentions]))
    assert torch.equal(maps["encoder"], torch.stack([a[0] for a in out.encoder_attentions]))
    with pytest.raises(DemoError, match="has 3 hypotheses, not a number 4"):
        hypothesis_attention(model, tokenizer, result, rank=4)


def test_a_heatmap_shows_one_head_or_the_average_over_the_heads(model, tokenizer):
    pytest.importorskip("matplotlib")
    maps = attention_maps(model, tokenizer, SENTENCES[0], target=SENTENCES[3])
    average = heatmap_figure(maps, "encoder-decoder", layer=-1)
    drawn = average.axes[0].images[0].get_array()
    assert torch.allclose(torch.as_tensor(drawn), maps["cross"][-1].mean(0))
    assert "layer 1, average of 4 heads" in average.axes[0].get_title()
    assert [t.get_text() for t in average.axes[0].get_xticklabels()] == maps["source_tokens"]
    assert [t.get_text() for t in average.axes[0].get_yticklabels()] == maps["target_tokens"]
    one = heatmap_figure(maps, "decoder-self", layer=0, head=2)
    assert torch.allclose(torch.as_tensor(one.axes[0].images[0].get_array()), maps["decoder"][0, 2])
    assert [t.get_text() for t in one.axes[0].get_xticklabels()] == maps["decoder_input_tokens"]
    assert figure_png(heatmap_figure(maps, "encoder-self", 1, 0))[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="head 4 does not exist"):
        heatmap_figure(maps, "encoder-self", 0, head=4)
    with pytest.raises(ValueError, match="unknown kind of attention 'cross'"):
        heatmap_figure(maps, "cross", 0)


def test_the_demo_and_the_attention_command_draw_with_the_same_function(model, tokenizer, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    drawn = []
    draw = heatmaps.draw_heatmap
    monkeypatch.setattr(heatmaps, "draw_heatmap", lambda ax, weights, *args: drawn.append(weights) or draw(
        ax, weights, *args))
    maps = attention_maps(model, tokenizer, SENTENCES[0], target=SENTENCES[1])
    heatmaps.plot_attention(model, tokenizer, SENTENCES[0], tmp_path, layers=[0], heads=[1], maps=maps)
    assert [w.shape for w in drawn] == [maps["encoder"][0, 1].shape, maps["decoder"][0, 1].shape,
                                        maps["cross"][0, 1].shape]
    heatmap_figure(maps, "encoder-decoder", 0)
    assert torch.equal(drawn[-1], maps["cross"][0].mean(0))


def test_the_decoding_defaults_are_the_models(model):
    model.generation_config.num_beams, model.generation_config.length_penalty = 5, 1.0
    assert decoding_defaults(model) == {"num_beams": 5, "length_penalty": 1.0, "length_penalty_style": "transformers",
                                        "max_new_tokens": None}
    assert describe_decoding(model) == ("beam 5, length penalty 1 (score = log P / length ** 1), at most source "
                                        "length + 50 tokens")


def test_a_greedy_model_saved_without_a_length_penalty_is_served_with_transformers_default(model, tokenizer, tmp_path):
    model.generation_config.num_beams, model.generation_config.length_penalty = 1, None  # as `train` saves beam 1
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_demo_model(str(tmp_path))
    assert loaded.generation_config.length_penalty is None
    assert decoding_defaults(loaded)["num_beams"] == 1 and decoding_defaults(loaded)["length_penalty"] == 1.0
    assert describe_decoding(loaded).startswith("beam 1, length penalty 1 ")
    [result] = translate_nbest(loaded, loaded_tokenizer, SENTENCES[0])
    assert len(result.hypotheses) == 1


def test_a_model_folder_loads_and_a_missing_one_or_an_unreachable_hub_id_is_one_message(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    loaded, loaded_tokenizer = load_demo_model(str(tmp_path / "model"), "cpu")
    assert not loaded.training and loaded.device.type == "cpu"
    assert torch.equal(loaded.final_logits_bias, model.final_logits_bias)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    with pytest.raises(DemoError, match=f"^model folder {tmp_path / 'missing'} does not exist$"):
        load_demo_model(str(tmp_path / "missing"))
    with pytest.raises(DemoError, match="^model folder nobody/no-model does not exist, and it cannot be loaded from "
                                        "the Hub either: "):
        load_demo_model("nobody/no-model", "cpu")  # HF_HUB_OFFLINE=1 (conftest): nothing is fetched
    with pytest.raises(DemoError, match="device 'cuda:7' cannot be used"):
        load_demo_model(str(tmp_path / "model"), "cuda:7")
    if not torch.backends.mps.is_available():  # Apple's GPU where torch cannot use it: why, in one line
        with pytest.raises(DemoError, match=r"^device 'mps' cannot be used: (this torch was built without MPS|MPS is "
                                            r"not available on this machine) \([^\n]*\)$"):
            load_demo_model(str(tmp_path / "model"), "mps")


def test_without_gradio_the_demo_command_says_how_to_install_it(tmp_path):
    script = ("import sys; sys.modules['gradio'] = None\n"
              "from vaswani_mt.cli import main\n"
              f"sys.exit(main(['demo', {str(tmp_path)!r}]))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.startswith('vaswani-mt demo: error: the demo needs gradio and matplotlib: pip install '
                                    '"vaswani-mt[demo]"')
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
