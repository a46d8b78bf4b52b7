"""`training.torch_compile: true` trains through the Trainer's `torch_compile` and saves a model that loads and
translates like any other (slow: compiling takes about a minute on 2 CPU cores)."""

import pytest
import torch
from safetensors.torch import load_file

from test_train_cli import run_train, small_corpus, tiny_config  # noqa: F401  (small_corpus is a fixture)
from vaswani_mt import VaswaniForConditionalGeneration


@pytest.mark.slow
def test_a_compiled_training_run_saves_a_plain_model_that_translates(tmp_path, small_corpus):  # noqa: F811
    config = tiny_config(tmp_path, small_corpus, max_steps=6, eval_steps=6, average_last=0, torch_compile=True)
    result = run_train("--config", str(config), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    weights = load_file(tmp_path / "run" / "model" / "model.safetensors")
    assert not any("_orig_mod" in name for name in weights)  # the compiled wrapper leaves no trace in the weights
    model = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "run" / "model").eval()
    output = model.generate(input_ids=torch.tensor([[5, 6, 7, 3]]), num_beams=1, max_new_tokens=4)
    assert output.shape[0] == 1
