"""Checkpoints through the CLI: a checkpoint of another run shape is refused before anything
starts; a periodic checkpoint survives a failure; resume_from=auto continues a folder's own run.
(A garbage or hostile resume_from file: tests/unit/test_refusals.py.)"""

from __future__ import annotations

import os
import zipfile

import torch

from hogwild.run import checkpoint

from support import FAILS_AT_STEP_40, SMALL, assert_refused_cleanly, read_summary, run_cli


def refused(result, run_dir, *fragments):
    return assert_refused_cleanly(
        result, run_dir, *fragments, prefix="hogwild: error: resume_from="
    )


def temp_files(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(".tmp")]


def test_cli_resume_with_other_num_workers_is_refused(tmp_path):
    first = tmp_path / "first"
    result = run_cli([*SMALL, "trainer.num_workers=1", "trainer.start_method=fork"], first)
    assert result.returncode == 0, result.stderr
    ckpt = first / "checkpoints" / "last.pt"
    assert ckpt.exists()
    run_dir = tmp_path / "second"
    result = run_cli(
        [*SMALL, "trainer.num_workers=2", "trainer.start_method=fork", f"resume_from={ckpt}"],
        run_dir,
    )
    refused(result, run_dir, str(ckpt), "num_workers=1", "num_workers=2")


def test_periodic_checkpoint_survives_a_worker_failure(tmp_path):
    run_dir = tmp_path / "run"
    args = [*FAILS_AT_STEP_40, "+model.fault=raise"]  # rank 1 raises at its 40th step
    result = run_cli(args, run_dir)
    assert result.returncode == 1, result.stderr
    assert "ZeroDivisionError: injected fault in forward" in result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    folder = run_dir / "checkpoints"
    assert temp_files(folder) == [] and sorted(os.listdir(folder)) == ["last.pt"]
    state = torch.load(folder / "last.pt", weights_only=True)  # intact: the safe loader takes it
    # streamed while the workers wrote the weights: its CRCs are of the bytes written, the zip's too
    checkpoint.load(str(folder / "last.pt"))
    assert state["format"] == checkpoint.FORMAT
    assert zipfile.ZipFile(folder / "last.pt").testzip() is None
    seen = state["run"]["samples_seen"]
    assert 0 < seen <= summary["samples_seen"]
    assert seen == int(
        state["progress"][:, 2].sum()
    )  # SAMPLES column: the table and the count agree
    assert seen < 16000  # written while the run was going, not at an end it never reached


def test_resume_from_auto_continues_this_folders_run_and_never_a_completed_one(tmp_path):
    """What a restarted job does (torchrun --max-restarts, a requeued Slurm job): the same
    command again, in the same folder, picks up from the folder's own last checkpoint."""
    run_dir = tmp_path / "run"
    args = [*FAILS_AT_STEP_40, "resume_from=auto"]
    first = run_cli([*args, "+model.fault=raise"], run_dir)  # no checkpoint yet: auto starts fresh
    assert first.returncode == 1, first.stderr
    assert read_summary(run_dir)["resumed_from"] is None
    second = run_cli([*args, "+model.fault=none"], run_dir)  # the failed run's folder: auto resumes
    assert second.returncode == 0, second.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from"] == str(
        run_dir / "checkpoints" / "last.pt"
    )
    assert s["samples_seen"] == 16000 and 0 < s["total_samples"] < 16000
    before = (run_dir / "summary.json").read_text()
    third = run_cli([*args, "+model.fault=none"], run_dir)  # a completed run is never run again
    assert third.returncode == 2
    assert "resume_from=auto" in third.stderr and "already holds a completed run" in third.stderr
    assert (run_dir / "summary.json").read_text() == before


def test_resume_a_completed_run_with_more_epochs_or_nothing_to_do(tmp_path):
    first = tmp_path / "first"
    args = [*SMALL, "trainer.start_method=fork"]
    assert run_cli(args, first).returncode == 0
    ckpt = first / "checkpoints" / "last.pt"
    same = run_cli([*args, f"resume_from={ckpt}"], tmp_path / "same")  # trainer.epochs=1 again
    assert_refused_cleanly(same, tmp_path / "same", "nothing to do", "x 1 epoch;", "trainer.epochs")
    more = tmp_path / "more"
    result = run_cli([*args, f"resume_from={ckpt}", "trainer.epochs=3"], more)
    assert result.returncode == 0, result.stderr
    done = read_summary(first)["samples_seen"]
    assert f"resumed from {ckpt} at {done:,} samples" in result.stderr
    s = read_summary(more)
    assert s["status"] == "completed" and s["samples_seen"] == 3 * done
    assert s["total_samples"] == 2 * done  # this run trained the two new epochs only


def test_another_data_set_is_named_as_the_reason_a_resume_is_refused(tmp_path):
    first = tmp_path / "first"
    assert run_cli([*SMALL, "trainer.start_method=fork"], first).returncode == 0
    ckpt = first / "checkpoints" / "last.pt"
    run_dir = tmp_path / "second"
    # the run's own overrides come back (data=synthetic, ...): another data set is asked for
    result = run_cli(["trainer.start_method=fork", "data=digits", f"resume_from={ckpt}"], run_dir)
    refused(result, run_dir, "data set 'synthetic'", "data set 'digits'")


def test_ctrl_c_then_the_printed_command_resumes_the_run_as_it_was_and_can_extend_it(tmp_path):
    """Resume is one command (issue 30): the interrupted run prints it; it trains the run's
    own epochs with its own overrides; given now, trainer.epochs=3 extends it, and says so."""
    import shlex
    import signal
    import subprocess
    import sys

    from support import cli_env, start_run

    proc, run_dir, _ = start_run(tmp_path, "trainer.start_method=fork", "trainer.epochs=2")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and read_summary(run_dir)["status"] == "interrupted"
    line = next(line for line in out.splitlines() if line.strip().startswith("resume with"))
    command = shlex.split(line.split("resume with", 1)[1])
    assert command[:4] == ["python", "-m", "hogwild", "train"], command
    assert command[4:] == ["hydra.run.dir=run", "resume_from=auto"]  # run_dir, from its cwd
    first_hydra = (run_dir / ".hydra" / "overrides.yaml").read_text()
    # the printed command, with faster steps (the run's own +model.step_seconds=0.2 replaced)
    again = subprocess.run(
        [sys.executable, *command[1:], "model.step_seconds=0.001"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=cli_env(),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "continuing run with the config it ran with (" in again.stderr
    assert "changed: model.step_seconds 0.2 -> 0.001" in again.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["epochs"] == 2 and s["samples_seen"] == 2 * 20000
    assert "trainer.epochs=2" in first_hydra
    # (a completed run is extended into a new folder, from its checkpoint)
    more = tmp_path / "more"
    ckpt = run_dir / "checkpoints" / "last.pt"
    third = run_cli(["model.step_seconds=0.001", f"resume_from={ckpt}", "trainer.epochs=3"], more)
    assert third.returncode == 0, third.stderr[-3000:]
    # the resumed run's config is the folder's record now (step_seconds=0.001 included)
    assert "; changed: trainer.epochs 2 -> 3\n" in third.stderr
    assert read_summary(more)["samples_seen"] == 3 * 20000
