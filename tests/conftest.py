"""Fixtures for both tiers; the helpers they share live in tests/support.py."""

from __future__ import annotations

import pytest

from support import SMALL, run_sweep, shm_entries, wait_until


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a shared-memory entry behind."""
    before = shm_entries()
    yield
    # torch_shm_manager unlinks file_system segments shortly after the last user exits
    wait_until(lambda: not shm_entries() - before, timeout=3)
    left = shm_entries() - before
    assert not left, f"shared-memory entries left behind: {sorted(left)}"


@pytest.fixture(scope="session")
def two_run_sweep(tmp_path_factory):
    """One real Hydra multirun (num_workers=1,2), shared by the tests that read a sweep."""
    folder = tmp_path_factory.mktemp("sweep") / "sweep"
    result = run_sweep(["trainer.num_workers=1,2", "trainer.start_method=fork", *SMALL], folder)
    assert result.returncode == 0, result.stderr
    (folder.parent / "cli.stdout").write_text(result.stdout)  # the table the CLI prints at the end
    return folder
