"""Training on several processes, nodes and attempts: the process group each attempt of an elastic run joins, and the
batch a resumed run keeps when it continues on another number of processes.

Elastic restarts (`torchrun --max-restarts N`): torchrun's agent keeps one key-value store for the whole job, and a
restarted worker's process group published its address under the same keys as the worker it replaces. gloo could
then read the address of a worker that had died and give up ("Gloo connectFullMesh failed ... Connection refused"),
ending the run instead of restarting it. On one node (one agent, so one count of restarts for every worker) each
attempt here joins under keys of its own (`TORCHELASTIC_RESTART_COUNT`), so the restarted workers meet each other.
Across nodes the agents count their restarts apart (a node whose workers were only stopped counts none), so no worker
can name the attempt for all; there torch's own remedy is needed, a store of each attempt's own (the c10d rendezvous
with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` on every node; pytorch issue 135712), and a run without it says so.

Another number of processes on resume: an update is `max_tokens x processes x gradient accumulation` target tokens
(per side, padding included; §5.1). Each checkpoint records the processes and the accumulation that made it
(`batch.json`); a run resumed on another number of processes changes the gradient accumulation so that an update
keeps its tokens, as fairseq's `--update-freq` does, and says so in one line. The learning-rate schedule counts
updates, so it continues unchanged. The run's config.yaml is rewritten with the accumulation the run trains with, and
a resume whose config asks for another one than that and than its config.yaml's is refused (`resumed_accumulation`):
an explicit `--training.gradient_accumulation_steps` is never silently replaced.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError

logger = logging.getLogger("vaswani_mt.train")

BATCH_FILE = "batch.json"  # in each checkpoint: the processes and gradient accumulation of its updates


def join_this_attempts_process_group(backend: str | None) -> bool:
    """Start the default process group of a torchrun worker on keys of this attempt of the job (see the module's
    docstring); True if it did. Nothing is done outside torchrun, where the group exists already, with one process,
    on several nodes, or where each attempt has a store of its own. `backend`: the run's `training.ddp_backend`, else
    NCCL on CUDA and gloo on CPUs, what accelerate chooses."""
    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return False
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    one_node = os.environ.get("LOCAL_WORLD_SIZE") == str(world_size)
    if (attempt is None or world_size < 2 or not one_node
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"):
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(minutes=30)
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                       is_master=False, timeout=timeout)
    torch.distributed.init_process_group(
        backend, store=torch.distributed.PrefixStore(f"vaswani_mt/attempt-{attempt}", store),
        rank=int(os.environ["RANK"]), world_size=world_size, timeout=timeout)
    return True


def restarts_across_nodes_problem() -> str | None:
    """One line for the log of an elastic run of several nodes whose attempts share torchrun's store (see the
    module's docstring); None where restarts are not asked for, on one node, or where each attempt has its own."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if (int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) < 1
            or os.environ.get("LOCAL_WORLD_SIZE", str(world_size)) == str(world_size)
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"):
        return None
    return ("torchrun --max-restarts on several nodes shares one store between attempts: a restarted worker may read "
            "the address of a dead one and the restart fail (pytorch issue 135712); start torchrun with "
            "--rdzv-backend c10d and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node")


@dataclass(frozen=True)
class UpdateBatch:
    """What one update holds: `processes` x `gradient_accumulation_steps` batches of `max_tokens` per side."""

    processes: int
    gradient_accumulation_steps: int
    max_tokens: int | None

    @property
    def batches(self) -> int:
        return self.processes * self.gradient_accumulation_steps

    def describe(self) -> str:
        tokens = f" x {self.max_tokens:,} tokens" if self.max_tokens else ""
        return f"{processes_text(self.processes)} x {self.gradient_accumulation_steps} accumulated{tokens}"

    def write(self, checkpoint: str | Path) -> None:
        (Path(checkpoint) / BATCH_FILE).write_text(json.dumps(
            {"processes": self.processes, "gradient_accumulation_steps": self.gradient_accumulation_steps,
             "max_tokens": self.max_tokens}) + "\n")

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> UpdateBatch | None:
        """The batch a checkpoint's updates had; None for a checkpoint saved before checkpoints recorded it."""
        path = Path(checkpoint) / BATCH_FILE
        if not path.is_file():
            return None
        saved = json.loads(path.read_text())
        return cls(saved["processes"], saved["gradient_accumulation_steps"], saved.get("max_tokens"))


def processes_text(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def accumulation_keeping(started: UpdateBatch, count: int, checkpoint: str | Path) -> int:
    """The gradient accumulation that gives `count` processes the updates of `started` (the checkpoint's batch); a
    ConfigError naming the numbers where they do not divide."""
    if started.batches % count:
        raise ConfigError(
            f"--resume on {processes_text(count)}: {checkpoint} was trained with {started.describe()} per update "
            f"({started.batches} batches), which {processes_text(count)} cannot split evenly; resume on a number of "
            f"processes that divides {started.batches}")
    return started.batches // count


def resumed_accumulation(started: UpdateBatch, count: int, asked: int, saved: int | None,
                         checkpoint: str | Path) -> int:
    """The gradient accumulation of a run resumed from `checkpoint` (whose updates were `started`) on `count`
    processes: the one that keeps the checkpoint's update (its own on the same number of processes). The resumed
    config's `asked` accumulation must be that one, or `saved`, the run's config.yaml's (left as it was: the
    checkpoint decides); any other would change the update in the middle of the run: a ConfigError in one line."""
    keeping = (started.gradient_accumulation_steps if started.processes == count
               else accumulation_keeping(started, count, checkpoint))
    if asked not in (keeping, saved):
        raise ConfigError(
            f"--resume on {processes_text(count)}: {checkpoint} was trained with {started.describe()} per update, "
            f"which gradient accumulation {keeping} keeps here; training.gradient_accumulation_steps {asked} would "
            f"change the update in the middle of the run: resume with {keeping} (the run's config.yaml says "
            f"{saved}), or start a new run")
    return keeping


__all__ = ["BATCH_FILE", "UpdateBatch", "accumulation_keeping", "join_this_attempts_process_group", "processes_text",
           "restarts_across_nodes_problem", "resumed_accumulation"]
