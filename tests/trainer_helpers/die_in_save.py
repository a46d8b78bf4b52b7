"""`vaswani-mt train` as a torchrun worker that dies once in the run, when it saves one checkpoint
(tests/test_processes.py's elastic tests): the worker of rank RANK kills itself with SIGKILL as it enters the save of
the checkpoint of update STEP, while rank 0 is writing that checkpoint's files. A file beside the run's checkpoints
(`died-in-save`) says it did, so that no later attempt dies again, whichever node its rank lands on.

    torchrun ... tests/trainer_helpers/die_in_save.py RANK STEP -- --config run.yaml --resume
"""

import os
import signal
import sys
from pathlib import Path

from vaswani_mt.cli.train import main
from vaswani_mt.recipe import trainer


def install(rank: str, step: int) -> None:
    if os.environ.get("RANK") != rank:
        return
    save = trainer.VaswaniTrainer._save_checkpoint

    def dying_save(self, model, trial=None, *args, **kwargs):
        died = Path(self.args.output_dir).parent / "died-in-save"
        if self.state.global_step == step and not died.exists():
            died.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return save(self, model, trial, *args, **kwargs)

    trainer.VaswaniTrainer._save_checkpoint = dying_save


if __name__ == "__main__":
    rank, step, separator, *train_args = sys.argv[1:]
    assert separator == "--", "usage: die_in_save.py RANK STEP -- TRAIN_ARGS"
    install(rank, int(step))
    sys.exit(main(train_args))
