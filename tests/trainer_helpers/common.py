"""Tiny, deterministic `VaswaniTrainer` setups used both in-process (pytest) and under torchrun (`ddp_checks.py`).

Examples are random id sequences of varying lengths over a 20-symbol vocabulary (+ the 4 specials of vaswani_mt's
tokenizers), every source sequence distinct, so the example a row came from can be recovered from its input_ids
(`ExampleIndex`) without an extra column going through the Trainer.
"""

from __future__ import annotations

import torch
from torch.utils.data import SequentialSampler
from transformers import PreTrainedTokenizerFast, TrainerCallback

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
SYMBOLS = [chr(ord("a") + i) for i in range(20)]
VOCAB_SIZE = len(SPECIALS) + len(SYMBOLS)
PER_DEVICE_BATCH = 3  # B of the exactness checks: B per micro-batch / per process against one batch of 2B


def symbol_tokenizer() -> PreTrainedTokenizerFast:
    """Whitespace-separated symbols, one token each, `</s>` appended; special ids as in vaswani_mt's tokenizers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(SPECIALS + SYMBOLS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


def make_model(seed: int = 0) -> VaswaniForConditionalGeneration:
    """The "tiny" preset (d_model 32, 2+2 layers) with every dropout off, seeded."""
    torch.manual_seed(seed)
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0, attention_dropout=0.0,
                                       activation_dropout=0.0)
    return VaswaniForConditionalGeneration(config)


def make_examples(count: int, seed: int, lengths: tuple[int, int] = (2, 12)) -> list[dict]:
    """`count` examples `{"input_ids", "labels"}` (each ending in `</s>`) with distinct sources; source and target
    lengths drawn independently from `lengths` (inclusive, `</s>` excluded)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = lengths
    examples, seen = [], set()
    while len(examples) < count:
        src_len, tgt_len = torch.randint(low, high + 1, (2,), generator=generator).tolist()
        src = torch.randint(len(SPECIALS), VOCAB_SIZE, (src_len,), generator=generator).tolist() + [EOS]
        tgt = torch.randint(len(SPECIALS), VOCAB_SIZE, (tgt_len,), generator=generator).tolist() + [EOS]
        if tuple(src) not in seen:
            seen.add(tuple(src))
            examples.append({"input_ids": src, "labels": tgt})
    return examples


def accumulation_examples(per_batch: int = 3) -> list[dict]:
    """`2 * per_batch` examples: the first `per_batch` short, the rest long, so the two halves (micro-batches, or
    the two ranks' batches) hold very different numbers of target tokens. Averaging per-half mean losses would
    then differ from the mean over all tokens of the whole batch by several percent."""
    short = make_examples(per_batch, seed=11, lengths=(2, 4))
    long = make_examples(per_batch, seed=12, lengths=(9, 14))
    return short + long


