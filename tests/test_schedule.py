"""Noam learning-rate schedule and Adam settings (paper §5.3)."""

import math

import pytest
import torch

from vaswani_mt.recipe.schedule import (NoamLR, cooldown_length, cooldown_multiplier, make_adam, noam_curve,
                                        noam_lr)


def _optimizer(num_groups: int = 1) -> torch.optim.Adam:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))]} for _ in range(num_groups)]
    return make_adam(groups)


def _train_steps(optimizer, scheduler, n: int) -> list[float]:
    """Run n updates; return the lr each update actually used."""
    used = []
    for _ in range(n):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def test_peak_is_at_warmup_with_paper_value():
    assert noam_lr(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert noam_lr(4000, 512, 4000) == pytest.approx(0.000698771, rel=1e-6)


def test_known_values_on_both_branches():
    # warmup branch: linear in step
    assert noam_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-12)
    assert noam_lr(2000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2, rel=1e-12)
    # decay branch: inverse square root
    assert noam_lr(16000, 512, 4000) == pytest.approx(512**-0.5 / math.sqrt(16000), rel=1e-12)
    assert noam_lr(16000, 512, 4000) == pytest.approx(noam_lr(4000, 512, 4000) / 2, rel=1e-12)


def test_factor_scales_linearly():
    assert noam_lr(123, 256, 400, factor=2.0) == pytest.approx(2 * noam_lr(123, 256, 400), rel=1e-12)


def test_step_zero_is_zero_lr():
    assert noam_lr(0, 512, 4000) == 0.0


def test_curve_rises_then_falls_with_maximum_at_warmup():
    curve = noam_curve(512, 100, 400)
    assert len(curve) == 400 and curve[0] == noam_lr(1, 512, 100)
    peak_index = max(range(len(curve)), key=curve.__getitem__)
    assert peak_index + 1 == 100
    assert all(a < b for a, b in zip(curve[:peak_index], curve[1 : peak_index + 1]))
    assert all(a > b for a, b in zip(curve[peak_index:], curve[peak_index + 1 :]))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"d_model": 0, "warmup_steps": 10}, "d_model"),
        ({"d_model": 512, "warmup_steps": 0}, "warmup_steps"),
        ({"d_model": 512, "warmup_steps": 10, "factor": -1.0}, "factor"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        noam_lr(1, **kwargs)
    with pytest.raises(ValueError, match=name):
        NoamLR(_optimizer(), **kwargs)


def test_negative_step_is_rejected():
    with pytest.raises(ValueError, match="step"):
        noam_lr(-1, 512, 4000)


def test_optimizer_holds_first_step_lr_right_after_construction():
    optimizer = _optimizer()
    NoamLR(optimizer, d_model=512, warmup_steps=4000)
    assert optimizer.param_groups[0]["lr"] == noam_lr(1, 512, 4000)


def test_kth_update_uses_noam_lr_of_k_in_every_group():
    optimizer = _optimizer(num_groups=2)
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=10, factor=2.0)
    used = []
    for _ in range(30):
        used.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert used == [[noam_lr(k, 64, 10, 2.0)] * 2 for k in range(1, 31)]
    assert scheduler.get_last_lr() == [noam_lr(31, 64, 10, 2.0)] * 2


def test_make_adam_uses_paper_hyperparameters():
    optimizer = make_adam([torch.nn.Parameter(torch.zeros(1))])
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.Adam)
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
    assert group["lr"] == 1.0


def test_resumed_scheduler_continues_the_exact_curve():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=10)
    _train_steps(optimizer, scheduler, 7)
    saved_scheduler, saved_optimizer = scheduler.state_dict(), optimizer.state_dict()
    uninterrupted = _train_steps(optimizer, scheduler, 10)

    # Restore scheduler state *after* constructing it on a fresh optimizer whose lr is noam_lr(1).
    resumed_optimizer = _optimizer()
    resumed_scheduler = NoamLR(resumed_optimizer, d_model=64, warmup_steps=10)
    resumed_optimizer.load_state_dict(saved_optimizer)
    resumed_scheduler.load_state_dict(saved_scheduler)
    assert _train_steps(resumed_optimizer, resumed_scheduler, 10) == uninterrupted


def test_loading_scheduler_state_alone_restores_the_optimizer_lr():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=10)
    _train_steps(optimizer, scheduler, 5)
    fresh_optimizer = _optimizer()
    fresh_scheduler = NoamLR(fresh_optimizer, d_model=64, warmup_steps=10)
    fresh_scheduler.load_state_dict(scheduler.state_dict())
    assert fresh_optimizer.param_groups[0]["lr"] == noam_lr(6, 64, 10)
    assert fresh_scheduler.get_last_lr() == [noam_lr(6, 64, 10)]


