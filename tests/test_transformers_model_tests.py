"""transformers' own model tests pass over vaswani_mt: `ModelTesterMixin`, `ConfigTester` and `PipelineTesterMixin`
from the source distribution of the installed transformers, run by scripts/run_transformers_tests.py over our tester
(tests/transformers_suite/vaswani_tester.py), as a model inside transformers is tested.

The script downloads that sdist from PyPI once (then reuses it from ~/.cache/vaswani_mt/transformers-tests/); where
the index cannot be reached this test fails, saying so, instead of skipping: CI reaches PyPI. The whole run takes
about a minute on 2 CPU cores.
"""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "run_transformers_tests.py"
SUMMARY_PREFIXES = ("FAILED", "SUBFAILED", "ERROR", "run_transformers_tests:")


def summary(output: str) -> str:
    """The lines that say what went wrong (pytest's FAILED / ERROR lines, the script's own messages) and the last
    one (pytest's counts)."""
    lines = output.splitlines()
    wanted = [line for line in lines if line.startswith(SUMMARY_PREFIXES)]
    return "\n".join(wanted + lines[-1:])


def test_transformers_own_model_tests_pass_on_the_installed_release():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=540)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"scripts/run_transformers_tests.py exited {result.returncode}:\n{summary(output)}\n\n"
        f"--- the end of its output ---\n{output[-6000:]}"
    )
