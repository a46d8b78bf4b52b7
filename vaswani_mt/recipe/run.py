"""A whole run of the paper's recipe, from a run config to a scored, saved model: `train_run(config) -> RunRecord`.

    from vaswani_mt import load_run_config, train_run
    record = train_run(load_run_config("multi30k-en-de", quick=True))    # resume=True continues a stopped run

The steps: prepare the data (clean, learn a joint BPE unless one is given (§5.1), tokenize; cached,
`vaswani_mt.data.prepared`); train with `VaswaniTrainer` (Noam + Adam, label smoothing, token-budget batches, BLEU
on valid with beam search, checkpoints); average the last checkpoints, or the last weight snapshots with
`training.average_every` (§6.1, `vaswani_mt.recipe.snapshots`), and keep whichever of {average, best checkpoint}
scores higher on valid; translate the test split with beam search and score it; write the run folder
(`vaswani_mt.run_record.RunFolder`):

    config.yaml  train.log  tokenizer/  checkpoints/  [snapshots/]  averaged/  model/  metrics.json  test.hyp  plots/

`metrics.json`, the `RunRecord`, is written last: a folder with one is a finished run. `resume=True` continues from
the last complete checkpoint after a crash or kill; when training had ended, it only redoes the steps after
training, and on a finished run it has nothing to do. The same call runs under `torchrun` / `accelerate launch`:
every process trains, the main one writes the files.

Bad input raises `ConfigError` or `DataError` (one line naming the key, file or line) before the run folder is
made; a failed write raises an `OSError` naming the file (`vaswani_mt.files.describe_os_error` says it in one line).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer, set_seed

from ..data.cache import cache_folder
from ..data.prepared import prepare
from ..data.sources import pinned_revision
from ..files import checkpoint_step, share_weights, write_atomically, writing
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..model.pipeline_vaswani import save_for_pipeline
from ..precision import PrecisionChoice, PrecisionError, choose_precision, default_device
from ..run_record import Hardware, ModelFacts, RunFolder, RunRecord, TimeBudgetPlan, TrainingFigures, last_validation
from .budget import BudgetPlanner
from .building import model_config, run_trainer, set_decoding, validation_split
from .config import ConfigError, RunConfig, save_run_config
from .host_memory import keep_freed_memory
from .pace import probed_planner
from .plots import plot_training_curves
from .processes import UpdateBatch, join_this_attempts_process_group, restarts_across_nodes_problem
from .progress import LOG_FORMAT, TrainingProgress, duration
from .resuming import check_run_folder, restore_ended_training, resume_point, resumed_update, say_the_update_batch
from .scoring import score_test
from .selection import select_final_model
from .snapshots import drop_snapshots_after
from .trainer import VaswaniTrainingArguments, complete_checkpoints

logger = logging.getLogger("vaswani_mt.train")


def train_run(config: RunConfig, resume: bool = False, command: str | None = None,
              started: float | None = None) -> RunRecord:
    """Train, select, score and save the run that `config` describes, in `config.output_dir`; return its record.

    `resume`: continue the run already in `config.output_dir` (with the config it was started with); without it, a
    folder that already holds a run is refused. `command`: how the run was started, for its record and card.
    `started`: when it was started (`time.time()`; None: now), where `training.budget_minutes` counts from.
    While it runs, the package logs its progress at INFO to the run's train.log, and to stderr too when the caller
    has set up no logging (a script, a notebook); `training.num_threads` holds for the run only. Under torchrun,
    a process group this call started is closed when it returns."""
    began = time.perf_counter()
    started = time.time() if started is None else started
    run = RunFolder(config.output_dir)
    check_run_folder(config, run, resume)
    with _progress_shown():
        if resume and run.record.is_file():
            logger.info("%s is a finished run (it has %s): nothing to do", run.root, run.record.name)
            return RunRecord.read(run.root)
        own_group = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        threads = torch.get_num_threads()
        try:
            record = _run(config, run, resume, command or "", started, began)
        finally:
            torch.set_num_threads(threads)
        if own_group:
            _leave_together()
    return record


def _run(config: RunConfig, run: RunFolder, resume: bool, command: str, started: float, began: float) -> RunRecord:
    join_this_attempts_process_group(config.training.ddp_backend)  # under torchrun: this attempt's own group
    device = default_device()  # cuda, else Apple's GPU (mps), else cpu
    try:  # training.precision: auto -> what pays on the device
        precision = choose_precision(config.training.precision, device)
    except PrecisionError as error:
        raise ConfigError(str(error)) from None
    args = VaswaniTrainingArguments.from_config(
        config.training, str(run.checkpoints), use_cpu=device == "cpu", **precision.trainer_flags(), report_to=[],
        ddp_find_unused_parameters=False, dataloader_num_workers=0, dataloader_pin_memory=device == "cuda",
        disable_tqdm=not sys.stderr.isatty())
    if config.training.num_threads:
        torch.set_num_threads(config.training.num_threads)
    if resume:  # before config.yaml is rewritten, so that it says the accumulation the run trains with
        config = resumed_update(config, run, args)
    # a resumed run keeps the tokenizer it started with, and the commit of its Hub dataset
    resumed_tokenizer = AutoTokenizer.from_pretrained(run.tokenizer) if resume and (
        run.tokenizer / "tokenizer.json").exists() else None
    revision = pinned_revision(config.data.path, config.data.revision, cache_folder(config.data), run.data_revision,
                               resume, args.world_size, args.process_index)
    keeps_memory = args.device.type == "cpu" and keep_freed_memory()  # before the time budget's probe measures
    with args.main_process_first(desc="data"):  # before the run folder exists: bad data leaves nothing behind
        prepared = prepare(config.data, config.tokenizer, tokenizer=resumed_tokenizer, revision=revision)
    # before the run folder exists too: a budget too short for this machine leaves nothing behind
    planner = probed_planner(config, args, prepared, started, resume and bool(complete_checkpoints(run.checkpoints)))
    run.root.mkdir(parents=True, exist_ok=True)
    with _run_log(run, args.should_save):
        if args.should_save and (restarts_problem := restarts_across_nodes_problem()):
            logger.warning(restarts_problem)
        if keeps_memory:
            logger.info("malloc keeps freed memory for the next step (vaswani_mt.recipe.host_memory)")
        if args.should_save:
            with writing(run.config):
                save_run_config(config, run.config)
            if prepared.revision:
                write_atomically((json.dumps({"path": config.data.path, "revision": prepared.revision}) + "\n")
                                 .encode(), run.data_revision)
            if config.tokenizer.path is None and resumed_tokenizer is None:
                prepared.tokenizer.save_pretrained(run.tokenizer)
        record = _train_and_finish(config, run, args, prepared, resume, command, precision, planner,
                                   run_started=started)
        if args.should_save:
            logger.info("run complete after %s; its record: %s", duration(time.perf_counter() - began), run.record)
    return record


@contextlib.contextmanager
def _progress_shown() -> Iterator[None]:
    """While the run lasts: the package's lines at INFO, and on stderr when the caller set up no logging at all
    (Python's last-resort handler would show only warnings, and none once train.log's handler is added)."""
    package, root = logging.getLogger("vaswani_mt"), logging.getLogger()
    level = package.level
    package.setLevel(logging.INFO)
    handler = None
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    try:
        yield
    finally:
        package.setLevel(level)
        if handler is not None:
            root.removeHandler(handler)


@contextlib.contextmanager
def _run_log(run: RunFolder, is_main: bool) -> Iterator[None]:
    """The main process writes the package's lines to the run's train.log too; the others say only warnings."""
    package = logging.getLogger("vaswani_mt")
    if not is_main:
        package.setLevel(logging.WARNING)  # put back by _progress_shown
        yield
        return
    handler = logging.FileHandler(run.log, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def _train_and_finish(config: RunConfig, run: RunFolder, args: VaswaniTrainingArguments, prepared, resume: bool,
                      command: str, precision: PrecisionChoice, planner: BudgetPlanner | None,
                      run_started: float) -> RunRecord:
    tokenizer, tokenized = prepared.tokenizer, prepared.tokenized
    logger.info("run folder %s; world size %d; %s", run.root, args.world_size, precision.describe())
    logger.info("data: %s%s; prepared in %s", prepared.report.summary(),
                f"; {config.data.path} at commit {prepared.revision}" if prepared.revision else "",
                ", ".join(str(folder) for folder in prepared.folders.values()))
    prepared.warn_truncated()
    valid = validation_split(config, tokenized)

    resume_from, ended = resume_point(run.checkpoints, args) if resume else (None, None)
    if resume_from is not None and ended is None:
        say_the_update_batch(args, resume_from)
    set_seed(config.training.seed)  # the initial weights, so that a run is reproducible from its config
    model = VaswaniForConditionalGeneration(model_config(config, tokenizer))
    set_decoding(model, config)
    logger.info("model: %s preset, %.2fM parameters, %s-norm", config.model.preset, model.num_parameters() / 1e6,
                model.config.norm_style)
    trainer = run_trainer(config, run, args, model, tokenizer, tokenized[config.data.train_split], valid, planner)
    if precision.name == "fp16" and not args.fp16:  # an accelerate that trains float16 on GPUs only (a warning said)
        precision = PrecisionChoice("fp32", f"{precision.reason}, but this accelerate trains float16 on GPUs only")
    progress = TrainingProgress(config.training.max_minutes,
                                budget_minutes=config.training.budget_minutes).install(trainer)

    if resume and ended is None and args.should_save:  # the updates after the checkpoint are repeated
        for removed in drop_snapshots_after(run.snapshots, checkpoint_step(resume_from) if resume_from else 0):
            logger.warning("removing %s", removed)
    trainer.accelerator.wait_for_everyone()

    started = time.perf_counter()
    if ended is None:
        train_metrics = trainer.train(resume_from_checkpoint=resume_from).metrics
    else:
        train_metrics = restore_ended_training(trainer, ended, run.checkpoints, resume_from)
    train_seconds = time.perf_counter() - started
    history = trainer.state.log_history
    schedule = trainer.lr_scheduler
    if schedule is not None and schedule.cooldown_steps and trainer.state.global_step < schedule.total_steps:
        logger.warning("the run stopped at update %d, before the end of its cool-down at update %d (%s)",
                       trainer.state.global_step, schedule.total_steps,
                       "its plan" if planner is not None else "training.max_steps")
    plan = trainer.time_budget_facts()

    # the update training ended with: this process's, or, when only the steps after training were left, the checkpoint's
    update = (UpdateBatch.of_checkpoint(resume_from) if ended is not None else None) or UpdateBatch(
        args.world_size, args.gradient_accumulation_steps, args.max_tokens)
    record = RunRecord(
        command=command,
        training=TrainingFigures.from_trainer_state(
            trainer.state, update.processes, wall_seconds_this_process=round(train_seconds, 1),
            train_runtime_seconds=train_metrics.get("train_runtime"), hardware=Hardware.of_this_machine(),
            precision=precision.describe(), gradient_accumulation_steps=update.gradient_accumulation_steps,
            time_budget=TimeBudgetPlan(**plan) if plan else None),
        model=ModelFacts(preset=config.model.preset, parameters=model.num_parameters(),
                         config=model.config.to_diff_dict()),
        data=prepared.report.to_dict(), data_revision=prepared.revision,
        selection=select_final_model(trainer, run, config, valid, progress),
        validation=last_validation(history, trainer.bleu_signatures),
        bleu_signatures_during_training=trainer.bleu_signatures,
    )
    if args.should_save:
        with writing(run.model):
            trainer.model.save_pretrained(run.model)
            tokenizer.save_pretrained(run.model)
            save_for_pipeline(trainer.model, tokenizer, run.model)  # pipeline("translation") with stock transformers
            share_weights(run.model)

    if config.data.test_split:
        references = [pair[config.data.target_lang] for pair in prepared.text[config.data.test_split]["translation"]]
        test = tokenized[config.data.test_split]
        kept = trainer.budget_planner.test_kept if trainer.budget_planner is not None else None
        if kept is not None and kept < len(test):
            logger.info("test %s: the first %d of its %d sentences, as the time budget planned", config.data.test_split,
                        kept, len(test))
            test, references = test.select(range(kept)), references[:kept]
        record.test, hypotheses = score_test(trainer, test, references, config, progress)
        if args.should_save:
            write_atomically(("\n".join(hypotheses) + "\n").encode(), run.test_hypotheses)
        logger.info("test %s: BLEU %.2f (%s), chrF %.2f, lowercased Moses-tokenized BLEU %.2f",
                    config.data.test_split, record.test.bleu, record.test.bleu_signature, record.test.chrf,
                    record.test.bleu_lowercased_moses_tokenized)
    if args.should_save:
        write_atomically((json.dumps(history, indent=1) + "\n").encode(), run.log_history)
        with writing(run.plots):
            _plot(history, run.plots)
        if record.training.time_budget is not None:
            record.training.time_budget.run_minutes = round((time.time() - run_started) / 60, 2)
        # Last, and atomically: a run folder with its record is finished (`resume` then has nothing to do).
        record.write(run)
    trainer.accelerator.wait_for_everyone()
    return RunRecord.read(run.root) if run.record.is_file() else record


def _plot(history: list[dict], folder: Path) -> None:
    try:
        paths = plot_training_curves(history, folder)
        logger.info("plots: %s", ", ".join(str(p) for p in paths))
    except ImportError as error:
        logger.info("no plots: %s", error)


def _leave_together() -> None:
    """Under several processes: wait until every one is done (the main one wrote the run's files last), then close
    the process group. A process that exited with the group still open could abort in torch's gloo threads
    ("terminate called without an active exception") and fail the whole torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


__all__ = ["train_run"]
