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
import dataclasses
import errno
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, TrainerCallback, TrainerState, set_seed

from ..data.cache import cache_folder
from ..data.prepared import prepare
from ..data.sources import hub_commit, is_hub_source
from ..data.tokenization import normalize_text
from ..files import (
    checkpoint_step,
    last_saves,
    remove_incomplete_checkpoints,
    share_weights,
    write_atomically,
    writing,
)
from ..metrics import corpus_scores, moses_tokenized_bleu, tokenized_bleu
from ..model.configuration_vaswani import VaswaniConfig
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..model.pipeline_vaswani import save_for_pipeline
from ..precision import PrecisionChoice, PrecisionError, choose_precision, default_device
from ..run_record import (
    Hardware,
    ModelFacts,
    RunFolder,
    RunRecord,
    Selection,
    TestScores,
    TimeBudgetPlan,
    TrainingFigures,
    last_validation,
)
from .averaging import average_checkpoints
from .budget import BudgetPlanner
from .config import ConfigError, RunConfig, load_run_config, save_run_config
from .host_memory import keep_freed_memory
from .pace import measure_pace
from .plots import plot_training_curves
from .processes import (UpdateBatch, join_this_attempts_process_group, processes_text, restarts_across_nodes_problem,
                        resumed_accumulation)
from .progress import LOG_FORMAT, TrainingProgress, duration
from .snapshots import WeightSnapshots, drop_snapshots_after, last_snapshots
from .trainer import VaswaniTrainer, VaswaniTrainingArguments, complete_checkpoints, is_complete_checkpoint

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
    _check_run_folder(config, run, resume)
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
        config = _resumed_update(config, run, args)
    # a resumed run keeps the tokenizer it started with, and the commit of its Hub dataset
    resumed_tokenizer = AutoTokenizer.from_pretrained(run.tokenizer) if resume and (
        run.tokenizer / "tokenizer.json").exists() else None
    revision = _data_revision(config, run, resume, args)
    keeps_memory = args.device.type == "cpu" and keep_freed_memory()  # before the time budget's probe measures
    with args.main_process_first(desc="data"):  # before the run folder exists: bad data leaves nothing behind
        prepared = prepare(config.data, config.tokenizer, tokenizer=resumed_tokenizer, revision=revision)
    # before the run folder exists too: a budget too short for this machine leaves nothing behind
    planner = _budget_planner(config, args, prepared, started, resume and bool(complete_checkpoints(run.checkpoints)))
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


def _check_run_folder(config: RunConfig, run: RunFolder, resume: bool) -> None:
    """A new run needs an empty folder; a resumed one, the config it was started with (`_what_trains`)."""
    if not resume:
        if run.root.exists() and any(run.root.iterdir()):
            raise ConfigError(f"output_dir {run.root} already holds a run: pass --resume (resume=True) to continue "
                              "it, or choose another --output-dir")
        return
    if run.config.exists() and _what_trains(load_run_config(str(run.config))) != _what_trains(config):
        raise ConfigError(f"--resume: the config differs from the one {run.config} was started with; resume with "
                          f"the same config and overrides, or with --config {run.config}")


def _what_trains(config: RunConfig) -> dict:
    """The settings a resumed run must share with its start: all but what only the card and --quick read."""
    settings = config.to_dict()
    settings["data"].pop("description", None)
    settings.pop("quick", None)
    settings["training"].pop("gradient_accumulation_steps")  # checked against the checkpoint (`_resumed_update`)
    return settings


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
    valid = _validation_split(config, tokenized)

    resume_from, ended = _resume_point(run.checkpoints, args) if resume else (None, None)
    if resume_from is not None and ended is None:
        _say_the_update_batch(args, resume_from)
    set_seed(config.training.seed)  # the initial weights, so that a run is reproducible from its config
    model = VaswaniForConditionalGeneration(_model_config(config, tokenizer))
    _set_decoding(model, config)
    logger.info("model: %s preset, %.2fM parameters, %s-norm", config.model.preset, model.num_parameters() / 1e6,
                model.config.norm_style)
    trainer = _trainer(config, run, args, model, tokenizer, tokenized[config.data.train_split], valid, planner)
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
        train_metrics = _restore_ended_training(trainer, ended, run.checkpoints, resume_from)
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
        selection=_select_final_model(trainer, run, config, valid, progress),
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
        record.test, hypotheses = _score(trainer, tokenized[config.data.test_split], references, config, progress)
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


class TimeBudget(TrainerCallback):
    """Stops training (saving and evaluating first) once `max_minutes` of training time have passed. The clock
    counts this process's training only, so a resumed run gets a fresh budget for its remaining part."""

    def __init__(self, max_minutes: float):
        self.deadline_seconds = max_minutes * 60
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.started > self.deadline_seconds:
            logger.info("time budget reached at step %d: saving and stopping", state.global_step)
            control.should_training_stop = control.should_save = control.should_evaluate = True
        return control


