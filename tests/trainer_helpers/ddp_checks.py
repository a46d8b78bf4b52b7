"""Multi-process checks of `VaswaniTrainer`, run by tests/test_trainer.py under
`python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_checks.py OUT_DIR` (gloo, CPU).

Every rank runs the same three checks and writes `OUT_DIR/rank<r>.json`; rank 0 also writes the gradients before
and the weights after the one-step run to `OUT_DIR/one_step.safetensors`. The test process compares them with
single-process runs.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `trainer_helpers`

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Seq2SeqTrainer  # noqa: E402

from trainer_helpers import common  # noqa: E402

def main(out_dir: Path) -> None:
    rank = int(os.environ["RANK"])
    (out_dir / f"pid.rank{rank}").write_text(str(os.getpid()))  # lets the test stop this worker after a timeout
    result = {"env_rank": rank, "env_world_size": int(os.environ["WORLD_SIZE"])}
    with tempfile.TemporaryDirectory() as scratch:
        # 1. One optimizer step, batch B per rank, rank r taking the r-th half of the 2B examples.
        batch = common.PER_DEVICE_BATCH
        one = common.one_step(common.accumulation_examples(batch), scratch, batch)
        if rank == 0:
            tensors = {f"grad/{k}": v.contiguous() for k, v in one["grads"].items()}
            tensors.update({f"weight/{k}": v.contiguous() for k, v in one["weights"].items()})
            save_file(tensors, str(out_dir / "one_step.safetensors"))
        result["one_step"] = {k: one[k] for k in ("loss", "grad_norm", "learning_rate", "micro_batches",
                                                  "process_index", "world_size")}
        # 2. Token-budget batches for two epochs.
        result["token_budget"] = common.token_budget_run(scratch)
        # 3. evaluate() on an odd number of examples: VaswaniTrainer, and stock Seq2SeqTrainer as the control.
        result["evaluate"] = common.evaluate_rows(scratch)
        result["evaluate_stock"] = common.evaluate_rows(scratch, trainer_class=Seq2SeqTrainer)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    # Leave together and close the process group, as `vaswani-mt train` does: a worker that exits with the group
    # still open can abort in torch's gloo threads ("terminate called without an active exception", SIGABRT) and
    # fail the whole torchrun after every check has passed.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
