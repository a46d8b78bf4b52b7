"""Models written by `vaswani-mt train` keep the run config's decoding (by default the paper's, §6.1: beam 4, length
penalty 0.6), up to source length + 50 new tokens — no stray `max_length: 20` from the Trainer's evaluation — and a
checkpoint's validation BLEU is the same during training and at model selection."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig

from test_train_cli import REPO, small_corpus, tiny_config  # noqa: F401  (small_corpus is a fixture)
from vaswani_mt import VaswaniForConditionalGeneration


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, small_corpus):  # noqa: F811
    """A run of the train command (tiny shape, 8 updates, validation with beam 2 every 4)."""
    tmp_path = tmp_path_factory.mktemp("decoding_defaults")
    config = tiny_config(tmp_path, small_corpus, max_steps=8, eval_steps=4, num_beams=2, average_last=2)
    result = subprocess.run([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(config)],
                            capture_output=True, text=True, timeout=300, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "run", result


def _saved_folders(run_dir: Path) -> list[Path]:
    return [run_dir / "model", *sorted((run_dir / "checkpoints").glob("checkpoint-*"))]


def test_saved_generation_configs_keep_the_runs_beam_the_papers_length_penalty_and_no_length_cap(trained_run):
    run_dir, _ = trained_run
    for folder in _saved_folders(run_dir):
        config = GenerationConfig.from_pretrained(folder)
        assert (config.num_beams, config.length_penalty) == (2, 0.6), folder  # the run config's beam 2
        assert config.max_length is None and config.max_new_tokens is None, (folder, config.max_length)


def test_a_trained_model_translates_past_20_tokens_up_to_source_length_plus_50(trained_run):
    run_dir, _ = trained_run
    model = VaswaniForConditionalGeneration.from_pretrained(run_dir / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    source = torch.randint(5, len(tokenizer), (1, 40))
    with torch.no_grad():
        forced = model.generate(input_ids=source, num_beams=1, min_new_tokens=30)
        unbounded = model.generate(input_ids=source, num_beams=1, min_new_tokens=1000)
    assert forced.shape[1] - 1 >= 30  # more than 20 tokens: nothing caps the output at 20
    assert unbounded.shape[1] - 1 == 40 + 50  # the limit is the source length + 50


def test_validation_bleu_of_a_checkpoint_is_the_same_during_training_and_at_selection(trained_run):
    run_dir, _ = trained_run
    metrics = json.loads((run_dir / "metrics.json").read_text())
    selection = metrics["selection"]
    step = int(Path(selection["best_checkpoint"]).name.split("-")[1])
    history = json.loads((run_dir / "log_history.json").read_text())
    during_training = next(e["eval_bleu"] for e in history if e.get("step") == step and "eval_bleu" in e)
    assert selection["valid_bleu_best_checkpoint"] == during_training


def test_reloading_the_best_checkpoint_reports_no_missing_tied_weights(trained_run):
    run_dir, result = trained_run
    logs = result.stderr + (run_dir / "train.log").read_text()
    assert "missing keys" not in logs


def test_the_trainers_evaluation_leaves_the_models_decoding_defaults_alone(make_tiny_model, tokenizer, tmp_path):
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    from tiny_tokenizer import SENTENCES
    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    model = make_tiny_model(vocab_size=len(tokenizer), final_logits_bias=True)
    model.final_logits_bias[0, tokenizer.eos_token_id] = -1e4  # never ends: outputs run to the length limit
    encoded = tokenizer(SENTENCES[:6], text_target=SENTENCES[1:7])
    dataset = Dataset.from_dict({"input_ids": encoded["input_ids"], "labels": encoded["labels"]})
    args = VaswaniTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, generation_num_beams=1,
                                    report_to=[], use_cpu=True)
    trainer = VaswaniTrainer(model=model, args=args, processing_class=tokenizer,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
    first, second = trainer.predict(dataset).predictions, trainer.predict(dataset).predictions
    assert model.generation_config.max_length is None and model.generation_config.max_new_tokens is None
    assert first.shape[1] > 21  # batch after batch, up to the source length + 50, not 20
    assert (first == second).all()


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False}, {"share_embeddings": False}])
def test_reloading_saved_weights_misses_exactly_the_tied_names_the_model_lists(make_tiny_model, tmp_path, overrides):
    from safetensors.torch import load_file

    model = make_tiny_model(**overrides)
    model.save_pretrained(tmp_path)
    missing = model.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False).missing_keys
    assert set(missing) == model._keys_to_ignore_on_save  # what the Trainer compares before warning


def test_a_model_untied_after_construction_saves_its_own_output_projection(make_tiny_model, tmp_path):
    from safetensors.torch import load_file

    model = make_tiny_model()
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(model.config.d_model, model.config.vocab_size, bias=False)
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")