def test_last_epoch_argument_resumes_like_torch_schedulers():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=10)
    _train_steps(optimizer, scheduler, 5)
    resumed = NoamLR(_optimizer(), d_model=64, warmup_steps=10, last_epoch=4)
    assert resumed.get_last_lr() == scheduler.get_last_lr() == [noam_lr(6, 64, 10)]


# --- the linear cool-down (not in the paper) ---------------------------------------------------------------------


def test_cooldown_multiplier_falls_linearly_over_the_last_n_updates_to_zero_after_the_last():
    assert [cooldown_multiplier(step, 10, 4) for step in range(1, 11)] == [1, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25]
    assert cooldown_multiplier(11, 10, 4) == 0.0  # the rate after the last update
    with pytest.raises(ValueError, match="step must be >= 1"):
        cooldown_multiplier(0, 10, 4)
    assert [cooldown_multiplier(step, 3, 3) for step in (1, 2, 3, 4)] == [1, 2 / 3, 1 / 3, 0.0]


def test_no_update_of_a_cooldown_runs_at_rate_zero():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=12)
    used = _train_steps(optimizer, scheduler, 12)
    assert min(used) > 0 and optimizer.param_groups[0]["lr"] == 0.0  # 0 only after the last update


@pytest.mark.parametrize(("setting", "total", "updates"), [(0, 100, 0), (None, 100, 0), (30, 100, 30),
                                                            (0.25, 100, 25), (0.22, 9000, 1980), (0.001, 100, 1)])
def test_a_cooldown_is_a_number_of_updates_or_a_fraction_of_the_run(setting, total, updates):
    assert cooldown_length(setting, total) == updates


def test_a_cooldown_laid_anew_before_its_fall_gives_the_rates_of_a_run_started_with_that_length():
    optimizer, planned = _optimizer(), _optimizer()
    replanned = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=8, total_steps=40)
    reference = NoamLR(planned, d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=20)
    first = _train_steps(optimizer, replanned, 10)
    assert replanned.replan(20, 5) is True  # 10 updates done, the fall at 15-20: laid anew
    assert first + _train_steps(optimizer, replanned, 10) == _train_steps(planned, reference, 20)
    assert optimizer.param_groups[0]["lr"] == 0.0 and replanned.get_last_lr() == [0.0]


def test_a_cooldown_shortened_inside_its_fall_goes_on_from_the_current_rate_straight_to_zero():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=10, total_steps=30)
    used = _train_steps(optimizer, scheduler, 24)  # the fall began after update 20: factor 0.6 for update 25
    assert scheduler.multiplier(25) == pytest.approx(0.6)
    assert scheduler.replan(27, 10) is False  # the new cool-down would have begun at 17: go on from here instead
    used += _train_steps(optimizer, scheduler, 3)
    expected = [noam_lr(k, 64, 3) * 0.6 * (27 - k + 1) / 3 for k in (25, 26, 27)]
    assert used[24:] == pytest.approx(expected, rel=1e-12) and optimizer.param_groups[0]["lr"] == 0.0
    assert (scheduler.total_steps, scheduler.cooldown_start, scheduler.cooldown_steps) == (27, 24, 3)
    assert scheduler.fall_start() == 20  # where the rate first fell, for the average of the fall's weights


def test_a_cooldown_lengthened_inside_its_fall_holds_the_current_rate_until_its_new_fall_begins():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=10, total_steps=30)
    _train_steps(optimizer, scheduler, 24)  # factor 0.6 for update 25
    assert scheduler.replan(40, 10) is False
    used = _train_steps(optimizer, scheduler, 16)
    factors = [rate / noam_lr(k, 64, 3) for k, rate in zip(range(25, 41), used)]
    assert factors[:6] == pytest.approx([0.6] * 6)  # updates 25-30 hold it; the fall of 10 updates ends after 40
    assert factors[6:] == pytest.approx([0.6 * (40 - k + 1) / 10 for k in range(31, 41)])
    assert all(later < earlier for earlier, later in zip(used, used[1:]))


def test_a_cooldown_that_should_have_begun_already_begins_at_the_next_update():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=10, total_steps=100)
    _train_steps(optimizer, scheduler, 20)
    assert scheduler.replan(25, 10) is False  # its fall would have begun at update 15: it starts now, from 1
    used = _train_steps(optimizer, scheduler, 5)
    assert used == pytest.approx([noam_lr(k, 64, 3) * (25 - k + 1) / 5 for k in range(21, 26)], rel=1e-12)


