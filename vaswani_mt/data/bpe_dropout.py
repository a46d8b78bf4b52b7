"""BPE-dropout (Provilkov et al. 2020, "BPE-Dropout: Simple and Effective Subword Regularization"): the training
pairs' pieces are split, at random and anew each epoch, into the pieces their BPE merge joined, so the model meets
each word in several segmentations and learns how its pieces compose.

Provilkov et al. drop each merge with probability p at every step of segmenting a word. Here the deterministic
segmentation, the one the data was tokenised with, is undone from the top: each piece is split into the two pieces of
the merge that made it with probability p, and each half again with p, so a piece stays whole with probability 1 - p
and the pieces that come out are always in the vocabulary. Working on token ids, it needs neither the text nor the
tokenizer while training, and leaves the prepared data as it is. Each draw is a hash of (seed, epoch, example, side,
round, place): a rerun or a resumed run sees the pieces the first run did, and a whole batch is split in a few array
operations.

    halves = merge_halves(tokenizer)
    train = BpeDropout(train, halves, p=0.1, seed=1, epoch_of=sampler)    # sampler.epoch: the current epoch
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

SPLIT_COLUMNS = ("input_ids", "labels")  # the source and target pieces, both split (Provilkov et al.'s best setting)


class EpochSource(Protocol):
    epoch: int


def merge_halves(tokenizer: Any) -> np.ndarray:
    """For each token id, the ids of the two pieces whose BPE merge made it (``[id, 2]``; -1 for a piece no merge
    made: characters, bytes, special tokens). `tokenizer`: a transformers fast tokenizer over a BPE model."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    model = json.loads(backend.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"bpe_dropout needs a BPE tokenizer; this one's model is {model.get('type')!r}")
    vocab: dict[str, int] = model["vocab"]
    size = max(len(tokenizer), max(vocab.values()) + 1)
    halves = np.full((size, 2), -1, dtype=np.int64)
    for merge in model["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge  # tokenizers < 0.20 wrote "a b"
        made = vocab.get(left + right)
        if made is not None and halves[made, 0] < 0:  # a piece two merges make: split as the first (top-ranked) one
            halves[made] = vocab[left], vocab[right]
    return halves


_STEP = np.uint64(0x9E3779B97F4A7C15)  # the golden ratio's 64 bits, SplitMix64's increment


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: 64 well-mixed bits from any 64 bits (uint64 arithmetic wraps)."""
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def row_keys(seed: int, epoch: int, indices: Sequence[int], column: int) -> np.ndarray:
    """One key per row: the stream of draws of row `indices[i]`'s `column` (0: source, 1: target) in `epoch`."""
    with np.errstate(over="ignore"):
        base = _mix(np.array([(seed * 4 + column) % 2**64], dtype=np.uint64))
        base ^= _mix(np.array([epoch % 2**64], dtype=np.uint64) + _STEP)
        return _mix(base + np.asarray(indices, dtype=np.uint64) * _STEP)


def split_pieces(rows: Sequence[Sequence[int]], halves: np.ndarray, p: float, keys: np.ndarray,
                 limits: np.ndarray | None = None) -> list[list[int]]:
    """Each row of token ids with every piece a merge made split into its two halves with probability `p`, and each
    new half again with `p`, until a round splits nothing. A piece's draw depends only on its row's key, the round and
    its place in the row, so a row comes out the same whatever rows it is split beside. `limits`: the most pieces
    each row may grow to (a row at its limit splits no further: its first drawn splits, left to right, are kept)."""
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    if not lengths.sum():
        return [list(row) for row in rows]
    pieces = np.concatenate([np.asarray(row, dtype=np.int64) for row in rows])
    owner = np.repeat(np.arange(len(rows)), lengths)
    fresh = np.ones(pieces.size, dtype=bool)  # pieces not yet drawn for
    for round_ in range(64):  # a piece is split at most once a round, and no piece has 64 levels of merges
        row_starts = np.cumsum(lengths) - lengths
        place = np.arange(pieces.size) - np.repeat(row_starts, lengths)
        with np.errstate(over="ignore"):
            bits = _mix(keys[owner] + (np.uint64(round_) << np.uint64(32) | place.astype(np.uint64)) * _STEP)
        draws = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        split = fresh & (halves[pieces, 0] >= 0) & (draws < p)
        if limits is not None:  # the row's splits of this round, counted left to right, within its room
            counted = np.cumsum(split)
            before = np.concatenate(([0], counted))[row_starts]
            split &= counted - before[owner] <= (limits - lengths)[owner]
        if not split.any():
            break
        counts = np.where(split, 2, 1)
        starts = np.cumsum(counts) - counts
        grown = np.repeat(pieces, counts)
        grown[starts[split]] = halves[pieces[split], 0]
        grown[starts[split] + 1] = halves[pieces[split], 1]
        fresh = np.zeros(grown.size, dtype=bool)
        fresh[starts[split]] = fresh[starts[split] + 1] = True
        lengths = lengths + np.bincount(owner[split], minlength=len(rows))
        owner, pieces = np.repeat(owner, counts), grown
    return [row.tolist() for row in np.split(pieces, np.cumsum(lengths)[:-1])]


class BpeDropout:
    """A tokenized training split (rows with ``input_ids`` and ``labels``) whose rows come out with their pieces split
    (`split_pieces`), drawn from (`seed`, ``epoch_of.epoch``, row index). Map-style: ``len``, ``[i]``, and
    ``__getitems__`` for whole batches, as torch's DataLoader fetches them.

    No row grows past `max_length` (the model's positions end there) and, fetched as a batch, past `max_tokens` x
    (1 + p) / rows: the batch's padded size stays within the token budget plus the p more pieces that dropout brings
    on average. Without that bound the longest split row sets every row's padded length: on Multi30k at p 0.1 and
    4,096 tokens a batch's padding went from 4 % to 25 % and its largest side to 1.86x the budget (docs/data.md)."""

    def __init__(self, dataset, halves: np.ndarray, p: float, seed: int, epoch_of: EpochSource,
                 max_length: int | None = None, max_tokens: int | None = None):
        # p is checked where the setting enters (recipe/rules.py: the run config, VaswaniTrainingArguments)
        self.dataset, self.halves, self.p, self.seed = dataset, halves, p, seed
        self.epoch_of, self.max_length, self.max_tokens = epoch_of, max_length, max_tokens

    def __len__(self) -> int:
        return len(self.dataset)

    def split_rows(self, indices: Sequence[int], rows: list[dict]) -> list[dict]:
        """Rows `indices` of the split (`rows`: their unsplit content), drawn for the current epoch."""
        rows = [dict(row) for row in rows]
        limit = min(self.max_length or np.iinfo(np.int64).max,
                    int(self.max_tokens * (1 + self.p)) // len(rows) if self.max_tokens else np.iinfo(np.int64).max)
        for column, name in enumerate(SPLIT_COLUMNS):
            keys = row_keys(self.seed, self.epoch_of.epoch, indices, column)
            unsplit = [row[name] for row in rows]
            limits = np.maximum([len(pieces) for pieces in unsplit], limit)  # a row already longer stays as it is
            for row, pieces in zip(rows, split_pieces(unsplit, self.halves, self.p, keys, limits)):
                row[name] = pieces
        for row in rows:
            if "attention_mask" in row:  # a mask kept with the data: as long as the pieces
                row["attention_mask"] = [1] * len(row["input_ids"])
        return rows

    def __getitem__(self, index: int) -> dict:
        return self.split_rows([index], [self.dataset[index]])[0]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        fetch = getattr(self.dataset, "__getitems__", None)
        return self.split_rows(indices, fetch(indices) if fetch is not None else [self.dataset[i] for i in indices])


__all__ = ["BpeDropout", "SPLIT_COLUMNS", "merge_halves", "row_keys", "split_pieces"]
