"""Fixtures for both tiers; the helpers they share live in tests/support.py."""

from __future__ import annotations

import contextlib

import psutil
import pytest

from support import SMALL, LeakCheck, run_sweep


@pytest.fixture
def no_leaks():
    """Fails the test if a process it started outlives it or leaves a /dev/shm entry behind.
    Only the test's own processes are judged, not the machine's (support.LeakCheck says how):
    other programs may run and use /dev/shm meanwhile."""
    with LeakCheck() as check:
        yield
        processes, entries = check.leftovers(timeout=20)
        running = []
        for p in processes:
            with contextlib.suppress(psutil.Error):  # it may exit just now
                running.append((p.pid, " ".join(p.cmdline())))
                p.kill()  # so that one test's leak does not spill into the next
    assert not running, f"processes left running: {running}"
    assert not entries, f"shared-memory entries left behind: {entries}"


@pytest.fixture(scope="session")
def two_run_sweep(tmp_path_factory):
    """One real Hydra multirun (num_workers=1,2), shared by the tests that read a sweep."""
    folder = tmp_path_factory.mktemp("sweep") / "sweep"
    result = run_sweep(["trainer.num_workers=1,2", "trainer.start_method=fork", *SMALL], folder)
    assert result.returncode == 0, result.stderr
    (folder.parent / "cli.stdout").write_text(result.stdout)  # the table the CLI prints at the end
    return folder
