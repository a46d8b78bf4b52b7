"""The `vaswani-mt` entry point: its version, and usage errors as argparse tools report them."""

import importlib.metadata

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