def _model_config(config: RunConfig, tokenizer) -> VaswaniConfig:
    return VaswaniConfig.from_preset(
        config.model.preset, **{
            **config.model.config, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **({"preprocess": config.data.preprocess, "source_lang": config.data.source_lang,
                "target_lang": config.data.target_lang} if config.data.preprocess else {}),
        })


def _set_decoding(model: VaswaniForConditionalGeneration, config: RunConfig) -> None:
    """The run's decoding (beam size, length penalty) as the model's generation defaults: validation and test decode
    with them, and the saved model keeps them, so `translate` and the pipeline decode as the run's scores did."""
    generation = model.generation_config
    generation.num_beams = config.training.num_beams
    if generation.num_beams == 1:  # greedy: a length penalty means nothing, and transformers refuses to save one
        generation.length_penalty = None
        return
    generation.length_penalty = config.training.length_penalty
    if config.training.length_penalty_style != "transformers":  # transformers' own style needs no extra key
        generation.length_penalty_style = config.training.length_penalty_style


def _trainer(config: RunConfig, run: RunFolder, args, model, tokenizer, train, valid,
             planner: BudgetPlanner | None = None) -> VaswaniTrainer:
    callbacks = [TimeBudget(config.training.max_minutes)] if config.training.max_minutes else []
    if config.training.average_every is not None:
        callbacks.append(WeightSnapshots(run.snapshots, config.training.average_every, config.training.average_last))
    if planner is not None:
        callbacks.append(planner)
    return VaswaniTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid, processing_class=tokenizer,
                          data_collator=_collator(config, tokenizer, model), callbacks=callbacks)


def _collator(config: RunConfig, tokenizer, model) -> DataCollatorForSeq2Seq:
    # Compiled on CUDA, inductor guards on whether each length is a multiple of 8 (the alignment SDPA needs for its
    # mask): lengths padded to a multiple of 8 keep it at one compile instead of up to four.
    pad_to = 8 if config.training.torch_compile and torch.cuda.is_available() else None
    return DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=pad_to)


def _validation_split(config: RunConfig, tokenized):
    """The validation split as training scores it: its first `data.valid_subset` pairs, or all of them."""
    valid = tokenized[config.data.valid_split]
    if config.data.valid_subset is not None:
        valid = valid.select(range(min(config.data.valid_subset, len(valid))))
    return valid


def _budget_planner(config: RunConfig, args: VaswaniTrainingArguments, prepared, started: float,
                    from_checkpoint: bool) -> BudgetPlanner | None:
    """The planner of a run with `training.budget_minutes` (`vaswani_mt.recipe.budget`). A run that starts here is
    probed first (`vaswani_mt.recipe.pace`), and refused in one line when the budget cannot fit its warm-up on this
    machine; a run resumed from a checkpoint keeps the checkpoint's plan."""
    t = config.training
    if not t.budget_minutes:
        return None
    valid = _validation_split(config, prepared.tokenized)
    test = prepared.tokenized[config.data.test_split] if config.data.test_split else []
    # what follows training, in validation passes: the best checkpoint's, the average's, the test split's
    after = 1 + (t.average_last > 1) + len(test) / max(len(valid), 1)
    planner = BudgetPlanner(t.budget_minutes, t.cooldown_steps, started=started, after_training=after)
    if from_checkpoint:
        return planner
    tokenizer = prepared.tokenizer

    def probe_trainer(probe_args):
        model = VaswaniForConditionalGeneration(_model_config(config, tokenizer))
        _set_decoding(model, config)
        return VaswaniTrainer(model=model, args=probe_args, train_dataset=prepared.tokenized[config.data.train_split],
                              processing_class=tokenizer, data_collator=_collator(config, tokenizer, model))

    planner.pace = measure_pace(probe_trainer, args, valid)
    logger.info("time budget %s: this machine takes %.3f s per update and about %.0f s per validation, %.0f s where "
                "the translations run to the length limit (a probe)", duration(t.budget_minutes * 60),
                planner.pace.seconds_per_update, planner.pace.seconds_per_validation,
                planner.pace.seconds_per_validation_at_limit)
    if problem := planner.warmup_problem(t.warmup_steps, t.eval_steps, t.max_steps or 10 ** 9):
        raise ConfigError(problem)
    return planner


