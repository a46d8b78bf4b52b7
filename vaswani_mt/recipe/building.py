"""A run's model and trainer, built from its config: the model configuration from the preset and the tokenizer, the
run's decoding as the model's generation defaults, the collator, the validation split as training scores it, and the
`VaswaniTrainer` with the run's callbacks (the probe of `recipe.pace` builds its throw-away trainer here too)."""

from __future__ import annotations

import torch
from transformers import DataCollatorForSeq2Seq

from ..model.configuration_vaswani import VaswaniConfig
from ..model.modeling_vaswani import VaswaniForConditionalGeneration
from ..run_record import RunFolder
from .budget import BudgetPlanner
from .config import RunConfig
from .snapshots import WeightSnapshots
from .stopping import MaxMinutesStop
from .trainer import VaswaniTrainer


def model_config(config: RunConfig, tokenizer) -> VaswaniConfig:
    return VaswaniConfig.from_preset(
        config.model.preset, **{
            **config.model.config, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **({"preprocess": config.data.preprocess, "source_lang": config.data.source_lang,
                "target_lang": config.data.target_lang} if config.data.preprocess else {}),
        })


def set_decoding(model: VaswaniForConditionalGeneration, config: RunConfig) -> None:
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


def run_trainer(config: RunConfig, run: RunFolder, args, model, tokenizer, train, valid,
             planner: BudgetPlanner | None = None) -> VaswaniTrainer:
    callbacks = [MaxMinutesStop(config.training.max_minutes)] if config.training.max_minutes else []
    if config.training.average_every is not None:
        callbacks.append(WeightSnapshots(run.snapshots, config.training.average_every, config.training.average_last))
    if planner is not None:
        callbacks.append(planner)
    return VaswaniTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid, processing_class=tokenizer,
                          data_collator=collator(config, tokenizer, model), callbacks=callbacks)


def collator(config: RunConfig, tokenizer, model) -> DataCollatorForSeq2Seq:
    # Compiled on CUDA, inductor guards on whether each length is a multiple of 8 (the alignment SDPA needs for its
    # mask): lengths padded to a multiple of 8 keep it at one compile instead of up to four.
    pad_to = 8 if config.training.torch_compile and torch.cuda.is_available() else None
    return DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=pad_to)


def validation_split(config: RunConfig, tokenized):
    """The validation split as training scores it: its first `data.valid_subset` pairs, or all of them."""
    valid = tokenized[config.data.valid_split]
    if config.data.valid_subset is not None:
        valid = valid.select(range(min(config.data.valid_subset, len(valid))))
    return valid


__all__ = ["collator", "model_config", "run_trainer", "set_decoding", "validation_split"]
