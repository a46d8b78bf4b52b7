"""`vaswani-mt export --to ctranslate2`: the CTranslate2 model computes what ours computes."""

import json
import os
import sys

import pytest
import torch

from conftest import with_the_recipes_decoding
from tiny_tokenizer import SENTENCES
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

ctranslate2 = pytest.importorskip("ctranslate2")

from vaswani_mt.cli.export import main  # noqa: E402
from vaswani_mt.cli.translate import main as translate_main  # noqa: E402
from vaswani_mt.inference.export import DECODING_FILE, export_ctranslate2, translate_with_ctranslate2  # noqa: E402

UNSEEN = ["a cat runs on the grass .", "men play in the park .", "die frau kocht .", "snow", "a a a a a a ."]


@pytest.fixture(scope="module", params=["post", "pre"])
def trained(request, tokenizer):
    """A tiny model trained for a second to map each sentence to another one: unlike a random model it ends its
    outputs with </s> at varied lengths, so beam search has real decisions to make."""
    return train_tiny(tokenizer, norm_style=request.param)


def train_tiny(tokenizer, **overrides):
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.0, **overrides)
    model = VaswaniForConditionalGeneration(config)
    batch = tokenizer(SENTENCES, text_target=SENTENCES[3:] + SENTENCES[:3], return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return with_the_recipes_decoding(model.eval())


def source_tokens(tokenizer, texts):
    return [tokenizer.convert_ids_to_tokens(tokenizer(t).input_ids) for t in texts]


def hf_ids(model, tokenizer, texts, **kwargs):
    """generate() output per sentence without the start token and from the first </s> on (padding)."""
    output = model.generate(**tokenizer(texts, return_tensors="pt", padding=True), **kwargs)
    rows = []
    for row in output.tolist():
        ids = row[1:]
        rows.append(ids[: ids.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in ids else ids)
    return rows


@pytest.mark.parametrize("beams", [1, 4])
def test_float32_export_decodes_token_for_token_like_generate(trained, tokenizer, tmp_path, beams):
    out = export_ctranslate2(trained, tmp_path / "ct2", tokenizer=tokenizer)
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    texts = SENTENCES + UNSEEN
    # Length penalty 0.6 divides by length**0.6 in both libraries. CTranslate2's beam search stops once beam_size
    # hypotheses are finished, which is transformers' early_stopping=True; and it refuses an empty output unless
    # min_decoding_length=0.
    expected = hf_ids(trained, tokenizer, texts, num_beams=beams, max_new_tokens=30, early_stopping=True)
    results = translator.translate_batch(source_tokens(tokenizer, texts), beam_size=beams, length_penalty=0.6,
                                         max_decoding_length=30, min_decoding_length=0, return_scores=True)
    got = [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
    assert got == expected
    assert len({len(ids) for ids in expected}) > 3  # varied lengths: outputs ended with </s> on their own
    if beams == 4:  # and the beam scores (sum of log-probabilities / length**0.6) agree
        scored = trained.generate(**tokenizer(texts, return_tensors="pt", padding=True), num_beams=4,
                                  max_new_tokens=30, early_stopping=True, return_dict_in_generate=True,
                                  output_scores=True)
        assert torch.allclose(torch.tensor([r.scores[0] for r in results]), scored.sequences_scores, atol=1e-4)


@pytest.mark.parametrize("beams", [1, 4])
def test_learned_positions_export_with_each_stacks_table_and_decode_like_generate(tokenizer, tmp_path, beams):
    model = train_tiny(tokenizer, position_embedding="learned")
    assert not torch.equal(model.model.encoder.embed_positions.weight, model.model.decoder.embed_positions.weight)
    translator = ctranslate2.Translator(str(export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)))
    texts = SENTENCES + UNSEEN
    expected = hf_ids(model, tokenizer, texts, num_beams=beams, max_new_tokens=30, early_stopping=True)
    results = translator.translate_batch(source_tokens(tokenizer, texts), beam_size=beams, length_penalty=0.6,
                                         max_decoding_length=30, min_decoding_length=0)
    assert [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results] == expected


def test_heads_of_another_size_than_d_model_over_heads_are_refused_naming_the_field(tokenizer, tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), d_v=16))
    with pytest.raises(ValueError, match=r"VaswaniConfig.d_v=16 does not convert to CTranslate2"):
        export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    assert not (tmp_path / "ct2").exists()


