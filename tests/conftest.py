"""Shared fixtures. Tests never touch the network: the Hub is switched off for every test process."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K_DIR = REPO_ROOT.parent / "shared" / "data" / "multi30k"


@pytest.fixture
def make_tiny_model():
    """Factory: a tiny VaswaniForConditionalGeneration in eval mode, seeded, with config overrides."""
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

    def make(seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", **overrides)).eval()

    return make


@pytest.fixture
def padded_batch():
    """A source/target batch with padding on both sides (pad id 0), ids in the tiny vocabulary."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 128, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    input_ids[attention_mask == 0] = 0
    labels = torch.randint(4, 128, (3, 7), generator=generator)
    labels[0, 5:] = -100
    labels[2, 2:] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
