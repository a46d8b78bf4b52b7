"""Tokenising a cleaned parallel corpus: ``tokenize_dataset`` turns the ``translation`` column into unpadded
``input_ids`` and ``labels`` ending in ``</s>``."""

from __future__ import annotations

import logging
from typing import Any

from datasets import Dataset, DatasetDict

from .reading import TRANSLATION_COLUMN, DataError, arrow_column
from .tokenization import EOS_ID

logger = logging.getLogger(__name__)



def max_length_problem(max_length: int | None) -> str | None:
    """The one rule of a length limit: room for one token and </s> (None: no limit)."""
    if max_length is not None and max_length < 2:
        return f"max_length must be at least 2 (one token and </s>), got {max_length!r}"
    return None


def check_max_length(max_length: int | None) -> None:
    if problem := max_length_problem(max_length):
        raise ValueError(problem)


def truncate(rows: list[list[int]], max_length: int | None, eos_id: int | None = EOS_ID) -> list[bool]:
    """Cut, in place, every token list longer than `max_length` to `max_length` tokens ending in `eos_id`, the
    tokenizer's </s> (the model must still see where the sentence ends; a tokenizer without one: just cut); which
    rows were cut."""
    cut = [max_length is not None and len(ids) > max_length for ids in rows]
    for row, is_cut in enumerate(cut):
        if is_cut:
            rows[row] = rows[row][: max_length - 1] + [eos_id] if eos_id is not None else rows[row][:max_length]
    return cut


def _tokenize_batch(
    batch: dict[str, list], tokenizer: Any, src_lang: str, tgt_lang: str,
    max_length: int | None, with_attention_mask: bool,
) -> dict[str, list]:
    pairs = batch[TRANSLATION_COLUMN]
    encoded = tokenizer(
        [pair[src_lang] for pair in pairs],
        text_target=[pair[tgt_lang] for pair in pairs],
        truncation=False,
        return_attention_mask=False,
    )
    input_ids, labels = encoded["input_ids"], encoded["labels"]
    eos_id = tokenizer.eos_token_id
    truncated = [a or b for a, b in zip(truncate(input_ids, max_length, eos_id), truncate(labels, max_length, eos_id))]
    result = {"input_ids": input_ids, "labels": labels, "_truncated": truncated}
    if with_attention_mask:
        result["attention_mask"] = [[1] * len(ids) for ids in input_ids]
    return result


def tokenize_dataset(
    dataset: DatasetDict | Dataset,
    tokenizer: Any,
    src_lang: str,
    tgt_lang: str,
    max_length: int | None = None,
    num_proc: int | None = None,
    with_attention_mask: bool = False,
    batch_size: int = 1000,
) -> DatasetDict | Dataset:
    """Tokenise the ``translation`` column of every split into ``input_ids`` and ``labels``.

    Both end with ``</s>`` and are *not padded*: pad per batch with
    ``DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)``, which also builds the
    ``attention_mask`` (so none is stored unless ``with_attention_mask=True``). The ``translation``
    column is removed. Lengths for :class:`~vaswani_mt.data.batching.TokenBudgetBatchSampler` are read from
    the two columns.

    Each split is tokenised once with a batched ``Dataset.map``; datasets backed by cache files (e.g.
    from the Hub or ``load_from_disk``) reuse the cached result on the next run. ``num_proc`` > 1 runs
    several processes, which pays off only for large corpora (the Rust tokenizer is already fast).

    ``max_length`` (None: no limit) truncates longer sequences to ``max_length`` tokens ending in
    ``</s>``; how many examples were truncated is logged as a warning per split.
    """
    if isinstance(dataset, Dataset):
        return _tokenize_split(dataset, "dataset", tokenizer, src_lang, tgt_lang, max_length, num_proc,
                               with_attention_mask, batch_size)
    return DatasetDict(
        {
            split: _tokenize_split(ds, split, tokenizer, src_lang, tgt_lang, max_length, num_proc,
                                   with_attention_mask, batch_size)
            for split, ds in dataset.items()
        }
    )


def _tokenize_split(
    dataset: Dataset, split: str, tokenizer: Any, src_lang: str, tgt_lang: str, max_length: int | None,
    num_proc: int | None, with_attention_mask: bool, batch_size: int,
) -> Dataset:
    if TRANSLATION_COLUMN not in dataset.column_names:
        raise DataError(f"{split}: no 'translation' column to tokenise (columns: {dataset.column_names})")
    check_max_length(max_length)
    tokenized = dataset.map(
        _tokenize_batch,
        batched=True,
        batch_size=batch_size,
        fn_kwargs={"tokenizer": tokenizer, "src_lang": src_lang, "tgt_lang": tgt_lang,
                   "max_length": max_length, "with_attention_mask": with_attention_mask},
        remove_columns=dataset.column_names,
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        desc=f"Tokenizing {split}",
    )
    truncated = sum(arrow_column(tokenized, "_truncated"))
    if truncated:
        logger.warning(
            "%s: truncated %d of %d examples to max_length=%d tokens", split, truncated, len(tokenized), max_length
        )
    return tokenized.remove_columns(["_truncated"])

