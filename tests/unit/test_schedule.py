"""Learning-rate rules under asynchrony: the curves, the worker-count rules, and a real run."""

from __future__ import annotations

import pytest
import torch

from hogwild.config.schema import ScheduleConfig
from hogwild.errors import ConfigError
from hogwild.optim.schedule import Scheduler, factor

from support import run_config


def test_curves_start_at_the_base_lr_and_end_at_the_floor():
    assert factor(ScheduleConfig(), 0.7) == 1.0
    linear = ScheduleConfig(name="linear", min_lr_fraction=0.1)
    assert (factor(linear, 0.0), factor(linear, 0.5), factor(linear, 1.0)) == pytest.approx(
        (1.0, 0.55, 0.1)
    )
    cosine = ScheduleConfig(name="cosine")
    assert (factor(cosine, 0.0), factor(cosine, 0.5), factor(cosine, 1.0)) == pytest.approx(
        (1.0, 0.5, 0.0)
    )


def test_warmup_rises_linearly_then_the_curve_spans_the_rest():
    cfg = ScheduleConfig(name="linear", warmup_fraction=0.2)
    assert factor(cfg, 0.0) == 0.0 and factor(cfg, 0.1) == pytest.approx(0.5)
    assert factor(cfg, 0.2) == pytest.approx(1.0) and factor(cfg, 0.6) == pytest.approx(0.5)
    assert factor(cfg, 2.0) == pytest.approx(
        0.0
    )  # past the end (a restarted tail) stays at the floor


def params():
    return list(torch.nn.Linear(3, 2).parameters())


@pytest.mark.parametrize("scaling, expected", [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_lr_scales_with_the_worker_count(scaling, expected):
    opt = torch.optim.SGD(params(), lr=0.1)
    s = Scheduler(
        opt, ScheduleConfig(scale_lr_with_workers=scaling), num_workers=4, total_samples=100
    )
    s.update(0)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)
    assert s.active is (scaling != "none")


def test_momentum_correction_removes_the_implicit_momentum_of_asynchrony():
    sgd = torch.optim.SGD(params(), lr=0.1, momentum=0.9)
    Scheduler(sgd, ScheduleConfig(momentum_correction=True), num_workers=2, total_samples=100)
    assert sgd.param_groups[0]["momentum"] == pytest.approx(0.4)
    adam = torch.optim.Adam(params(), betas=(0.9, 0.999))
    Scheduler(adam, ScheduleConfig(momentum_correction=True), num_workers=4, total_samples=100)
    assert adam.param_groups[0]["betas"] == pytest.approx((0.15, 0.999))
    one = torch.optim.SGD(params(), lr=0.1, momentum=0.9)
    Scheduler(one, ScheduleConfig(momentum_correction=True), num_workers=1, total_samples=100)
    assert one.param_groups[0]["momentum"] == pytest.approx(0.9)


def test_update_follows_the_global_sample_count():
    opt = torch.optim.SGD(params(), lr=0.2)
    s = Scheduler(opt, ScheduleConfig(name="linear"), num_workers=2, total_samples=1000)
    s.update(750)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize(
    "override, message",
    [
        ("schedule.name=step", "schedule.name='step'.*constant, linear, cosine"),
        ("schedule.warmup_fraction=1.0", "schedule.warmup_fraction=1.0.*< 1.0"),
        ("schedule.min_lr_fraction=2", "schedule.min_lr_fraction=2.*<= 1.0"),
        ("schedule.scale_lr_with_workers=cube", "scale_lr_with_workers='cube'.*none, linear, sqrt"),
        ("schedule.momentum_correction=yes", "momentum_correction='yes'.*true or false"),
        ("+schedule.gamma=0.1", "schedule.gamma"),
    ],
)
def test_bad_schedule_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        run_config([override])
