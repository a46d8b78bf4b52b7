"""`training.budget_minutes`: the run measures its machine, plans its updates to end within the budget and lays its
schedule over them, the rate at 0 at the last update (vaswani_mt.recipe.budget)."""

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_train_cli import CPU_ENV, KILL_AT, REPO, run_train, small_corpus, tiny_config  # noqa: F401 (a fixture)
from transformers import TrainerControl, TrainerState

from vaswani_mt.publishing.model_card import render_model_card
from vaswani_mt.recipe.budget import (AFTER_TRAINING_SECONDS, BudgetPlanner, Pace, saves_between, updates_that_fit,
                                      validations_between)
from vaswani_mt.recipe.config import ConfigError, load_run_config
from vaswani_mt.recipe.schedule import NoamLR, noam_lr
from vaswani_mt.recipe.trainer import VaswaniTrainer
from vaswani_mt.run_record import TimeBudgetPlan

# logging every update: the rate of every update is in the log (and the run plans at every update)
BUDGET_RUN = dict(max_steps=None, num_epochs=1000, cooldown_steps=0.2, warmup_steps=4, eval_steps=40,
                  logging_steps=1, keep_checkpoints=3, average_last=2)


# -- the arithmetic of a plan ------------------------------------------------------------------------------------------

def test_validations_come_every_eval_steps_and_once_more_at_an_end_off_that_grid():
    assert validations_between(0, 100, 40) == 3  # 40, 80 and the end at 100
    assert validations_between(0, 120, 40) == 3  # 40, 80, 120
    assert validations_between(50, 120, 40) == 2
    assert validations_between(0, 100, None) == 0


def test_the_updates_that_fit_are_the_most_whose_updates_validations_and_aftermath_fit_the_seconds_left():
    pace = Pace(seconds_per_update=1.0, seconds_per_validation=10.0)
    # 100 s for n updates, 10 s per validation (every 40, and one at an end off that grid) and 5 s after training:
    assert updates_that_fit(100, 0, pace, 40, after_training=5, cap=10 ** 6) == 75  # 75 + 2 * 10 + 5; 76 needs 101
    assert updates_that_fit(100, 0, pace, 40, after_training=5, cap=50) == 50  # max_steps caps the plan
    assert updates_that_fit(100, 60, pace, 40, after_training=5, cap=10 ** 6) == 125  # 65 + 3 * 10 + 5 after 60 done
    assert updates_that_fit(3, 7, pace, 40, after_training=5, cap=10 ** 6) == 7  # nothing fits any more


# -- planning while the run goes: the real planner and schedule replayed on a clock the test moves ------------------

class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Replay:
    updates: int
    rates: list[float]  # the rate each update ran at
    rate_after: float  # the rate after the last update
    training_ended: float  # seconds from the budget's start
    ended: float  # the run's end: training, then the passes after it
    planner: BudgetPlanner
    scheduler: NoamLR


