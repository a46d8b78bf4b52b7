"""`training.budget_minutes`: the run measures its machine, plans its updates to end within the budget and lays its
schedule over them, the rate at 0 at the last update (vaswani_mt.recipe.budget)."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_cli import CPU_ENV, KILL_AT, REPO, run_train, small_corpus, tiny_config  # noqa: F401 (a fixture)
from transformers import TrainerControl, TrainerState

from vaswani_mt.publishing.model_card import render_model_card
from vaswani_mt.recipe.budget import BudgetPlanner, Pace, updates_that_fit, validations_between
from vaswani_mt.recipe.config import ConfigError, load_run_config
from vaswani_mt.recipe.schedule import NoamLR, noam_lr

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


# -- planning while the run goes (a clock that the test moves) -----------------------------------------------------

class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Args:
    eval_steps, logging_steps = None, 10


def _planned_run(seconds_per_update, budget_minutes: float = 10) -> tuple:
    """A run of a planner with a 10-minute budget, a 20 % cool-down and a probe that measured 1 s per update, whose
    k-th update takes `seconds_per_update(k)` seconds on a clock the test moves. Returns the rates used, the
    planner, the scheduler and the seconds the training took."""
    clock = _Clock()
    planner = BudgetPlanner(budget_minutes, cooldown_steps=0.2, started=clock(), pace=Pace(1.0, 0.0), clock=clock)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=20)
    state, control = TrainerState(max_steps=10 ** 6), TrainerControl()
    planner.on_train_begin(_Args, state, control, lr_scheduler=scheduler)
    rates = []
    while not control.should_training_stop:
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        clock.now += seconds_per_update(state.global_step + 1)
        state.global_step += 1
        control.should_training_stop = state.global_step >= state.max_steps  # as the Trainer's DefaultFlowCallback
        planner.on_step_end(_Args, state, control, lr_scheduler=scheduler)
    return rates, planner, scheduler, clock.now - 1000


# 10 minutes: 600 s, less the margin (2 %: 12 s) and the 10 s after training
PLANNED = 600 - 12 - 10


def test_a_plan_lays_the_cooldown_over_the_updates_that_fit_and_ends_at_rate_zero():
    rates, planner, scheduler, _ = _planned_run(lambda k: 1.0)
    fall = PLANNED - round(0.2 * PLANNED)
    assert len(rates) == scheduler.total_steps == PLANNED and scheduler.cooldown_start == fall
    assert rates[:fall] == [noam_lr(k, 64, 20) for k in range(1, fall + 1)]  # the warm-up and decay of any length
    assert rates[fall] == pytest.approx(noam_lr(fall + 1, 64, 20) * (PLANNED - fall - 1) / (PLANNED - fall))
    assert rates[-1] == 0.0
    assert planner.plans[0]["why"] == "first plan, from a probe of this machine"


def test_a_slower_machine_before_the_fall_plans_fewer_updates_and_still_ends_at_rate_zero():
    rates, _, scheduler, seconds = _planned_run(lambda k: 1.0 if k <= 200 else 2.0)
    assert seconds <= 600 - 10 and 200 < len(rates) < PLANNED and rates[-1] == 0.0
    assert scheduler.cooldown_start == len(rates) - round(0.2 * len(rates))  # laid anew, whole


def test_a_slower_machine_inside_the_fall_shortens_it_from_the_current_rate_to_zero():
    rates, planner, _, seconds = _planned_run(lambda k: 1.0 if k <= 500 else 3.0)
    assert seconds <= 600 - 10 and len(rates) < PLANNED and rates[-1] == 0.0
    assert any("the cool-down is shortened" in plan["why"] for plan in planner.plans)
    fall = PLANNED - round(0.2 * PLANNED)
    assert all(later < earlier for earlier, later in zip(rates[fall:], rates[fall + 1:]))  # it only falls


def test_a_faster_machine_inside_the_fall_leaves_it_as_it_is():
    rates, _, scheduler, _ = _planned_run(lambda k: 1.0 if k <= 500 else 0.5)
    assert len(rates) == scheduler.total_steps == PLANNED


def test_passes_after_training_count_at_the_length_limit_until_the_run_has_measured_a_validation():
    # a run that validates only at its end (--quick) translates with a model that repeats a word up to the limit
    clock = _Clock()
    planner = BudgetPlanner(10, started=clock(), after_training=3, pace=Pace(1.0, 10.0, 40.0), clock=clock)
    # 600 s less the margin (12 s), 10 s after training and its 3 passes; one validation at the end (10 s)
    assert planner.updates_fitting(0, eval_steps=1000, cap=10 ** 6) == 600 - 12 - 10 - 3 * 40 - 10
    planner.validation_seconds = 12.0  # measured: a validation during training, and the passes after it
    assert planner.updates_fitting(0, eval_steps=1000, cap=10 ** 6) == 600 - 12 - 10 - 3 * 12 - 12


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


def test_a_budget_too_short_for_the_warmup_is_one_line_before_any_work(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, **{**BUDGET_RUN, "budget_minutes": 0.2, "warmup_steps": 4000})
    result = run_train("--config", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("vaswani-mt train: error: training.budget_minutes (0.2) is too short on this machine: "
                            "the 4,000 warm-up updates"), result.stderr[-2000:]
    assert "or fewer training.warmup_steps" in error
    assert not (tmp_path / "run").exists()


# -- real runs, on the real clock --------------------------------------------------------------------------------------

def _record(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _last_logged_step(log: Path) -> int:
    steps = re.findall(r"train: step (\d+)/", log.read_text()) if log.is_file() else []
    return int(steps[-1]) if steps else 0


def _rates(run: Path) -> dict[int, float]:
    history = json.loads((run / "log_history.json").read_text())
    return {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}


def test_a_run_with_a_budget_of_a_minute_ends_within_it_with_its_rate_at_zero(tmp_path, small_corpus):
    config = tiny_config(tmp_path, small_corpus, test_split="test",
                         **{**BUDGET_RUN, "budget_minutes": 1})
    started = time.time()
    result = run_train("--config", str(config))
    seconds = time.time() - started
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    training = _record(run)["training"]
    plan = training["time_budget"]
    assert seconds <= 60 and plan["run_minutes"] <= 1, (seconds, plan)
    # the rate falls over the last 20 % of the updates (later, if a slower machine shortened the fall on the way)
    assert plan["updates"] == training["steps"]
    assert training["steps"] - round(0.2 * training["steps"]) <= plan["cooldown_from"] < training["steps"]
    rates = _rates(run)
    assert rates[training["steps"]] == 0.0 and rates[plan["cooldown_from"]] > 0
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
    assert _rates(tmp_path / "run")[training["steps"]] == 0.0


def test_a_run_resumed_mid_plan_ends_with_the_weights_of_an_uninterrupted_run_with_that_plan(tmp_path, small_corpus):
    """Killed inside the save of checkpoint-40 (tests/trainer_helpers/kill_at.py), resumed from checkpoint-20: it keeps
    that checkpoint's plan, and ends bitwise where a run of that many updates and that cool-down, without a budget,
    ends."""
    budget_run = {**BUDGET_RUN, "budget_minutes": 0.5, "eval_steps": 20}
    (tmp_path / "budget").mkdir()
    config = tiny_config(tmp_path / "budget", small_corpus, **budget_run)
    killed = subprocess.run([sys.executable, str(KILL_AT), "save-written", "40", "--", "--config", str(config)],
                            capture_output=True, text=True, env=CPU_ENV, cwd=REPO, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_train("--config", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at update 20: keeps its plan of " in resumed.stderr
    plan = _record(tmp_path / "budget" / "run")["training"]["time_budget"]
    assert plan["resumed"] is True
    (tmp_path / "plain").mkdir()
    plain = tiny_config(tmp_path / "plain", small_corpus, **{
        **budget_run, "budget_minutes": None, "max_steps": plan["updates"],
        "cooldown_steps": plan["updates"] - plan["cooldown_from"]})
    assert run_train("--config", str(plain)).returncode == 0
    weights = [load_file(tmp_path / folder / "run" / "model" / "model.safetensors") for folder in ("budget", "plain")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
