"""Ctrl-C in a sweep (docs/fault-tolerance.md, issue 31): the first one stops the job that runs
as it stops a single run, and no further job starts; the sweep table still comes, the jobs
never run marked `not run` and their folders gone, exit 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

from support import assert_nothing_left, cli_env, read_summary, wait_until

# 4 jobs of one worker: the first has no pause per step (done in seconds), the others sleep
# 0.5 s per step (32 steps: long enough to be interrupted whatever the machine's load)
SWEEP = [
    "data=synthetic",
    "data.num_samples=2000",
    "data.num_test_samples=200",
    "trainer.epochs=1",
    "trainer.num_workers=1",
    "trainer.start_method=fork",
    "model._target_=faults.FaultyMLP",
    "+model.step_seconds=0,0.5,0.51,0.52",
]


def job(sweep_dir, number: int):
    """Job `number`'s folder: named by what it varies (hogwild.cli.sweep.job_folder)."""
    return sweep_dir / f"{number}_+model.step_seconds={['0', '0.5', '0.51', '0.52'][number]}"


def start_sweep(tmp_path):
    """The sweep in its own session, as a shell runs it: a signal to its process group is what
    the terminal's Ctrl-C is."""
    tag, sweep_dir = uuid.uuid4().hex, tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hogwild", "train", "-m", f"hydra.sweep.dir={sweep_dir}", *SWEEP],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(tag),
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    return proc, sweep_dir, tag


def interrupt_when(proc, ready) -> tuple[str, str]:
    """Ctrl-C to the sweep's process group once `ready()` (an event in its folder), never a
    fixed wait; (stdout, stderr) once it has ended. Killed if it outlives the test."""
    try:
        assert wait_until(lambda: ready() or proc.poll() is not None, 300)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def table_rows(out: str) -> dict[str, list[str]]:
    """The sweep table's rows by job number: the cells split on runs of 2+ spaces."""
    import re

    table = out[out.index("\nsweep: ") :].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("job "))
    rows = [re.split(r"\s{2,}", line.strip()) for line in table[header + 2 :] if line.strip()]
    return {cells[0]: cells for cells in rows}


def test_ctrl_c_during_the_second_job_stops_the_sweep_with_its_table(tmp_path, no_leaks):
    proc, sweep_dir, tag = start_sweep(tmp_path)
    # job 1 is training once its TensorBoard folder exists: the run took its signals before
    # it made it
    out, err = interrupt_when(proc, lambda: (job(sweep_dir, 1) / "tensorboard").exists())
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    assert read_summary(job(sweep_dir, 0))["status"] == "completed"
    assert read_summary(job(sweep_dir, 1))["status"] == "interrupted"
    assert (job(sweep_dir, 1) / "checkpoints" / "last.pt").exists()
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == [
        job(sweep_dir, 0).name,
        job(sweep_dir, 1).name,
    ]  # the jobs not run left no folder
    assert "sweep: 4 jobs, 2 not run (stopped by SIGINT)" in out, out
    rows = table_rows(out)
    assert [rows[j][2] for j in "0123"] == ["completed", "interrupted", "not run", "not run"]
    assert rows["2"][1] == "+model.step_seconds=0.51" and rows["3"][-1] == "-"
    assert out.count("run interrupted") == 1  # job 1's report; jobs 2 and 3 said nothing
    assert_nothing_left(tag)


def test_ctrl_c_before_the_first_job_started_writes_nothing(tmp_path, no_leaks):
    proc, sweep_dir, tag = start_sweep(tmp_path)
    # the first job's first line: it is validated, its torch is being imported
    out, err = interrupt_when(proc, lambda: (job(sweep_dir, 0) / "train.log").exists())
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    if "nothing was written" in out:  # the usual case: torch was still being imported
        assert "interrupted by SIGINT before the run started" in out
        assert "\nsweep: " not in out
        assert not sweep_dir.exists()  # not even Hydra's multirun.yaml
    else:  # a loaded machine: its worker had started, an interrupted run with its records
        assert read_summary(job(sweep_dir, 0))["status"] == "interrupted"
        assert "sweep: 4 jobs, 3 not run (stopped by SIGINT)" in out
        assert not any(job(sweep_dir, j).exists() for j in (1, 2, 3))
    assert_nothing_left(tag)
