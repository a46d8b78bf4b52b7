"""End-to-end check that the recipe learns: the synthetic copy task, for both norm styles."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "copy_task.py"


def _copy_task_module():
    spec = importlib.util.spec_from_file_location("copy_task", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("norm_style", [
    "post",  # the paper's
    pytest.param("pre", marks=pytest.mark.slow),  # ~20 s more; `pytest -m slow`
])
def test_tiny_model_trained_with_the_full_recipe_copies_at_least_99_percent_of_unseen_sequences(norm_style):
    result = _copy_task_module().train_copy_task(norm_style=norm_style)
    print(result)
    assert result["exact_match"] >= 0.99, result
