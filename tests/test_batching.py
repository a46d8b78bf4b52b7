"""Token-budget batching: budget per side, each example once per epoch, seeded order, rank sharding."""

from collections import Counter

import numpy as np
import pytest
import torch
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq

from vaswani_mt.data.batching import TokenBudgetBatchSampler, pack_by_token_budget, padding_stats


def random_lengths(n=3000, seed=0, high=80):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, high, n)
    tgt = np.clip((src * rng.uniform(0.6, 1.5, n)).astype(int), 1, None)
    return src, tgt


def assert_within_budget(batches, src, tgt, max_tokens):
    for batch in batches:
        assert len(batch) * max(src[i] for i in batch) <= max_tokens
        assert len(batch) * max(tgt[i] for i in batch) <= max_tokens


def greedy_one_by_one(order, src, tgt, max_tokens, max_sentences=None):
    """Reference: add examples one at a time, close the batch when the next one does not fit."""
    batches, current, longest_src, longest_tgt = [], [], 0, 0
    for index in order:
        new_src, new_tgt = max(longest_src, src[index]), max(longest_tgt, tgt[index])
        size = len(current) + 1
        too_many = max_sentences is not None and size > max_sentences
        if current and (size * new_src > max_tokens or size * new_tgt > max_tokens or too_many):
            batches.append(current)
            current, new_src, new_tgt = [], src[index], tgt[index]
        current.append(int(index))
        longest_src, longest_tgt = new_src, new_tgt
    return batches + ([current] if current else [])


def test_no_batch_exceeds_the_token_budget_on_either_side():
    src, tgt = random_lengths()
    for max_tokens in (120, 257, 1000, 4096):
        sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=max_tokens, seed=3)
        assert_within_budget(list(sampler), src, tgt, max_tokens)


def test_padding_to_a_multiple_stays_within_the_budget():
    src, tgt = random_lengths()
    for max_tokens in (257, 1000, 4096):
        sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=max_tokens, seed=3, pad_to_multiple_of=8)
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(len(src)))
        assert_within_budget(batches, -(-src // 8) * 8, -(-tgt // 8) * 8, max_tokens)


def test_every_example_appears_exactly_once_per_epoch():
    src, tgt = random_lengths()
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = [i for batch in sampler for i in batch]
        assert sorted(seen) == list(range(len(src)))


def test_batch_order_changes_with_the_epoch_and_repeats_for_the_same_seed_and_epoch():
    src, tgt = random_lengths()
    first = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=7)
    second = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=7)
    epoch0 = list(first)
    first.set_epoch(1)
    epoch1 = list(first)
    assert epoch0 != epoch1
    assert list(second) == epoch0
    second.set_epoch(1)
    assert list(second) == epoch1
    other_seed = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=8)
    assert list(other_seed) != epoch0


def test_batches_are_runs_of_the_length_sorted_order_and_their_count_is_fixed():
    src, tgt = random_lengths()
    longest = np.maximum(src, tgt)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=1000, seed=0)
    for epoch in range(4):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        # Sorted by the longer side: the length bands of two batches meet at most at one value.
        bands = sorted((longest[batch].min(), longest[batch].max()) for batch in batches)
        for (_, high), (low, _) in zip(bands, bands[1:]):
            assert high <= low


def test_packing_is_greedy_in_the_given_order():
    src, tgt = random_lengths(n=2000, seed=5, high=40)
    order = np.random.default_rng(5).permutation(len(src))
    for max_tokens, max_sentences in ((60, None), (300, None), (300, 7), (1000, 50)):
        assert pack_by_token_budget(order, src, tgt, max_tokens, max_sentences) == greedy_one_by_one(
            order, src, tgt, max_tokens, max_sentences
        )


def test_packing_without_target_lengths_budgets_the_source_side_only():
    # translate_stream's use: sentences sorted longest first, no targets yet; a sentence over budget stands alone.
    src, _ = random_lengths(n=2000, seed=6, high=120)
    order = np.argsort(-src, kind="stable")
    for max_tokens in (1, 60, 100, 2048):
        batches = pack_by_token_budget(order, src, None, max_tokens)
        assert batches == greedy_one_by_one(order, src, src, max_tokens)
        assert [i for batch in batches for i in batch] == order.tolist()
        assert all(len(batch) == 1 or len(batch) * src[batch[0]] <= max_tokens for batch in batches)


