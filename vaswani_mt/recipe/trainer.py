"""`VaswaniTrainer`: transformers' `Seq2SeqTrainer` with the paper's training recipe wired in.

* Adam with beta = (0.9, 0.98), eps = 1e-9 and the Noam learning-rate schedule (§5.3);
* label-smoothed cross-entropy, eps_ls = 0.1 (§5.4), summed and divided by the number of target tokens of the whole
  optimizer batch, so gradient accumulation and multi-process training equal one big batch;
* batches of similar-length sentences within a token budget (§5.1), via `TokenBudgetBatchSampler`;
* BLEU and chrF with beam search on the validation set during training, scored with sacreBLEU (signature logged),
  and without the duplicate rows `Seq2SeqTrainer` keeps under multi-process evaluation;
* checkpoints that never look complete when a save was interrupted (see `_save_checkpoint`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

from ..data.batching import TokenBudgetBatchSampler
from ..data.bpe_dropout import BpeDropout, merge_halves
from ..files import (  # noqa: F401
    SAVING_MARKER,
    TOKENIZER_FILES,
    begin_checkpoint,
    complete_checkpoints,
    finish_checkpoint,
    is_complete_checkpoint,
    rotate_checkpoints,
    share_weights,
    writing,
)
from ..metrics import corpus_scores
from ..model.modeling_vaswani import label_smoothed_cross_entropy
from ..model.pipeline_vaswani import save_for_pipeline
from ..precision import choose_precision, default_device
from ..run_record import RunRecord, TimeBudgetPlan
from .budget import BudgetPlanner
from .config import TrainingConfig
from .loss import (compiled_label_smoothed_cross_entropy, output_projection_in_the_loss,
                   projected_label_smoothed_cross_entropy, projects_in_the_loss)
from .loss_scaling import SkippedUpdates, scale_losses_on_the_cpu
from .processes import UpdateBatch
from .rdrop import duplicated, projected_rdrop_label_smoothed_cross_entropy, rdrop_label_smoothed_cross_entropy
from .rules import cooldown_problem, setting_problem
from .schedule import NoamLR, cooldown_length, make_adam

logger = logging.getLogger(__name__)

# transformers' private Trainer methods overridden below: the Trainer has no public hook at these points. What is lost
# when a transformers release no longer has one (the Trainer then does its own thing; a warning at construction
# names it; tests/test_transformers_compat.py removes each):
TRAINER_PRIVATE_HOOKS = {
    "_save_checkpoint": "checkpoints are written without the in-progress marker and rotated by the Trainer itself, "
                        "so a kill during a save may leave a checkpoint that looks complete",
    "_save": "saved weights are readable by their owner only (safetensors writes them 0600), and models saved by a "
             "Hub-pushing Trainer carry no pipeline code",
    "_push_from_checkpoint": "Hub pushes during training carry transformers' model card and no pipeline code",
}


_RECIPE = TrainingConfig()  # the recipe's defaults, written once (recipe/config.py)


@dataclass
class VaswaniTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's defaults, plus the recipe's own settings.

    Changed defaults, those of the run config's `training` section (`TrainingConfig`): `adam_beta2=0.98`,
    `adam_epsilon=1e-9`, `warmup_steps=4000` (§5.3), `weight_decay=0`, `generation_num_beams=4` (§6.1), and
    `predict_with_generate=True`. `learning_rate` is not used: the Noam schedule sets the rate. Validation decodes
    with `generation_num_beams` and the model's length penalty: a model built from a config has transformers' 1.0
    until its generation config says otherwise (`vaswani-mt train` sets the run's, §6.1's 0.6 by default).
    `from_config` builds them from a run config's training section, as `vaswani-mt train` does.
    """

    max_tokens: int | None = field(
        default=None,
        metadata={"help": "Token budget per batch and side, padding included (§5.1 used ~25k per side). "
                          "None: batches of per_device_train_batch_size sentences."},
    )
    label_smoothing: float = field(default=_RECIPE.label_smoothing, metadata={"help": "eps_ls of §5.4 (0 = plain "
                                                                                       "cross-entropy)."})
    noam_factor: float = field(default=_RECIPE.noam_factor, metadata={"help": "Multiplier of the Noam schedule."})
    bpe_dropout: float = field(
        default=_RECIPE.bpe_dropout,
        metadata={"help": "Not in the paper: BPE-dropout (Provilkov et al. 2020), each training piece split into the "
                          "two its merge joined with this probability, anew each epoch (needs max_tokens; 0: none)."})
    rdrop_alpha: float = field(
        default=_RECIPE.rdrop_alpha,
        metadata={"help": "Not in the paper: R-Drop (Liang et al. 2021), each training batch through the model twice "
                          "and this weight on the symmetric KL divergence of the two passes' outputs (0: one pass)."})
    warmup_steps: int | float = field(default=_RECIPE.warmup_steps, metadata={"help": "Noam warm-up updates (§5.3)."})
    cooldown_steps: int | float | None = field(
        default=_RECIPE.cooldown_steps,
        metadata={"help": "Not in §5.3: the rate falls linearly to 0 over the last N of the run's updates, or a "
                          "fraction (< 1) of them (0: none)."})
    budget_minutes: float | None = field(
        default=_RECIPE.budget_minutes,
        metadata={"help": "Plan the run's updates from the machine's measured pace so that training and its "
                          "validations end within this many minutes, the cool-down laid over them "
                          "(vaswani_mt.recipe.budget); max_steps then caps the plan."})
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={"help": "transformers' default (True) asks every update's loss whether it is finite, which waits "
                          "for a GPU to finish the update; off, a NaN or infinite loss is logged as it is."})
    adam_beta2: float = field(default=_RECIPE.adam_beta2, metadata={"help": "§5.3: beta_2 = 0.98."})
    adam_epsilon: float = field(default=_RECIPE.adam_epsilon, metadata={"help": "§5.3: epsilon = 1e-9."})
    weight_decay: float = field(default=_RECIPE.weight_decay, metadata={"help": "None in the paper."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Score BLEU from generate()."})
    generation_num_beams: int | None = field(default=_RECIPE.num_beams, metadata={"help": "§6.1: beam size 4."})
    checkpoint_limit: int | None = field(
        default=None,
        metadata={"help": "Checkpoints kept (the best one counts), rotated by VaswaniTrainer only once a new "
                          "checkpoint is complete. Taken from save_total_limit, which is then cleared: the Trainer's "
                          "own rotation deletes while the new checkpoint is unfinished."},
    )

    def __post_init__(self):
        super().__post_init__()
        if self.save_total_limit is not None:
            self.checkpoint_limit, self.save_total_limit = self.save_total_limit, None
        for name in ("warmup_steps", "label_smoothing", "noam_factor", "max_tokens", "cooldown_steps",
                     "budget_minutes", "bpe_dropout", "rdrop_alpha"):
            problem = setting_problem(name, getattr(self, name))
            if problem:
                raise ValueError(problem)
        if self.bpe_dropout and self.max_tokens is None:
            raise ValueError("bpe_dropout needs max_tokens: its draws follow the epochs of the token-budget batches")
        if self.label_smoothing_factor:
            raise ValueError("use label_smoothing (the paper's formulation, §5.4), not label_smoothing_factor")

    @property
    def device(self) -> torch.device:
        """transformers' device, with an indexed CPU ("cpu:0", what accelerate gives each process of a multi-process CPU
        run) as plain "cpu", the same memory: transformers before 5.24 resume such a run by loading the optimizer state
        with it as `map_location`, which torch refuses ("don't know how to restore data location ... cpu:0")."""
        device = super().device
        return torch.device("cpu") if device.type == "cpu" else device

    @classmethod
    def from_config(cls, training: TrainingConfig, output_dir: str, **settings) -> VaswaniTrainingArguments:
        """The arguments of a run config's training section. A key that names an argument (`warmup_steps`,
        `label_smoothing`, `seed`, ...) is that argument; the others say what the run does, and become: evaluation
        (beam-search BLEU on valid with `num_beams`) and a checkpoint every `eval_steps`, the best checkpoint by BLEU
        loaded at the end, `keep_checkpoints` kept besides it, `num_epochs` or `max_steps` long. `settings`: further
        `Seq2SeqTrainingArguments` (e.g. `use_cpu`, `disable_tqdm`)."""
        t = training
        named = {**_arguments_named_by(t), "max_steps": -1 if t.max_steps is None else t.max_steps}  # -1: epochs
        if not {"bf16", "fp16"} & settings.keys():  # else decided by the caller (`train_run` logs and records why)
            device = "cpu" if settings.get("use_cpu") else default_device()
            named.update(choose_precision(t.precision, device).trainer_flags())
        return cls(
            output_dir=output_dir, **named, num_train_epochs=t.num_epochs, generation_num_beams=t.num_beams,
            eval_strategy="steps", save_strategy="steps", save_steps=t.eval_steps,
            # +1: the best checkpoint, kept besides the newest ones, counts towards the limit; without it the last
            # `average_last` saves were not all on disk and averaging took the (older) best one instead.
            save_total_limit=t.keep_checkpoints + 1, load_best_model_at_end=True, metric_for_best_model="bleu",
            greater_is_better=True, logging_first_step=True, per_device_eval_batch_size=64,
            predict_with_generate=True, **settings)

    def recipe_settings(self) -> dict:
        """These arguments as a run config's training section (its keys), for a model card of a trainer that was
        given no run config."""
        section = {**_arguments_named_by(self), "num_epochs": self.num_train_epochs,
                   "num_beams": self.generation_num_beams}
        if section["max_steps"] <= 0:  # -1: num_epochs decides
            del section["max_steps"]
        if self.max_tokens is None:
            section["per_device_train_batch_size"] = self.per_device_train_batch_size
        return section


def _arguments_named_by(settings) -> dict:
    """The run config's training keys that are also `VaswaniTrainingArguments` fields, with `settings`' values."""
    arguments = {f.name for f in dataclasses.fields(VaswaniTrainingArguments)}
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(TrainingConfig) if f.name in arguments}


def bleu_chrf_metrics(tokenizer, on_signature=None):
    """A `compute_metrics` for `predict_with_generate`: corpus BLEU and chrF with sacreBLEU's defaults (cased,
    13a-tokenized, on detokenized text) of decoded predictions against decoded labels. `on_signature` receives the
    sacreBLEU signatures once."""

    def compute(eval_prediction) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        pad = tokenizer.pad_token_id
        predictions = np.where(predictions < 0, pad, predictions)
        labels = np.where(eval_prediction.label_ids < 0, pad, eval_prediction.label_ids)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        scores = corpus_scores(hypotheses, references)
        if on_signature is not None:
            on_signature({"bleu": scores["bleu_signature"], "chrf": scores["chrf_signature"]})
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute


class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's recipe (module docstring). Use it like `Seq2SeqTrainer`, with
    `VaswaniTrainingArguments`; `compute_metrics` defaults to BLEU/chrF when a tokenizer is given as
    `processing_class` and `predict_with_generate` is on."""

    # What becomes README.md before each Hub upload: `card_writer(record, repo_id=..., **create_model_card kwargs)`.
    # The recipe renders no card itself: `vaswani_mt.publishing` plugs its card in here (vaswani_mt/__init__.py),
    # so the trainer never imports the layers above it. None: transformers' own draft card.
    card_writer: ClassVar[Callable[..., str] | None] = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, VaswaniTrainingArguments):
            raise TypeError("VaswaniTrainer needs VaswaniTrainingArguments (the recipe's settings live there)")
        self.bleu_signatures: dict[str, str] | None = None
        if self.compute_metrics is None and self.args.predict_with_generate and self.processing_class is not None:
            self.compute_metrics = bleu_chrf_metrics(self.processing_class, self._remember_signatures)
        self._target_tokens_since_log = 0
        self._last_log_time = time.perf_counter()
        self.skipped_updates = SkippedUpdates()  # by float16's loss scaling; logged at each logging step
        self.add_callback(self.skipped_updates)
        if self.args.budget_minutes and self.budget_planner is None:
            self.add_callback(BudgetPlanner(self.args.budget_minutes, self.args.cooldown_steps))
        for name, lost in TRAINER_PRIVATE_HOOKS.items():
            if not callable(getattr(Seq2SeqTrainer, name, None)):
                logger.warning("vaswani_mt: transformers' Trainer has no %s: %s", name, lost)

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's accelerator; with `fp16` on a CPU, given the float16 autocast and grad scaler accelerate gives
        only GPUs (`loss_scaling.scale_losses_on_the_cpu`; where it cannot, `fp16` is off: float32, as accelerate)."""
        super().create_accelerator_and_postprocess()
        if self.args.fp16 and not scale_losses_on_the_cpu(self.accelerator):
            self.args.fp16 = False

    @property
    def budget_planner(self) -> BudgetPlanner | None:
        """The callback that plans the run's updates within `budget_minutes`, if there is one."""
        return next((c for c in self.callback_handler.callbacks if isinstance(c, BudgetPlanner)), None)

    def time_budget_facts(self) -> dict | None:
        """How the time budget laid the run out (`BudgetPlanner.facts`), for the run record; None without one."""
        planner = self.budget_planner
        if planner is None:
            return None
        if self.lr_scheduler is not None:  # where the rate first fell, though a re-plan inside the fall re-laid it
            return planner.facts(self.lr_scheduler.total_steps, self.lr_scheduler.fall_start(),
                                 self.lr_scheduler.warmup_steps)
        planner.restore(self.state)  # a run resumed after its training ended: the plan its checkpoint keeps
        fall_from = planner.fall_from  # a checkpoint saved before the planner kept it: from the logged plans
        if fall_from is None:
            fall_from = TimeBudgetPlan(plans=planner.plans).fall_start()
        return planner.facts(self.state.max_steps, fall_from, (planner.plans or [{}])[-1].get("warmup_steps"))

    def _remember_signatures(self, signatures: dict[str, str]) -> None:
        if self.bleu_signatures is None:
            logger.info("sacreBLEU signatures: BLEU %s | chrF %s", signatures["bleu"], signatures["chrf"])
        self.bleu_signatures = signatures

    # -- optimizer and schedule (§5.3) --------------------------------------------------------------------------
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            params = [p for p in (model or self.model).parameters() if p.requires_grad]
            self.optimizer = make_adam(params, betas=(self.args.adam_beta1, self.args.adam_beta2),
                                       eps=self.args.adam_epsilon, weight_decay=self.args.weight_decay)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            d_model = self.accelerator.unwrap_model(self.model).config.d_model
            # get_warmup_steps: a float warmup_steps < 1 is a fraction of the training steps, as in TrainingArguments.
            # num_training_steps: max_steps, or the updates of num_train_epochs; the cool-down ends there.
            # With a time budget the planner lays the cool-down out once it has measured the machine.
            planned = bool(self.args.budget_minutes)
            problem = cooldown_problem(self.args.cooldown_steps, num_training_steps, "the run's updates", planned)
            if problem:
                raise ValueError(problem)
            cooldown = 0 if planned else cooldown_length(self.args.cooldown_steps, num_training_steps)
            self.lr_scheduler = NoamLR(optimizer or self.optimizer, d_model=d_model,
                                       warmup_steps=self.args.get_warmup_steps(num_training_steps),
                                       factor=self.args.noam_factor, cooldown_steps=cooldown,
                                       total_steps=num_training_steps)
        return self.lr_scheduler

    # -- token-budget batches (§5.1) ----------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        if self.args.max_tokens is None:
            return super().get_train_dataloader()
        dataset = self._model_columns(self.train_dataset)
        sampler = TokenBudgetBatchSampler.from_dataset(
            dataset, max_tokens=self.args.max_tokens, seed=self.args.seed,
            num_replicas=self.args.world_size, rank=self.args.process_index,
            pad_to_multiple_of=getattr(self.data_collator, "pad_to_multiple_of", None),
        )
        if self.args.bpe_dropout:
            if self.processing_class is None:
                raise ValueError("bpe_dropout needs the trainer's tokenizer (processing_class): its merges say how "
                                 "pieces split")
            positions = getattr(self.accelerator.unwrap_model(self.model).config, "max_position_embeddings", None)
            dataset = BpeDropout(dataset, merge_halves(self.processing_class), self.args.bpe_dropout, self.args.seed,
                                 epoch_of=sampler, max_length=positions, max_tokens=self.args.max_tokens)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator,
                            num_workers=self.args.dataloader_num_workers, pin_memory=self.args.dataloader_pin_memory)
        loader = self.accelerator.prepare(loader)
        # The sampler already gives each process its own batches: accelerate's shard wrapper must pass them through,
        # and pass the epoch on (the Trainer sets it on the wrapper of a resumed epoch's skipping loader: without this
        # a resumed multi-process run drew its batches in the first epoch's order).
        wrapper = getattr(loader, "batch_sampler", None)
        if wrapper is not None and getattr(wrapper, "batch_sampler", None) is sampler:
            wrapper.num_processes, wrapper.process_index = 1, 0
            wrapper.set_epoch = sampler.set_epoch
        return loader

    def _model_columns(self, dataset):
        """`dataset` with only the columns the model's forward() takes (and the labels), when
        `remove_unused_columns` is on, as the Trainer's own data loaders do."""
        if not self.args.remove_unused_columns or not hasattr(dataset, "column_names"):
            return dataset
        accepted = set(inspect.signature(self.accelerator.unwrap_model(self.model).forward).parameters)
        unused = [name for name in dataset.column_names if name not in accepted | {"labels", "label", "label_ids"}]
        return dataset.remove_columns(unused) if unused else dataset

    # -- loss (§5.4) --------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Training: label-smoothed cross-entropy summed over target tokens, divided by `num_items_in_batch` (the
        target tokens of the whole accumulated, all-process batch); with `rdrop_alpha`, R-Drop's loss of the batch's
        two passes, divided the same (`recipe/rdrop.py`). Outside training (eval without generation):
        the plain NLL per target token of the batch. With `predict_with_generate`, `Seq2SeqTrainer.prediction_step`
        takes the model's own loss instead, so `eval_loss` is then a mean of per-batch token means (not
        token-weighted across batches)."""
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        unwrapped = self.accelerator.unwrap_model(model)
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = unwrapped.prepare_decoder_input_ids_from_labels(labels)
        alpha = self.args.rdrop_alpha if model.training else 0.0
        if alpha:  # R-Drop: the batch twice, in one forward pass (recipe/rdrop.py)
            inputs = duplicated(inputs)
        if self.args.torch_compile:
            _any_shape(inputs)
        epsilon = self.args.label_smoothing if model.training else 0.0
        pad_token_id = unwrapped.config.pad_token_id
        if model.training and not return_outputs and projects_in_the_loss(unwrapped, labels.device,
                                                                           self.args.torch_compile):
            with output_projection_in_the_loss(unwrapped) as (weight, bias):  # no [tokens, V] logits (recipe/loss)
                hidden_states = model(**inputs, use_cache=False).logits
            with self.loss_autocast():  # the projection's products in the run's precision, as in the forward
                if alpha:
                    loss_sum, _, num_tokens = projected_rdrop_label_smoothed_cross_entropy(
                        hidden_states, weight, labels, alpha, epsilon=epsilon, pad_token_id=pad_token_id, bias=bias)
                else:
                    loss_sum, _, num_tokens = projected_label_smoothed_cross_entropy(
                        hidden_states, weight, labels, epsilon=epsilon, pad_token_id=pad_token_id, bias=bias)
            outputs = None
        elif alpha:
            outputs = model(**inputs, use_cache=False)
            loss_sum, _, num_tokens = rdrop_label_smoothed_cross_entropy(
                outputs.logits, labels, alpha, epsilon=epsilon, pad_token_id=pad_token_id)
        else:
            outputs = model(**inputs, use_cache=False)
            smoothed = (compiled_label_smoothed_cross_entropy() if self.args.torch_compile
                        else label_smoothed_cross_entropy)
            loss_sum, _, num_tokens = smoothed(outputs.logits, labels, epsilon=epsilon, pad_token_id=pad_token_id)
        if model.training:  # kept where it is (a GPU's memory) until a log step reads it: no wait for the GPU here
            self._target_tokens_since_log = self._target_tokens_since_log + num_tokens.detach()
        if num_items_in_batch is None:
            loss = loss_sum / num_tokens.clamp(min=1)
        else:
            loss = loss_sum / num_items_in_batch
            # Each process's gradient is averaged over processes by DDP; num_items_in_batch counts all processes.
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                loss = loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss

    def loss_autocast(self) -> contextlib.AbstractContextManager:
        """The run's autocast (`bf16`, `fp16`) for the part of the training loss that runs outside the model.
        accelerate puts only the model's forward under autocast and hands its outputs back in float32; without this
        the output projection inside the loss on CPU (`recipe/loss.py`, half the FLOPs of the `mini` step) ran in
        float32 in a bf16 run. Built from this trainer's settings, not from accelerate's process-wide state, which
        the last accelerator made in the process sets. Elsewhere the projection is in the model's forward, under
        accelerate's autocast, and the loss of its logits is float32 by design (`label_smoothed_cross_entropy`)."""
        if not getattr(self.accelerator, "native_amp", False) or not (self.args.bf16 or self.args.fp16):
            return contextlib.nullcontext()
        return torch.autocast(self.args.device.type, dtype=torch.bfloat16 if self.args.bf16 else torch.float16)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            now = time.perf_counter()
            tokens = int(self._target_tokens_since_log) * self.accelerator.num_processes
            logs["target_tokens_per_second"] = round(tokens / max(now - self._last_log_time, 1e-9), 1)
            self._target_tokens_since_log, self._last_log_time = 0, now
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None:  # float16: the loss scale, and the updates it skipped
                logs["skipped_updates"] = self.skipped_updates.take(self.state.global_step)
                logs["loss_scale"] = scaler.get_scale()
        super().log(logs, start_time)

    # -- evaluation keeps the model's decoding defaults ------------------------------------------------------------
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """`Seq2SeqTrainer.prediction_step`, leaving the model's generation config as it found it.

        transformers fills the model's generation config with its global defaults after generating (`max_length`
        20, ...), so every later generate() — the next validation batch, every checkpoint and the final model —
        stopped at 20 tokens instead of the paper's source length + 50 (§6.1), and a checkpoint's validation BLEU
        during training differed from the same checkpoint's BLEU at model selection."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        saved = copy.deepcopy(unwrapped.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            unwrapped.generation_config = saved

    # -- evaluation under several processes ---------------------------------------------------------------------
    def evaluation_loop(self, *args, **kwargs):
        """The Trainer's evaluation loop, gathering with `gather_for_metrics`, as the Trainer sets it up.
        `Seq2SeqTrainer.evaluate` / `predict` switch it to `accelerator.gather`, which keeps the rows that even
        batches repeat under multi-process evaluation, so BLEU would score duplicates; `gather_for_metrics` drops
        them."""
        self.gather_function = self.accelerator.gather_for_metrics
        if "use_gather_object" in inspect.signature(self.gather_function).parameters:
            self.gather_function = functools.partial(self.gather_function,
                                                     use_gather_object=self.args.eval_use_gather_object)
        return super().evaluation_loop(*args, **kwargs)

    # -- checkpoints that never look complete when a save was interrupted ---------------------------------------
    def _save_checkpoint(self, model, trial=None, *args, **kwargs) -> None:
        """Save so that a kill at any moment leaves every `checkpoint-<step>` folder complete or visibly incomplete
        (`vaswani_mt.files.checkpoint_problem`): a `.saving` marker is created (and synced) before the Trainer writes
        the folder and removed once every process has written its files and they are synced; only then are old
        checkpoints deleted (`checkpoint_limit`; the Trainer's own rotation, which deletes while the new checkpoint is
        still unfinished and can leave a half-deleted folder, is off), each renamed before it is removed.
        A failed write (e.g. a full disk) raises an OSError naming the checkpoint."""
        if trial is not None:  # a hyperparameter-search trial writes a folder of its own: the Trainer's own saving
            return super()._save_checkpoint(model, trial, *args, **kwargs)
        if self.skipped_updates.count:  # in the checkpoint's log history, so a resumed run counts them once
            self.log({"skipped_updates": self.skipped_updates.take(self.state.global_step)})
        run_dir = Path(self.args.output_dir)
        folder = run_dir / f"checkpoint-{self.state.global_step}"
        writes_files = self.args.should_save
        with writing(folder):
            if writes_files:
                begin_checkpoint(folder)
            super()._save_checkpoint(model, trial, *args, **kwargs)
            if writes_files and folder.exists():  # what an update held, for a resume on another number of processes
                UpdateBatch(self.args.world_size, self.args.gradient_accumulation_steps,
                            self.args.max_tokens).write(folder)
            self.accelerator.wait_for_everyone()
            if writes_files and folder.exists():
                finish_checkpoint(folder)
        if writes_files:
            rotate_checkpoints(run_dir, self.args.checkpoint_limit, self.state.best_model_checkpoint, keep=folder)

    # -- saves: weights that follow the umask; Hub pushes carry our model card and the model + pipeline code ---
    def _save(self, output_dir: str | None = None, *args, **kwargs) -> None:
        """The Trainer's save (checkpoints and `save_model`), with the weights readable as the umask says
        (`vaswani_mt.files.share_weights`) and, for Hub pushes, the pipeline code."""
        super()._save(output_dir, *args, **kwargs)
        folder = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save and Path(folder).is_dir():
            share_weights(folder)
        if self.args.push_to_hub and self.args.should_save:
            _add_pipeline_code(folder)

    def create_model_card(self, **kwargs) -> None:
        """The card of `card_writer` as README.md instead of the Trainer's generic draft, and the pipeline code in the
        output folder; `push_to_hub` calls this just before uploading. Without a card writer: the Trainer's draft."""
        if self.card_writer is None:
            return super().create_model_card(**kwargs)
        if self.is_world_process_zero():
            self._prepare_push(**kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str, *args, **kwargs) -> None:
        # The Trainer copies only weights and configs from the checkpoint: bring the code and the card along.
        if self.is_world_process_zero() and self.args.hub_strategy != "end" and self.card_writer is not None:
            self._prepare_push(checkpoint_folder)
        super()._push_from_checkpoint(checkpoint_folder, *args, **kwargs)

    def _prepare_push(self, checkpoint_folder: str | None = None, **card_kwargs) -> None:
        """The output folder before a Hub upload: the model code of `checkpoint_folder` (an upload from a checkpoint),
        the pipeline code, and README.md from `RunRecord.from_trainer` (the one place a trainer's record is built)."""
        output_dir = Path(self.args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if checkpoint_folder is not None:
            for path in Path(checkpoint_folder).glob("*.py"):
                shutil.copyfile(path, output_dir / path.name)
        _add_pipeline_code(output_dir)
        repo_id = getattr(self, "hub_model_id", None) or self.args.hub_model_id
        card = type(self).card_writer(RunRecord.from_trainer(self), repo_id=repo_id, **card_kwargs)
        (output_dir / "README.md").write_text(card, encoding="utf-8")


def _any_shape(inputs: dict) -> None:
    """Token-budget batches vary in sentences and lengths: mark every dimension dynamic, so that torch.compile
    compiles once for any shape instead of once for the first shape and again, dynamic, for the second (36
    recompiles in 30 steps without it). `maybe_mark_dynamic` lives in torch's `_dynamo` module: without it, torch's
    own automatic dynamic shapes take over after the first recompile."""
    mark = getattr(getattr(torch, "_dynamo", None), "maybe_mark_dynamic", None)
    if mark is None:
        return
    for tensor in inputs.values():
        if isinstance(tensor, torch.Tensor):
            for dim in range(tensor.dim()):
                mark(tensor, dim)


def _add_pipeline_code(folder) -> None:
    """The pipeline code in a saved model folder, once it has its config.json and tokenizer (`save_for_pipeline`)."""
    folder = Path(folder)
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in TOKENIZER_FILES):
        save_for_pipeline(None, None, folder)

__all__ = [
    "VaswaniTrainer",
    "VaswaniTrainingArguments",
    "bleu_chrf_metrics",
    "complete_checkpoints",
    "is_complete_checkpoint",
]
