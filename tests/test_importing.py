"""Importing the package changes nothing of the process but transformers' registries. In a fresh interpreter, after
`import vaswani_mt` as before it: Python, numpy and torch keep subnormal floats (in the importing thread, a thread
started after the import and torch's worker threads), the environment, torch's default dtype, thread counts and
matrix-product precision are the same, and glibc's malloc still hands a large freed block back to the kernel. What a
training run needs, the run sets for itself; what only a whole process can have, the `vaswani-mt` command sets for
its own (tests/test_shared_cpu.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What the dependencies change when they load is theirs (torch._dynamo, which transformers' models import, sets
# TORCHINDUCTOR_CACHE_DIR): they load before the state is first read.
STATE = r'''
import json, os, sys, threading
import numpy, torch
import transformers.modeling_utils

def floats():
    product = torch.full((1 << 20,), 1e-30) * 1e-9  # 1e-39, below float32's normal range, on torch's threads
    return {
        "python keeps subnormals": sys.float_info.min / 2 != 0.0 and 5e-324 > 0,
        "numpy float32 keeps subnormals": float(numpy.float32(1e-39) * numpy.float32(1.0)) != 0.0,
        "numpy float64 keeps subnormals": float(numpy.float64(5e-324) * 1.0) != 0.0,
        "torch keeps subnormals": bool((product > 0).all()),
    }

def in_a_new_thread():
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(floats()))
    thread.start()
    thread.join()
    return seen

def freed_memory_goes_back():
    """A freed 256 MiB block leaves the process (glibc's default: blocks this large are mmap'ed, then unmapped)."""
    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    block = bytearray(256 << 20)
    held = resident()
    del block
    return held - resident() > 200 << 20

def state():
    return {
        "floats": floats(),
        "floats in a new thread": in_a_new_thread(),
        "environment": dict(os.environ),
        "default dtype": str(torch.get_default_dtype()),
        "threads": torch.get_num_threads(),
        "interop threads": torch.get_num_interop_threads(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "grad enabled": torch.is_grad_enabled(),
        "freed memory goes back": sys.platform != "linux" or freed_memory_goes_back(),
    }

before = state()
IMPORT
after = state()
print(json.dumps({"before": before, "after": after}))
'''


def states_around(statement: str) -> tuple[dict, dict]:
    result = subprocess.run([sys.executable, "-c", STATE.replace("IMPORT", statement)], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    states = json.loads(result.stdout.strip().splitlines()[-1])
    return states["before"], states["after"]


@pytest.mark.parametrize("statement", ["import vaswani_mt", "import vaswani_mt.cli",
                                       "import vaswani_mt.recipe.run"])
def test_importing_the_package_leaves_float_modes_environment_threads_dtype_and_malloc_as_they_were(statement):
    before, after = states_around(statement)
    assert all(before["floats"].values()) and all(before["floats in a new thread"].values())
    assert before["freed memory goes back"]
    assert after == before


def test_importing_the_package_registers_the_model_with_transformers_auto_classes():
    """`import vaswani_mt` alone, then transformers: the Auto classes know model_type "vaswani"."""
    code = ("import vaswani_mt\n"
            "from transformers import AutoConfig, AutoModelForSeq2SeqLM\n"
            "config = AutoConfig.for_model('vaswani', vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,"
            " encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)\n"
            "print(type(AutoModelForSeq2SeqLM.from_config(config)).__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "VaswaniForConditionalGeneration"


def test_the_public_names_load_when_asked_for_and_are_all_listed():
    import vaswani_mt

    assert vaswani_mt.__all__ == vaswani_mt.package.__all__  # listed without loading package.py, the same names
    for name in vaswani_mt.__all__:
        assert getattr(vaswani_mt, name) is getattr(vaswani_mt.package, name)
    assert set(vaswani_mt.__all__) <= set(dir(vaswani_mt))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        vaswani_mt.not_a_name  # noqa: B018
    namespace: dict = {}
    exec("from vaswani_mt import *", namespace)
    assert set(vaswani_mt.__all__) <= set(namespace)