def replay(update_seconds, budget_minutes=80.0, cooldown_steps=0.22, warmup_steps=800, eval_steps=500,
           validation_seconds=20.0, probe=None, before_training=60.0, after_training=1, test_passes=1.0,
           logging_steps=50, max_steps=10 ** 9) -> Replay:
    """A budgeted run through `BudgetPlanner` and `NoamLR`, the Trainer's events in the Trainer's order, on a clock
    the test moves: the k-th update takes `update_seconds(k)` seconds, a validation and its checkpoint
    `validation_seconds` (a number or a function of the update), the data and the probe `before_training`, and after
    training the passes the plan counts (the average's validation and the test translation) at the last validation's
    cost, plus the fixed seconds the plan keeps for saving. Defaults: multi30k-en-de as shipped."""
    clock = _Clock()
    per_validation = validation_seconds if callable(validation_seconds) else (lambda k: validation_seconds)
    started, clock.now = clock.now, clock.now + before_training
    planner = BudgetPlanner(budget_minutes, cooldown_steps, started=started, after_training=after_training,
                            test_passes=test_passes, test_sentences=1000 if test_passes else None,
                            pace=probe or Pace(update_seconds(1), per_validation(1), per_validation(1)), clock=clock)
    assert planner.fit_problem(eval_steps, max_steps) is None
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, d_model=128, warmup_steps=warmup_steps, factor=0.64)
    args = SimpleNamespace(eval_steps=eval_steps, logging_steps=logging_steps, save_steps=eval_steps,
                           save_strategy="steps")
    state, control = TrainerState(max_steps=max_steps), TrainerControl()
    planner.on_train_begin(args, state, control, lr_scheduler=scheduler)
    rates, last_validation = [], per_validation(1)
    while not control.should_training_stop:
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        clock.now += update_seconds(state.global_step + 1)
        state.global_step += 1
        # as the Trainer's DefaultFlowCallback, before the planner's on_step_end
        control.should_training_stop = state.global_step >= state.max_steps
        control.should_evaluate = bool(eval_steps) and (state.global_step % eval_steps == 0
                                                        or control.should_training_stop)
        planner.on_step_end(args, state, control, lr_scheduler=scheduler)
        if control.should_evaluate:
            last_validation = per_validation(state.global_step)
            clock.now += last_validation
            planner.on_evaluate(args, state, control)
            planner.on_save(args, state, control)
    planner.on_train_end(args, state, control)
    training_ended = clock.now - started
    test = test_passes * (planner.test_kept / 1000 if planner.test_kept is not None else 1)
    ended = training_ended + (after_training + test) * last_validation + AFTER_TRAINING_SECONDS
    return Replay(state.global_step, rates, optimizer.param_groups[0]["lr"], training_ended, ended, planner,
                  scheduler)


def _fall_length(run: Replay) -> int:
    """The updates from the first that ran below the Noam rate to the last."""
    noam = [noam_lr(k, 128, run.scheduler.warmup_steps, run.scheduler.factor) for k in range(1, run.updates + 1)]
    first = next(k for k, (rate, full) in enumerate(zip(run.rates, noam)) if rate < full * (1 - 1e-9))
    return run.updates - first


def _within_the_last_five_percent(run: Replay, budget_minutes: float = 80.0) -> bool:
    return 0.95 * budget_minutes * 60 <= run.ended <= budget_minutes * 60


def _ends_at_rate_zero_with_no_update_at_zero(run: Replay) -> bool:
    return run.rate_after == 0.0 and min(run.rates) > 0.0


STEADY = 0.74  # seconds per update of multi30k-en-de in float32 on 2 Zen 4 cores


def _pace_trace() -> dict[int, float]:
    """The seconds per update of each logged window of a real run (tests/fixtures: multi30k-en-de as shipped,
    float32, 2 cores of an AMD EPYC Zen 3 with AVX2 only), and its validations' seconds."""
    rows = json.loads((Path(__file__).parent / "fixtures" / "pace-avx2-epyc-multi30k-en-de.json").read_text())["rows"]
    windows, validations, last = {}, {}, (1, 0.0)
    for row in rows:
        if "validation_seconds" in row:
            validations[row["step"]] = row["validation_seconds"]
        else:
            windows[row["step"]] = (row["seconds"] - last[1]) / (row["step"] - last[0]) if row["step"] > 1 else 0
        last = (row["step"], row["seconds"])
    return windows, validations


def test_a_steady_machine_uses_its_budget_and_the_shipped_schedule():
    run = replay(lambda k: STEADY)
    assert _within_the_last_five_percent(run) and _ends_at_rate_zero_with_no_update_at_zero(run)
    assert run.scheduler.warmup_steps == 800 and run.scheduler.cooldown_start == run.updates - round(0.22 * run.updates)
    assert run.planner.plans[0]["why"] == "first plan, from a probe of this machine"


def test_the_cooldown_rates_fall_linearly_to_zero_after_the_last_update_from_the_noam_rate():
    run = replay(lambda k: STEADY)
    fall, total = run.scheduler.cooldown_start, run.updates
    assert run.rates[:fall + 1] == [noam_lr(k, 128, 800, 0.64) for k in range(1, fall + 2)]
    for k in (fall + 2, total):
        assert run.rates[k - 1] == pytest.approx(noam_lr(k, 128, 800, 0.64) * (total - k + 1) / (total - fall))


