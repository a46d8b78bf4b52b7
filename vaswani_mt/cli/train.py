"""`vaswani-mt train`: the paper's recipe end to end, from a YAML config to a scored, saved model.

    vaswani-mt train --config multi30k-en-de [--quick] [--resume] [--output-dir DIR] [--training.max_steps 300 ...]

Steps: validate the config; load and clean the data; train a joint BPE tokenizer unless one is given (§5.1);
train with `VaswaniTrainer` (Noam + Adam, label smoothing, token-budget batches, BLEU on valid with beam search,
checkpoints); average the last checkpoints, or the last weight snapshots with `training.average_every` (§6.1,
`vaswani_mt.recipe.snapshots`), and keep whichever of {average, best checkpoint} scores higher
on valid; translate the test split with beam search and score it; write the run folder:

    config.yaml  train.log  tokenizer/  checkpoints/  [snapshots/]  averaged/  model/  metrics.json  test.hyp  plots/

What it prints goes to stderr (and train.log); stdout stays empty. On a terminal, labelled progress bars; in a log
file, one progress line per logging step and per translation pass (`vaswani_mt.cli.reporting`); at the end, a summary:
the model folder, the test scores with their signatures, the time taken and the commands to run next.

Runs the same under `torchrun --nproc_per_node N` or `accelerate launch --multi_gpu --num_processes N` (see
README); `--resume` continues from the last complete checkpoint after a crash or kill; when training had ended, it
only redoes the steps after training, and on a finished run (metrics.json, written last) it has nothing to do.
"""

import argparse
import dataclasses
import errno
import json
import logging
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, TrainerCallback, TrainerState, set_seed

