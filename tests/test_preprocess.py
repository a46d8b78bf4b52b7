"""The literature's Multi30k protocol as an option (`data.preprocess: lowercase_moses`): both sides lowercased and
Moses-tokenized before the tokenizer; the model records it, so translate, the pipeline and a CTranslate2 export do
the same to raw input, and the test BLEU is multi-bleu's on the tokenized lowercase output."""

import copy
import json

import pytest
import torch
import yaml

from tiny_tokenizer import SENTENCES
from vaswani_mt import VaswaniConfig
from vaswani_mt.cli import main
from vaswani_mt.inference.translate import translate_lines
from vaswani_mt.model.pipeline_vaswani import moses_tokenize, preprocess_source

RAW = ["A Dog's ball, in the park!", "Two MEN (one tall) play.", "", "A man."]


def test_raw_input_is_lowercased_and_moses_tokenized_for_the_source_language():
    config = VaswaniConfig.from_preset("tiny", preprocess="lowercase_moses", source_lang="en")
    assert preprocess_source("A Dog's ball, in the park!", config) == "a dog 's ball , in the park !"
    assert preprocess_source("A Dog's ball", VaswaniConfig.from_preset("tiny")) == "A Dog's ball"
    assert moses_tokenize("Ein Hund, im Park.", "de") == "ein hund , im park ."


def test_a_model_trained_on_preprocessed_text_translates_raw_input_as_its_preprocessed_form(model, tokenizer):
    model.eval()
    recorded = copy.deepcopy(model)
    recorded.config.preprocess, recorded.config.source_lang = "lowercase_moses", "en"
    by_hand = list(translate_lines(model, tokenizer, [preprocess_source(line, recorded.config) for line in RAW],
                                   num_beams=2, max_new_tokens=8))
    assert list(translate_lines(recorded, tokenizer, RAW, num_beams=2, max_new_tokens=8)) == by_hand
    assert by_hand[2] == ""


def test_the_pipeline_preprocesses_raw_input_for_such_a_model(model, tokenizer):
    from transformers import pipeline

    model.eval()
    recorded = copy.deepcopy(model)
    recorded.config.preprocess, recorded.config.source_lang = "lowercase_moses", "en"
    plain = pipeline("translation", model=model, tokenizer=tokenizer)
    preprocessed = pipeline("translation", model=recorded, tokenizer=tokenizer)
    for line in RAW[:2]:
        assert (preprocessed(line, num_beams=2, max_new_tokens=8)
                == plain(preprocess_source(line, recorded.config), num_beams=2, max_new_tokens=8))


def test_an_unknown_preprocessing_or_one_without_its_language_is_refused_by_name():
    with pytest.raises(ValueError, match="preprocess must be None or one of"):
        VaswaniConfig.from_preset("tiny", preprocess="truecase", source_lang="en")
    with pytest.raises(ValueError, match="needs source_lang"):
        VaswaniConfig.from_preset("tiny", preprocess="lowercase_moses")