@pytest.mark.parametrize("at", [0.6, 0.9])
def test_a_one_off_stall_costs_the_run_about_its_own_seconds_of_training(at):
    steady = replay(lambda k: STEADY)
    stall_at = round(at * steady.updates)
    stalled = replay(lambda k: STEADY + (15.0 if k == stall_at else 0.0))
    assert _within_the_last_five_percent(stalled) and _ends_at_rate_zero_with_no_update_at_zero(stalled)
    assert (steady.updates - stalled.updates) * STEADY <= 15.0 + 2 * STEADY
    assert stalled.scheduler.cooldown_start >= steady.scheduler.cooldown_start - 30  # the fall kept its length


def test_ten_slow_updates_cost_the_run_about_their_own_seconds():
    steady = replay(lambda k: STEADY)
    stalled = replay(lambda k: 3 * STEADY if 3990 < k <= 4000 else STEADY)  # 14.8 s lost
    assert _within_the_last_five_percent(stalled) and _ends_at_rate_zero_with_no_update_at_zero(stalled)
    assert (steady.updates - stalled.updates) * STEADY <= 14.8 + 2 * STEADY


def test_a_machine_twice_as_slow_from_half_way_still_ends_within_its_budget_at_rate_zero():
    steady = replay(lambda k: STEADY)
    half = steady.updates // 2
    slower = replay(lambda k: STEADY if k <= half else 2 * STEADY,
                    validation_seconds=lambda k: 20.0 if k <= half else 40.0)
    assert _within_the_last_five_percent(slower) and _ends_at_rate_zero_with_no_update_at_zero(slower)
    assert half < slower.updates < steady.updates


def test_a_machine_twice_as_fast_from_half_way_uses_the_time_it_gains():
    steady = replay(lambda k: STEADY)
    half = steady.updates // 2
    faster = replay(lambda k: STEADY if k <= half else STEADY / 2,
                    validation_seconds=lambda k: 20.0 if k <= half else 10.0)
    assert _within_the_last_five_percent(faster) and _ends_at_rate_zero_with_no_update_at_zero(faster)
    assert faster.updates > 1.4 * steady.updates


def test_a_fall_shortened_by_a_slow_spell_lengthens_again_when_the_machine_recovers():
    steady = replay(lambda k: STEADY)
    spell = range(round(0.85 * steady.updates), round(0.85 * steady.updates) + 100)
    run = replay(lambda k: 3 * STEADY if k in spell else STEADY)
    assert _within_the_last_five_percent(run) and _ends_at_rate_zero_with_no_update_at_zero(run)
    shortened = [plan["updates"] for plan in run.planner.plans if "shortened" in plan["why"]]
    assert shortened and run.updates > shortened[-1]
    assert (steady.updates - run.updates) * STEADY <= 100 * 2 * STEADY + 2 * STEADY  # about the spell's own seconds
    assert all(later <= earlier for earlier, later in zip(run.rates[spell.start:], run.rates[spell.start + 1:]))


def test_the_run_record_gives_where_the_rate_first_fell_though_a_replan_inside_the_fall_re_laid_it():
    steady = replay(lambda k: STEADY)
    spell = range(round(0.85 * steady.updates), round(0.85 * steady.updates) + 100)
    run = replay(lambda k: 3 * STEADY if k in spell else STEADY)  # the fall shortened, then lengthened again
    began = run.updates - _fall_length(run) - 1  # the fall's origin: its first update still runs at the Noam rate
    assert run.scheduler.cooldown_start > began  # the schedule's own fall, as last re-laid, starts later
    trainer = SimpleNamespace(budget_planner=run.planner, lr_scheduler=run.scheduler, state=None)
    assert VaswaniTrainer.time_budget_facts(trainer)["fall_from"] == began
    record = TimeBudgetPlan(**VaswaniTrainer.time_budget_facts(trainer))
    assert record.fall_start() == began  # what the card reads
    assert TimeBudgetPlan(cooldown_from=4745, plans=record.plans).fall_start() == began  # an older record
    older = run.planner.state()  # resumed after training ended, from a checkpoint saved before the planner kept
    del older["attributes"]["fall_from"]  # the fall's start: its logged plans give it
    resumed = SimpleNamespace(budget_planner=BudgetPlanner(80, 0.22), lr_scheduler=None,
                              state=TrainerState(max_steps=run.updates, stateful_callbacks={"BudgetPlanner": older}))
    assert VaswaniTrainer.time_budget_facts(resumed)["fall_from"] == began


