"""No run is ever lost (issue 31): a run whose folder is removed while it trains fails with one
line and keeps its lock, so a second run into the same path is refused while it lives; the
partial checkpoints a killed run left are removed by the run that continues it."""

from __future__ import annotations

import os
import shutil
import signal

import torch

from support import SLOW, assert_nothing_left, read_summary, run_cli, start_run, wait_until

FORK = "trainer.start_method=fork"


def lock_files(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(".hogwild.lock")]


def test_a_run_whose_folder_is_removed_fails_in_one_line_and_keeps_its_lock(tmp_path, no_leaks):
    proc, run_dir, tag = start_run(tmp_path, FORK)  # both workers have taken steps
    assert lock_files(tmp_path) == [".run.hogwild.lock"]
    # The orchestrator is held still while the folder goes and a second run tries the same
    # path: it would otherwise notice within half a second and end, lock and all.
    proc.send_signal(signal.SIGSTOP)
    try:
        shutil.rmtree(run_dir)
        second = run_cli([*SLOW, FORK], run_dir, timeout=300)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert second.returncode == 2, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith("hogwild: error: ") and "Traceback" not in second.stderr
    assert f"run folder {run_dir} is in use by another hogwild run (PID {proc.pid})" in line
    assert not run_dir.exists()  # the refused run's own fresh folder went again

    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err  # failed
    assert "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"hogwild: run failed: run folder {run_dir} was removed while the run was running: "
        )
    ), err
    assert "run failed" in out.splitlines()[0], out  # the console report, all the same
    assert not run_dir.exists()  # nothing of it made again: no checkpoint, no summary
    assert lock_files(tmp_path) == []  # the lock went with the run
    assert_nothing_left(tag)


def test_a_resumed_run_removes_the_partial_checkpoints_a_killed_run_left(tmp_path, no_leaks):
    checkpoints = [f"{FORK}", "checkpoint.every_n_steps=5", "checkpoint.every_seconds=0"]
    proc, run_dir, tag = start_run(tmp_path, *checkpoints)
    last = run_dir / "checkpoints" / "last.pt"
    assert wait_until(last.exists, 120), "no periodic checkpoint"
    proc.kill()  # the orchestrator, killed outright: its workers follow it
    proc.communicate(timeout=60)
    assert_nothing_left(tag)
    # what a kill in the middle of writing a checkpoint leaves (hogwild.run.checkpoint)
    partial = run_dir / "checkpoints" / ".last.k1ll3d.tmp"
    partial.write_bytes(os.urandom(2**21))
    notes = run_dir / "checkpoints" / "notes.tmp"  # not a checkpoint's: kept
    notes.write_text("mine")

    # the same run again, continued, at full speed (the step time is not part of its shape)
    fast = [arg for arg in SLOW if not arg.startswith("+model.step_seconds")]
    resumed = run_cli([*fast, *checkpoints, "+model.step_seconds=0", "resume_from=auto"], run_dir)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(last)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["last.pt", "notes.tmp"]
    assert torch.load(last, weights_only=True)["run"]["samples_seen"] == 20000
    assert lock_files(tmp_path) == []