def test_training_with_the_protocol_records_it_in_the_model_and_scores_tokenized_output(tmp_path, multi30k_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, source, count in (("train", "train", 200), ("valid", "valid", 8), ("test", "test2016", 8)):
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{source}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (corpus / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = {"data": {"path": str(corpus), "test_split": "test", "max_length": 64, "preprocess": "lowercase_moses"},
              "tokenizer": {"vocab_size": 400},
              "model": {"preset": "tiny", "config": {"max_position_embeddings": 128}},
              "training": {"max_tokens": 512, "max_steps": 2, "warmup_steps": 2, "eval_steps": 2, "logging_steps": 1,
                           "keep_checkpoints": 1, "average_last": 1, "num_beams": 1, "num_threads": 1},
              "output_dir": str(tmp_path / "run")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", "--config", str(tmp_path / "config.yaml")]) == 0
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert (saved["preprocess"], saved["source_lang"]) == ("lowercase_moses", "en")
    test = json.loads((tmp_path / "run" / "metrics.json").read_text())["test"]
    assert test["preprocess"] == "lowercase_moses"
    assert "tok:none" in test["bleu_lowercased_moses_tokenized_signature"]
    hypotheses = (tmp_path / "run" / "test.hyp").read_text(encoding="utf-8")
    assert hypotheses == hypotheses.lower()


def test_a_bad_preprocess_value_in_a_run_config_is_refused_naming_the_key(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"data": {"path": str(tmp_path), "preprocess": "lower"}}))
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "data.preprocess must be null or one of ['lowercase_moses']" in capsys.readouterr().err


def test_a_ctranslate2_export_of_such_a_model_preprocesses_raw_input_too(model, tokenizer, tmp_path):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.inference.export import ExportedModel, export_ctranslate2

    model.eval()
    model.config.preprocess, model.config.source_lang = "lowercase_moses", "en"
    export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    exported = ExportedModel(tmp_path / "ct2", "cpu")
    lines = RAW + SENTENCES[:3]
    with torch.no_grad():
        expected = list(translate_lines(model, tokenizer, lines, num_beams=2, max_new_tokens=8))
    assert list(exported.translate_lines(lines, num_beams=2, max_new_tokens=8)) == expected


def test_the_raw_ctranslate2_api_preprocesses_raw_input_and_decodes_with_the_exports_defaults(model, tokenizer,
                                                                                              tmp_path):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.inference.export import ExportedModel, export_ctranslate2, translate_with_ctranslate2

    model.eval()
    model.config.preprocess, model.config.source_lang = "lowercase_moses", "en"
    model.generation_config.num_beams = 2  # saved in the export's decoding defaults (the raw API used to say 4)
    export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    lines = RAW + SENTENCES[:3]
    expected = list(ExportedModel(tmp_path / "ct2", "cpu").translate_lines(lines, max_new_tokens=8))
    assert translate_with_ctranslate2(tmp_path / "ct2", tokenizer, lines, max_decoding_length=8, threads=1) == expected


def test_the_model_card_of_such_a_run_says_what_its_scores_and_input_are():
    from vaswani_mt.publishing.model_card import render_card
    from vaswani_mt.run_record import RunRecord, TestScores

    record = RunRecord(name="lctok", config={"data": {"source_lang": "en", "target_lang": "de"}},
                       model_config={"preprocess": "lowercase_moses", "source_lang": "en", "d_model": 128},
                       test=TestScores(split="test2016", bleu=40.1, bleu_signature="nrefs:1|case:mixed|tok:13a",
                                       bleu_lowercased_moses_tokenized=40.9,
                                       bleu_lowercased_moses_tokenized_signature="nrefs:1|case:lc|tok:none",
                                       preprocess="lowercase_moses"))
    card = render_card(record, repo_id="someone/lctok")
    assert "trained on lowercased, Moses-tokenized text" in card and "40.90" in card
    assert ".lower()" in card and "Scores are computed on detokenized output" not in card


def test_translate_reference_scores_of_such_a_model_compare_like_with_like_and_print_the_literature_bleu(
        model, tokenizer, tmp_path, capsys):
    model.config.preprocess, model.config.source_lang, model.config.target_lang = "lowercase_moses", "en", "de"
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "in.en").write_text("A Dog.\n", encoding="utf-8")
    (tmp_path / "ref.de").write_text("Ein Hund.\n", encoding="utf-8")
    assert main(["translate", str(tmp_path / "model"), "-i", str(tmp_path / "in.en"), "-r", str(tmp_path / "ref.de"),
                 "--device", "cpu", "--max-new-tokens", "4"]) == 0
    err = capsys.readouterr().err
    assert "references lowercased and Moses-tokenized" in err
    assert "BLEU, lowercased Moses-tokenized (multi-bleu.perl) = " in err and "case:lc|eff:no|tok:none" in err
