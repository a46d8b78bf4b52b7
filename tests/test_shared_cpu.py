"""Two runs on one CPU share it: the `vaswani-mt` command makes OpenMP threads that wait for work spin briefly, then
sleep, in its own process, set before torch loads OpenMP, unless the user chose otherwise; a program that imports the
package keeps its environment. The speed it buys is measured by scripts/bench_shared_cpu.py (docs/speed.md), not
here."""

import os
import subprocess
import sys

import pytest

# What pip's console script `vaswani-mt` does: import the command's entry point (then call it)
CONSOLE_SCRIPT = ("import os, sys\n"
                  "from vaswani_mt.cli import main\n"
                  "print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))\n")


def environment(spin: str | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "GOMP_SPINCOUNT"}
    if spin:
        env["GOMP_SPINCOUNT"] = spin
    return env


@pytest.mark.parametrize("preset,expected", [(None, "10000"), ("300000", "300000")])
def test_the_command_shortens_the_spin_of_waiting_openmp_threads_before_torch_loads_unless_the_user_said_otherwise(
        tmp_path, preset, expected):
    script = tmp_path / "vaswani-mt"
    script.write_text(CONSOLE_SCRIPT, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], env=environment(preset), capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["False", expected]


def test_a_program_that_imports_the_package_and_its_command_keeps_its_environment():
    code = "import os, vaswani_mt, vaswani_mt.cli, torch; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=environment(None), capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.split()[-1] == "None"
