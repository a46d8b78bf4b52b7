"""`vaswani-mt train`, killed with SIGKILL at one chosen point inside saving a checkpoint or inside deleting an old one
(tests/test_train_cli.py's fault-injection test).

    python tests/trainer_helpers/kill_at.py POINT STEP -- --config run.yaml

Points: inside the save of the checkpoint of update STEP, or inside the first deletion of an old checkpoint.
    save-begun       the checkpoint folder is marked as being written, nothing written yet
    save-weights     the weights are written; the optimizer, scheduler, RNG and trainer state are not
    save-written     every file is written, the marker not yet removed
    delete-renamed   an old checkpoint is renamed for deletion, nothing removed yet
    delete-half      half of the renamed old checkpoint's files are removed
    delete-in-place  an old checkpoint loses files in place, as a plain rmtree stopped half-way can leave it: no
                     rng_state.pth and no training_args.bin; weights, optimizer, scheduler and trainer state still there
"""

import os
import signal
import sys
from pathlib import Path

from vaswani_mt import files
from vaswani_mt.recipe import trainer
from vaswani_mt.cli.train import main


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install_save_point(point: str, step: int) -> None:
    folder_name = f"checkpoint-{step}"
    begin, finish = trainer.begin_checkpoint, trainer.finish_checkpoint
    save_optimizer = trainer.VaswaniTrainer._save_optimizer_and_scheduler

    def begun(folder):
        begin(folder)
        if point == "save-begun" and Path(folder).name == folder_name:
            kill()

    def weights_written(self, output_dir):
        if point == "save-weights" and Path(output_dir).name == folder_name:
            kill()
        save_optimizer(self, output_dir)

    def written(folder):
        if point == "save-written" and Path(folder).name == folder_name:
            kill()
        finish(folder)

    trainer.begin_checkpoint, trainer.finish_checkpoint = begun, written
    trainer.VaswaniTrainer._save_optimizer_and_scheduler = weights_written


def install_delete_point(point: str) -> None:
    def rmtree(path, *args, **kwargs):
        entries = sorted(Path(path).iterdir())
        for entry in entries[: len(entries) // 2] if point == "delete-half" else []:
            entry.unlink()
        kill()

    def delete_in_place(folder):
        for name in ("rng_state.pth", "training_args.bin"):
            (Path(folder) / name).unlink()
        kill()

    if point == "delete-in-place":
        files.delete_checkpoint = delete_in_place
    else:
        files.shutil = type("Shutil", (), {"rmtree": staticmethod(rmtree)})


if __name__ == "__main__":
    point, step, separator, *train_args = sys.argv[1:]
    assert separator == "--", "usage: kill_at.py POINT STEP -- TRAIN_ARGS"
    if point.startswith("save-"):
        install_save_point(point, int(step))
    else:
        install_delete_point(point)
    sys.exit(main(train_args))
