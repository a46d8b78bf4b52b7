"""A run folder written before the package moved into subpackages (tests/fixtures/run-saved-by-c3eb282, see its
README) still loads, scores, translates, resumes and pushes with today's code."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vaswani_mt.cli import main
from vaswani_mt.run_record import RunRecord

OLD_RUN = Path(__file__).parent / "fixtures" / "run-saved-by-c3eb282"
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder", ["model", "checkpoints/checkpoint-2"])
def test_a_model_and_a_checkpoint_saved_before_the_move_load_and_score_pairs_as_they_did(folder):
    expected = json.loads((OLD_RUN / "losses.json").read_text())[folder]
    tokenizer = AutoTokenizer.from_pretrained(OLD_RUN / folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(OLD_RUN / folder).eval()
    sources = (OLD_RUN / "corpus" / "test.en").read_text().splitlines()[:len(expected)]
    targets = (OLD_RUN / "corpus" / "test.de").read_text().splitlines()[:len(expected)]
    with torch.no_grad():
        losses = [model(**tokenizer([s], text_target=[t], return_tensors="pt")).loss.item()
                  for s, t in zip(sources, targets)]
    assert losses == pytest.approx(expected, abs=1e-5)


def test_a_model_saved_before_the_move_translates_as_it_did(tmp_path, capsys):
    assert main(["translate", str(OLD_RUN / "model"), "--input", str(OLD_RUN / "corpus" / "test.en"),
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out == (OLD_RUN / "test.translate.de").read_text()


def test_a_run_saved_before_the_move_reads_into_the_run_record_and_passes_the_push_checks(capsys):
    record = RunRecord.read(OLD_RUN)
    assert record.test.split == "test" and record.training.steps == 4 and record.model.preset == "tiny"
    assert main(["push", str(OLD_RUN), "someone/old-run", "--dry-run"]) == 0
    card = capsys.readouterr().out
    assert f"{record.test.bleu:.2f}" in card and record.test.bleu_signature.replace("|", "\\|") in card


def test_a_run_saved_before_the_move_resumes_from_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN / "checkpoints", run / "checkpoints")
    shutil.copytree(OLD_RUN / "tokenizer", run / "tokenizer")
    config = yaml.safe_load((OLD_RUN / "config.yaml").read_text())
    config["data"]["path"] = str(OLD_RUN / "corpus")
    config["output_dir"] = str(run)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(run / "config.yaml"),
                           "--resume"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming from" in done.stderr and "checkpoint-2" in done.stderr
    assert RunRecord.read(run).training.steps == 4 and (run / "model" / "model.safetensors").is_file()
