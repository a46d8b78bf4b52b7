"""The training benchmarks time the update `VaswaniTrainer` makes: scripts/bench_training.py and scripts/bench_gpu.py
train our model through the trainer, and its loss sees there the dtypes it sees in an update of a training run (the
hidden states and weight entering the output projection inside the loss on CPU, the precision of its products, the
logits the loss reads where the model computes them)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
SCRIPTS = TESTS_DIR.parent / "scripts"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from trainer_helpers import common  # noqa: E402

from vaswani_mt.recipe import loss as loss_module  # noqa: E402
from vaswani_mt.recipe import trainer as trainer_module  # noqa: E402
from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments  # noqa: E402


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def loss_sees(monkeypatch):
    """Records, per call of the training loss, the dtypes it receives and computes in: with the projection inside
    (hidden states, weight, the products' dtype, the block logits' dtype), or of the model's logits."""
    seen = []
    forward = loss_module._ProjectedSmoothedCrossEntropy.forward
    block = loss_module._block

    def recording_forward(ctx, hidden_states, weight, *rest):
        seen.append(["projected", hidden_states.dtype, weight.dtype, rest[-1]])
        return forward(ctx, hidden_states, weight, *rest)

    def recording_block(logits, *rest):
        if len(seen[-1]) == 4:
            seen[-1].append(logits.dtype)
        return block(logits, *rest)

    def recording_logits_loss(logits, *args, **kwargs):
        seen.append(["logits", logits.dtype, torch.is_autocast_enabled(logits.device.type)])
        return smoothed(logits, *args, **kwargs)

    smoothed = trainer_module.label_smoothed_cross_entropy
    monkeypatch.setattr(loss_module._ProjectedSmoothedCrossEntropy, "forward", staticmethod(recording_forward))
    monkeypatch.setattr(loss_module, "_block", recording_block)
    monkeypatch.setattr(trainer_module, "label_smoothed_cross_entropy", recording_logits_loss)
    return seen


def _a_training_runs_update(tmp_path, precision: str) -> None:
    """One update of `VaswaniTrainer.train()` on the CPU, in `precision`."""
    flags = {"bf16": {"bf16": True}, "fp16": {"fp16": True}}.get(precision, {})
    args = VaswaniTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], max_steps=1,
                                    per_device_train_batch_size=6, save_strategy="no", eval_strategy="no",
                                    disable_tqdm=True, **flags)
    trainer = VaswaniTrainer(model=common.make_model(0), args=args, data_collator=common.pad_collator,
                             train_dataset=common.to_dataset(common.accumulation_examples(3)))
    trainer.train()


def _batch() -> dict:
    return common.pad_collator(common.accumulation_examples(3))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bench_training_updates_our_model_as_the_trainer_does_and_its_loss_sees_the_dtypes_of_a_training_run(
        tmp_path, loss_sees, precision):
    _a_training_runs_update(tmp_path, precision)
    in_training, _ = list(loss_sees), loss_sees.clear()
    bench = _script("bench_training")
    run = bench.step_runner(common.make_model(0).train(), _batch(), 1, precision, 0.1)
    run()
    assert isinstance(run.trainer, VaswaniTrainer)
    compute = torch.bfloat16 if precision == "bf16" else torch.float32
    # accelerate hands the forward's output back in float32; the loss's products run in the run's precision
    assert in_training == [["projected", torch.float32, torch.float32, compute, compute]]
    assert loss_sees == in_training


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bench_gpu_updates_our_model_as_the_trainer_does_and_its_loss_sees_the_dtypes_of_a_training_run(
        tmp_path, loss_sees, monkeypatch, precision):
    """On the CPU as the script's smoke path runs it, and with the loss of the model's logits, as on a GPU (where
    the projection is in the model's forward, under autocast, and the loss reads the float32 logits accelerate hands
    back)."""
    bench = _script("bench_gpu")
    args = bench.parse_args(["--device", "cpu", "--steps", "1"])
    for on_the_gpus_path in (False, True):
        if on_the_gpus_path:
            monkeypatch.setattr(trainer_module, "projects_in_the_loss", lambda *args: False)
        loss_sees.clear()
        _a_training_runs_update(tmp_path, precision)
        in_training, _ = list(loss_sees), loss_sees.clear()
        bench.training_runner(common.make_model(0).train(), "ours", _batch(), args, precision, torch.device("cpu"))()
        assert loss_sees == in_training and len(in_training) == 1
        if on_the_gpus_path:
            assert in_training == [["logits", torch.float32, False]]  # float32 by design: no products in it
