"""float16 training with dynamic loss scaling (`training.precision: fp16`, transformers' `fp16=True`) on the CPU, the
path a GPU takes: products in float16, the loss in float32, an update whose gradients overflow skipped, counted and
logged once per logging step, and a resume that restores the scaler to the uninterrupted run's weights bit for bit.
The overflows are forced with a large initial scale."""

import logging
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerCallback

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from trainer_helpers import common  # noqa: E402

import vaswani_mt.recipe.trainer as trainer_module  # noqa: E402
from vaswani_mt.recipe.loss_scaling import scale_losses_on_the_cpu  # noqa: E402
from vaswani_mt.recipe.schedule import noam_lr  # noqa: E402
from vaswani_mt.recipe.trainer import VaswaniTrainer  # noqa: E402
from vaswani_mt.run_record import TrainingFigures  # noqa: E402

# With this initial scale the tiny run's float16 gradients overflow at updates 1, 2, 4, 5 and 6 of 8: before and
# after its checkpoint at update 4.
INITIAL_SCALE = 2.0 ** 20


def fp16_trainer(output_dir, initial_scale: float = INITIAL_SCALE, callbacks=(), **overrides) -> VaswaniTrainer:
    examples = common.make_examples(48, seed=5)
    settings = {"max_steps": 8, "per_device_train_batch_size": 4, "fp16": True, **overrides}
    trainer = VaswaniTrainer(model=common.make_model(), args=common.make_args(str(output_dir), **settings),
                             train_dataset=common.to_dataset(examples), data_collator=common.pad_collator,
                             callbacks=list(callbacks))
    if trainer.accelerator.scaler is not None:  # the Trainer's own scaler, with a scale that overflows at first
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=initial_scale)
    return trainer


def weights(trainer) -> dict:
    return {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}


def skipped(trainer) -> int:
    return TrainingFigures.from_trainer_state(trainer.state, 1).skipped_updates


class LinearOutputs(TrainerCallback):
    """The dtype of the first linear layer's output, at each training forward."""

    def __init__(self, model):
        self.dtypes = set()
        linear = next(module for module in model.modules() if isinstance(module, torch.nn.Linear))
        linear.register_forward_hook(lambda module, inputs, output: self.dtypes.add(output.dtype))


def test_fp16_on_the_cpu_multiplies_in_float16_the_projection_inside_the_loss_too_and_sums_the_loss_in_float32(
        tmp_path, monkeypatch):
    seen = []
    loss = trainer_module.projected_label_smoothed_cross_entropy  # the training loss on CPU (recipe/loss.py)

    def recording_loss(hidden_states, *args, **kwargs):
        seen.append((hidden_states.dtype, torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                     else None))
        result = loss(hidden_states, *args, **kwargs)
        seen.append((result[0].dtype, None))
        return result

    monkeypatch.setattr(trainer_module, "projected_label_smoothed_cross_entropy", recording_loss)
    trainer = fp16_trainer(tmp_path, initial_scale=2.0 ** 10, max_steps=2)
    products = LinearOutputs(trainer.model)
    trainer.train()
    assert products.dtypes == {torch.float16}
    # the hidden states handed back in float32, the loss's products under the run's float16 autocast, its sums float32
    assert set(seen) == {(torch.float32, torch.float16), (torch.float32, None)}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # the weights stay float32


def test_an_update_whose_float16_gradients_overflow_is_skipped_and_leaves_the_weights_as_they_were(tmp_path):
    trainer = fp16_trainer(tmp_path, initial_scale=2.0 ** 100, max_steps=3)
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert skipped(trainer) == 3
    assert trainer.accelerator.scaler.get_scale() == 2.0 ** 97  # halved at each overflow
    # a skipped update still advances the Noam schedule: the rate stays a function of the update number
    d_model = trainer.model.config.d_model
    assert [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry] == pytest.approx(
        [noam_lr(step, d_model, 4) for step in (1, 2, 3)], rel=1e-12)


