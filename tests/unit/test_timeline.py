"""The fixed-cost breakdown: phases in the order they began, the three measured between marks,
and parts that add up to the wall clock."""

from __future__ import annotations

import time

import pytest

from hogwild.reporting.timeline import Timeline


def test_the_breakdown_lists_phases_in_order_and_adds_up_to_the_wall_clock(monkeypatch):
    clock = iter([10.0, 10.5, 11.0, 11.2, 12.0, 20.0, 20.3, 21.0, 21.4]).__next__
    monkeypatch.setattr(time, "time", clock)
    timeline = Timeline(9.0, {"python_and_imports": 0.6, "config": 0.3})
    with timeline.phase("data_and_model"):  # 10.0 -> 10.5
        pass
    with timeline.phase("checks"):  # 11.0 -> 11.2
        pass
    timeline.mark("launch")  # 12.0
    timeline.mark("joined")  # 20.0
    with timeline.phase("evaluations"):  # 20.3 -> 21.0, overlapping training: listed apart
        pass
    timeline.add("final_evaluation", 0.4, start=20.05)
    out = timeline.breakdown(wall_seconds=13.0, first_step=12.5, last_step=19.9)
    assert list(out) == [
        "python_and_imports", "config", "data_and_model", "checks", "start_to_first_step",
        "training", "last_step_to_exit", "final_evaluation", "other", "fixed_total",
        "during_training",
    ]  # fmt: skip
    assert out["start_to_first_step"] == 0.5 and out["training"] == pytest.approx(7.4)
    assert out["last_step_to_exit"] == pytest.approx(0.1)
    parts = [v for k, v in out.items() if k not in ("fixed_total", "during_training")]
    assert sum(parts) == pytest.approx(13.0)  # `other` is what no phase covers
    assert out["fixed_total"] == pytest.approx(13.0 - 7.4)
    assert out["during_training"] == {"evaluations": {"seconds": 0.7, "count": 1}}


def test_a_run_that_never_stepped_has_no_training_and_each_job_starts_afresh():
    timeline = Timeline(time.time())
    timeline.add("checks", 0.2)
    out = timeline.breakdown(wall_seconds=1.0, first_step=None, last_step=None)
    assert "training" not in out and out["checks"] == 0.2 and out["other"] == pytest.approx(0.8)
    assert out["fixed_total"] == 1.0 and out["during_training"] == {}
    assert "checks" not in Timeline(time.time()).breakdown(0.0, None, None)  # a sweep's next job


def test_start_up_counts_from_the_interpreter_not_from_a_shell_that_exec_d_it():
    from hogwild.cli.main import interpreter_start

    assert interpreter_start(100.0, 100.4) == 100.0  # python's own start: the process's
    # `bash -c 'sleep 120; python -m hogwild train'`: the process began with the shell
    assert interpreter_start(100.0, 220.0) == 220.0
