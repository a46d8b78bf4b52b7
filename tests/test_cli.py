"""The `vaswani-mt` entry point: its version, and usage errors as argparse tools report them."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import vaswani_mt
from vaswani_mt import __version__
from vaswani_mt.cli import main


def test_version_prints_the_installed_version(capsys):
    assert main(["--version"]) == 0
    printed = capsys.readouterr().out
    assert printed == f"vaswani-mt {importlib.metadata.version('vaswani-mt')}\n"
    assert printed == f"vaswani-mt {__version__}\n"  # the package and its metadata agree
    assert main(["-V"]) == 0 and capsys.readouterr().out == printed


def test_the_bare_command_exits_2_with_usage_on_stderr(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: vaswani-mt <command>") and "translate" in captured.err
    assert captured.err.rstrip().endswith("vaswani-mt: error: a command is required")


def test_help_is_usage_on_stdout_and_exit_0(capsys):
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: vaswani-mt <command>")


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_answer_without_importing_torch_transformers_or_datasets(option):
    """`python -X importtime` lists every module the command imported (on stderr)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "vaswani_mt.cli", option], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0 and result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "vaswani_mt.cli" in imported
    assert not imported & {"torch", "transformers", "datasets", "vaswani_mt.package"}


def test_a_command_runs_with_the_package_as_import_vaswani_mt_gives_it(tmp_path):
    """Under the command the package loads when a command runs: the model is registered with the Auto classes."""
    code = ("import sys; sys.argv = ['vaswani-mt', 'plot-schedule', '--help']\n"
            "import vaswani_mt, vaswani_mt.cli\n"
            "assert 'torch' not in sys.modules\n"
            "try:\n    vaswani_mt.cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "from transformers import AutoConfig\n"
            "print(type(AutoConfig.for_model('vaswani')).__name__, vaswani_mt.VaswaniConfig.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("VaswaniConfig VaswaniConfig")


@pytest.mark.parametrize("argv,interpreter_argv,command", [
    (["/usr/local/bin/vaswani-mt", "train"], ["python", "/usr/local/bin/vaswani-mt", "train"], True),
    (["-m", "--help"], ["python", "-X", "importtime", "-m", "vaswani_mt.cli", "--help"], True),
    (["-m", "--config", "x"], ["python", "-u", "-m", "vaswani_mt.cli.train", "--config", "x"], True),  # torchrun
    (["-m"], ["python", "-Bmvaswani_mt.cli"], True),
    (["-m", "-q"], ["python", "-m", "pytest", "-q"], False),
    (["-m"], ["python", "-m", "vaswani_mt.client"], False),
    (["train.py"], ["python", "train.py"], False),
    (["-c"], ["python", "-c", "import vaswani_mt"], False),
], ids=["console-script", "python-m", "torchrun-m-train", "combined-options", "other-module", "other-name", "script",
        "command-string"])
def test_the_package_tells_that_it_starts_the_command_from_how_the_interpreter_was_started(
        monkeypatch, argv, interpreter_argv, command):
    """While `python -m` imports the packages of the module it runs, `sys.argv[0]` is "-m"."""
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", interpreter_argv)
    assert vaswani_mt._running_the_command() is command
