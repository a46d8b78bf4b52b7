"""Shared fixtures. Tests never touch the network: the Hub is switched off for every test process."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Prepared data (vaswani_mt.data.prepared) goes to a cache of this test session, removed at its end.
_CACHE = tempfile.mkdtemp(prefix="vaswani-mt-test-cache-")
os.environ.setdefault("VASWANI_MT_CACHE", _CACHE)
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(_CACHE, "datasets"))  # the json/csv/parquet builders' files
atexit.register(shutil.rmtree, _CACHE, True)

import pytest  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
# Every device this machine has: tests that take the `device` fixture run once per device, so the same suite proves
# CUDA when it runs on a GPU machine.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MULTI30K_DIR = REPO_ROOT.parent / "shared" / "data" / "multi30k"


def load_script(name: str):
    """scripts/<name>.py as a module, with scripts/ on the path for the modules it imports beside it
    (benchmark_common, averaging_windows)."""
    import importlib.util
    import sys

    scripts = REPO_ROOT / "scripts"
    if str(scripts) not in sys.path:
        sys.path.insert(0, str(scripts))
    spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


def with_the_recipes_decoding(model):
    """The model with the decoding `vaswani-mt train` saves by default (§6.1: beam 4, length penalty 0.6): a model
    built from a config decodes greedily, as every transformers model does until its generation config says more."""
    model.generation_config.num_beams = 4
    model.generation_config.length_penalty = 0.6
    return model


@pytest.fixture
def make_tiny_model():
    """Factory: a tiny VaswaniForConditionalGeneration in eval mode, seeded, with config overrides."""
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

    def make(seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", **overrides)).eval()

    return make


@pytest.fixture
def model_dir(model, tokenizer, tmp_path):
    """The test module's `model` and `tokenizer` saved in a folder, as `vaswani-mt translate` and the demo load them."""
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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


# --- Data layer (issue #3): Multi30k fixtures, each built once per test session -------------------


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The shared Multi30k folder (train/valid/test2016 .en/.de); tests using it skip if it is absent."""
    if not (MULTI30K_DIR / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K_DIR} (expected at ../shared/data/multi30k beside the repo)")
    return MULTI30K_DIR


@pytest.fixture(scope="session")
def multi30k_cleaned(multi30k_dir):
    """``(DatasetDict, CleaningReport)``: Multi30k en-de loaded with the default cleaning."""
    from vaswani_mt.data.cleaning import load_parallel

    return load_parallel(multi30k_dir, "en", "de")


@pytest.fixture(scope="session")
def multi30k_tokenizer_training(multi30k_cleaned):
    """The joint BPE tokenizer (vocab 8000) learned on cleaned Multi30k train, with its training time."""
    import time
    from types import SimpleNamespace

    from vaswani_mt.data.tokenization import train_tokenizer

    started = time.perf_counter()
    tokenizer = train_tokenizer(multi30k_cleaned[0]["train"], vocab_size=8000)
    return SimpleNamespace(tokenizer=tokenizer, seconds=time.perf_counter() - started)


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_tokenizer_training):
    return multi30k_tokenizer_training.tokenizer


@pytest.fixture(scope="session")
def multi30k_tokenized(multi30k_cleaned, multi30k_tokenizer):
    """Multi30k tokenised with ``multi30k_tokenizer``: splits with ``input_ids`` and ``labels``."""
    from vaswani_mt.data.tokenizing import tokenize_dataset

    return tokenize_dataset(multi30k_cleaned[0], multi30k_tokenizer, "en", "de")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tests use tiny models, which run fastest on one thread, and far faster than on two when another process
    (a training run, a second test process) is busy on this 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    """A small BPE tokenizer (tests/tiny_tokenizer.py) with vaswani_mt's special tokens."""
    from tiny_tokenizer import make_tokenizer

    return make_tokenizer()


@pytest.fixture
def model(tokenizer):
    """A tiny model sized to `tokenizer`, seeded, in eval mode, decoding as a trained one
    (`with_the_recipes_decoding`)."""
    from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    return with_the_recipes_decoding(model)
