"""What `vaswani-mt train` tells its user while it runs and at its end (`vaswani_mt.recipe.progress`,
`vaswani_mt.cli.reporting`); the same output of a real run is checked in tests/test_train_cli.py."""

import io
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from vaswani_mt.cli.reporting import run_summary
from vaswani_mt.recipe import progress as reporting
from vaswani_mt.recipe.progress import TrainingProgress, duration


class Clock:
    """A stand-in for time.perf_counter that the test moves forward."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Loader(list):
    """An evaluation data loader: 3 batches of 10 sentences."""

    dataset = list(range(10))


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(reporting.time, "perf_counter", clock)
    return clock


def _state(step: int, max_steps: int = 100) -> TrainerState:
    return TrainerState(global_step=step, max_steps=max_steps)


def _one_training_log_and_a_test_pass(progress, args, clock):
    """Ten updates in a minute, one logging step, then a test translation of 3 batches of 20 s each."""
    control = TrainerControl()
    progress.on_train_begin(args, _state(0), control)
    clock.now += 60
    progress.on_step_end(args, _state(10), control)
    progress.on_log(args, _state(10), control,
                    logs={"loss": 4.2, "learning_rate": 1e-3, "target_tokens_per_second": 2558.0})
    with progress.stage("test translation"):
        for _ in range(3):
            clock.now += 20
            progress.on_prediction_step(args, _state(10), control, eval_dataloader=Loader([0, 1, 2]))
        progress.on_predict(args, _state(10), control, metrics={"test_bleu": 9.3, "test_chrf": 32.1, "test_loss": 3})


def test_progress_lines_when_stderr_is_not_a_terminal_name_the_step_the_speed_the_eta_and_each_pass(clock, caplog):
    progress = TrainingProgress(every_seconds=30)
    with caplog.at_level(logging.INFO, logger="vaswani_mt.train"):
        _one_training_log_and_a_test_pass(progress, SimpleNamespace(disable_tqdm=True), clock)
    assert [record.getMessage() for record in caplog.records] == [
        "train: 100 updates to go (step 0/100)",
        "train: step 10/100, loss 4.200, lr 1.00e-03, 2,558 target tok/s, elapsed 1 min 00 s, ETA 9 min 00 s",
        "test translation: translating 10 sentences in 3 batches",  # after its first batch
        "test translation: batch 3/3, elapsed 1 min 00 s, ETA 0 s",  # 30 s after the line before
        "test translation: 3 batches in 1 min 00 s, BLEU 9.30, chrF 32.10",
    ]


def test_the_eta_says_when_max_minutes_stops_the_run(clock, caplog):
    progress = TrainingProgress(max_minutes=5)
    args = SimpleNamespace(disable_tqdm=True)
    with caplog.at_level(logging.INFO, logger="vaswani_mt.train"):
        progress.on_train_begin(args, _state(0), TrainerControl())
        clock.now += 60  # 10 of 100 updates in a minute: 9 more minutes by steps, but the stop comes in 4
        progress.on_log(args, _state(10), TrainerControl(), logs={"loss": 4.0})
    assert caplog.records[0].getMessage().endswith("training.max_minutes 5 min 00 s")
    assert caplog.records[-1].getMessage().endswith("ETA 4 min 00 s (training.max_minutes)")


def test_labelled_progress_bars_on_a_terminal(clock, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _one_training_log_and_a_test_pass(TrainingProgress(), SimpleNamespace(disable_tqdm=False), clock)
    shown = terminal.getvalue()
    assert "train:  10%" in shown and "10/100, loss 4.200" in shown and "2,558 target tok/s, elapsed 1 min 00 s, " \
        "ETA 9 min 00 s" in shown
    assert "test translation:   0%" in shown and "0/3 [" in shown  # tqdm redraws at most every 0.1 s


def test_install_replaces_the_trainers_own_display(model, tokenizer, tmp_path):
    from transformers import PrinterCallback, ProgressCallback

    from vaswani_mt.recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments

    for disable_tqdm in (True, False):
        args = VaswaniTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, disable_tqdm=disable_tqdm)
        trainer = VaswaniTrainer(model=model, args=args, processing_class=tokenizer)
        progress = TrainingProgress().install(trainer)
        callbacks = trainer.callback_handler.callbacks
        assert progress in callbacks
        assert not any(isinstance(c, (PrinterCallback, ProgressCallback)) for c in callbacks)


METRICS = {
    "training": {"steps": 3006},
    "selection": {"chosen": "best_checkpoint", "best_checkpoint": "runs/x/checkpoints/checkpoint-3000"},
    "test": {"split": "test2016", "bleu": 35.76, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a",
             "chrf": 59.42, "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6",
             "bleu_lowercased_moses_tokenized": 36.1, "bleu_lowercased_moses_tokenized_signature": "nrefs:1|case:lc"},
}


def test_the_summary_names_the_model_the_test_scores_with_signatures_the_time_and_the_next_commands():
    summary = run_summary(METRICS, Path("runs/my run"), 5101, ("en", "de"))
    assert summary.splitlines()[0] == "finished in 1 h 25 min (3006 updates)"
    assert "runs/my run/model  (best checkpoint checkpoint-3000)" in summary
    assert "test2016      BLEU 35.76  nrefs:1|case:mixed|eff:no|tok:13a" in summary
    assert "chrF 59.42  nrefs:1|case:mixed|eff:yes|nc:6" in summary
    assert "lowercased Moses-tokenized BLEU 36.10  nrefs:1|case:lc" in summary
    assert "vaswani-mt translate 'runs/my run/model' --input sentences.en > sentences.de" in summary
    assert "vaswani-mt export --to ctranslate2 'runs/my run/model' 'runs/my run'/ct2" in summary
    assert "vaswani-mt push 'runs/my run' YOUR-NAME/MODEL-NAME --dry-run" in summary


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (4.4, 65, 3599, 5101, 5090.4)] == ["4 s", "1 min 05 s", "59 min 59 s", "1 h 25 min",
                                                              "1 h 25 min"]