def _score(trainer: VaswaniTrainer, dataset, references: list[str], config: RunConfig,
           progress: TrainingProgress) -> tuple[TestScores, list[str]]:
    """Translate `dataset` with beam search and score against the `references` (normalised as the tokenizer
    normalises): sacreBLEU BLEU + chrF, and lowercased Moses-tokenized BLEU. With `data.preprocess`, references and
    output are lowercased tokenized text already: the tokenized BLEU is then multi-bleu's on them as they are."""
    num_beams, target_lang = config.training.num_beams, config.data.target_lang
    started = time.perf_counter()
    with progress.stage("test translation"):
        output = trainer.predict(dataset, metric_key_prefix="test", num_beams=num_beams)
    tokenizer = trainer.processing_class
    predictions = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
    predictions = predictions.clip(min=0)
    hypotheses = [h.strip() for h in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [normalize_text(r) for r in references]
    scores = corpus_scores(hypotheses, references)
    if config.data.preprocess:
        tokenized = tokenized_bleu(hypotheses, references)
    else:
        tokenized = moses_tokenized_bleu(hypotheses, references, lang=target_lang, lowercase=True)
    result = TestScores(
        split=config.data.test_split, sentences=len(hypotheses), preprocess=config.data.preprocess,
        bleu=scores["bleu"], bleu_signature=scores["bleu_signature"],
        chrf=scores["chrf"], chrf_signature=scores["chrf_signature"],
        bleu_lowercased_moses_tokenized=tokenized["bleu"],
        bleu_lowercased_moses_tokenized_signature=tokenized["bleu_signature"],
        num_beams=num_beams, seconds=round(time.perf_counter() - started, 1),
    )
    return result, hypotheses


def _select_final_model(trainer: VaswaniTrainer, run: RunFolder, config: RunConfig, valid_dataset,
                        progress: TrainingProgress) -> Selection:
    """§6.1: average the last checkpoints; keep the average if it beats the best checkpoint on valid BLEU."""
    with progress.stage("valid, best checkpoint"):
        best_metrics = trainer.evaluate(valid_dataset, metric_key_prefix="valid")
    choice = Selection(chosen="best_checkpoint", best_checkpoint=trainer.state.best_model_checkpoint,
                       valid_bleu_best_checkpoint=best_metrics.get("valid_bleu"))
    t = config.training
    if t.average_every is None:
        kind, last = "saves", last_saves(run.checkpoints, t.average_last)
    else:
        kind, last = "snapshots", last_snapshots(run.snapshots, t.average_every, t.average_last)
        if len(last) < 2 <= t.average_last:
            logger.warning("nothing averaged: %d weight snapshot(s) of training.average_every %d in %d updates",
                           len(last), t.average_every, trainer.state.global_step)
    if 1 < len(last) < t.average_last:
        logger.warning("averaging only the last %d %s (%s): the one before them is not on disk", len(last), kind,
                       ", ".join(p.name for p in last))
    if t.average_last > 1 and len(last) > 1:
        logger.info("averaging the last %d %s: %s", len(last), kind, ", ".join(p.name for p in last))
        if trainer.args.should_save:
            average_checkpoints(last, output_dir=run.averaged)
        trainer.accelerator.wait_for_everyone()
        best_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        averaged = VaswaniForConditionalGeneration.from_pretrained(run.averaged)
        trainer.model.load_state_dict(averaged.state_dict())
        with progress.stage(f"valid, average of the last {len(last)} {kind}"):
            averaged_metrics = trainer.evaluate(valid_dataset, metric_key_prefix="valid")
        choice.averaged_checkpoints = [p.name for p in last]
        choice.valid_bleu_averaged = averaged_metrics.get("valid_bleu")
        if averaged_metrics.get("valid_bleu", -1) >= best_metrics.get("valid_bleu", -1):
            choice.chosen = "averaged"
        else:
            trainer.model.load_state_dict(best_state)
    chosen = {key: value for key, value in dataclasses.asdict(choice).items() if value is not None}
    logger.info("final model: %s", json.dumps(chosen))
    return choice


def _resume_point(checkpoints_dir: Path, args) -> tuple[str | None, TrainerState | None]:
    """Where a resumed run continues: the last complete checkpoint, once what a kill left half-written or
    half-deleted is removed (`vaswani_mt.files`); plus that checkpoint's trainer state when training had already
    ended there (all steps done, or stopped by the time budget), so that only the steps after training are left."""
    with args.main_process_first(desc="resume"):
        if args.should_save:
            for removed in remove_incomplete_checkpoints(checkpoints_dir):
                logger.warning("removing %s", removed)
        complete = complete_checkpoints(checkpoints_dir)
    if not complete:
        logger.info("resuming from scratch (no complete checkpoint yet)")
        return None, None
    state = TrainerState.load_from_json(str(complete[-1] / "trainer_state.json"))
    if not _training_ended(state):
        logger.info("resuming from %s", complete[-1])
        return str(complete[-1]), None
    logger.info("resuming from %s: training ended there (step %d); finishing the steps after training", complete[-1],
                state.global_step)
    return str(complete[-1]), state


def _training_ended(state: TrainerState) -> bool:
    """Whether training had ended at a checkpoint of this state: all steps done, or stopped (the time budget)."""
    control = (state.stateful_callbacks or {}).get("TrainerControl", {}).get("args", {})
    return state.global_step >= state.max_steps or bool(control.get("should_training_stop"))


def _resumed_update(config: RunConfig, run: RunFolder, args: VaswaniTrainingArguments) -> RunConfig:
    """A resumed run keeps the update of its last checkpoint (`vaswani_mt.recipe.processes`): the config with the
    gradient accumulation that gives this number of processes the checkpoint's batches per update (the checkpoint's
    own when only the steps after training are left), also set in `args` before the Trainer is built. A config that
    asks for another accumulation than that and than the run's config.yaml is refused. A checkpoint saved before
    checkpoints recorded their batch resumes with the config's."""
    complete = complete_checkpoints(run.checkpoints)
    started = UpdateBatch.of_checkpoint(complete[-1]) if complete else None
    if started is None:
        return config
    ended = _training_ended(TrainerState.load_from_json(str(complete[-1] / "trainer_state.json")))
    saved = load_run_config(str(run.config)).training.gradient_accumulation_steps if run.config.is_file() else None
    asked = config.training.gradient_accumulation_steps
    accumulation = resumed_accumulation(started, started.processes if ended else args.world_size, asked, saved,
                                        complete[-1])
    if accumulation != asked and started.processes == args.world_size:
        logger.warning("resuming with gradient accumulation %d, %s's (training.gradient_accumulation_steps %d in %s "
                       "is the start's)", accumulation, complete[-1].name, asked, run.config)
    if not ended:
        args.gradient_accumulation_steps = accumulation
    return dataclasses.replace(config, training=dataclasses.replace(config.training,
                                                                    gradient_accumulation_steps=accumulation))


def _say_the_update_batch(args: VaswaniTrainingArguments, checkpoint: str) -> None:
    """One line when a run resumes on another number of processes than its checkpoint's: the gradient accumulation
    `_resumed_update` chose keeps the update."""
    started = UpdateBatch.of_checkpoint(checkpoint)
    if started is None or started.processes == args.world_size:
        return
    now = UpdateBatch(args.world_size, args.gradient_accumulation_steps, args.max_tokens)
    logger.warning("resuming on %s where %s was trained on %d: gradient accumulation %d -> %d keeps an update at "
                   "%d batches (%s; was %s)", processes_text(args.world_size), Path(checkpoint).name,
                   started.processes, started.gradient_accumulation_steps, now.gradient_accumulation_steps,
                   now.batches, now.describe(), started.describe())


def _data_revision(config: RunConfig, run: RunFolder, resume: bool, args: VaswaniTrainingArguments) -> str | None:
    """The commit of the run's Hub dataset: on --resume, the one the run started with (its data_revision.json), so
    that a new commit upstream never changes a resumed run; else the one `data.revision` resolves to now, found by
    process 0 and shared with the others (nodes asking apart could see different commits). None: local data, or
    one process that lets `prepare` resolve it."""
    if not is_hub_source(config.data.path):
        return None
    if resume and run.data_revision.is_file():
        pinned = json.loads(run.data_revision.read_text())["revision"]
        logger.info("data: %s at commit %s, the commit the run started with (%s)", config.data.path, pinned,
                    run.data_revision)
        return pinned
    if args.world_size == 1:
        return None
    found = [hub_commit(config.data.path, cache_folder(config.data), config.data.revision)
             if args.process_index == 0 else None]
    torch.distributed.broadcast_object_list(found, src=0)
    return found[0]


def _restore_ended_training(trainer: VaswaniTrainer, state: TrainerState, checkpoints_dir: Path, last: str) -> dict:
    """Put `trainer` where `trainer.train()` left it when training ended (without training another step, which
    resuming the Trainer at its last step would do): the trainer state, and the weights of the best checkpoint
    (`load_best_model_at_end`), else of the last one. Returns the train metrics (none: nothing was trained)."""
    best = checkpoints_dir / Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
    if best is not None and not is_complete_checkpoint(best):
        raise FileNotFoundError(errno.ENOENT, "the run's best checkpoint is missing or incomplete, so the run cannot "
                                "be finished as it would have been", str(best))
    trainer.state = state
    trainer.state.best_model_checkpoint = str(best) if best is not None else None
    weights = VaswaniForConditionalGeneration.from_pretrained(best or last).state_dict()
    trainer.model.load_state_dict(weights)
    return {}


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


__all__ = ["TimeBudget", "train_run"]
