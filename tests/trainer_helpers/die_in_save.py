"""`vaswani-mt train` as a torchrun worker that dies, on its first attempt only, when the run saves one checkpoint
(tests/test_processes.py's elastic test): the worker of rank RANK kills itself with SIGKILL as it enters the save of
the checkpoint of update STEP, while rank 0 is writing that checkpoint's files.

    torchrun ... tests/trainer_helpers/die_in_save.py RANK STEP -- --config run.yaml --resume
"""

import os
import signal
import sys

from vaswani_mt.cli.train import main
from vaswani_mt.recipe import trainer


def install(rank: str, step: int) -> None:
    if os.environ.get("RANK") != rank or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    save = trainer.VaswaniTrainer._save_checkpoint

    def dying_save(self, model, trial=None, *args, **kwargs):
        if self.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return save(self, model, trial, *args, **kwargs)

    trainer.VaswaniTrainer._save_checkpoint = dying_save


if __name__ == "__main__":
    rank, step, separator, *train_args = sys.argv[1:]
    assert separator == "--", "usage: die_in_save.py RANK STEP -- TRAIN_ARGS"
    install(rank, int(step))
    sys.exit(main(train_args))
