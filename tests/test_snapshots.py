"""Weight snapshots for averaging at a finer interval than evaluation (training.average_every, §6.1)."""

import shutil
from types import SimpleNamespace

import torch

from vaswani_mt.model.configuration_vaswani import VaswaniConfig
from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration
from vaswani_mt.recipe.snapshots import WeightSnapshots, drop_snapshots_after, last_snapshots, snapshot_folders


def _model() -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=60, pad_token_id=0,
                                                                     bos_token_id=1, eos_token_id=2))


def _train(model, snapshots: WeightSnapshots, steps: range, stop_at: int | None = None) -> dict[int, torch.Tensor]:
    """Change the weights once per update as an optimizer would, for a run of 100 updates (or one that the time
    budget stops at `stop_at`); returns one weight as it was after each update."""
    seen = {}
    args = SimpleNamespace(should_save=True)
    for step in steps:
        with torch.no_grad():
            model.model.shared.weight.add_(0.01 * step)
        seen[step] = model.model.shared.weight.detach().clone()
        state, control = SimpleNamespace(global_step=step, max_steps=100), SimpleNamespace(
            should_training_stop=step == stop_at)
        snapshots.on_step_end(args, state, control, model=model)
    return seen


def test_snapshots_are_written_every_n_updates_and_only_the_newest_are_kept(tmp_path):
    model = _model()
    seen = _train(model, WeightSnapshots(tmp_path / "snapshots", every=3, keep=2), range(1, 11))
    kept = snapshot_folders(tmp_path / "snapshots")
    assert [p.name for p in kept] == ["step-6", "step-9"]
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["step-6", "step-9"]  # nothing else left
    for folder, step in zip(kept, (6, 9)):
        loaded = VaswaniForConditionalGeneration.from_pretrained(folder)
        assert torch.equal(loaded.model.shared.weight, seen[step])


def test_the_last_update_of_a_run_is_snapshotted_even_between_two_intervals(tmp_path):
    model = _model()
    seen = _train(model, WeightSnapshots(tmp_path / "stopped", every=3, keep=3), range(1, 11), stop_at=10)
    assert [p.name for p in snapshot_folders(tmp_path / "stopped")] == ["step-6", "step-9", "step-10"]
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "stopped" / "step-10")
    assert torch.equal(loaded.model.shared.weight, seen[10])
    assert [p.name for p in last_snapshots(tmp_path / "stopped", every=3, count=2)] == ["step-9", "step-10"]
    _train(_model(), WeightSnapshots(tmp_path / "full", every=3, keep=2), range(98, 101))
    assert [p.name for p in snapshot_folders(tmp_path / "full")] == ["step-99", "step-100"]  # max_steps: 100


def test_the_average_takes_consecutive_snapshots_never_an_older_one_in_place_of_a_damaged_one(tmp_path):
    folder = tmp_path / "snapshots"
    _train(_model(), WeightSnapshots(folder, every=2, keep=4), range(1, 9))
    assert [p.name for p in last_snapshots(folder, every=2, count=3)] == ["step-4", "step-6", "step-8"]
    weights = folder / "step-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    assert [p.name for p in last_snapshots(folder, every=2, count=3)] == ["step-8"]
    assert last_snapshots(tmp_path / "absent", every=2, count=3) == []


def test_a_process_that_does_not_save_writes_no_snapshot(tmp_path):
    snapshots = WeightSnapshots(tmp_path / "snapshots", every=1, keep=2)
    snapshots.on_step_end(SimpleNamespace(should_save=False), SimpleNamespace(global_step=1, max_steps=10),
                          SimpleNamespace(should_training_stop=False), model=_model())
    assert not (tmp_path / "snapshots").exists()


def test_a_half_written_half_deleted_or_truncated_snapshot_is_never_taken_for_a_whole_one(tmp_path):
    folder = tmp_path / "snapshots"
    _train(_model(), WeightSnapshots(folder, every=1, keep=3), range(1, 4))
    shutil.copytree(folder / "step-3", folder / ".step-4.tmp")  # killed before the rename
    shutil.copytree(folder / "step-1", folder / ".deleting-step-0")  # killed inside the deletion
    weights = folder / "step-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # a disk that lost the end of the file
    assert [p.name for p in snapshot_folders(folder)] == ["step-1", "step-3"]


def test_resuming_from_a_checkpoint_drops_the_snapshots_after_it_and_the_leftovers_of_a_kill(tmp_path):
    folder = tmp_path / "snapshots"
    _train(_model(), WeightSnapshots(folder, every=2, keep=5), range(1, 9))
    shutil.copytree(folder / "step-8", folder / ".step-10.tmp")
    weights = folder / "step-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    removed = drop_snapshots_after(folder, 4)
    assert sorted(p.name for p in removed) == [".step-10.tmp", "step-2", "step-6", "step-8"]
    assert sorted(p.name for p in folder.iterdir()) == ["step-4"]
    assert drop_snapshots_after(tmp_path / "absent", 4) == []
