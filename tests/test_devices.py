"""Everything that takes a model or tensors works on the device they live on: each test runs once per device this
machine has (`DEVICES` in conftest.py: the CPU always, CUDA when present), so the suite proves CUDA on a GPU machine."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import pipeline

from tiny_tokenizer import SENTENCES
from vaswani_mt import VaswaniForConditionalGeneration
from vaswani_mt.inference.heatmaps import attention_maps
from vaswani_mt.recipe.averaging import average_checkpoints
from vaswani_mt.model.pipeline_vaswani import register_translation_pipeline
from vaswani_mt.inference.translate import translate_lines

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _decode(model, tokenizer, texts, **kwargs):
    batch = tokenizer(texts, return_tensors="pt", padding=True).to(model.device)
    with torch.no_grad():
        return tokenizer.batch_decode(model.generate(**batch, **kwargs), skip_special_tokens=True)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_fast_loops_return_transformers_loops_output_on_every_device(model, tokenizer, device, num_beams):
    model.to(device)
    batch = tokenizer(SENTENCES[:6], return_tensors="pt", padding=True).to(device)
    with torch.no_grad():
        fast = model.generate(**batch, num_beams=num_beams, max_new_tokens=12)
        model.use_fast_decoding = False
        reference = model.generate(**batch, num_beams=num_beams, max_new_tokens=12)
    assert fast.device.type == device.type
    assert torch.equal(fast, reference)


def test_bfloat16_generation_runs_on_every_device(model, tokenizer, device):
    model.to(device=device, dtype=torch.bfloat16)
    outputs = _decode(model, tokenizer, SENTENCES[:3], max_new_tokens=6)
    assert len(outputs) == 3


def test_the_pipeline_translates_with_a_model_object_and_a_folder_on_every_device(model, tokenizer, device, tmp_path):
    register_translation_pipeline()
    model.to(device)
    expected = _decode(model, tokenizer, SENTENCES[:3], num_beams=1, max_new_tokens=8)
    from_object = pipeline("translation", model=model, tokenizer=tokenizer, device=device)
    assert [r["translation_text"] for r in from_object(SENTENCES[:3], num_beams=1, max_new_tokens=8)] == expected
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    from_folder = pipeline("translation", model=str(tmp_path), device=device)
    assert from_folder.model.device.type == device.type
    assert [r["translation_text"] for r in from_folder(SENTENCES[:3], num_beams=1, max_new_tokens=8)] == expected


def test_translate_lines_uses_the_models_device(model, tokenizer, device):
    model.to(device)
    out = list(translate_lines(model, tokenizer, SENTENCES[:4], max_tokens=40, num_beams=1, max_new_tokens=6))
    assert out == [_decode(model, tokenizer, [s], num_beams=1, max_new_tokens=6)[0] for s in SENTENCES[:4]]


def test_translate_command_runs_on_the_device_it_is_given(model, tokenizer, device, tmp_path):
    model.to(device)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "vaswani_mt.cli", "translate", str(tmp_path / "model"), "--input",
         str(tmp_path / "in.txt"), "--device", device.type, "--num-beams", "1", "--max-new-tokens", "6"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == _decode(model, tokenizer, SENTENCES[:3], num_beams=1, max_new_tokens=6)


def test_attention_maps_come_from_a_model_on_any_device(model, tokenizer, device):
    on_cpu = attention_maps(model, tokenizer, SENTENCES[0], target=SENTENCES[1])
    model.to(device)
    on_device = attention_maps(model, tokenizer, SENTENCES[0], target=SENTENCES[1])
    for kind in ("encoder", "decoder", "cross"):
        for a, b in zip(on_cpu[kind], on_device[kind]):
            assert torch.allclose(torch.as_tensor(a).float().cpu(), torch.as_tensor(b).float().cpu(), atol=1e-4)


def test_checkpoints_saved_from_a_model_on_any_device_average_and_load(model, device, tmp_path):
    model.to(device)
    model.save_pretrained(tmp_path / "a")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    model.save_pretrained(tmp_path / "b")
    averaged = average_checkpoints([tmp_path / "a", tmp_path / "b"], output_dir=tmp_path / "avg")
    a = load_file(tmp_path / "a" / "model.safetensors")
    assert torch.allclose(averaged["model.shared.weight"], a["model.shared.weight"] + 0.5, atol=1e-5)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "avg").to(device)
    assert loaded.device.type == device.type


def test_a_ctranslate2_export_of_a_model_on_any_device_matches_generate(model, tokenizer, device, tmp_path):
    pytest.importorskip("ctranslate2")
    from vaswani_mt.inference.export import export_ctranslate2, translate_with_ctranslate2

    expected = _decode(model, tokenizer, SENTENCES[:3], num_beams=1, max_new_tokens=8)  # on the CPU, as CTranslate2
    model.to(device)
    export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    assert next(model.parameters()).device.type == device.type  # the export leaves the model where it was
    exported = translate_with_ctranslate2(tmp_path / "ct2", tokenizer, SENTENCES[:3], beam_size=1,
                                          max_decoding_length=8)
    assert exported == expected
