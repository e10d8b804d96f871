"""A hostile world (docs/fault-tolerance.md): hung workers, signals at any moment, poisoned
gradients, full or read-only disks, two runs in one folder, a closed stdout, a killed
torch_shm_manager, a flipped byte in a checkpoint. Each case: the exit code, the last line,
summary.json (strict JSON), whether last.pt loads with finite weights, nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from support import (
    SLOW,
    assert_nothing_left,
    cli_command,
    cli_env,
    fault,
    run_cli,
    shm_entries,
    start_run,
    tagged_processes,
    tensorboard_tags,
    wait_until,
)

QUICK = [*SLOW[:-3], "model._target_=faults.FaultyMLP", "trainer.start_method=fork"]


def finite_checkpoint(run_dir: Path) -> dict:
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    return state


def strict_summary(run_dir: Path) -> dict:
    text = (run_dir / "summary.json").read_text()
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in summary.json"))


# ---- hung workers ----


def test_a_hung_worker_is_named_with_its_stack_killed_and_the_run_fails(tmp_path):
    args = [
        *SLOW,
        *fault("hang", at_step=5),
        "trainer.start_method=fork",
        "trainer.stall_seconds=3",
    ]
    result = run_cli(args, tmp_path / "run", timeout=120)
    assert result.returncode == 1, result.stderr
    assert "worker 1 took no step for 3 s" in result.stderr
    assert "faults.py" in result.stderr and "in _fire" in result.stderr  # its Python stack
    assert result.stderr.strip().splitlines()[-1].startswith("hogwild: run failed: worker 1: hung")
    s = strict_summary(tmp_path / "run")
    assert s["status"] == "failed" and "hung" in s["error"]["reason"]


def test_a_hung_worker_is_replaced_with_on_worker_failure_restart(tmp_path):
    tag = uuid.uuid4().hex
    args = [
        *SLOW, *fault("hang", at_step=5), "trainer.start_method=fork", "trainer.stall_seconds=3",
        "trainer.on_worker_failure=restart", "model.step_seconds=0", "data.num_samples=4000",
    ]  # fmt: skip
    env = cli_env(tag, HOGWILD_FAULT_FILE=str(tmp_path / "fault"))  # it hangs once
    result = subprocess.run(
        cli_command(args, tmp_path / "run"), capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    s = strict_summary(tmp_path / "run")
    assert s["status"] == "completed" and s["worker_restarts"] == 1
    assert_nothing_left(tag)


def test_a_stopped_worker_is_a_hung_worker(tmp_path):
    proc, run_dir, tag = start_run(tmp_path, "trainer.start_method=fork", "trainer.stall_seconds=3")
    workers = [
        p for p in psutil.Process(proc.pid).children() if "forkserver" not in " ".join(p.cmdline())
    ]
    os.kill(workers[-1].pid, signal.SIGSTOP)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "stopped (SIGSTOP)" in stderr
    assert strict_summary(run_dir)["status"] == "failed"
    assert_nothing_left(tag)


# ---- signals at any moment ----


@pytest.mark.parametrize("sig, code", [(signal.SIGHUP, 129), (signal.SIGTERM, 143)])
def test_a_hangup_or_sigterm_stops_the_run_with_summary_and_checkpoint(tmp_path, sig, code):
    proc, run_dir, tag = start_run(tmp_path, "trainer.start_method=fork")
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert strict_summary(run_dir)["status"] == "interrupted"
    finite_checkpoint(run_dir)
    assert "Traceback" not in stderr
    assert_nothing_left(tag)


def test_a_second_ctrl_c_during_shutdown_still_writes_summary_and_checkpoint(tmp_path):
    # the polite stop takes seconds (each step sleeps 1 s): the second signal lands inside it
    proc, run_dir, tag = start_run(tmp_path, "trainer.start_method=fork", "model.step_seconds=1")
    proc.send_signal(signal.SIGINT)
    assert wait_until(lambda: "SIGINT received" in (run_dir / "train.log").read_text(), 30)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert strict_summary(run_dir)["status"] == "interrupted"
    finite_checkpoint(run_dir)
    assert "Traceback" not in stderr
    assert_nothing_left(tag)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_ctrl_c_at_start_up_is_one_line_and_writes_nothing(tmp_path, start_method):
    """The terminal's Ctrl-C reaches the whole process group while the fork server (or the first
    worker) is still importing torch."""
    tag, run_dir = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen(
        cli_command([*SLOW, f"trainer.start_method={start_method}"], run_dir),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(tag),
        start_new_session=True,
    )  # fmt: skip
    # as soon as the orchestrator has a child (the fork server, or the first spawned worker)
    assert wait_until(lambda: psutil.Process(proc.pid).children(), 60)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err and "EOFError" not in err, err
    assert proc.returncode == 130, err
    if "nothing was written" in out:
        assert not run_dir.exists()  # refused before it began: no folder either
    else:  # the workers had started: an interrupted run, with its records
        assert strict_summary(run_dir)["status"] == "interrupted"
    assert_nothing_left(tag)


# ---- poisoned weights ----


def test_a_nan_gradient_fails_the_run_and_the_checkpoint_stays_finite(tmp_path):
    args = [
        *QUICK,
        *fault("nangrad", at_step=20),
        "checkpoint.every_n_steps=5",
        "checkpoint.every_seconds=0",
    ]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 1, result.stderr
    assert "non-finite gradient" in result.stderr
    assert strict_summary(tmp_path / "run")["status"] == "failed"
    state = finite_checkpoint(tmp_path / "run")
    assert state["run"]["samples_seen"] > 0  # the good one written before the failure


def test_skipped_nan_gradients_are_counted_and_never_saved(tmp_path):
    args = [*QUICK, *fault("nangrad", at_step=20), "trainer.skip_nonfinite=true"]
    result = run_cli(args, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    s = strict_summary(tmp_path / "run")
    assert s["status"] == "completed" and s["skipped_steps"] > 0
    assert "train/skipped_steps" in tensorboard_tags(tmp_path / "run")
    finite_checkpoint(tmp_path / "run")


# ---- write errors ----

needs_mounts = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and unshare -m to mount a small tmpfs",
)


def run_on_tmpfs(tmp_path, size: str, script: str, args: list[str]) -> subprocess.CompletedProcess:
    """The CLI inside a private mount namespace, its run folder on a tmpfs of `size`; `script`
    prepares the mount (fill it, make part of it read-only) before the run starts."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = " ".join(f"'{c}'" for c in cli_command(args, mnt / "run"))
    shell = f"mount -t tmpfs -o size={size} tmpfs {mnt} && cd {mnt} && {script} && {cmd}; echo $? > {tmp_path}/rc; cp -r {mnt}/run {tmp_path}/copy 2>/dev/null; true"
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120,
        env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    result.returncode = int((tmp_path / "rc").read_text())
    return result