@pytest.mark.parametrize("norm_style", ["post", "pre"])
def test_untied_unshared_unscaled_model_with_logits_bias_scores_the_same_log_probabilities(
        tokenizer, tmp_path, norm_style):
    torch.manual_seed(1)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), norm_style=norm_style,
                                       share_embeddings=False, tie_word_embeddings=False, scale_embedding=False,
                                       final_logits_bias=True, layer_norm_eps=1e-6)
    model = VaswaniForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    out = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    translator = ctranslate2.Translator(str(out), intra_threads=1)
    targets = list(reversed(SENTENCES))
    scores = translator.score_batch(source_tokens(tokenizer, SENTENCES),
                                    [tokens[:-1] for tokens in source_tokens(tokenizer, targets)])
    batch = tokenizer(SENTENCES, text_target=targets, return_tensors="pt", padding=True)
    labels = batch.pop("labels")
    labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
    with torch.no_grad():
        log_probs = model(**batch, labels=labels).logits.log_softmax(-1)
    for i, score in enumerate(scores):
        n = int((labels[i] != -100).sum())
        ours = log_probs[i, torch.arange(n), labels[i, :n]]
        assert len(score.log_probs) == n  # every target token plus </s>
        assert torch.allclose(torch.tensor(score.log_probs), ours, atol=1e-4)
    # A random model may pick <pad>: suppress it on both sides (greedy picks are unaffected by CTranslate2
    # renormalising without it).
    greedy = translator.translate_batch(source_tokens(tokenizer, SENTENCES), beam_size=1, max_decoding_length=12,
                                        min_decoding_length=0, suppress_sequences=[["<pad>"]])
    assert [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in greedy] == \
        hf_ids(model, tokenizer, SENTENCES, num_beams=1, max_new_tokens=12, suppress_tokens=[0])


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_cli_exports_a_saved_folder_in_float32_and_int8(trained, tokenizer, tmp_path, capsys):
    folder = tmp_path / "model"
    trained.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert main(["--to", "ctranslate2", str(folder), str(tmp_path / "fp32")]) == 0
    assert main(["--to", "ctranslate2", str(folder), str(tmp_path / "int8"), "--quantization", "int8"]) == 0
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (tmp_path / "fp32" / "model.bin").stat().st_size
    assert (tmp_path / "fp32" / "tokenizer.json").is_file()
    fp32 = translate_with_ctranslate2(tmp_path / "fp32", tokenizer, SENTENCES + [""], threads=1)
    expected = tokenizer.batch_decode(
        trained.generate(**tokenizer(SENTENCES, return_tensors="pt", padding=True), early_stopping=True),
        skip_special_tokens=True)
    assert fp32 == expected + [""]  # beam 4, length penalty 0.6, source length + 50 by default on both sides
    int8 = translate_with_ctranslate2(tmp_path / "int8", tokenizer, SENTENCES, threads=1)
    assert sum(a == b for a, b in zip(int8, expected)) >= len(SENTENCES) // 2
    # An existing output folder is refused without --force.
    assert main([str(folder), str(tmp_path / "fp32")]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main([str(folder), str(tmp_path / "fp32"), "--force"]) == 0
    assert main([str(tmp_path / "missing"), str(tmp_path / "x")]) == 1


def test_missing_ctranslate2_raises_an_import_error_naming_the_extra(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer)))
    with pytest.raises(ImportError, match=r'pip install "vaswani-mt\[ctranslate2\]"'):
        export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(tokenizer, tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer) - 1))
    with pytest.raises(ValueError, match="tokenizer has"):
        export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_translating_with_ctranslate2_leaves_torchs_thread_count_alone(trained, tokenizer, tmp_path):
    export_ctranslate2(trained, tmp_path / "ct2", tokenizer=tokenizer)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        translate_with_ctranslate2(tmp_path / "ct2", tokenizer, SENTENCES[:1], threads=1)
        assert torch.get_num_threads() == 2  # a 1-thread Translator used to make torch single-threaded
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_an_int8_export_leaves_the_models_own_weights_untouched(trained, tokenizer, tmp_path):
    before = {name: tensor.clone() for name, tensor in trained.state_dict().items()}
    export_ctranslate2(trained, tmp_path / "int8", tokenizer=tokenizer, quantization="int8")
    changed = [name for name, tensor in trained.state_dict().items() if not torch.equal(tensor, before[name])]
    assert changed == []  # CTranslate2 quantizes in place: it must get copies


# --- --force never deletes work (issue #12) -------------------------------------------------------------------------


@pytest.fixture
def run_folder(tokenizer, tmp_path):
    """A run folder with its model folder, as `vaswani-mt train` writes them."""
    run = tmp_path / "run"
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer)))
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    (run / "config.yaml").write_text("output_dir: run\n")
    (run / "checkpoints").mkdir()
    return run


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