def test_a_shortened_warmup_reaches_the_same_peak_rate():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=40, factor=2.0)
    peak = scheduler.peak_lr()
    scheduler.shorten_warmup(10)
    used = _train_steps(optimizer, scheduler, 20)
    assert max(used) == pytest.approx(peak) and used.index(max(used)) == 9  # the 10th update
    with pytest.raises(ValueError, match="before the first update"):
        scheduler.shorten_warmup(5)


def _resumed_rates(saved: dict, updates: int) -> list[float]:
    """The rates of `updates` updates of a scheduler built without a cool-down and restored from `saved`."""
    optimizer = _optimizer()
    resumed = NoamLR(optimizer, d_model=64, warmup_steps=3)
    resumed.load_state_dict(saved)
    return _train_steps(optimizer, resumed, updates)


def test_a_replanned_schedule_resumes_with_its_plan():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=10, total_steps=30)
    _train_steps(optimizer, scheduler, 24)
    scheduler.replan(27, 10)
    saved = scheduler.state_dict()
    assert _resumed_rates(saved, 3) == _train_steps(optimizer, scheduler, 3)


def test_a_schedule_saved_before_replanning_existed_resumes_with_its_cooldown():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=12)
    _train_steps(optimizer, scheduler, 6)
    saved = {k: v for k, v in scheduler.state_dict().items() if not k.startswith("cooldown_start")}
    assert _resumed_rates(saved, 6) == _train_steps(optimizer, scheduler, 6)


def test_replanning_to_an_end_already_passed_is_refused():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3)
    _train_steps(optimizer, scheduler, 5)
    with pytest.raises(ValueError, match=r"total_steps \(5\) must lie after the 5 updates done"):
        scheduler.replan(5, 1)


def test_scheduler_with_cooldown_uses_the_noam_rate_times_the_cooldown_multiplier():
    optimizer = _optimizer(num_groups=2)
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, factor=2.0, cooldown_steps=4, total_steps=10)
    used = _train_steps(optimizer, scheduler, 10)
    assert used == pytest.approx([noam_lr(k, 64, 3, 2.0) * cooldown_multiplier(k, 10, 4) for k in range(1, 11)],
                                 rel=1e-12)
    assert used[:6] == noam_curve(64, 3, 6, 2.0)  # untouched before the cool-down
    assert optimizer.param_groups[1]["lr"] == 0.0  # after the last update


def test_resumed_scheduler_keeps_the_saved_cooldown():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=12)
    _train_steps(optimizer, scheduler, 6)
    saved = scheduler.state_dict()
    assert _resumed_rates(saved, 6) == _train_steps(optimizer, scheduler, 6)  # built without one: the saved one counts


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cooldown_steps": 5}, r"cooldown_steps \(5\) needs total_steps"),
    ({"cooldown_steps": 11, "total_steps": 10}, r"cooldown_steps \(11\) exceeds total_steps \(10\)"),
    ({"cooldown_steps": -1, "total_steps": 10}, r"cooldown_steps must be >= 0 \(0: none\)"),
    ({"cooldown_steps": -1}, r"cooldown_steps must be >= 0 \(0: none\)"),
], ids=["no-total", "longer-than-run", "negative", "negative-no-total"])
def test_scheduler_rejects_a_cooldown_it_cannot_apply(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NoamLR(_optimizer(), d_model=64, warmup_steps=3, **kwargs)


def test_resuming_with_another_cooldown_than_the_saved_one_is_refused():
    scheduler = NoamLR(_optimizer(), d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=12)
    for other in ({"cooldown_steps": 5, "total_steps": 20}, {"cooldown_steps": 4, "total_steps": 12}):
        with pytest.raises(ValueError, match="keeps the cool-down it was started with"):
            NoamLR(_optimizer(), d_model=64, warmup_steps=3, **other).load_state_dict(scheduler.state_dict())
    without = NoamLR(_optimizer(), d_model=64, warmup_steps=3).state_dict()
    with pytest.raises(ValueError, match="the saved schedule has cooldown_steps=None"):
        NoamLR(_optimizer(), d_model=64, warmup_steps=3, cooldown_steps=5, total_steps=12).load_state_dict(without)


def test_a_cooldown_of_zero_updates_is_no_cooldown():
    plain = NoamLR(_optimizer(), d_model=64, warmup_steps=3)
    zero = NoamLR(_optimizer(), d_model=64, warmup_steps=3, cooldown_steps=0, total_steps=12)
    assert zero.cooldown_steps is None
    for _ in range(12):
        assert plain.get_last_lr() == zero.get_last_lr()
        for scheduler in (plain, zero):
            scheduler.optimizer.step()
            scheduler.step()