def test_the_run_record_gives_where_the_rate_first_fell_though_no_logged_plan_laid_the_fall_there_even_resumed():
    steady = replay(lambda k: STEADY)
    run = replay(lambda k: STEADY if k < steady.updates // 2 else 0.97 * STEADY)  # re-plans too small to be logged
    began = run.updates - _fall_length(run) - 1
    trainer = SimpleNamespace(budget_planner=run.planner, lr_scheduler=run.scheduler, state=None)
    record = TimeBudgetPlan(**VaswaniTrainer.time_budget_facts(trainer))
    assert TimeBudgetPlan(plans=record.plans).fall_start() != began  # the logged plans alone lay it elsewhere
    assert record.fall_from == record.fall_start() == began
    # a run resumed after its training ended has no schedule: its last checkpoint's planner state says it
    checkpoint = TrainerState(max_steps=run.updates, stateful_callbacks={"BudgetPlanner": run.planner.state()})
    resumed = SimpleNamespace(budget_planner=BudgetPlanner(80, 0.22), lr_scheduler=None, state=checkpoint)
    assert VaswaniTrainer.time_budget_facts(resumed)["fall_from"] == began


def test_the_pace_of_a_real_laptop_class_run_replays_within_its_budget():
    windows, validations = _pace_trace()
    steps = sorted(windows)

    def seconds(k: int) -> float:  # the mean of the window that holds update k; past the trace, its last window
        return windows[next((step for step in steps if step >= k), steps[-1])] or windows[steps[1]]

    run = replay(seconds, validation_seconds=lambda k: validations.get(k, 20.0),
                 probe=Pace(1.108, 6.0, 9.0))
    assert _within_the_last_five_percent(run) and _ends_at_rate_zero_with_no_update_at_zero(run)
    assert _fall_length(run) >= 0.2 * run.updates  # the rate fell over about the configured 22 %


def test_a_short_budget_shortens_the_warmup_keeping_its_peak_and_cuts_the_test_translation():
    # --quick on a laptop-class CPU: 3 minutes, 1.1 s per update, validations of 100 sentences
    run = replay(lambda k: 1.1, budget_minutes=3, cooldown_steps=0.22, warmup_steps=50, eval_steps=100000,
                 validation_seconds=6.0, probe=Pace(1.1, 6.0, 9.0), before_training=40, test_passes=10.0,
                 logging_steps=10)
    assert run.ended <= 180 and _ends_at_rate_zero_with_no_update_at_zero(run)
    assert run.scheduler.warmup_steps == round(0.25 * run.updates) < 50
    assert run.scheduler.peak_lr() == pytest.approx(noam_lr(50, 128, 50, 0.64))
    assert 0 < run.planner.test_kept < 1000
    first = run.planner.plans[0]["why"]
    assert "the warm-up shortened from 50 to" in first and "the test translation cut to its first" in first


def test_an_integer_cooldown_longer_than_the_plan_keeps_the_warmup_and_its_peak():
    run = replay(lambda k: STEADY, budget_minutes=15, cooldown_steps=2000, warmup_steps=200)
    assert run.scheduler.warmup_steps == 200 and max(run.rates) == pytest.approx(noam_lr(200, 128, 200, 0.64))
    assert run.scheduler.cooldown_start == 200 and _ends_at_rate_zero_with_no_update_at_zero(run)
    assert "the cool-down cut from 2,000 to" in run.planner.plans[0]["why"]


def test_checkpoints_saved_without_a_validation_are_counted_in_the_plan():
    clock = _Clock()
    planner = BudgetPlanner(10, started=clock(), pace=Pace(1.0, 0.0), clock=clock)
    planner.save_seconds = 5.0
    # 600 s less the margin (12 s) and the 10 s after training: n updates and a 5-s save every 20 (none validated)
    assert planner.updates_fitting(0, eval_steps=None, cap=10 ** 6, save_steps=20) == 463  # 463 + 23 * 5 = 578
    assert saves_between(0, 100, 20, 40) == 3  # 20, 60, 100: 40 and 80 save with their validation


def test_passes_after_training_count_at_the_length_limit_until_the_run_has_measured_a_validation():
    # a run that validates only at its end (--quick) translates with a model that repeats a word up to the limit
    clock = _Clock()
    planner = BudgetPlanner(10, started=clock(), after_training=3, pace=Pace(1.0, 10.0, 40.0), clock=clock)
    # 600 s less the margin (12 s), 10 s after training and its 3 passes; one validation at the end (10 s)
    assert planner.updates_fitting(0, eval_steps=1000, cap=10 ** 6) == 600 - 12 - 10 - 3 * 40 - 10
    planner.validation_seconds = 12.0  # measured: a validation during training, and the passes after it
    assert planner.updates_fitting(0, eval_steps=1000, cap=10 ** 6) == 600 - 12 - 10 - 3 * 12 - 12


def test_the_pace_is_the_median_of_the_last_updates_so_a_few_slow_ones_do_not_move_it():
    planner = BudgetPlanner(80, pace=Pace(1.0, 0.0))
    planner.update_seconds = [1.0] * 40 + [15.0] + [3.0] * 9
    assert planner.measured_pace().seconds_per_update == 1.0
    planner.update_seconds = [1.0] * 20 + [2.0] * 30  # a change that lasts more than half the window
    assert planner.measured_pace().seconds_per_update == 2.0


# -- rules: in the config, before any work ------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    ({"training.budget_minutes": 0}, "training.budget_minutes must be > 0, got 0"),
    ({"training.cooldown_steps": 1.5, "training.budget_minutes": 5},
     "training.cooldown_steps must be a number of updates or a fraction of the run (below 1), got 1.5"),
    ({"training.cooldown_steps": 0.2, "training.max_steps": None, "training.budget_minutes": None},
     "training.cooldown_steps (0.2) needs training.max_steps (or a time budget, budget_minutes)"),
])
def test_a_budget_or_cooldown_that_cannot_be_planned_is_refused_naming_the_key(tmp_path, small_corpus, overrides,
                                                                               message):
    with pytest.raises(ConfigError) as error:
        load_run_config(str(tiny_config(tmp_path, small_corpus)), overrides)
    assert str(error.value).startswith(message)


