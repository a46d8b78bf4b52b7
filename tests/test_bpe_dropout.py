"""BPE-dropout (training.bpe_dropout, vaswani_mt/data/bpe_dropout.py): training pieces split into the halves their
merge joined, drawn from (seed, epoch, example), the text unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset

from vaswani_mt.data.bpe_dropout import BpeDropout, merge_halves, row_keys, split_pieces
from vaswani_mt.data.tokenization import train_tokenizer
from vaswani_mt.data.tokenizing import tokenize_dataset

SENTENCES = [
    "a dog runs through the green park.", "two men are playing football on the grass.",
    "the black cat sleeps on a red sofa.", "a woman rides her bike down the busy street.",
    "children play together in the white snow.", "a man is cooking dinner in the kitchen.",
    "ein hund rennt durch den grünen park.", "zwei männer spielen fußball auf dem rasen.",
    "die schwarze katze schläft auf dem roten sofa.", "eine frau fährt mit dem fahrrad die straße entlang.",
]


class Epoch:
    def __init__(self, epoch: int = 0):
        self.epoch = epoch


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(SENTENCES * 3, vocab_size=400, min_frequency=2)


@pytest.fixture(scope="module")
def pairs(tokenizer):
    english, german = SENTENCES[:5], SENTENCES[6:]
    rows = [{"translation": {"en": e, "de": g}} for e, g in zip(english * 4, german * 4)]
    return tokenize_dataset(Dataset.from_list(rows), tokenizer, "en", "de")


def test_each_merged_piece_maps_to_the_two_pieces_that_spell_it_and_characters_bytes_and_specials_to_none(tokenizer):
    halves = merge_halves(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merged = np.flatnonzero(halves[:, 0] >= 0)
    assert merged.size > 50
    for made in merged:
        left, right = halves[made]
        assert tokens[left] + tokens[right] == tokens[made]
    for special in ("<pad>", "<unk>", "<s>", "</s>", "<0x41>", "a"):
        assert tuple(halves[tokenizer.convert_tokens_to_ids(special)]) == (-1, -1)


def test_no_dropout_keeps_the_pieces_and_full_dropout_spells_the_same_text_in_characters(tokenizer):
    halves, keys = merge_halves(tokenizer), row_keys(seed=1, epoch=0, indices=[0], column=0)
    for sentence in SENTENCES:
        ids = tokenizer(sentence).input_ids
        assert split_pieces([ids], halves, 0.0, keys) == [ids]
        [characters] = split_pieces([ids], halves, 0.999999, keys)
        assert tokenizer.decode(characters, skip_special_tokens=True) == sentence
        assert all(halves[piece, 0] < 0 for piece in characters) and characters[-1] == tokenizer.eos_token_id
        assert len(characters) > len(ids)


def test_a_piece_is_split_with_the_dropout_probability(tokenizer):
    halves = merge_halves(tokenizer)
    # pieces whose two halves are characters: each split adds exactly one piece
    pairs_of_characters = [i for i in range(len(tokenizer)) if halves[i, 0] >= 0 and (halves[halves[i], 0] < 0).all()]
    ids = pairs_of_characters * (20_000 // len(pairs_of_characters))
    for seed in (1, 2):
        [split] = split_pieces([ids], halves, 0.1, row_keys(seed, epoch=0, indices=[0], column=0))
        assert 0.09 < (len(split) - len(ids)) / len(ids) < 0.11


def test_a_rows_draws_depend_on_its_key_alone_not_on_the_rows_beside_it(tokenizer):
    halves = merge_halves(tokenizer)
    rows = [tokenizer(sentence).input_ids for sentence in SENTENCES]
    keys = row_keys(seed=1, epoch=0, indices=range(len(rows)), column=1)
    together = split_pieces(rows, halves, 0.3, keys)
    assert [split_pieces([row], halves, 0.3, keys[i:i + 1])[0] for i, row in enumerate(rows)] == together
    assert together != split_pieces(rows, halves, 0.3, row_keys(seed=1, epoch=1, indices=range(len(rows)), column=1))
    assert together != split_pieces(rows, halves, 0.3, row_keys(seed=1, epoch=0, indices=range(len(rows)), column=0))


def test_a_rows_pieces_are_drawn_from_seed_epoch_and_index_whatever_batch_it_is_fetched_in(tokenizer, pairs):
    """(Without a token budget: with one, a batch of more rows leaves each row less room.)"""
    epoch = Epoch(0)
    split = BpeDropout(pairs, merge_halves(tokenizer), 0.3, seed=1, epoch_of=epoch)
    alone, in_a_batch = split[7], split.__getitems__([3, 7, 11])[1]
    assert alone == in_a_batch and split[7] == alone
    assert BpeDropout(pairs, merge_halves(tokenizer), 0.3, seed=2, epoch_of=epoch)[7] != alone
    epoch.epoch = 1
    assert split[7] != alone


def test_split_rows_read_as_the_same_sentences_and_end_in_eos(tokenizer, pairs):
    split = BpeDropout(pairs, merge_halves(tokenizer), 0.3, seed=1, epoch_of=Epoch(0))
    longer = 0
    for index in range(len(pairs)):
        row, original = split[index], pairs[index]
        for column in ("input_ids", "labels"):
            assert tokenizer.decode(row[column], skip_special_tokens=True) == \
                tokenizer.decode(original[column], skip_special_tokens=True)
            assert row[column][-1] == tokenizer.eos_token_id
            longer += len(row[column]) > len(original[column])
    assert longer > len(pairs)  # most rows of either side


def test_no_row_grows_past_the_models_positions(tokenizer, pairs):
    lengths = [max(len(row["input_ids"]), len(row["labels"])) for row in pairs]
    split = BpeDropout(pairs, merge_halves(tokenizer), 0.999999, seed=1, epoch_of=Epoch(0), max_length=max(lengths) + 2)
    for index in range(len(pairs)):
        row = split[index]
        for column in ("input_ids", "labels"):
            assert len(pairs[index][column]) <= len(row[column]) <= max(lengths) + 2
            assert tokenizer.decode(row[column]) == tokenizer.decode(pairs[index][column])


def test_a_batchs_padded_size_stays_within_the_token_budget_and_the_pieces_dropout_adds(tokenizer, pairs):
    batch = list(range(8))
    unsplit = max(len(pairs[i][c]) for i in batch for c in ("input_ids", "labels")) * len(batch)
    for p in (0.3, 0.9):
        split = BpeDropout(pairs, merge_halves(tokenizer), p, seed=1, epoch_of=Epoch(0), max_tokens=unsplit)
        rows = split.__getitems__(batch)
        for column in ("input_ids", "labels"):
            assert len(batch) * max(len(row[column]) for row in rows) <= unsplit * (1 + p)
            texts = [tokenizer.decode(row[column]) for row in rows]
            assert texts == [tokenizer.decode(pairs[i][column]) for i in batch]
        assert sum(len(row["labels"]) for row in rows) > sum(len(pairs[i]["labels"]) for i in batch)


def test_bpe_dropout_needs_a_bpe_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    word_level = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    with pytest.raises(ValueError, match="needs a BPE tokenizer; this one's model is 'WordLevel'"):
        merge_halves(word_level)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_a_dropout_outside_zero_to_one_is_refused_by_the_config_and_the_trainer(tmp_path, value):
    from vaswani_mt.recipe.config import ConfigError, load_run_config
    from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

    with pytest.raises(ConfigError, match=r"training\.bpe_dropout must be in \[0, 1\)"):
        load_run_config("multi30k-en-de", {"data.path": str(tmp_path), "training.bpe_dropout": value})
    with pytest.raises(ValueError, match=r"bpe_dropout must be in \[0, 1\)"):
        VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_tokens=64,
                                 bpe_dropout=value)


def test_the_trainer_refuses_bpe_dropout_without_token_budget_batches(tmp_path):
    from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

    with pytest.raises(ValueError, match="bpe_dropout needs max_tokens"):
        VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], bpe_dropout=0.1)


def test_the_trainers_batches_hold_the_same_sentences_split_anew_each_epoch(tmp_path, tokenizer, pairs):
    from transformers import DataCollatorForSeq2Seq

    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer)))
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def epochs(dropout: float) -> list[list[list[tuple[str, tuple[int, ...]]]]]:
        """Per epoch, per batch, each row's target text and pieces."""
        args = VaswaniTrainingArguments(output_dir=str(tmp_path / str(dropout)), use_cpu=True, report_to=[],
                                        max_tokens=120, bpe_dropout=dropout, seed=3)
        loader = VaswaniTrainer(model=model, args=args, train_dataset=pairs, processing_class=tokenizer,
                                data_collator=collator).get_train_dataloader()
        seen = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            rows = [[[t for t in row if t >= 0] for row in batch["labels"].tolist()] for batch in loader]
            seen.append([[(tokenizer.decode(r, skip_special_tokens=True), tuple(r)) for r in b] for b in rows])
        return seen

    def texts(epoch):
        return [[text for text, _ in batch] for batch in epoch]

    def pieces(epoch):
        return sorted(row for batch in epoch for row in batch)

    plain, dropped = epochs(0.0), epochs(0.3)
    assert texts(dropped[0]) == texts(plain[0]) and texts(dropped[1]) == texts(plain[1])  # same sentences, batches
    assert pieces(plain[0]) == pieces(plain[1]) and pieces(dropped[0]) != pieces(dropped[1])  # split anew
    assert sum(len(p) for _, p in pieces(dropped[0])) > sum(len(p) for _, p in pieces(plain[0]))  # into more pieces


def test_a_card_names_bpe_dropout_only_when_the_run_had_it():
    from vaswani_mt.publishing.model_card import _recipe_rows

    assert dict(_recipe_rows({"bpe_dropout": 0.1}))["BPE-dropout"].startswith("p = 0.1: training pieces split")
    assert "BPE-dropout" not in dict(_recipe_rows({"bpe_dropout": 0.0}))


def test_the_trainer_needs_its_tokenizer_to_split_pieces(tmp_path, pairs):
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    args = VaswaniTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_tokens=120,
                                    bpe_dropout=0.1)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=400))
    trainer = VaswaniTrainer(model=model, args=args, train_dataset=pairs)
    with pytest.raises(ValueError, match=r"bpe_dropout needs the trainer's tokenizer \(processing_class\)"):
        trainer.get_train_dataloader()
