"""Shared optimizer state end to end: every worker updates one state; a resumed run continues it."""

from __future__ import annotations

import torch

from support import FAILS_AT_STEP_40, SMALL, read_summary, run_cli


def test_workers_update_one_shared_adam_state(tmp_path):
    """The orchestrator's copy of the state counts the steps of every worker, not of one."""
    run_dir = tmp_path / "run"
    result = run_cli(
        [*SMALL, "optimizer=adam", "optimizer.shared=true", "trainer.start_method=fork"], run_dir
    )
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    per_worker = [w["steps"] for w in s["staleness"]["per_worker"]]
    assert s["optimizer_shared"] is True and len(per_worker) == 2
    # concurrent `step += 1` can race, so a few increments may be lost; never a per-worker count
    assert max(per_worker) < s["optimizer_state_steps"] <= sum(per_worker)
    assert s["test_accuracy"] > 0.8


def test_per_worker_state_is_the_default(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, "optimizer=adam", "trainer.start_method=fork"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["optimizer_shared"] is False and s["optimizer_state_steps"] is None


def test_a_resumed_run_continues_the_shared_optimizer_state(tmp_path):
    """The checkpoint carries the shared Adam state: after a failure and a resume, the shared
    step counter counts the steps of both attempts, not of the second alone."""
    run_dir = tmp_path / "run"
    args = [*FAILS_AT_STEP_40, "optimizer=adam", "optimizer.shared=true", "resume_from=auto"]
    assert run_cli([*args, "+model.fault=raise"], run_dir).returncode == 1
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    saved_step = int(saved["optimizer_state"][0]["step"])
    assert saved_step > 0 and set(saved["optimizer_state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    result = run_cli([*args, "+model.fault=none"], run_dir)
    assert result.returncode == 0, result.stderr
    assert "resumed the shared optimizer state" in result.stderr
    s = read_summary(run_dir)
    second_attempt_steps = sum(w["steps"] for w in s["staleness"]["per_worker"])
    assert s["optimizer_state_steps"] > second_attempt_steps  # it went on from saved_step
    assert s["optimizer_state_steps"] >= saved_step


def test_resuming_with_another_optimizer_starts_fresh_and_says_why(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert (
        run_cli(
            [*SMALL, "optimizer=adam", "optimizer.shared=true", "trainer.start_method=fork"], first
        ).returncode
        == 0
    )
    result = run_cli(
        [
            *SMALL,
            "optimizer=sgd",
            "optimizer.momentum=0.9",
            "optimizer.shared=true",
            "trainer.start_method=fork",
            "trainer.epochs=2",  # the first run finished its epoch: train on
            f"resume_from={first / 'checkpoints' / 'last.pt'}",
        ],
        second,
    )
    assert result.returncode == 0, result.stderr
    assert "does not fit this optimizer" in result.stderr and "momentum_buffer" in result.stderr