def test_a_budget_that_cannot_hold_a_single_update_is_one_line_before_any_work(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, **{**BUDGET_RUN, "budget_minutes": 0.01})
    result = run_train("--config", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("vaswani-mt train: error: training.budget_minutes (0.01) is too short on this machine to "
                            "train a single update: "), result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_a_budget_shorter_than_the_warmup_trains_with_a_shorter_warmup(tmp_path, small_corpus):
    # 4,000 warm-up updates do not fit half a minute: the plan shortens the warm-up to a quarter of its updates
    config = tiny_config(tmp_path, small_corpus, **{**BUDGET_RUN, "budget_minutes": 0.5, "warmup_steps": 4000})
    result = run_train("--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    plan = _record(tmp_path / "run")["training"]["time_budget"]
    assert plan["warmup_steps"] == round(0.25 * plan["plans"][0]["updates"])
    assert "the warm-up shortened from 4,000 to" in plan["plans"][0]["why"]


def test_the_budget_counts_from_the_command_not_from_a_shell_that_waited_and_then_exec_ed_it(tmp_path):
    # a job script or a container's entrypoint that prepares for a while, then `exec vaswani-mt train ...`: the
    # process is the shell's, started 2 s before the command; the budget must not spend those 2 s
    command = tmp_path / "vaswani-mt"  # named as the console script, so the package knows it runs the command
    command.write_text("import time\nfirst_line = time.time()\nimport vaswani_mt.cli.train as train\n"
                       "print(train.command_started() - first_line)\n")
    result = subprocess.run(["bash", "-c", 'sleep 2; exec "$0" "$1"', sys.executable, str(command)],
                            capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**CPU_ENV, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert 0 <= float(result.stdout) < 1  # from the package's import, right after the script's first line


# -- real runs, on the real clock --------------------------------------------------------------------------------------

def _record(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _last_logged_step(log: Path) -> int:
    steps = re.findall(r"train: step (\d+)/", log.read_text()) if log.is_file() else []
    return int(steps[-1]) if steps else 0


def _rates(run: Path) -> dict[int, float]:
    history = json.loads((run / "log_history.json").read_text())
    return {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}


def _ends_at_rate_zero(run: Path, steps: int) -> bool:
    """Every update logged ran at a rate above 0, and the schedule saved with the last update's checkpoint is at 0
    after it."""
    scheduler = NoamLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), d_model=8, warmup_steps=1)
    scheduler.load_state_dict(torch.load(run / "checkpoints" / f"checkpoint-{steps}" / "scheduler.pt"))
    return min(_rates(run).values()) > 0 and scheduler.get_last_lr() == [0.0]


def test_a_run_with_a_budget_of_a_minute_stopped_for_5_seconds_ends_within_it_with_its_rate_at_zero(
        tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, test_split="test", **{**BUDGET_RUN, "budget_minutes": 1})
    started = time.time()
    train = subprocess.Popen([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CPU_ENV, cwd=REPO)
    log = tmp_path / "run" / "train.log"
    while _last_logged_step(log) < 30 and train.poll() is None:
        time.sleep(0.2)
    train.send_signal(signal.SIGSTOP)  # a stall: the laptop's lid closed for 5 seconds
    stalled_at = _last_logged_step(log)
    time.sleep(5)
    train.send_signal(signal.SIGCONT)
    _, stderr = train.communicate(timeout=120)
    seconds = time.time() - started
    assert train.returncode == 0, stderr[-3000:]
    run = tmp_path / "run"
    training = _record(run)["training"]
    plan = training["time_budget"]
    assert seconds <= 60 and plan["run_minutes"] <= 1, (seconds, plan)
    assert plan["updates"] == training["steps"] > stalled_at
    assert _ends_at_rate_zero(run, training["steps"])
    # the stall cost its seconds, not the pace: no plan after it saw a pace twice the one before
    before = [entry["seconds_per_update"] for entry in plan["plans"] if entry["step"] <= stalled_at]
    assert all(entry["seconds_per_update"] < 2 * before[-1] for entry in plan["plans"] if entry["step"] > stalled_at)
    assert "updates planned at update 0 (first plan, from a probe of this machine)" in (run / "train.log").read_text()
    checkpoint = json.loads((run / "checkpoints" / f"checkpoint-{training['steps']}" / "trainer_state.json").read_text())
    assert checkpoint["stateful_callbacks"]["BudgetPlanner"]["attributes"]["plans"] == plan["plans"]
    assert f"a time budget of 1 minute: {training['steps']:,} updates planned" in render_model_card(run)


@pytest.mark.slow  # a minute on the real clock beside two busy processes
def test_a_run_beside_a_busy_process_still_ends_within_its_budget_with_fewer_updates(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, **{**BUDGET_RUN, "budget_minutes": 1})
    started = time.time()
    train = subprocess.Popen([sys.executable, "-m", "vaswani_mt.cli", "train", "--config", str(config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=CPU_ENV, cwd=REPO)
    log = tmp_path / "run" / "train.log"
    while (quiet_until := _last_logged_step(log)) < 50 and train.poll() is None:  # progress lines come by time
        time.sleep(0.2)
    # two processes of two threads each on every core: the run keeps about a third of the machine
    busy = [subprocess.Popen([sys.executable, "-c", "import torch\ntorch.set_num_threads(2)\n"
                              "a = torch.randn(512, 512)\nwhile True:\n    a @ a"]) for _ in range(2)]
    try:
        _, stderr = train.communicate(timeout=120)
    finally:
        for process in busy:
            process.kill()
    seconds = time.time() - started
    assert train.returncode == 0, stderr[-3000:]
    training = _record(tmp_path / "run")["training"]
    plan = training["time_budget"]
    assert seconds <= 60 and plan["run_minutes"] <= 1, (seconds, plan)
    quiet = [entry for entry in plan["plans"] if entry["step"] <= quiet_until][-1]  # the plan before they started
    assert training["steps"] < quiet["updates"]  # fewer than planned on the quiet machine
    busy_paces = [entry["seconds_per_update"] for entry in plan["plans"] if entry["step"] > quiet_until]
    assert max(busy_paces) > 1.5 * quiet["seconds_per_update"]  # the busy processes were seen, and planned for
    assert _ends_at_rate_zero(tmp_path / "run", training["steps"])


def _killed_at_the_save_of(step: int, config: Path) -> None:
    """Run the config's training and kill it with SIGKILL inside the save of checkpoint-`step`."""
    killed = subprocess.run([sys.executable, str(KILL_AT), "save-written", str(step), "--", "--config", str(config)],
                            capture_output=True, text=True, env=CPU_ENV, cwd=REPO, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]


def test_a_resumed_run_plans_what_is_left_of_the_whole_runs_budget(tmp_path, small_corpus):
    """Killed inside the save of checkpoint-40, resumed from checkpoint-20: the budget counts the first attempt's
    time up to that checkpoint, and the resumed run plans the rest of it."""
    config = tiny_config(tmp_path, small_corpus, **{**BUDGET_RUN, "budget_minutes": 0.75, "eval_steps": 20})
    _killed_at_the_save_of(40, config)
    state = json.loads((tmp_path / "run" / "checkpoints" / "checkpoint-20" / "trainer_state.json").read_text())
    used = state["stateful_callbacks"]["BudgetPlanner"]["attributes"]["seconds_used"]
    started = time.time()
    resumed = run_train("--config", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"planned at update 20 \(resumed at update 20 with .* of the budget left", resumed.stderr)
    plan = _record(tmp_path / "run")["training"]["time_budget"]
    assert plan["resumed"] is True and _ends_at_rate_zero(tmp_path / "run", plan["updates"])
    assert used + time.time() - started <= 0.75 * 60 + 1, used


def _one_update(planner, optimizer, scheduler, args, state, control, clock, seconds: float = 1.0) -> None:
    """An update of `seconds` on the test's clock, and the events the Trainer sends around it (without validation)."""
    optimizer.step()
    scheduler.step()
    clock.now += seconds
    state.global_step += 1
    control.should_training_stop = state.global_step >= state.max_steps  # as the Trainer's DefaultFlowCallback
    planner.on_step_end(args, state, control, lr_scheduler=scheduler)


def test_a_planner_rebuilt_from_a_checkpoint_as_transformers_restores_callback_states_finishes_its_plan():
    """`restore_callback_states_from_checkpoint=True`: transformers rebuilds each stateful callback as
    `type(callback)(**saved["args"])` and sets `saved["attributes"]` on it, before training begins."""
    clock = _Clock()
    planner = BudgetPlanner(10, cooldown_steps=0.2, started=clock(), pace=Pace(1.0, 5.0, 8.0), clock=clock,
                            after_training=1, test_passes=1.0, test_sentences=100)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=20)
    args = SimpleNamespace(eval_steps=None, logging_steps=10, save_steps=None, save_strategy="no")
    state, control = TrainerState(max_steps=10 ** 6), TrainerControl()
    planner.on_train_begin(args, state, control, lr_scheduler=scheduler)
    for _ in range(100):
        _one_update(planner, optimizer, scheduler, args, state, control, clock)
    saved = json.loads(json.dumps(planner.state()))  # as trainer_state.json keeps it
    rebuilt = BudgetPlanner(**saved["args"])
    for name, value in saved["attributes"].items():
        setattr(rebuilt, name, value)
    rebuilt.clock = clock
    state.stateful_callbacks = {"BudgetPlanner": saved}
    clock.now += 30  # the resumed attempt starts later
    rebuilt.on_train_begin(args, state, control, lr_scheduler=scheduler)
    while not control.should_training_stop:
        _one_update(rebuilt, optimizer, scheduler, args, state, control, clock)
    rebuilt.on_train_end(args, state, control)
    facts = rebuilt.facts(scheduler.total_steps, scheduler.cooldown_start, scheduler.warmup_steps)
    assert facts["resumed"] is True and optimizer.param_groups[0]["lr"] == 0.0
    assert rebuilt.used_before == pytest.approx(100.0)  # the first attempt's training, from the checkpoint
    assert "resumed at update 100" in facts["plans"][-1]["why"] or any("resumed" in p["why"] for p in facts["plans"])


def test_a_resumed_run_whose_plan_max_steps_caps_ends_with_the_uninterrupted_budgeted_runs_weights(tmp_path,
                                                                                                   small_corpus):
    """Bitwise the same weights as the uninterrupted run exactly when both plans end at the same update with the same
    schedule: when max_steps caps a budget that fits more updates (the plan does not depend on the clock)."""
    capped = {**BUDGET_RUN, "budget_minutes": 5, "max_steps": 60, "eval_steps": 20}
    for folder in ("killed", "whole"):
        (tmp_path / folder).mkdir()
    killed = tiny_config(tmp_path / "killed", small_corpus, **capped)
    _killed_at_the_save_of(40, killed)
    resumed = run_train("--config", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert run_train("--config", str(tiny_config(tmp_path / "whole", small_corpus, **capped))).returncode == 0
    plans = [_record(tmp_path / folder / "run")["training"]["time_budget"] for folder in ("killed", "whole")]
    assert plans[0]["resumed"] is True and plans[0]["updates"] == plans[1]["updates"] == 60
    weights = [load_file(tmp_path / folder / "run" / "model" / "model.safetensors") for folder in ("killed", "whole")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_a_checkpoint_saved_with_a_validation_keeps_that_validations_seconds():
    clock = _Clock()
    planner = BudgetPlanner(10, started=clock(), pace=Pace(1.0, 5.0, 8.0), clock=clock)
    args = SimpleNamespace(eval_steps=1, logging_steps=10, save_steps=1, save_strategy="steps")
    scheduler = NoamLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), d_model=64, warmup_steps=2)
    state, control = TrainerState(max_steps=10 ** 6), TrainerControl()
    planner.on_train_begin(args, state, control, lr_scheduler=scheduler)
    clock.now += 1.0
    state.global_step = 1
    planner.on_step_end(args, state, control, lr_scheduler=scheduler)
    clock.now += 6.0  # the validation
    planner.on_evaluate(args, state, control)
    clock.now += 1.0  # its checkpoint
    planner.on_save(args, state, control)
    assert planner.state()["attributes"]["validation_seconds"] == 7.0


def test_a_run_resumed_from_a_checkpoint_of_untimed_updates_plans_once_it_has_timed_some():
    clock = _Clock()
    saved = {"args": {"budget_minutes": 10}, "attributes": {"update_seconds": [], "seconds_used": 20.0}}
    planner = BudgetPlanner(10, started=clock(), clock=clock)
    args = SimpleNamespace(eval_steps=None, logging_steps=1, save_steps=None, save_strategy="no")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=2)
    optimizer.step()
    scheduler.step()
    state, control = TrainerState(max_steps=10 ** 6, global_step=1), TrainerControl()
    state.stateful_callbacks = {"BudgetPlanner": saved}
    planner.on_train_begin(args, state, control, lr_scheduler=scheduler)  # no pace yet: no plan, no error
    for _ in range(3):
        _one_update(planner, optimizer, scheduler, args, state, control, clock)
    assert planner.plans and state.max_steps < 10 ** 6
