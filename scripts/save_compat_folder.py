"""Save a small model folder with the installed transformers, and the tokens transformers' own loops decode for it.

    python scripts/save_compat_folder.py tests/fixtures/saved-with-transformers-X.Y

The model is trained for a few seconds to reverse short random sequences, so that what it decodes depends on every
earlier position (a random model repeats one token, whatever its cache holds). Writes the folder as
`save_pretrained` writes it (weights, config.json with auto_map, the model code) plus
`reference.json`: the source batch, and the greedy and beam-4 output of transformers' own loops without a cache
(which depends on nothing but the model's forward), with the transformers and torch versions that computed it.
tests/test_saved_folders.py loads such folders with `trust_remote_code=True` in a process without vaswani_mt under
whatever transformers is installed, and requires exactly these tokens: a folder saved under the lowest supported
transformers must decode the same under the newest, and the reverse. The folders in tests/fixtures were made with
this script under transformers 5.17.0 and 5.24.0 (torch 2.13.0, CPU).
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers

import vaswani_mt  # noqa: F401  (registers the model for the Auto classes: save_pretrained writes auto_map)
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

EOS, PAD = 3, 0
# Small: the folder is a test fixture.
CONFIG = dict(vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
              eos_token_id=EOS, pad_token_id=PAD, norm_style="post", dropout=0.0, attention_dropout=0.0,
              activation_dropout=0.0)
CALLS = {"greedy": dict(num_beams=1, max_new_tokens=12), "beam4": dict(num_beams=4, max_new_tokens=12)}


def reversal_batch(generator: torch.Generator, size: int = 64) -> dict[str, torch.Tensor]:
    """Random sequences of 2-7 tokens + EOS, right-padded, and their reversals as labels."""
    lengths = torch.randint(2, 8, (size,), generator=generator)
    tokens = torch.randint(4, CONFIG["vocab_size"], (size, 7), generator=generator)
    input_ids = torch.full((size, 8), PAD)
    labels = torch.full((size, 8), -100)
    for row, length in enumerate(lengths.tolist()):
        input_ids[row, :length] = tokens[row, :length]
        input_ids[row, length] = EOS
        labels[row, :length] = tokens[row, :length].flip(0)
        labels[row, length] = EOS
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(), "labels": labels}


def trained_model(steps: int = 300) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig(**CONFIG))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = model(**reversal_batch(generator)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def source_batch() -> dict[str, list[list[int]]]:
    batch = reversal_batch(torch.Generator().manual_seed(7), size=6)
    return {"input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.folder.exists():
        print(f"save_compat_folder: {args.folder} exists; give a new folder", file=sys.stderr)
        return 2
    model = trained_model()
    model.save_pretrained(args.folder)
    batch = source_batch()
    inputs = {name: torch.tensor(values) for name, values in batch.items()}
    model.use_fast_decoding = False
    outputs = {name: model.generate(**inputs, use_cache=False, **call).tolist() for name, call in CALLS.items()}
    reference = {"transformers": transformers.__version__, "torch": torch.__version__, "inputs": batch,
                 "calls": CALLS, "outputs": outputs}
    (args.folder / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(f"saved {args.folder} with transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
