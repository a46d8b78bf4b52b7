"""Attention heatmaps: the matrices are the model's attention weights, and the PNGs get written."""

import sys

import pytest
import torch

from tiny_tokenizer import SENTENCES
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.cli.attention import main
from vaswani_mt.inference.heatmaps import attention_maps, plot_attention

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def model(tokenizer):
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), decoder_layers=3)
    return VaswaniForConditionalGeneration(config).eval()


def test_maps_are_the_models_attention_weights_for_a_given_target(model, tokenizer):
    source, target = SENTENCES[0], SENTENCES[3]
    maps = attention_maps(model, tokenizer, source, target=target)
    src_ids = tokenizer(source).input_ids
    tgt_ids = tokenizer(target).input_ids
    assert maps["source_tokens"] == tokenizer.convert_ids_to_tokens(src_ids)
    assert maps["target_tokens"] == tokenizer.convert_ids_to_tokens(tgt_ids)
    assert maps["decoder_input_tokens"] == ["<s>"] + tokenizer.convert_ids_to_tokens(tgt_ids[:-1])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([src_ids]), decoder_input_ids=torch.tensor([[2] + tgt_ids[:-1]]),
                    output_attentions=True)
    S, T, heads = len(src_ids), len(tgt_ids), model.config.encoder_attention_heads
    assert maps["encoder"].shape == (2, heads, S, S)
    assert maps["decoder"].shape == (3, heads, T, T)
    assert maps["cross"].shape == (3, heads, T, S)
    assert torch.equal(maps["encoder"], torch.stack([a[0] for a in out.encoder_attentions]))
    assert torch.equal(maps["decoder"], torch.stack([a[0] for a in out.decoder_attentions]))
    assert torch.equal(maps["cross"], torch.stack([a[0] for a in out.cross_attentions]))


def test_rows_sum_to_one_and_the_decoder_never_attends_to_the_future(model, tokenizer):
    maps = attention_maps(model, tokenizer, SENTENCES[1], target=SENTENCES[4])
    for key in ("encoder", "decoder", "cross"):
        assert torch.allclose(maps[key].sum(-1), torch.ones(()), atol=1e-5), key
    T = maps["decoder"].shape[-1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert maps["decoder"][..., future].abs().max() == 0
    assert maps["decoder"][..., ~future].min() > 0


def test_without_target_the_greedy_translation_is_analysed(model, tokenizer):
    model.train()  # attention_maps switches to eval (no dropout) and back
    maps = attention_maps(model, tokenizer, SENTENCES[2], max_new_tokens=7)
    assert model.training
    model.eval()
    batch = tokenizer([SENTENCES[2]], return_tensors="pt")
    greedy = model.generate(**batch, num_beams=1, max_new_tokens=7)[0].tolist()
    assert maps["target_tokens"] == tokenizer.convert_ids_to_tokens(greedy[1:])
    assert maps["translation"] == tokenizer.decode(greedy, skip_special_tokens=True)
    assert maps["decoder"].shape[-1] == maps["cross"].shape[-2] == len(greedy) - 1


def test_plot_writes_one_png_per_layer_and_kind_without_pyplot(model, tokenizer, tmp_path):
    pyplot_before = "matplotlib.pyplot" in sys.modules
    paths = plot_attention(model, tokenizer, SENTENCES[5], tmp_path, target=SENTENCES[2], heads=[1])  # "$" in a token
    assert [p.name for p in paths] == [
        "encoder-self_layer0.png", "encoder-self_layer1.png",
        "decoder-self_layer0.png", "decoder-self_layer1.png", "decoder-self_layer2.png",
        "encoder-decoder_layer0.png", "encoder-decoder_layer1.png", "encoder-decoder_layer2.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC
    assert ("matplotlib.pyplot" in sys.modules) == pyplot_before
    subset = plot_attention(model, tokenizer, SENTENCES[0], tmp_path / "subset", layers=[-1], heads=[0, 3],
                            max_new_tokens=6)
    assert [p.name for p in subset] == ["encoder-self_layer1.png", "decoder-self_layer2.png",
                                        "encoder-decoder_layer2.png"]
    with pytest.raises(ValueError, match="head 4 does not exist"):
        plot_attention(model, tokenizer, SENTENCES[0], tmp_path / "bad", heads=[4])


def test_cli_writes_the_heatmaps_of_a_saved_model(model, tokenizer, tmp_path, capsys):
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert main([str(tmp_path / "model"), SENTENCES[0], "--out", str(tmp_path / "maps"), "--layers", "0",
                 "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 3 and all(p.endswith(".png") for p in printed)
    assert main([str(tmp_path / "missing"), SENTENCES[0], "--out", str(tmp_path / "x")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_missing_matplotlib_raises_an_import_error_naming_the_extra(model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "vaswani-mt\[plot\]"'):
        plot_attention(model, tokenizer, SENTENCES[0], tmp_path)