def test_max_sentences_caps_the_batch_size():
    src = tgt = np.full(100, 3)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=1000, max_sentences=16, seed=0)
    assert max(len(batch) for batch in sampler) == 16
    assert sum(len(batch) for batch in sampler) == 100


@pytest.mark.parametrize("num_replicas", [2, 3, 4, 8])
def test_distributed_ranks_get_disjoint_batches_and_the_same_number_of_steps(num_replicas):
    src, tgt = random_lengths(n=1001, seed=num_replicas)
    samplers = [
        TokenBudgetBatchSampler(src, tgt, max_tokens=700, seed=11, num_replicas=num_replicas, rank=rank)
        for rank in range(num_replicas)
    ]
    for epoch in (0, 1):
        per_rank = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
        steps = {len(batches) for batches in per_rank}
        assert steps == {len(samplers[0])}  # equal step counts, matching __len__
        seen = [i for batches in per_rank for batch in batches for i in batch]
        assert sorted(seen) == list(range(len(src)))  # disjoint, and every example exactly once
        for batches in per_rank:
            assert_within_budget(batches, src, tgt, 700)


def test_unsharded_sampler_under_accelerate_batch_sampler_shard_gives_each_rank_its_batches():
    # Trainer under DDP wraps the DataLoader's batch sampler in accelerate's BatchSamplerShard.
    from accelerate.data_loader import BatchSamplerShard

    src, tgt = random_lengths(n=777, seed=4)
    world = 3
    everything = TokenBudgetBatchSampler(src, tgt, max_tokens=600, seed=5, num_replicas=world, shard=False)
    assert len(everything) % world == 0
    for rank in range(world):
        own = TokenBudgetBatchSampler(src, tgt, max_tokens=600, seed=5, num_replicas=world, rank=rank)
        wrapped = BatchSamplerShard(everything, num_processes=world, process_index=rank)
        assert len(wrapped) == len(own)
        assert list(wrapped) == list(own)


def test_ranks_repeat_batches_only_when_there_are_too_few_examples_to_split():
    src = tgt = np.array([5, 5, 5])
    samplers = [TokenBudgetBatchSampler(src, tgt, max_tokens=100, num_replicas=4, rank=r) for r in range(4)]
    per_rank = [list(sampler) for sampler in samplers]
    assert [len(batches) for batches in per_rank] == [1, 1, 1, 1]
    counts = Counter(i for batches in per_rank for batch in batches for i in batch)
    assert set(counts) == {0, 1, 2}
    assert sorted(counts.values()) == [1, 1, 2]  # one padding repeat fills the fourth rank


def test_rank_and_world_size_default_to_a_single_process():
    src, tgt = random_lengths(n=50)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=400)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


def test_example_larger_than_the_budget_raises_naming_its_index_and_lengths():
    src = [3, 4, 40, 5]
    tgt = [3, 50, 4, 6]
    with pytest.raises(ValueError) as error:
        TokenBudgetBatchSampler(src, tgt, max_tokens=32)
    message = str(error.value)
    assert "2 example(s) exceed max_tokens=32" in message
    assert "index 1 (source 4 tokens, target 50 tokens)" in message
    assert "index 2 (source 40 tokens, target 4 tokens)" in message


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError, match="src_lengths has 2 entries but tgt_lengths has 3"):
        TokenBudgetBatchSampler([1, 2], [1, 2, 3], max_tokens=10)
    with pytest.raises(ValueError, match="rank must be in"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        TokenBudgetBatchSampler([1], [1], max_tokens=0)
    with pytest.raises(ValueError, match="negative length"):
        TokenBudgetBatchSampler([1, -1], [1, 1], max_tokens=10)
    with pytest.raises(ValueError, match="sort_by must be"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, sort_by="random")


def test_without_shuffle_batches_come_shortest_first_and_the_same_every_epoch():
    src, tgt = random_lengths(n=500)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=600, shuffle=False)
    epoch0 = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == epoch0
    longest = [max(max(src[i], tgt[i]) for i in batch) for batch in epoch0]
    assert longest == sorted(longest)


