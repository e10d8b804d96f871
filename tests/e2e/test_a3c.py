"""A3C end to end (docs/a3c.md): a short run learns CartPole and stops as solved; an environment
that raises stops the run or is restarted; Ctrl-C stops with a checkpoint and a resumed run
continues the env-step count and the shared optimizer state."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import torch

from support import (
    assert_nothing_left,
    cli_command,
    cli_env,
    free_port,
    read_summary,
    run_example,
    start_run,
    tagged_processes,
    tensorboard_tags,
)

A3C = ["+experiment=a3c_cartpole", "trainer.start_method=fork"]
# A lower bar than the 475 that solves CartPole: a random policy's return is ~20.
LEARNS = ["a3c.stop_at_return=150", "a3c.max_env_steps=400000", "a3c.eval_every_env_steps=10000"]
FAULTY_ENV = ["env._target_=faults.faulty_env", "+env.fault=raise", "+env.at_step=300"]


def run(tmp_path: Path, args, timeout: float = 120, **env: str):
    tag, run_dir = uuid.uuid4().hex, tmp_path / "run"
    result = subprocess.run(
        cli_command(args, run_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(tag, **env),
        cwd=tmp_path,
    )
    return result, run_dir, tag


def test_a_short_run_learns_cartpole_and_stops_as_solved(tmp_path):
    """The experiment as a user runs it (forkserver, 2 workers, shared Adam), with a lower bar."""
    result, run_dir, tag = run(tmp_path, ["+experiment=a3c_cartpole", *LEARNS])
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["solved"] is True, s
    assert s["eval_return"] >= 150 and s["best_eval_return"] >= 150
    assert 0 < s["seconds_to_solve"] <= s["wall_seconds"]
    assert s["env_steps"] == s["total_samples"] < 400_000 and s["env_steps_per_second"] > 0
    assert s["env"] == "CartPole-v1" and s["optimizer_shared"] is True
    # one shared Adam step counter for every worker's updates (a racing increment may be lost)
    per_worker = [w["steps"] for w in s["staleness"]["per_worker"]]
    assert max(per_worker) < s["optimizer_state_steps"] <= sum(per_worker)
    assert "solved: greedy return" in result.stderr and "stopping the workers" in result.stderr
    assert "solved         yes" in result.stdout
    tags = tensorboard_tags(run_dir)
    for expected in (
        "train/episode_return",
        "train/episode_length",
        "train/entropy",
        "train/policy_loss",
        "train/value_loss",
        "eval/return",
        "perf/env_steps_per_second",
        "staleness/mean",
    ):
        assert expected in tags, (expected, sorted(tags))
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert_nothing_left(tag)


def test_an_env_that_raises_stops_the_run_with_its_traceback(tmp_path):
    result, run_dir, tag = run(tmp_path, [*A3C, *FAULTY_ENV])
    assert result.returncode == 1, result.stderr
    assert (
        "hogwild: run failed: worker 1: RuntimeError: injected fault in env.step" in result.stderr
    )
    assert "in step" in result.stderr  # the worker's traceback, in the orchestrator's log
    assert read_summary(run_dir)["status"] == "failed"
    assert_nothing_left(tag)


def test_an_env_that_raises_is_restarted_and_the_run_still_learns(tmp_path):
    args = [*A3C, *LEARNS, *FAULTY_ENV, "trainer.on_worker_failure=restart"]
    result, run_dir, tag = run(tmp_path, args, HOGWILD_FAULT_FILE=str(tmp_path / "fault"))
    assert result.returncode == 0, result.stderr
    assert "worker 1 died (RuntimeError: injected fault in env.step); restarting it (1/3)" in (
        result.stderr
    )
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["worker_restarts"] == 1 and s["solved"] is True
    assert_nothing_left(tag)


def test_ctrl_c_checkpoints_and_a_resumed_run_continues_env_steps_and_optimizer_state(tmp_path):
    """An unreachable goal and a large budget: the run trains until Ctrl-C; its resume gets a
    budget 10,000 env steps past where it stopped."""
    args = [*A3C, "env._target_=faults.faulty_env", "a3c.stop_at_return=100000", "resume_from=auto"]
    proc, run_dir, tag = start_training(tmp_path, [*args, "a3c.max_env_steps=10000000"])
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    first = read_summary(run_dir)
    assert first["status"] == "interrupted" and first["env_steps"] >= 200
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert int(saved["optimizer_state"][0]["step"]) == first["optimizer_state_steps"] > 0
    assert_nothing_left(tag)

    budget = first["env_steps"] + 10_000
    result, run_dir, _ = run(tmp_path, [*args, f"a3c.max_env_steps={budget}"])
    assert result.returncode == 0, result.stderr
    assert "resumed the shared optimizer state" in result.stderr
    second = read_summary(run_dir)
    assert second["status"] == "completed" and second["solved"] is False
    assert second["env_steps"] >= budget and second["total_samples"] < budget
    assert second["env_steps"] == first["env_steps"] + second["total_samples"]
    assert second["optimizer_state_steps"] > first["optimizer_state_steps"]
    assert second["eval_return"] is not None  # the final evaluation of an unsolved run


def start_training(tmp_path: Path, args):
    """A run with an unreachable goal, returned once both workers have stepped their envs."""
    unreachable = ["env._target_=faults.faulty_env", "a3c.stop_at_return=100000"]
    return start_run(tmp_path, *args, *unreachable, base=[])


def test_workers_playing_under_spawn_end_when_the_orchestrator_is_killed(tmp_path):
    proc, _, tag = start_training(
        tmp_path, ["+experiment=a3c_cartpole", "trainer.start_method=spawn"]
    )
    workers = [p for p in tagged_processes(tag) if p.pid != proc.pid]
    assert workers
    proc.kill()
    proc.communicate(timeout=10)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert_nothing_left(tag)


def test_a_goal_reached_on_rank_0_stops_every_torchrun_node(tmp_path):
    """Two loopback nodes average their models; rank 0's evaluation solves, its next rounds
    tell node 1, and both complete (instead of node 1 waiting for a round that never comes)."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        f"--master_port={free_port()}", "-m", "hogwild", "train", "distributed=torchrun",
        f"hydra.run.dir={run_dir}", "trainer.num_workers=1", *A3C, *LEARNS,
        "distributed.timeout_seconds=30",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=150, env=cli_env(), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "another node reached the run's goal; stopping the workers" in result.stderr
    assert "node 1: completed" in result.stdout
    s = read_summary(run_dir)
    assert (
        s["status"] == "completed" and s["solved"] is True and s["distributed"]["world_size"] == 2
    )


def test_the_custom_env_example_solves_its_corridor_without_hydra(tmp_path):
    # A run can settle in the corridor's local optimum, walking to one end whatever the goal
    # (train/episode_return ~0.45, greedy return 0.25): seen once in about 60 runs. So the
    # example gets a second run; a broken A3C fails both.
    for attempt in (1, 2):
        folder = tmp_path / f"attempt_{attempt}"
        folder.mkdir()
        result = run_example("a3c_custom_env.py", folder, timeout=120)
        assert result.returncode == 0, result.stderr
        if "completed: solved=True" in result.stdout:
            break
    assert "completed: solved=True" in result.stdout
    (run,) = (folder / "outputs" / "a3c_custom_env").iterdir()  # a fresh folder per run
    s = read_summary(run)
    assert s["solved"] is True and s["eval_return"] >= 0.9 and s["optimizer_shared"] is True
