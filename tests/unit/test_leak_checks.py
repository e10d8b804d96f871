"""The leak check behind the `no_leaks` fixture (support.LeakCheck) judges only what the test's own
processes leave behind: it still catches them, and ignores other programs' files and processes."""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from support import OWNER_ENV, LeakCheck, wait_until

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm (Linux)")

# above the kernel's PID_MAX_LIMIT (2**22 on 64-bit): no process ever has this pid
NO_SUCH_PID = 2**22 + 1


@contextlib.contextmanager
def shm_files(*names: str):
    """Files in /dev/shm, removed afterwards whatever happens."""
    paths = [SHM / name for name in names]
    try:
        for path in paths:
            path.write_bytes(b"\0" * mmap.PAGESIZE)
        yield paths
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def unique(prefix: str) -> str:
    return f"{prefix}leakcheck_{uuid.uuid4().hex[:8]}"


def untagged_env() -> dict[str, str]:
    """This environment without the check's tag: how another program's processes start."""
    return {k: v for k, v in os.environ.items() if k != OWNER_ENV}


def orphan(env=None) -> int:
    """A `sleep` whose shell has exited: re-parented away from the test process."""
    started = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(started.stdout)


def test_an_entry_this_process_creates_is_reported_and_one_from_before_is_not():
    mine, older = unique(f"torch_{os.getpid()}_"), unique(f"torch_{os.getpid()}_")
    outside = os.environ.get(OWNER_ENV)
    with shm_files(older), LeakCheck() as check:
        with shm_files(mine):
            processes, entries = check.leftovers(timeout=0)
    assert entries == [mine]
    assert processes == []
    assert os.environ.get(OWNER_ENV) == outside  # the tag is gone with the check


def test_entries_and_processes_of_other_programs_are_ignored():
    earlier = subprocess.Popen(["sleep", "60"])  # a child from before the check: not its business
    with LeakCheck() as check:
        # a live process that is neither tagged nor a descendant: another program's, in effect
        stranger = orphan(untagged_env())
        try:
            foreign = [
                unique(f"torch_{stranger}_"),
                unique(f"torch_{os.getppid()}_"),  # pytest's parent: alive, not ours
                unique(f"torch_{NO_SUCH_PID}_"),
                unique("psm_"),  # no pid in the name, and none of ours maps it
                unique("other_prog_"),
            ]
            with shm_files(*foreign):
                processes, entries = check.leftovers(timeout=0)
        finally:
            os.kill(stranger, signal.SIGKILL)
            earlier.kill()
            earlier.wait()
    assert entries == []
    assert processes == []


def test_an_entry_of_a_process_of_ours_that_has_exited_is_reported():
    with LeakCheck() as check:
        # a tagged child (it inherits the environment) that creates its segment and waits
        child = subprocess.Popen(
            ["sh", "-c", "touch /dev/shm/torch_$$_leakcheck_exited; read line"],
            stdin=subprocess.PIPE,
        )
        name = f"torch_{child.pid}_leakcheck_exited"
        try:
            assert wait_until(lambda: child.pid in check.pids and (SHM / name).exists(), 30)
            child.communicate(b"exit now\n", timeout=30)  # gone before the check ends
            processes, entries = check.leftovers(timeout=0)
        finally:
            child.kill()
            child.wait()
            (SHM / name).unlink(missing_ok=True)
    assert entries == [name]
    assert processes == []


def test_processes_of_ours_still_running_are_reported():
    with LeakCheck() as check:
        tagged = orphan()  # ours by the tag alone: no longer a descendant of the test process
        child = subprocess.Popen(["sleep", "60"], env=untagged_env())  # ours as a descendant
        try:
            processes, entries = check.leftovers(timeout=0)
        finally:
            os.kill(tagged, signal.SIGKILL)
            child.kill()
            child.wait()
    assert sorted(p.pid for p in processes) == sorted([tagged, child.pid])
    assert entries == []


def test_a_pid_less_entry_is_reported_when_a_process_of_ours_maps_it():
    mapped, unmapped = unique("psm_"), unique("psm_")
    with LeakCheck() as check, shm_files(mapped, unmapped):
        with open(SHM / mapped, "r+b") as f, mmap.mmap(f.fileno(), 0):
            processes, entries = check.leftovers(timeout=0)
    assert entries == [mapped]
    assert processes == []