@pytest.mark.parametrize("target", ["model folder", "run folder", "a folder that is not an export"])
def test_export_force_never_deletes_the_model_a_run_or_a_folder_that_is_not_an_export(run_folder, tmp_path, capsys,
                                                                                       target):
    out = {"model folder": run_folder / "model", "run folder": run_folder,
           "a folder that is not an export": tmp_path / "notes"}[target]
    out.mkdir(exist_ok=True)
    (out / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    assert main([str(run_folder / "model"), str(out), "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vaswani-mt export: error:" in err
    assert {"model folder": "is the model folder", "run folder": "holding the model folder",
            "a folder that is not an export": "is not one"}[target] in err
    assert _tree(tmp_path) == before


def test_export_force_replaces_a_previous_export(run_folder, tmp_path, capsys):
    out = tmp_path / "ct2"
    assert main([str(run_folder / "model"), str(out)]) == 0
    assert main([str(run_folder / "model"), str(out), "--quantization", "int8", "--force"]) == 0
    assert (out / "model.bin").is_file() and (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("damage", ["empty", "truncated", "deleted"])
def test_export_names_a_broken_weights_file(run_folder, tmp_path, capsys, damage):
    weights = run_folder / "model" / "model.safetensors"
    if damage == "deleted":
        weights.unlink()
    else:
        weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[:1000])
    assert main([str(run_folder / "model"), str(tmp_path / "ct2")]) == 1
    err = capsys.readouterr().err
    assert "model.safetensors" in err and err.count("\n") == 1 and "Traceback" not in err


# --- `vaswani-mt translate EXPORT` (issue #15) ------------------------------------------------------------------------


@pytest.fixture
def saved_and_exported(trained, tokenizer, tmp_path):
    """The trained tiny model saved as `vaswani-mt train` saves it, and its float32 CTranslate2 export."""
    folder = tmp_path / "model"
    trained.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert main([str(folder), str(tmp_path / "ct2")]) == 0
    return folder, tmp_path / "ct2"


@pytest.mark.parametrize("trained", ["post"], indirect=True)
@pytest.mark.parametrize("options", [[], ["--num-beams", "1", "--max-new-tokens", "6"]])
def test_translate_with_a_ctranslate2_folder_equals_the_pytorch_output_in_float32(saved_and_exported, trained,
                                                                                 tmp_path, capsys, options):
    """Same streaming, batching (several windows and batches), order, decoding defaults and --reference scores."""
    folder, export = saved_and_exported
    decoding = json.loads((export / DECODING_FILE).read_text())
    assert decoding == {"num_beams": 4, "length_penalty": 0.6, "length_penalty_style": "transformers",
                        "max_new_tokens": None, "length_margin": 50,
                        "max_position_embeddings": trained.config.max_position_embeddings}
    lines = SENTENCES + ["", "   "] + UNSEEN + [" ".join(SENTENCES * 3)]  # the last one is truncated to 128 tokens
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines + lines[::-1]) + "\n", encoding="utf-8")
    capsys.readouterr()
    results = {}
    for name, model in (("pytorch", folder), ("ctranslate2", export)):
        output = tmp_path / f"{name}.txt"
        assert translate_main([str(model), "-i", str(source), "-o", str(output), "-r", str(source),
                               "--max-tokens", "64", "--sort-window", "7", "--device", "cpu", *options]) == 0
        scores = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("BLEU", "chrF2"))]
        results[name] = output.read_text(encoding="utf-8"), scores
    assert results["ctranslate2"] == results["pytorch"]
    translations, scores = results["pytorch"]
    assert len(translations.splitlines()) == 2 * len(lines) and len(scores) == 2
    assert len(set(translations.splitlines())) > 5


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_translate_refuses_a_ctranslate2_folder_without_its_decoding_defaults_in_one_line(saved_and_exported,
                                                                                          capsys):
    _, export = saved_and_exported
    (export / DECODING_FILE).unlink()
    assert translate_main([str(export), "--input", str(export / "config.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vaswani-mt translate: error: ")
    assert DECODING_FILE in err and "vaswani-mt export --force" in err


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_an_exports_length_penalty_is_its_decoding_files_unless_one_is_given(saved_and_exported):
    from vaswani_mt.inference.export import ExportedModel

    exported, penalties = ExportedModel(saved_and_exported[1], "cpu"), []
    real = exported.translator

    class Spy:
        def translate_batch(self, *args, **kwargs):
            penalties.append(kwargs["length_penalty"])
            return real.translate_batch(*args, **kwargs)

    exported.translator = Spy()
    assert len(list(exported.translate_lines(SENTENCES[:3], length_penalty=1.4, max_new_tokens=4))) == 3
    assert penalties and set(penalties) == {1.4}
    penalties.clear()
    list(exported.translate_lines(SENTENCES[:3], max_new_tokens=4))
    assert penalties and set(penalties) == {0.6}


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_translate_refuses_gnmts_length_penalty_for_a_ctranslate2_folder_before_touching_the_output(
        saved_and_exported, tmp_path, capsys):
    _, export = saved_and_exported
    source, output = tmp_path / "in.txt", tmp_path / "kept.txt"
    source.write_text("\n".join(SENTENCES[:2]) + "\n", encoding="utf-8")
    output.write_text("earlier work\n", encoding="utf-8")
    assert translate_main([str(export), "-i", str(source), "-o", str(output), "--length-penalty-style", "gnmt"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CTranslate2 has only" in err
    assert output.read_text(encoding="utf-8") == "earlier work\n"


@pytest.mark.parametrize("trained", ["post"], indirect=True)
def test_the_files_of_an_export_follow_the_umask(trained, tokenizer, tmp_path):
    previous = os.umask(0o002)
    try:
        out = export_ctranslate2(trained, tmp_path / "ct2", tokenizer=tokenizer)
    finally:
        os.umask(previous)
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in out.iterdir()}
    assert "model.bin" in modes and DECODING_FILE in modes
    assert set(modes.values()) == {oct(0o664)}
