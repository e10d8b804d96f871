"""One run per folder (hogwild.run.folder.Claim): the lock lives beside the folder, where
`rm -rf <folder>` cannot take it; a folder removed under a run is noticed; a claim clears the
partial checkpoints a killed run left; a fresh folder is never left behind by a refused run."""

from __future__ import annotations

import os
import shutil

import pytest

from hogwild.errors import RunFolderError
from hogwild.run import folder as run_folder
from hogwild.run.folder import Claim, lock_path


def refusal(folder) -> str:
    with pytest.raises(RunFolderError) as info:
        Claim(str(folder)).__enter__()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def beside(folder) -> str:
    return os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.hogwild.lock")


# ---- where the lock lives ----


def test_the_lock_is_beside_the_folder_holds_pid_and_folder_and_goes_with_the_run(tmp_path):
    run = tmp_path / "run"
    with Claim(str(run)) as claim:
        assert claim.lock == beside(str(run)) == lock_path(str(run))
        pid, identity = open(claim.lock).read().split()
        st = os.stat(run)
        assert pid == str(os.getpid()) and identity == f"{st.st_dev}:{st.st_ino}"
        assert os.listdir(run) == []  # nothing of the lock inside the run's folder
        claim.started = True
    assert os.listdir(tmp_path) == ["run"]  # the lock file went with the run


def test_a_second_claim_is_refused_with_the_holders_pid_and_touches_nothing(tmp_path):
    run = tmp_path / "run"
    with Claim(str(run)) as claim:
        (run / "train.log").write_text("the first run's\n")
        message = refusal(run)
        assert f"is in use by another hogwild run (PID {os.getpid()})" in message
        assert (run / "train.log").read_text() == "the first run's\n"
        assert os.path.exists(claim.lock)
        claim.started = True


def test_rm_rf_of_the_folder_does_not_release_it(tmp_path):
    run = tmp_path / "run"
    with Claim(str(run)) as claim:
        claim.started = True
        (run / "checkpoints").mkdir()
        shutil.rmtree(run)
        # a second run into the same path: its fresh folder is not the holder's, and goes again
        assert "in use by another hogwild run" in refusal(run)
        assert not run.exists()
        with pytest.raises(RunFolderError) as info:
            claim.check()
    message = str(info.value)
    assert message.startswith(f"run folder {run} was removed while the run was running: ")
    assert "\n" not in message
    assert not run.exists() and os.listdir(tmp_path) == []  # nothing made again, no lock left


def test_a_folder_replaced_by_another_of_the_same_name_is_noticed(tmp_path):
    run = tmp_path / "run"
    with Claim(str(run)) as claim:
        claim.started = True
        claim.check()  # still there: nothing to say
        shutil.rmtree(run)
        run.mkdir()
        with pytest.raises(RunFolderError, match="another folder now has its name"):
            claim.check()
        # the holder's folder is not this one either: but a folder that is not fresh is kept
        (run / "notes.txt").write_text("mine")
        refusal(run)
        assert (run / "notes.txt").exists()


def test_a_fresh_folder_busy_with_its_holder_is_never_removed_by_a_refused_run(tmp_path):
    run = tmp_path / "run"
    with Claim(str(run)) as claim:  # the holder has not written anything yet
        refusal(run)
        assert run.is_dir()
        claim.started = True
    assert run.is_dir()


def test_a_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(beside(str(run)), "w") as f:
        f.write("4194305\n1:2\n")  # a PID no process has; a folder long gone
    with Claim(str(run)) as claim:
        assert open(claim.lock).read().split()[0] == str(os.getpid())
        claim.started = True
    assert not os.path.exists(beside(str(run)))


# ---- fresh folders ----


def test_a_fresh_folder_is_removed_when_the_run_never_started_and_kept_once_it_did(tmp_path):
    with Claim(str(tmp_path / "never")):
        (tmp_path / "never" / "train.log").write_text("preparing\n")
    with Claim(str(tmp_path / "ran")) as claim:
        claim.started = True
    assert os.listdir(tmp_path) == ["ran"]


def test_an_older_versions_lock_inside_the_folder_keeps_it_fresh(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".hogwild.lock").write_text("123\n")
    with Claim(str(run)) as claim:
        assert claim.fresh
    assert not run.exists()


# ---- where a parent takes no new file ----


def test_a_read_only_parent_locks_in_this_users_own_folder(tmp_path, monkeypatch):
    locks = tmp_path / "locks"  # /tmp in real runs
    locks.mkdir()
    monkeypatch.setattr(run_folder, "LOCKS_FALLBACK", str(locks))
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep").write_text("")
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if p == str(tmp_path) else real_access(p, m)
    )
    path = lock_path(str(run))
    assert path.startswith(os.path.join(run_folder.LOCKS_FALLBACK, f"hogwild-{os.getuid()}", ""))
    assert path == lock_path(str(run))  # every run into the folder finds the same one
    assert path != lock_path(str(tmp_path / "other"))
    with Claim(str(run)) as claim:
        assert claim.lock == path
        assert "in use by another hogwild run" in refusal(run)
        claim.started = True
    assert not os.path.exists(path) and sorted(os.listdir(tmp_path)) == ["locks", "run"]


def test_no_place_for_the_lock_is_one_line_and_leaves_no_fresh_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setattr(run_folder, "LOCKS_FALLBACK", str(blocker))  # not a folder
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if p == str(tmp_path) else real_access(p, m)
    )
    message = refusal(tmp_path / "run")
    assert message.startswith(f"cannot lock run folder {tmp_path / 'run'}: cannot write ")
    assert "Not a directory" in message
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_a_lock_folder_someone_else_made_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(run_folder, "LOCKS_FALLBACK", str(tmp_path))
    os.symlink("/", tmp_path / f"hogwild-{os.getuid()}")  # planted: not a folder of this user's
    parent = tmp_path / "parent"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if p == str(parent) else real_access(p, m))
    message = refusal(parent / "run")
    assert "is not a folder of this user's" in message


# ---- what a claim clears ----


def test_a_claim_removes_partial_checkpoints_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"the good one")
    (run / "checkpoints" / ".last.k3j2_x.tmp").write_bytes(b"\0" * 4096)  # a kill mid-write
    (run / "checkpoints" / "notes.tmp").write_text("not a checkpoint's")
    (run / ".last.abc.tmp").write_text("not in checkpoints/")
    with Claim(str(run)) as claim:
        claim.started = True
        assert sorted(os.listdir(run / "checkpoints")) == ["last.pt", "notes.tmp"]
    assert (run / ".last.abc.tmp").exists()


def test_a_refused_claim_clears_nothing(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with Claim(str(run)) as claim:
        claim.started = True
        (run / "checkpoints" / ".last.being_written.tmp").write_bytes(b"\0")
        refusal(run)
        assert (run / "checkpoints" / ".last.being_written.tmp").exists()
