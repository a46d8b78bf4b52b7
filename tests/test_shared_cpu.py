"""Two runs on one CPU share it: vaswani_mt makes OpenMP threads that wait for work spin briefly, then sleep, before
torch loads OpenMP, unless the user chose otherwise. The speed it buys is measured by scripts/bench_shared_cpu.py
(docs/speed.md), not here."""

import os
import subprocess
import sys

import pytest

SCRIPT = "import os, vaswani_mt, torch; print(os.environ.get('GOMP_SPINCOUNT'))"


@pytest.mark.parametrize("preset,expected", [(None, "10000"), ("300000", "300000")])
def test_importing_vaswani_mt_shortens_the_spin_of_waiting_openmp_threads_unless_the_user_said_otherwise(preset,
                                                                                                        expected):
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if preset:
        env["GOMP_SPINCOUNT"] = preset
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == expected


def test_the_package_sets_it_before_it_imports_torch():
    source = open(os.path.join(os.path.dirname(__file__), "..", "vaswani_mt", "__init__.py"), encoding="utf-8").read()
    spin = source.index('os.environ.setdefault("GOMP_SPINCOUNT", "10000")')
    assert spin < source.index("from .package import *") and spin < source.index("from . import package")  # torch