from ..data.prepared import prepare
from ..data.reading import DataError
from ..data.tokenization import normalize_text
from ..files import (
    checkpoint_step,
    describe_os_error,
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
from ..publishing.plots import plot_training_curves
from ..recipe.averaging import average_checkpoints
from ..recipe.config import (
    ConfigError,
    RunConfig,
    load_run_config,
    parse_overrides,
    save_run_config,
    shipped_config_names,
)
from ..recipe.host_memory import keep_freed_memory
from ..recipe.snapshots import WeightSnapshots, drop_snapshots_after, last_snapshots
from ..recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments, complete_checkpoints, is_complete_checkpoint
from ..run_record import (
    Hardware,
    ModelFacts,
    RunFolder,
    RunRecord,
    Selection,
    TestScores,
    TrainingFigures,
    last_validation,
)
from .reporting import TrainingProgress, run_summary

logger = logging.getLogger("vaswani_mt.train")


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


def _setup_logging(run: RunFolder, is_main: bool) -> None:
    handlers = [logging.StreamHandler(sys.stderr)]
    if is_main:
        handlers.append(logging.FileHandler(run.log, encoding="utf-8"))
    logging.basicConfig(level=logging.INFO if is_main else logging.WARNING, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _training_arguments(config: RunConfig, run: RunFolder) -> VaswaniTrainingArguments:
    return VaswaniTrainingArguments.from_config(
        config.training, str(run.checkpoints), use_cpu=not torch.cuda.is_available(), report_to=[],
        ddp_find_unused_parameters=False, dataloader_num_workers=0, disable_tqdm=not sys.stderr.isatty())


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
        averaged_dir = run.averaged
        if trainer.args.should_save:
            average_checkpoints(last, output_dir=averaged_dir)
        trainer.accelerator.wait_for_everyone()
        best_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        averaged = VaswaniForConditionalGeneration.from_pretrained(averaged_dir)
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


def run(config: RunConfig, resume: bool = False, command: str = "") -> dict:
    run_started = time.perf_counter()
    run = RunFolder(config.output_dir)
    run_dir = run.root
    if resume and run.record.is_file():
        print(f"vaswani-mt train: {run_dir} is a finished run (it has {run.record.name}): nothing to do",
              file=sys.stderr)
        return RunRecord.read(run_dir).to_json()
    if run_dir.exists() and not resume and any(run_dir.iterdir()):
        raise ConfigError(f"output_dir {run_dir} already holds a run: pass --resume to continue it, or choose "
                          "another --output-dir")
    args = _training_arguments(config, run)
    if config.training.num_threads:
        torch.set_num_threads(config.training.num_threads)
    # a resumed run keeps the tokenizer it started with
    resumed_tokenizer = AutoTokenizer.from_pretrained(run.tokenizer) if resume and (
        run.tokenizer / "tokenizer.json").exists() else None
    with args.main_process_first(desc="data"):  # before the run folder exists: bad data leaves nothing behind
        prepared = prepare(config.data, config.tokenizer, tokenizer=resumed_tokenizer)
    tokenizer, tokenized, cleaning_report = prepared.tokenizer, prepared.tokenized, prepared.report
    run_dir.mkdir(parents=True, exist_ok=True)
    _setup_logging(run, args.should_save)
    if args.should_save:
        with writing(run.config):
            save_run_config(config, run.config)
        if config.tokenizer.path is None and resumed_tokenizer is None:
            tokenizer.save_pretrained(run.tokenizer)
    logger.info("run folder %s; world size %d", run_dir, args.world_size)
    if args.device.type == "cpu" and keep_freed_memory():
        logger.info("malloc keeps freed memory for the next step (vaswani_mt.recipe.host_memory)")
    logger.info("data: %s; prepared in %s", cleaning_report.summary(),
                ", ".join(str(folder) for folder in prepared.folders.values()))
    for split, count in prepared.truncated.items():
        if count:
            logger.warning("%s: %d of %d examples are truncated to data.max_length=%d tokens", split, count,
                           len(tokenized[split]), config.data.max_length)
    valid = tokenized[config.data.valid_split]
    if config.data.valid_subset is not None:
        valid = valid.select(range(min(config.data.valid_subset, len(valid))))

    set_seed(config.training.seed)  # the initial weights, so that a run is reproducible from its config
    model = VaswaniForConditionalGeneration(_model_config(config, tokenizer))
    _set_decoding(model, config)
    logger.info("model: %s preset, %.2fM parameters, %s-norm", config.model.preset, model.num_parameters() / 1e6,
                model.config.norm_style)
    callbacks = [TimeBudget(config.training.max_minutes)] if config.training.max_minutes else []
    if config.training.average_every is not None:
        callbacks.append(WeightSnapshots(run.snapshots, config.training.average_every, config.training.average_last))
    # Compiled on CUDA, inductor guards on whether each length is a multiple of 8 (the alignment SDPA needs for its
    # mask): lengths padded to a multiple of 8 keep it at one compile instead of up to four.
    pad_to = 8 if config.training.torch_compile and torch.cuda.is_available() else None
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=pad_to)
    trainer = VaswaniTrainer(
        model=model, args=args, train_dataset=tokenized[config.data.train_split], eval_dataset=valid,
        processing_class=tokenizer, data_collator=collator,
        callbacks=callbacks,
    )
    progress = TrainingProgress(config.training.max_minutes).install(trainer)

    resume_from, ended = _resume_point(run.checkpoints, args) if resume else (None, None)
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
    if config.training.cooldown_steps and trainer.state.global_step < config.training.max_steps:
        logger.warning("the run stopped at update %d, before the end of its cool-down at training.max_steps %d",
                       trainer.state.global_step, config.training.max_steps)

    record = RunRecord(
        command=command,
        training=TrainingFigures.from_trainer_state(
            trainer.state, args.world_size, wall_seconds_this_process=round(train_seconds, 1),
            train_runtime_seconds=train_metrics.get("train_runtime"), hardware=Hardware.of_this_machine()),
        model=ModelFacts(preset=config.model.preset, parameters=model.num_parameters(),
                         config=model.config.to_diff_dict()),
        data=cleaning_report.to_dict(),
        selection=_select_final_model(trainer, run, config, valid, progress),
        validation=last_validation(history, trainer.bleu_signatures),
        bleu_signatures_during_training=trainer.bleu_signatures,
    )
    final_dir = run.model
    if args.should_save:
        with writing(final_dir):
            trainer.model.save_pretrained(final_dir)
            tokenizer.save_pretrained(final_dir)
            save_for_pipeline(trainer.model, tokenizer, final_dir)  # pipeline("translation", ...) with stock transformers
            share_weights(final_dir)

    if config.data.test_split:
        references = [pair[config.data.target_lang] for pair in prepared.text[config.data.test_split]["translation"]]
        test_scores, hypotheses = _score(trainer, tokenized[config.data.test_split], references, config, progress)
        record.test = test_scores
        if args.should_save:
            write_atomically(("\n".join(hypotheses) + "\n").encode(), run.test_hypotheses)
        logger.info("test %s: BLEU %.2f (%s), chrF %.2f, lowercased Moses-tokenized BLEU %.2f",
                    config.data.test_split, test_scores.bleu, test_scores.bleu_signature, test_scores.chrf,
                    test_scores.bleu_lowercased_moses_tokenized)
    if args.should_save:
        write_atomically((json.dumps(history, indent=1) + "\n").encode(), run.log_history)
        with writing(run.plots):
            _plot(history, run.plots)
        # Last, and atomically: a run folder with its record is finished (`--resume` then has nothing to do).
        record.write(run)
        logger.info(run_summary(record.to_json(), run.root, time.perf_counter() - run_started, (config.data.source_lang, config.data.target_lang)))
    _leave_together(trainer)
    return record.to_json()


def _leave_together(trainer: VaswaniTrainer) -> None:
    """Under several processes: wait until every one is done (the main one writes the run's files last), then close
    the process group. A process that exited with the group still open could abort in torch's gloo threads
    ("terminate called without an active exception") and fail the whole torchrun."""
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _resume_point(checkpoints_dir: Path, args) -> tuple[str | None, TrainerState | None]:
    """Where `--resume` continues: the last complete checkpoint, once what a kill left half-written or half-deleted
    is removed (`vaswani_mt.files`); plus that checkpoint's trainer state when training had already ended there
    (all steps done, or stopped by the time budget), so that only the steps after training are left to do."""
    with args.main_process_first(desc="resume"):
        if args.should_save:
            for removed in remove_incomplete_checkpoints(checkpoints_dir):
                logger.warning("removing %s", removed)
        complete = complete_checkpoints(checkpoints_dir)
    if not complete:
        logger.info("resuming from scratch (no complete checkpoint yet)")
        return None, None
    state = TrainerState.load_from_json(str(complete[-1] / "trainer_state.json"))
    control = (state.stateful_callbacks or {}).get("TrainerControl", {}).get("args", {})
    if state.global_step < state.max_steps and not control.get("should_training_stop"):
        logger.info("resuming from %s", complete[-1])
        return str(complete[-1]), None
    logger.info("resuming from %s: training ended there (step %d); finishing the steps after training", complete[-1],
                state.global_step)
    return str(complete[-1]), state


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vaswani-mt train", description="Train a Transformer with the paper's recipe.",
        epilog="Any config key can be overridden with a dotted option, e.g. --training.max_steps 300 "
               "--model.config.norm_style pre --data.path ../shared/data/multi30k",
    )
    parser.add_argument("--config", required=True,
                        help="a YAML file or a shipped config name (" + ", ".join(shipped_config_names()) + ")")
    parser.add_argument("--quick", action="store_true", help="apply the config's 'quick' section: a few minutes on a CPU")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    parser.add_argument("--output-dir", help="run folder (overrides output_dir)")
    return parser


def _what_trains(config: RunConfig) -> dict:
    """The settings a resumed run must share with its start: all but what only the card and --quick read."""
    settings = config.to_dict()
    settings["data"].pop("description", None)
    settings.pop("quick", None)
    return settings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    known, rest = parser.parse_known_args(argv)
    try:
        overrides = parse_overrides(rest)
        if known.output_dir:
            overrides["output_dir"] = known.output_dir
        config = load_run_config(known.config, overrides, quick=known.quick)
        saved_config = RunFolder(config.output_dir).config
        if known.resume and saved_config.exists():
            saved = load_run_config(str(saved_config))
            if _what_trains(saved) != _what_trains(config):
                raise ConfigError(f"--resume: the config differs from the one {saved_config} was started with; "
                                  f"resume with the same config and overrides, or with --config {saved_config}")
        run(config, resume=known.resume, command="vaswani-mt train " + " ".join(argv))
    except (ConfigError, DataError) as error:
        print(f"vaswani-mt train: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"vaswani-mt train: error: {describe_os_error(error)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
