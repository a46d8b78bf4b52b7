"""pipeline("translation") works for vaswani_mt models on transformers 5, with and without vaswani_mt installed."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from stock_transformers import WITHOUT_VASWANI_MT
from transformers import pipeline

from tiny_tokenizer import SENTENCES
from vaswani_mt.model.pipeline_vaswani import (
    TranslationPipeline,
    register_translation_pipeline,
    right_align,
    save_for_pipeline,
)


@pytest.fixture(autouse=True)
def registered():
    register_translation_pipeline()


def generate_and_decode(model, tokenizer, texts, **generate_kwargs):
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
    with torch.no_grad():
        output = model.generate(**batch, **generate_kwargs)
    return tokenizer.batch_decode(output, skip_special_tokens=True)


def test_translation_task_with_a_model_object_gives_generate_output_with_the_papers_defaults(model, tokenizer,
                                                                                           device):
    model.to(device)
    pipe = pipeline("translation", model=model, tokenizer=tokenizer, device=device)
    assert isinstance(pipe, TranslationPipeline)
    text = SENTENCES[0]
    # The model's defaults: beam 4, length penalty 0.6, source length + 50 new tokens. Nothing added by the pipeline.
    expected = generate_and_decode(model, tokenizer, [text])
    assert pipe(text) == [{"translation_text": expected[0]}]
    generated = model.generate(**tokenizer([text], return_tensors="pt").to(device))
    assert generated.shape[1] - 1 <= len(tokenizer(text).input_ids) + 50


def test_a_list_gives_a_flat_list_in_order_with_and_without_batch_size(model, tokenizer):
    texts = SENTENCES[:5]
    pipe = pipeline("translation", model=model, tokenizer=tokenizer)
    one_by_one = [generate_and_decode(model, tokenizer, [t], num_beams=1, max_new_tokens=8)[0] for t in texts]
    assert pipe(texts, num_beams=1, max_new_tokens=8) == [{"translation_text": t} for t in one_by_one]
    # Batched: the same as generate() on the same padded batches of 2.
    batched = [t for i in range(0, len(texts), 2)
               for t in generate_and_decode(model, tokenizer, texts[i:i + 2], num_beams=1, max_new_tokens=8)]
    assert pipe(texts, batch_size=2, num_beams=1, max_new_tokens=8) == [{"translation_text": t} for t in batched]
    assert batched == one_by_one  # greedy with a length limit: padding changes nothing


def test_generation_kwargs_pass_through_at_call_and_at_construction(model, tokenizer):
    text = SENTENCES[1]
    greedy = generate_and_decode(model, tokenizer, [text], num_beams=1, max_new_tokens=6)[0]
    pipe = pipeline("translation", model=model, tokenizer=tokenizer)
    assert pipe(text, num_beams=1, max_new_tokens=6) == [{"translation_text": greedy}]
    pipe = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=6)
    assert pipe(text) == [{"translation_text": greedy}]
    beams = generate_and_decode(model, tokenizer, [text], num_beams=3, max_new_tokens=6, num_return_sequences=2)
    assert pipe(text, num_beams=3, num_return_sequences=2) == [{"translation_text": t} for t in beams]
    nested = pipe([text, ""], num_beams=3, num_return_sequences=2)
    assert nested == [[{"translation_text": t} for t in beams], [{"translation_text": ""}] * 2]


def test_empty_strings_translate_to_empty_strings_without_calling_the_model(model, tokenizer, monkeypatch):
    pipe = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=5)
    calls = []
    original = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(k["input_ids"].shape[0]) or original(*a, **k))
    assert pipe("") == [{"translation_text": ""}]
    assert pipe("   ") == [{"translation_text": ""}]
    assert pipe(["", " \t"]) == [{"translation_text": ""}, {"translation_text": ""}]
    assert calls == []
    out = pipe(["", SENTENCES[0], ""], batch_size=4)
    assert [o["translation_text"] == "" for o in out] == [True, False, True]
    assert calls == [1]  # one generate() call with only the non-empty sentence


def test_an_over_long_source_is_truncated_to_max_positions_with_a_warning(model, tokenizer, caplog, device):
    model.to(device)
    limit = model.config.max_position_embeddings
    text = " ".join(["dog"] * (limit + 20))
    assert len(tokenizer(text).input_ids) > limit
    pipe = pipeline("translation", model=model, tokenizer=tokenizer, device=device, num_beams=1, max_new_tokens=4)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.model.pipeline_vaswani"):
        out = pipe(text)
    assert any("truncated" in r.getMessage() and str(limit) in r.getMessage() for r in caplog.records)
    truncated = tokenizer(text, truncation=True, max_length=limit, return_tensors="pt")
    assert truncated.input_ids.shape[1] == limit and truncated.input_ids[0, -1] == tokenizer.eos_token_id
    expected = tokenizer.batch_decode(model.generate(**truncated.to(device), num_beams=1, max_new_tokens=4),
                                      skip_special_tokens=True)
    assert out == [{"translation_text": expected[0]}]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        pipe(text, truncation=False)


def test_left_padded_batches_are_realigned_to_right_padding():
    ids = torch.tensor([[0, 0, 5, 6, 3], [7, 8, 9, 10, 3]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    aligned, aligned_mask = right_align(ids, mask, 0)
    assert aligned.tolist() == [[5, 6, 3, 0, 0], [7, 8, 9, 10, 3]]
    assert aligned_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_translation_task_from_a_saved_folder_after_import(model, tokenizer, tmp_path):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pipe = pipeline("translation", model=str(tmp_path))
    assert isinstance(pipe, TranslationPipeline)
    expected = generate_and_decode(model, tokenizer, SENTENCES[:2], num_beams=2, max_new_tokens=7)
    assert pipe(SENTENCES[:2], num_beams=2, max_new_tokens=7) == [{"translation_text": t} for t in expected]


def test_save_for_pipeline_writes_code_and_custom_pipelines_and_can_be_repeated(model, tokenizer, tmp_path):
    folder = save_for_pipeline(model, tokenizer, tmp_path / "run")
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"] == {
        "translation": {"impl": "pipeline_vaswani.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"]}}
    assert {"AutoConfig", "AutoModelForSeq2SeqLM"} <= set(config["auto_map"])
    for name in ("pipeline_vaswani.py", "modeling_vaswani.py", "configuration_vaswani.py", "tokenizer.json"):
        assert (folder / name).is_file(), name
    # Again on the folder alone (e.g. after the trainer saved it): idempotent, other config keys kept.
    save_for_pipeline(save_directory=folder)
    assert json.loads((folder / "config.json").read_text()) == config
    # With vaswani_mt imported, such a folder loads through pipeline_class (or trust_remote_code=True).
    pipe = pipeline("translation", model=str(folder), pipeline_class=TranslationPipeline)
    expected = generate_and_decode(model, tokenizer, SENTENCES[:1], num_beams=1, max_new_tokens=5)
    assert pipe(SENTENCES[0], num_beams=1, max_new_tokens=5) == [{"translation_text": expected[0]}]


def test_save_for_pipeline_refuses_a_folder_without_config_or_tokenizer(model, tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        save_for_pipeline(save_directory=tmp_path / "empty")
    with pytest.raises(ValueError, match="tokenizer"):
        save_for_pipeline(model, None, tmp_path / "no_tokenizer")


# Runs in a fresh interpreter in which `import vaswani_mt` fails, as on a machine with only stock transformers.
STOCK_PIPELINE = WITHOUT_VASWANI_MT + textwrap.dedent("""
    import json, sys
    from transformers import pipeline
    path, texts = sys.argv[1], json.loads(sys.argv[2])
    pipe = pipeline("translation", model=path, trust_remote_code=True)
    inferred = pipeline(model=path, trust_remote_code=True)  # the task comes from custom_pipelines
    print(json.dumps({
        "class": type(pipe).__module__ + "." + type(pipe).__name__,
        "model_class": type(pipe.model).__module__,
        "default": pipe(texts[0]),
        "greedy": pipe(texts, num_beams=1, max_new_tokens=9, batch_size=2),
        "inferred": inferred(texts[0], num_beams=1, max_new_tokens=9),
    }))
""")


def test_stock_transformers_without_vaswani_mt_runs_the_translation_pipeline_from_the_folder(
        model, tokenizer, tmp_path):
    folder = save_for_pipeline(model, tokenizer, tmp_path / "checkpoint")
    texts = SENTENCES[:3]
    home = tmp_path / "hf"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(home),
           "HF_MODULES_CACHE": str(home / "modules")}
    result = subprocess.run([sys.executable, "-c", STOCK_PIPELINE, str(folder), json.dumps(texts)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])

    assert out["class"].startswith("transformers_modules.")
    assert out["class"].endswith("pipeline_vaswani.TranslationPipeline")
    assert out["model_class"].startswith("transformers_modules.")
    assert out["default"] == [{"translation_text": generate_and_decode(model, tokenizer, texts[:1])[0]}]
    greedy = [t for i in range(0, 3, 2)
              for t in generate_and_decode(model, tokenizer, texts[i:i + 2], num_beams=1, max_new_tokens=9)]
    assert out["greedy"] == [{"translation_text": t} for t in greedy]
    assert out["inferred"] == [{"translation_text": greedy[0]}]
