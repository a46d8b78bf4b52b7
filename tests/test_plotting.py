"""Schedule and training-curve figures."""

import builtins
import sys

import pytest

pytest.importorskip("matplotlib")

from vaswani_mt.cli.plot_schedule import main as plot_schedule_command  # noqa: E402
from vaswani_mt.recipe import plots as plotting  # noqa: E402
from vaswani_mt.recipe.plots import plot_schedule, plot_training_curves  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

LOG_HISTORY = [  # shaped like transformers.Trainer.state.log_history
    {"loss": 5.1, "grad_norm": 2.0, "learning_rate": 1e-4, "epoch": 0.1, "step": 10},
    {"loss": 4.2, "grad_norm": 1.5, "learning_rate": 2e-4, "epoch": 0.2, "step": 20},
    {"eval_loss": 4.0, "eval_bleu": 3.5, "eval_runtime": 1.0, "epoch": 0.2, "step": 20},
    {"loss": 3.9, "grad_norm": 1.2, "learning_rate": 1.8e-4, "epoch": 0.3, "step": 30},
    {"eval_loss": 3.7, "eval_bleu": 6.0, "eval_runtime": 1.0, "epoch": 0.4, "step": 40},
    {"train_runtime": 10.0, "train_loss": 4.4, "epoch": 0.4, "step": 40},
]


def _assert_png(path):
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_schedule_plot_is_written_as_png(tmp_path):
    out = plot_schedule([(512, 4000), (512, 8000), (256, 4000)], tmp_path / "figs" / "noam.png", num_steps=2000)
    assert out == tmp_path / "figs" / "noam.png"
    _assert_png(out)


def test_schedule_plot_needs_at_least_one_pair(tmp_path):
    with pytest.raises(ValueError):
        plot_schedule([], tmp_path / "noam.png")


def test_training_curves_write_one_png_per_available_series(tmp_path):
    written = plot_training_curves(LOG_HISTORY, tmp_path)
    assert [p.name for p in written] == ["learning_rate.png", "train_loss.png", "eval_loss.png", "eval_bleu.png"]
    for path in written:
        _assert_png(path)


def test_training_curves_skip_series_that_were_never_logged(tmp_path):
    loss_and_eval_loss_only = [
        {"loss": 5.0, "epoch": 0.1, "step": 10},
        {"eval_loss": 4.0, "epoch": 0.1, "step": 10},
        {"train_runtime": 1.0, "train_loss": 5.0, "step": 10},
    ]
    written = plot_training_curves(loss_and_eval_loss_only, tmp_path)
    assert [p.name for p in written] == ["train_loss.png", "eval_loss.png"]
    assert plot_training_curves([], tmp_path / "empty") == []


def test_plotting_leaves_pyplot_state_alone(tmp_path):
    plot_schedule([(512, 4000)], tmp_path / "noam.png", num_steps=100)
    if "matplotlib.pyplot" in sys.modules:  # only inspect pyplot if something else imported it
        assert sys.modules["matplotlib.pyplot"].get_fignums() == []


def test_missing_matplotlib_gives_install_hint(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def import_without_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", import_without_matplotlib)
    with pytest.raises(ImportError, match=r'pip install "vaswani-mt\[plot\]"'):
        plotting.plot_schedule([(512, 4000)], tmp_path / "noam.png")


@pytest.mark.parametrize("option", [["--pair", "512:0"], ["--pair", "0:4000"], ["--steps", "0"], ["--factor", "-1"]])
def test_plot_schedule_refuses_zero_and_negative_values_in_one_line(tmp_path, capsys, option):
    with pytest.raises(SystemExit) as exit_info:
        plot_schedule_command([*option, "--out", str(tmp_path / "s.png")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "must be positive" in err or "two positive integers" in err
    assert "Traceback" not in err and not (tmp_path / "s.png").exists()


def test_plot_schedule_says_where_it_wrote_and_its_help_names_the_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert plot_schedule_command(["--pair", "256:800", "--steps", "50"]) == 0
    captured = capsys.readouterr()
    _assert_png(tmp_path / "noam_schedule.png")
    assert captured.err == f"wrote {tmp_path / 'noam_schedule.png'} (1 curve)\n" and captured.out == ""
    with pytest.raises(SystemExit):
        plot_schedule_command(["--help"])
    assert "noam_schedule.png in the current folder" in " ".join(capsys.readouterr().out.split())
