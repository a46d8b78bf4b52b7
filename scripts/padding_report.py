"""How much padding does token-budget batching leave, against batches of randomly ordered sentences?

Loads Multi30k (cleaned), learns the joint BPE tokenizer on its training split, tokenises it, and
prints the padding share of TokenBudgetBatchSampler at a token budget beside two baselines with the
same budget and the same greedy packing: fairseq's (source, target) length order, and random order.
With --bpe-dropout P, also one epoch of our batches with their pieces split (training.bpe_dropout): the tokens
gained, the padding, the largest padded batch against the budget, and the time the splitting takes per batch.

    python scripts/padding_report.py [--data-dir ../shared/data/multi30k] [--max-tokens 4096] [--bpe-dropout 0.1]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "multi30k"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="folder with train.en/train.de")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096], help="token budget(s) per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bpe-dropout", type=float, help="also our batches with BPE-dropout at this probability")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    import datasets

    from vaswani_mt.data.batching import TokenBudgetBatchSampler, pack_by_token_budget, padding_stats
    from vaswani_mt import load_parallel, tokenize_dataset
    from vaswani_mt.data.tokenization import train_tokenizer

    datasets.disable_progress_bars()
    started = time.perf_counter()
    corpus, report = load_parallel(args.data_dir, args.src_lang, args.tgt_lang, splits=["train"])
    tokenizer = train_tokenizer(corpus["train"], vocab_size=args.vocab_size)
    train = tokenize_dataset(corpus, tokenizer, args.src_lang, args.tgt_lang)["train"]
    print(f"{report['train'].summary()}")
    print(f"tokenizer: joint BPE, {len(tokenizer)} tokens; prepared in {time.perf_counter() - started:.1f} s")

    for max_tokens in args.max_tokens:
        sampler = TokenBudgetBatchSampler.from_dataset(train, max_tokens=max_tokens, seed=args.seed)
        src, tgt = sampler.src_lengths, sampler.tgt_lengths
        fairseq_order = TokenBudgetBatchSampler(src, tgt, max_tokens=max_tokens, seed=args.seed, sort_by="source")
        random_order = np.random.default_rng(args.seed).permutation(len(src))
        rows = {
            "token-budget sampler (ours)": padding_stats(list(sampler), src, tgt),
            "fairseq (source, target) order": padding_stats(list(fairseq_order), src, tgt),
            "random order, same budget": padding_stats(
                pack_by_token_budget(random_order, src, tgt, max_tokens), src, tgt
            ),
        }
        print(
            f"\nmax_tokens={max_tokens} per side, {len(src)} pairs, "
            f"{int(src.sum())} source + {int(tgt.sum())} target tokens"
        )
        print(f"{'batching':32} {'padding':>8} {'source':>8} {'target':>8} {'batches':>8} {'pairs/batch':>12}")
        for name, stats in rows.items():
            print(
                f"{name:32} {stats['padding_share']:8.2%} {stats['src_padding_share']:8.2%} "
                f"{stats['tgt_padding_share']:8.2%} {stats['num_batches']:8d} {stats['mean_batch_size']:12.1f}"
            )
        if args.bpe_dropout:
            bpe_dropout_report(train, tokenizer, sampler, max_tokens, args.bpe_dropout, args.seed)


def bpe_dropout_report(train, tokenizer, sampler, max_tokens: int, p: float, seed: int) -> None:
    """One epoch of `sampler`'s batches fetched through BpeDropout, as the trainer fetches them."""
    from vaswani_mt.data.batching import padding_stats
    from vaswani_mt.data.bpe_dropout import BpeDropout, merge_halves

    for bound, what in ((max_tokens, "as the trainer fetches them"), (None, "without the batch bound")):
        split = BpeDropout(train, merge_halves(tokenizer), p, seed=seed, epoch_of=sampler, max_tokens=bound)
        batches, seconds, rows = list(sampler), 0.0, {}
        for batch in batches:
            plain = train.__getitems__(batch)
            started = time.perf_counter()
            rows.update(zip(batch, split.split_rows(batch, plain)))
            seconds += time.perf_counter() - started
        src = np.array([len(rows[i]["input_ids"]) for i in range(len(train))])
        tgt = np.array([len(rows[i]["labels"]) for i in range(len(train))])
        stats = padding_stats(batches, src, tgt)
        largest = max(len(b) * max(max(src[b]), max(tgt[b])) for b in batches)
        print(f"BPE-dropout {p:g}, {what}: {int(src.sum())} source (+{src.sum() / sampler.src_lengths.sum() - 1:.1%}) "
              f"and {int(tgt.sum())} target tokens (+{tgt.sum() / sampler.tgt_lengths.sum() - 1:.1%}); padding "
              f"{stats['padding_share']:.2%}; largest padded side {largest} tokens ({largest / max_tokens:.2f}x the "
              f"budget); splitting {1000 * seconds / len(batches):.1f} ms per batch")


if __name__ == "__main__":
    main()