def to_dataset(examples: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(examples)


class ExampleIndex:
    """Maps a (padded) row of `input_ids` back to the index of its example."""

    def __init__(self, examples: list[dict]):
        self._index = {tuple(example["input_ids"]): i for i, example in enumerate(examples)}

    def ids(self, input_ids: torch.Tensor) -> list[int]:
        found = []
        for row in input_ids.tolist():
            while row and row[-1] == PAD:
                row.pop()
            found.append(self._index[tuple(row)])
        return found


def pad_collator(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pads `input_ids` with <pad> (and builds `attention_mask`) and `labels` with -100, to the batch's
    longest row. `VaswaniTrainer.compute_loss` makes `decoder_input_ids` from the labels."""
    src_len = max(len(f["input_ids"]) for f in features)
    tgt_len = max(len(f["labels"]) for f in features)
    input_ids = torch.full((len(features), src_len), PAD)
    attention_mask = torch.zeros((len(features), src_len), dtype=torch.long)
    labels = torch.full((len(features), tgt_len), -100)
    for row, feature in enumerate(features):
        src, tgt = feature["input_ids"], feature["labels"]
        input_ids[row, : len(src)] = torch.tensor(src)
        attention_mask[row, : len(src)] = 1
        labels[row, : len(tgt)] = torch.tensor(tgt)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_args(output_dir: str, **overrides) -> VaswaniTrainingArguments:
    """Quiet CPU arguments: no saving, no evaluation during training, a log entry every step, clipping that never
    binds (so it cannot hide a wrong gradient scale), label smoothing on."""
    settings = dict(
        output_dir=output_dir, use_cpu=True, report_to=[], disable_tqdm=True, save_strategy="no",
        eval_strategy="no", logging_steps=1, seed=0, max_grad_norm=1e9, label_smoothing=0.1, warmup_steps=4,
        noam_factor=1.0, dataloader_num_workers=0, ddp_find_unused_parameters=False,
    )
    settings.update(overrides)
    return VaswaniTrainingArguments(**settings)


class RecordingTrainer(VaswaniTrainer):
    """`VaswaniTrainer` that records what every training micro-batch held, and optionally takes the examples in
    dataset order (`sequential=True`) so runs with different batch layouts see the same examples."""

    def __init__(self, *args, example_index: ExampleIndex, sequential: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.example_index = example_index
        self.sequential = sequential
        self.epoch_index = -1
        self.micro_batches: list[dict] = []
        self.add_callback(_EpochCounter(self))

    def _get_train_sampler(self, train_dataset=None):
        if self.sequential:
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)
        return super()._get_train_sampler(train_dataset)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            self.micro_batches.append({
                "epoch": self.epoch_index,
                "step": self.state.global_step,
                "ids": self.example_index.ids(inputs["input_ids"]),
                "input_shape": list(inputs["input_ids"].shape),
                "labels_shape": list(inputs["labels"].shape),
                "target_tokens": int((inputs["labels"] != -100).sum()),
            })
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


class _EpochCounter(TrainerCallback):
    def __init__(self, trainer: RecordingTrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.trainer.epoch_index += 1


class GradientSnapshot(TrainerCallback):
    """Copies every parameter's gradient just before the first optimizer step (after clipping and, under DDP,
    after the all-reduce) and the learning rate each optimizer step actually uses."""

    def __init__(self):
        self.grads: dict[str, torch.Tensor] | None = None
        self.applied_lr: dict[int, float] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.grads is None:
            self.grads = {name: param.grad.detach().clone() for name, param in model.named_parameters()
                          if param.grad is not None}
        self.applied_lr[state.global_step + 1] = float(optimizer.param_groups[0]["lr"])


def one_step(examples: list[dict], output_dir: str, per_device_batch: int, grad_accum: int = 1) -> dict:
    """One optimizer step of the tiny model (seed 0) over `examples` in dataset order. Returns the logged loss and
    grad norm, the gradients before the step, the weights after it and the example ids of each micro-batch."""
    model = make_model(seed=0)
    snapshot = GradientSnapshot()
    trainer = RecordingTrainer(
        model=model,
        args=make_args(output_dir, max_steps=1, per_device_train_batch_size=per_device_batch,
                       gradient_accumulation_steps=grad_accum, warmup_steps=1, noam_factor=0.1),
        train_dataset=to_dataset(examples), data_collator=pad_collator, callbacks=[snapshot],
        example_index=ExampleIndex(examples), sequential=True,
    )
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    weights = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    return {
        "loss": logged["loss"], "grad_norm": logged["grad_norm"], "learning_rate": logged["learning_rate"],
        "grads": snapshot.grads, "weights": weights, "micro_batches": trainer.micro_batches,
        "process_index": trainer.args.process_index, "world_size": trainer.args.world_size,
    }


def token_budget_run(output_dir: str, max_tokens: int = 48, epochs: int = 2, count: int = 41) -> dict:
    """Train `epochs` epochs with token-budget batches (`max_tokens`) over `count` examples of varied lengths;
    return the micro-batches this process trained on and its step count."""
    examples = make_examples(count, seed=2, lengths=(1, 14))
    trainer = RecordingTrainer(
        model=make_model(seed=0),
        args=make_args(output_dir, max_tokens=max_tokens, num_train_epochs=epochs, logging_steps=1000),
        train_dataset=to_dataset(examples), data_collator=pad_collator, example_index=ExampleIndex(examples),
    )
    trainer.train()
    return {"micro_batches": trainer.micro_batches, "global_step": trainer.state.global_step,
            "num_examples": count, "max_tokens": max_tokens, "epochs": epochs,
            "process_index": trainer.args.process_index, "world_size": trainer.args.world_size}


class RowCounter:
    """A `compute_metrics` that reports how many prediction rows it was given and which examples they are."""

    def __init__(self, examples: list[dict]):
        self._labels = {tuple(example["labels"]): i for i, example in enumerate(examples)}
        self.seen: list[list[int]] = []

    def __call__(self, eval_prediction) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        ids = [self._labels[tuple(int(t) for t in row if t not in (-100, PAD))] for row in eval_prediction.label_ids]
        self.seen.append(ids)
        return {"rows": float(len(predictions)), "distinct": float(len(set(ids)))}


def evaluate_rows(output_dir: str, trainer_class=None, count: int = 7, per_device_batch: int = 2) -> dict:
    """`evaluate()` with generation on `count` examples; returns the metrics and the example ids scored."""
    trainer_class = trainer_class or VaswaniTrainer
    examples = make_examples(count, seed=3, lengths=(2, 6))
    counter = RowCounter(examples)
    trainer = trainer_class(
        model=make_model(seed=0),
        args=make_args(output_dir, per_device_eval_batch_size=per_device_batch, generation_num_beams=1,
                       generation_max_length=8),
        eval_dataset=to_dataset(examples), data_collator=pad_collator, compute_metrics=counter,
    )
    metrics = trainer.evaluate()
    return {"metrics": metrics, "seen": counter.seen, "num_examples": count,
            "process_index": trainer.args.process_index, "world_size": trainer.args.world_size}
