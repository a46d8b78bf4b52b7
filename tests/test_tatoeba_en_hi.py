"""Another script end to end: the shipped tatoeba-en-hi config (English -> Hindi in Devanagari, ../shared/data)
prepares, round-trips through its tokenizer, trains, is scored with sacreBLEU and chrF, and its card names the data
and its terms."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vaswani_mt.cli import main
from vaswani_mt.data.prepared import prepare
from vaswani_mt.data.reading import read_lines
from vaswani_mt.data.tokenization import normalize_text
from vaswani_mt.recipe.config import load_run_config, parse_overrides

REPO = Path(__file__).resolve().parents[1]
TATOEBA = REPO.parent / "shared" / "data" / "tatoeba-en-hi"
pytestmark = pytest.mark.skipif(not (TATOEBA / "train.hi").is_file(),
                                reason=f"Tatoeba En-Hi not found at {TATOEBA} (../shared/data beside the repo)")


def test_every_sentence_round_trips_through_the_learned_tokenizer_after_normalisation(tmp_path):
    config = load_run_config("tatoeba-en-hi", parse_overrides(["--data.path", str(TATOEBA)]))
    tokenizer = prepare(config.data, config.tokenizer, cache_dir=tmp_path).tokenizer
    sentences = [normalize_text(line) for split in ("train", "valid", "test") for lang in ("en", "hi")
                 for line in read_lines(TATOEBA / f"{split}.{lang}")]
    decoded = tokenizer.batch_decode(tokenizer(sentences)["input_ids"], skip_special_tokens=True)
    assert [d for d, s in zip(decoded, sentences) if d != s] == []
    assert any("\u0900" <= c <= "\u097f" for c in sentences[-1])  # Devanagari
    assert tokenizer.unk_token_id not in {i for ids in tokenizer(sentences)["input_ids"] for i in ids}


def test_the_shipped_config_trains_end_to_end_scores_test_with_sacrebleu_and_chrf_and_the_card_names_the_terms(
        tmp_path, capsys):
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "vaswani_mt.cli", "train", "--config", "tatoeba-en-hi", "--quick",
         "--data.path", str(TATOEBA), "--output-dir", str(run), "--model.preset", "tiny",
         "--training.max_steps", "4", "--training.eval_steps", "4", "--training.warmup_steps", "2",
         "--training.bf16", "false", "--training.num_beams", "1", "--data.valid_subset", "20"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    test = json.loads((run / "metrics.json").read_text())["test"]
    assert test["split"] == "test" and test["sentences"] == 282
    assert test["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert test["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6")
    assert main(["push", str(run), "someone/vaswani-en-hi", "--dry-run"]) == 0
    card = capsys.readouterr().out
    assert "English-to-Hindi" in card or "(en → hi)" in card
    for phrase in ("Tatoeba English-Hindi", "CC-BY 2.0 (France)", "attribution", "license_name: cc-by-2.0-fr"):
        assert phrase in card, phrase