@needs_mounts
def test_a_disk_without_room_for_two_checkpoints_is_refused_up_front(tmp_path):
    args = [*QUICK, "model.hidden_sizes=[2048,2048]"]  # ~ 20 MiB of weights per checkpoint
    result = run_on_tmpfs(tmp_path, "8m", "true", args)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "MiB free but two checkpoints need" in line and "Traceback" not in result.stderr


@needs_mounts
def test_a_disk_that_fills_up_mid_run_is_one_line_and_the_summary_is_written(tmp_path):
    # room for the run's start; once the first checkpoint is there a filler takes every byte,
    # then gives 64 KiB back: the next checkpoint cannot be written, the tiny summary fits
    filler = "(dd if=/dev/zero of=reserve bs=4k count=16 2>/dev/null; while [ ! -e run/checkpoints/last.pt ]; do sleep 0.05; done; dd if=/dev/zero of=filler bs=4k 2>/dev/null; rm -f reserve; true) &"
    args = [
        *QUICK,
        "+model.step_seconds=0.01",
        "checkpoint.every_n_steps=20",
        "checkpoint.every_seconds=0",
    ]
    result = run_on_tmpfs(tmp_path, "16m", filler + " true", args)
    assert result.returncode == 1, result.stderr
    assert "No space left on device" in result.stderr
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("No space left on device (free some space, or point the run elsewhere)")
    )
    copy = tmp_path / "copy"
    finite_checkpoint(copy)  # the earlier checkpoint survives
    assert strict_summary(copy)["status"] == "failed"


@needs_mounts
def test_a_read_only_checkpoint_folder_is_refused_in_one_line(tmp_path):
    ro = "mkdir -p run/checkpoints && mount --bind run/checkpoints run/checkpoints && mount -o remount,bind,ro run/checkpoints"
    result = run_on_tmpfs(tmp_path, "64m", ro, [*QUICK])
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "cannot write" in line and "Read-only file system" in line, result.stderr


# ---- one run per folder ----


def test_a_second_run_into_a_busy_folder_is_refused_and_touches_nothing(tmp_path):
    proc, run_dir, tag = start_run(tmp_path, "trainer.start_method=fork")
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    for extra in ([], ["resume_from=auto"]):
        second = run_cli([*SLOW, "trainer.start_method=fork", *extra], run_dir)
        assert second.returncode == 2, second.stderr
        line = second.stderr.strip().splitlines()[-1]
        assert f"in use by another hogwild run (PID {proc.pid})" in line
    assert (run_dir / ".hydra" / "config.yaml").read_text() == config
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert strict_summary(run_dir)["status"] == "interrupted"
    assert_nothing_left(tag)


# ---- smaller ones ----


def test_a_closed_stdout_is_not_an_error(tmp_path):
    cmd = cli_command([*QUICK], tmp_path / "run")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env()) as p:
        p.stdout.readline()  # `| head -1`
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=120)
    assert p.returncode == 0, err
    assert "BrokenPipeError" not in err and "Traceback" not in err


def test_file_system_segments_are_removed_even_without_torch_shm_manager(tmp_path):
    proc, run_dir, tag = start_run(
        tmp_path,
        "trainer.start_method=fork",
        "trainer.sharing_strategy=file_system",
        "model.step_seconds=0.05",
    )

    def own_managers():  # this run's (it inherited the tag), never another program's
        return [p for p in tagged_processes(tag) if "torch_shm_manager" in " ".join(p.cmdline())]

    assert wait_until(own_managers, timeout=60), "the run started no torch_shm_manager"
    for m in own_managers():
        m.kill()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert not {e for e in shm_entries() if e.startswith(f"torch_{proc.pid}_")}
    assert_nothing_left(tag)


def test_a_checkpoint_with_a_flipped_byte_is_refused_on_resume(tmp_path):
    first = tmp_path / "first"
    assert run_cli([*QUICK], first).returncode == 0
    path = first / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    weight = next(iter(state["model"].values()))
    needle = weight.contiguous().reshape(-1)[:16].numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at > 0
    data[at + 3] ^= 0x40
    path.write_bytes(bytes(data))
    result = run_cli([*QUICK, f"resume_from={path}", "trainer.epochs=2"], tmp_path / "second")
    assert result.returncode == 2, result.stderr
    assert "do not match their checksum" in result.stderr.strip().splitlines()[-1]
