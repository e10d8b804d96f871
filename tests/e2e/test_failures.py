"""Failure semantics (docs/fault-tolerance.md): a failing worker, an interrupt or a killed orchestrator never
leaves a run broken — no orphans, no shared memory left, a clear message, the right exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import psutil
import pytest
import torch

from support import (
    SLOW,
    assert_nothing_left,
    cli_command,
    cli_env,
    fault,
    read_summary,
    run_cli,
    start_run,
    tagged_processes,
    wait_until,
)

START_METHODS = ["fork", "spawn", "forkserver"]


def run_with_fault(tmp_path, kind, start_method, *extra, strategy="file_descriptor"):
    tag, run_dir = uuid.uuid4().hex, tmp_path / "run"
    fault_file = tmp_path / "fault"
    env = cli_env(tag, HOGWILD_FAULT_FILE=str(fault_file))
    args = [
        *SLOW,
        *fault(kind),
        f"trainer.start_method={start_method}",
        f"trainer.sharing_strategy={strategy}",
        *extra,
    ]
    result = subprocess.run(
        cli_command(args, run_dir),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    ended = time.time()
    fired = float(fault_file.read_text()) if fault_file.exists() else None
    return result, run_dir, tag, fired, ended


@pytest.mark.parametrize("start_method", START_METHODS)
def test_worker_exception_stops_the_run_with_rank_and_traceback(tmp_path, start_method, no_leaks):
    result, run_dir, tag, fired, ended = run_with_fault(
        tmp_path, "raise", start_method, strategy="file_system"
    )
    assert result.returncode == 1, result.stderr
    assert "worker 1 failed: ZeroDivisionError: injected fault in forward" in result.stderr
    assert "Traceback" in result.stderr and "faults.py" in result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["error"]["rank"] == 1
    assert "ZeroDivisionError" in summary["error"]["reason"]
    assert ended - fired < 5  # detected, other worker stopped, summary written: all within seconds
    assert_nothing_left(tag)


@pytest.mark.parametrize(
    "start_method, kind, reason",
    # every start method and every way of dying silently, each at least once
    [
        ("fork", "sigkill", "killed by SIGKILL"),
        ("forkserver", "sigkill", "killed by SIGKILL"),
        ("fork", "exit", "exit code 7"),
        ("spawn", "segv", "killed by SIGSEGV"),
    ],
)
def test_worker_that_dies_silently_is_detected_within_seconds(
    tmp_path, start_method, kind, reason, no_leaks
):
    result, run_dir, tag, fired, ended = run_with_fault(tmp_path, kind, start_method)
    assert result.returncode == 1, result.stderr
    assert f"worker 1 failed: {reason}" in result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["error"] == {"rank": 1, "reason": reason}
    assert ended - fired < 5, ended - fired
    assert_nothing_left(tag)


def test_non_finite_loss_stops_the_run_naming_rank_and_step(tmp_path):
    result, run_dir, tag, _, _ = run_with_fault(tmp_path, "nonfinite", "fork")
    assert result.returncode == 1
    assert "run failed: worker 1: non-finite loss (nan) at epoch 0, batch" in result.stderr
    assert read_summary(run_dir)["status"] == "failed"


def test_non_finite_batches_can_be_skipped(tmp_path):
    args = [
        "data=synthetic",
        "data.num_samples=2000",
        "data.num_test_samples=200",
        "trainer.epochs=1",
        "model._target_=faults.FaultyMLP",
        *fault("nonfinite", at_step=3),
        "trainer.skip_nonfinite=true",
        "trainer.start_method=fork",
    ]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    s = read_summary(tmp_path / "run")
    assert s["status"] == "completed" and s["total_samples"] < 2000  # rank 1's batches were skipped


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_a_killed_worker_is_replaced_and_the_run_completes(tmp_path, start_method):
    args = [
        "trainer.on_worker_failure=restart",
        "trainer.max_restarts=2",
        "data.num_samples=4000",
        "model.step_seconds=0.001",
    ]
    result, run_dir, tag, fired, _ = run_with_fault(tmp_path, "sigkill", start_method, *args)
    assert result.returncode == 0, result.stderr
    assert "worker 1 died (killed by SIGKILL); restarting it (1/2)" in result.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["worker_restarts"] == 1
    # the replacement took over the rest of rank 1's shard: the epoch still adds up
    assert s["total_samples"] == 4000
    assert_nothing_left(tag)


def test_restarts_are_bounded_by_max_restarts(tmp_path):
    args = [
        *SLOW,
        *fault("raise"),
        "trainer.on_worker_failure=restart",
        "trainer.max_restarts=0",
        "trainer.start_method=fork",
    ]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 1 and read_summary(tmp_path / "run")["status"] == "failed"


@pytest.mark.parametrize(
    "start_method, sig, code",
    [(m, signal.SIGINT, 130) for m in START_METHODS] + [("forkserver", signal.SIGTERM, 143)],
)
def test_interrupt_stops_workers_writes_checkpoint_and_summary(
    tmp_path, sig, code, start_method, no_leaks
):
    proc, run_dir, tag = start_run(
        tmp_path, f"trainer.start_method={start_method}", "trainer.sharing_strategy=file_system"
    )
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == code, stderr
    s = read_summary(run_dir)
    assert s["status"] == "interrupted" and 0 < s["total_samples"] < 20000
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["run"]["samples_seen"] == s["total_samples"]
    assert "Traceback" not in stderr
    assert_nothing_left(tag)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_workers_exit_by_themselves_when_the_orchestrator_is_killed(
    tmp_path, start_method, no_leaks
):
    proc, run_dir, tag = start_run(
        tmp_path, f"trainer.start_method={start_method}", "trainer.sharing_strategy=file_system"
    )
    workers = [p for p in tagged_processes(tag) if p.pid != proc.pid]
    assert workers
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert_nothing_left(tag)


def test_resumed_run_continues_the_sample_count(tmp_path):
    base = ["trainer.start_method=fork"]
    proc, first_dir, _ = start_run(tmp_path, *base)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    first = read_summary(first_dir)
    assert first["status"] == "interrupted"
    second_dir = tmp_path / "resumed"
    args = [
        *SLOW,
        *base,
        "model.step_seconds=0",
        f"resume_from={first_dir / 'checkpoints' / 'last.pt'}",
    ]
    result = run_cli(args, second_dir)
    assert result.returncode == 0, result.stderr
    second = read_summary(second_dir)
    assert second["status"] == "completed"
    assert first["total_samples"] + second["total_samples"] == 20000
    assert second["samples_seen"] == 20000


def test_second_ctrl_c_forces_the_stop_of_a_stuck_worker(tmp_path):
    # rank 1 hangs inside its step, so a polite stop would wait the whole grace period
    proc, run_dir, tag = start_run(
        tmp_path,
        "trainer.start_method=fork",
        *fault("hang", at_step=5),
        "trainer.grace_seconds=120",
    )
    log = run_dir / "train.log"
    proc.send_signal(signal.SIGINT)
    assert wait_until(lambda: log.exists() and "SIGINT received" in log.read_text(), 30)
    assert proc.poll() is None  # heard it, and still waiting for the stuck worker
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 130, stderr
    assert read_summary(run_dir)["status"] == "interrupted"
    torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert_nothing_left(tag)