def test_skipped_updates_are_counted_and_logged_in_one_line_per_logging_step(tmp_path, caplog):
    trainer = fp16_trainer(tmp_path, logging_steps=4)
    with caplog.at_level(logging.INFO, logger="vaswani_mt.recipe.loss_scaling"):
        trainer.train()
    logged = [(entry["step"], entry["skipped_updates"]) for entry in trainer.state.log_history if "loss" in entry]
    assert [step for step, _ in logged] == [4, 8] and logged[0][1] > 0  # the first updates overflow at 2^20
    scale, lines = INITIAL_SCALE, []
    for (step, count), first in zip(logged, (1, 5)):
        scale /= 2 ** count  # each skipped update halves the scale (and none of 8 updates is enough to raise it)
        if count:
            lines.append(f"updates {first}-{step}: {count} skipped, their float16 gradients overflowed; loss scale "
                         f"now {scale:g}")
    assert [record.getMessage() for record in caplog.records] == lines
    assert skipped(trainer) == sum(count for _, count in logged) == round(torch.log2(torch.tensor(
        INITIAL_SCALE / trainer.accelerator.scaler.get_scale())).item())


class StopAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        control.should_training_stop = True


def test_a_resumed_fp16_run_restores_its_loss_scale_and_ends_with_the_uninterrupted_runs_weights(tmp_path):
    saving = dict(save_strategy="steps", save_steps=4)
    uninterrupted = fp16_trainer(tmp_path / "a", **saving)
    uninterrupted.train()

    stopped = fp16_trainer(tmp_path / "b", callbacks=[StopAfterSave()], **saving)
    stopped.train()
    checkpoint = tmp_path / "b" / "checkpoint-4"
    assert stopped.state.global_step == 4 and (checkpoint / "scaler.pt").is_file()  # the Trainer saves the scaler
    resumed = fp16_trainer(tmp_path / "b", **saving)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    expected, got = weights(uninterrupted), weights(resumed)
    assert all(torch.equal(expected[name], got[name]) for name in expected)  # bitwise on CPU
    assert resumed.accelerator.scaler.get_scale() == uninterrupted.accelerator.scaler.get_scale() < INITIAL_SCALE
    assert skipped(resumed) == skipped(uninterrupted) > 0

    # Without its scaler the resumed run would start again at the initial scale: more skipped updates, other weights.
    shutil.copytree(checkpoint, tmp_path / "c" / "checkpoint-4")
    (tmp_path / "c" / "checkpoint-4" / "scaler.pt").unlink()
    without = fp16_trainer(tmp_path / "c", **saving)
    without.train(resume_from_checkpoint=str(tmp_path / "c" / "checkpoint-4"))
    assert skipped(without) > skipped(uninterrupted)
    assert not all(torch.equal(expected[name], value) for name, value in weights(without).items())


def test_skipped_updates_not_yet_logged_go_into_the_checkpoints_log_history(tmp_path):
    trainer = fp16_trainer(tmp_path, logging_steps=8, save_strategy="steps", save_steps=4,
                           callbacks=[StopAfterSave()])
    trainer.train()
    state = __import__("json").loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert [entry.get("skipped_updates") for entry in state["log_history"]] == [3]


def test_bfloat16_and_float32_runs_log_no_loss_scale(tmp_path):
    examples = common.make_examples(8, seed=5)
    trainer = VaswaniTrainer(model=common.make_model(), args=common.make_args(str(tmp_path), max_steps=2,
                                                                              per_device_train_batch_size=4),
                             train_dataset=common.to_dataset(examples), data_collator=common.pad_collator)
    trainer.train()
    assert trainer.accelerator.scaler is None
    assert not any("skipped_updates" in entry or "loss_scale" in entry for entry in trainer.state.log_history)
    assert skipped(trainer) is None


def test_an_accelerate_without_a_cpu_grad_scaler_to_set_trains_fp16_in_float32_with_one_warning(tmp_path,
                                                                                                 monkeypatch, caplog):
    lacking = SimpleNamespace(device=torch.device("cpu"), mixed_precision="fp16", scaler=None)  # no native_amp
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.recipe.loss_scaling"):
        assert not scale_losses_on_the_cpu(lacking)
    [warning] = caplog.records
    assert warning.getMessage() == ("this accelerate has no grad scaler to set for the CPU: fp16 trains in float32 "
                                    "there")

    monkeypatch.setattr(trainer_module, "scale_losses_on_the_cpu", lambda accelerator: False)
    trainer = fp16_trainer(tmp_path, max_steps=2)
    products = LinearOutputs(trainer.model)
    trainer.train()
    assert not trainer.args.fp16 and trainer.accelerator.scaler is None
    assert products.dtypes == {torch.float32}  # accelerate's own float32, and the arguments say so
    assert skipped(trainer) is None
