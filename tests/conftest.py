"""Shared fixtures: run the CLI as a user would, and check that nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

# A small, fast, learnable workload for end-to-end runs.
SMALL = ["data=synthetic", "data.num_samples=2000", "data.num_test_samples=500", "data.noise=2.0", "trainer.epochs=1"]


def cli_command(args, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "hogwild", "train", f"hydra.run.dir={run_dir}", *args]


def cli_env(tag: str = "", **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "HOGWILD_TEST_TAG": tag, **extra}
    env.pop("HOGWILD_PROGRESS", None)
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_cli(args, run_dir: Path, timeout: float = 120, tag: str = "", cwd=None) -> subprocess.CompletedProcess:
    """`python -m hogwild train ...` in a subprocess, its outputs in run_dir."""
    return subprocess.run(
        cli_command(args, run_dir), capture_output=True, text=True, timeout=timeout, env=cli_env(tag),
        cwd=cwd or run_dir.parent,
    )


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(("torch_", "sem.mp"))}
    except FileNotFoundError:
        return set()


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes that inherited HOGWILD_TEST_TAG=tag: the orchestrator, its workers, its
    fork server and resource tracker — wherever they were re-parented to."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("HOGWILD_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def worker_processes(tag: str, orchestrator_pid: int) -> list[psutil.Process]:
    """The training workers among a run's tagged processes: not the orchestrator, its fork server
    (a child of the orchestrator) or the resource tracker. Forkserver workers are children of
    the fork server and carry its command line."""
    workers = []
    for p in tagged_processes(tag):
        try:
            cmd = " ".join(p.cmdline())
            helper = "resource_tracker" in cmd or ("forkserver" in cmd and p.ppid() == orchestrator_pid)
            if p.pid != orchestrator_pid and not helper:
                workers.append(p)
        except psutil.Error:
            pass
    return workers


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a shared-memory entry behind."""
    before = shm_entries()
    yield
    # torch_shm_manager unlinks file_system segments shortly after the last user exits
    left = shm_entries() - before
    for _ in range(30):
        if not left:
            break
        import time

        time.sleep(0.1)
        left = shm_entries() - before
    assert not left, f"shared-memory entries left behind: {sorted(left)}"