def test_fairseq_source_order_is_available():
    src, tgt = random_lengths(n=500)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=600, sort_by="source", shuffle=False)
    batches = list(sampler)
    assert_within_budget(batches, src, tgt, 600)
    order = [i for batch in batches for i in batch]
    assert [(src[i], tgt[i]) for i in order] == sorted(zip(src, tgt))


def test_empty_dataset_gives_no_batches():
    sampler = TokenBudgetBatchSampler([], [], max_tokens=100)
    assert len(sampler) == 0 and list(sampler) == []


def test_from_dataset_reads_the_lengths_of_input_ids_and_labels():
    ds = Dataset.from_dict({"input_ids": [[5, 3], [5, 6, 7, 3], [3]], "labels": [[8, 8, 8, 3], [3], [9, 3]]})
    sampler = TokenBudgetBatchSampler.from_dataset(ds, max_tokens=64, seed=2)
    assert sampler.src_lengths.tolist() == [2, 4, 1]
    assert sampler.tgt_lengths.tolist() == [4, 1, 2]
    selected = TokenBudgetBatchSampler.from_dataset(ds.select([2, 0]), max_tokens=64)  # honours indices
    assert selected.src_lengths.tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"no column\(s\) \['labels'\]"):
        TokenBudgetBatchSampler.from_dataset(ds.remove_columns("labels"), max_tokens=64)


def test_padding_stats_counts_real_and_padded_tokens():
    stats = padding_stats([[0, 1], [2]], src_lengths=[2, 4, 3], tgt_lengths=[1, 1, 5])
    assert stats["real_tokens"] == 2 + 4 + 3 + 1 + 1 + 5
    assert stats["padded_tokens"] == 2 * 4 + 3 + 2 * 1 + 5
    assert stats["pad_tokens"] == 2
    assert stats["padding_share"] == pytest.approx(2 / 18)
    assert stats["src_padding_share"] == pytest.approx(2 / 11)
    assert stats["tgt_padding_share"] == 0
    assert (stats["num_batches"], stats["mean_batch_size"]) == (2, 1.5)


def test_dataloader_with_the_seq2seq_collator_gives_padded_batches_within_budget(
    multi30k_tokenized, multi30k_tokenizer
):
    valid = multi30k_tokenized["valid"]
    max_tokens = 512
    sampler = TokenBudgetBatchSampler.from_dataset(valid, max_tokens=max_tokens, seed=0)
    collator = DataCollatorForSeq2Seq(multi30k_tokenizer, label_pad_token_id=-100)
    loader = DataLoader(valid, batch_sampler=sampler, collate_fn=collator)
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert sum(batch["input_ids"].shape[0] for batch in batches) == len(valid)
    for batch in batches:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        assert batch["input_ids"].numel() <= max_tokens and batch["labels"].numel() <= max_tokens
        assert torch.equal(batch["input_ids"] == 0, batch["attention_mask"] == 0)  # padded with <pad>=0
        assert ((batch["labels"] == 3).sum(dim=1) == 1).all()  # one </s> per target, then -100 padding
        assert not (batch["labels"] == 0).any()


def test_padding_share_on_multi30k_train_is_below_10_percent_at_4096_tokens(multi30k_tokenized):
    train = multi30k_tokenized["train"]
    sampler = TokenBudgetBatchSampler.from_dataset(train, max_tokens=4096, seed=0)
    src, tgt = sampler.src_lengths, sampler.tgt_lengths
    ours = padding_stats(list(sampler), src, tgt)
    random_order = np.random.default_rng(0).permutation(len(train))
    baseline = padding_stats(pack_by_token_budget(random_order, src, tgt, 4096), src, tgt)
    print(
        f"\nMulti30k train, max_tokens=4096: token-budget sampler {ours['padding_share']:.2%} padding "
        f"in {ours['num_batches']} batches; random-order baseline {baseline['padding_share']:.2%} "
        f"in {baseline['num_batches']} batches"
    )
    assert ours["padding_share"] < 0.10
    assert ours["num_batches"] < baseline["num_batches"]
    assert baseline["padding_share"] > 3 * ours["padding_share"]
