"""End-to-end runs of `python -m hogwild train`, as a user starts them, on tiny workloads."""

from __future__ import annotations

import math

import pytest
import torch

from support import (
    SMALL,
    learnable_mnist,
    read_summary,
    run_cli,
    tensorboard_scalars,
    tensorboard_tags,
)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_two_workers_complete_under_every_start_method_and_strategy(
    tmp_path, start_method, strategy, no_leaks
):
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            *SMALL,
            "trainer.num_workers=2",
            f"trainer.start_method={start_method}",
            f"trainer.sharing_strategy={strategy}",
        ],
        run_dir,
    )
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed"
    assert s["total_samples"] == 1 * 2000
    assert (s["start_method"], s["sharing_strategy"], s["num_workers"]) == (
        start_method,
        strategy,
        2,
    )
    # the strategy is a per-process setting: each worker reports the one it really runs with
    assert s["worker_sharing_strategies"] == [strategy, strategy]
    assert s["test_accuracy"] > 0.8
    assert s["memory_format"] == "contiguous"  # an MLP has no 4-D weights to lay out


def test_default_run_outputs_summary_checkpoint_and_tensorboard(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["trainer.epochs=5"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    required = [
        "status",
        "num_workers",
        "start_method",
        "sharing_strategy",
        "device",
        "threads_per_worker",
        "epochs",
        "total_samples",
        "wall_seconds",
        "train_seconds",
        "samples_per_second",
        "final_train_loss",
        "test_loss",
        "test_accuracy",
    ]
    assert all(k in s for k in required), set(required) - set(s)
    assert s["test_accuracy"] >= 0.95
    assert 0 < s["train_seconds"] < s["wall_seconds"]
    assert s["samples_per_second"] == pytest.approx(
        s["total_samples"] / s["train_seconds"], rel=0.01
    )
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["run"]["samples_seen"] == s["total_samples"]
    tags = tensorboard_tags(run_dir)
    for tag in [
        "train/loss",
        "train/lr",
        "perf/samples_per_second",
        "eval/loss",
        "eval/accuracy",
        "staleness/mean",
        "staleness/p95",
        "staleness/max",
        "summary/test_accuracy",
        "summary/ksamples_per_second",
    ]:
        assert tag in tags, tags
    for rank in ("w0", "w1"):  # one TensorBoard run per worker, the same tags in each
        worker_tags = tensorboard_tags(run_dir, rank)
        assert {"workers/loss", "workers/samples_per_second", "workers/staleness"} <= worker_tags
    assert not any("rank_" in tag for tag in tags), tags
    # every step recorded its staleness once; with 2 workers some steps saw the other's update
    st = s["staleness"]
    steps = int(state["progress"][:, 3].sum())  # the progress table's STEPS column
    assert st["steps"] == sum(w["steps"] for w in st["per_worker"]) == steps
    # (the mean may exceed the p95: when over 95% of steps saw no other update, p95 is 0)
    assert 0 <= st["mean"] <= st["max"] and 0 <= st["p95"] <= st["max"]
    assert [w["rank"] for w in st["per_worker"]] == [0, 1]
    assert "test accuracy" in result.stdout and "tensorboard --logdir" in result.stdout


def test_epochs_count_in_total_not_per_worker(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "data=synthetic",
        "data.num_samples=997",
        "data.num_test_samples=100",
        "data.batch_size=10",
        "trainer.epochs=3",
        "trainer.num_workers=3",
        "trainer.start_method=fork",
    ]
    result = run_cli(args, run_dir)
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["total_samples"] == 3 * 997
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    per_rank = state["progress"][:, 2].tolist()
    assert sum(per_rank) == 3 * 997 and max(per_rank) - min(per_rank) <= 3


def test_runs_from_any_working_directory(tmp_path):
    elsewhere = tmp_path / "somewhere"
    elsewhere.mkdir()
    result = run_cli([*SMALL, "trainer.start_method=fork"], elsewhere / "run", cwd=elsewhere)
    assert result.returncode == 0, result.stderr


def test_worker_logging_reaches_the_orchestrator_log(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        [*SMALL, "model._target_=faults.LoggingMLP", "trainer.start_method=fork"], run_dir
    )
    assert result.returncode == 0, result.stderr
    log = (run_dir / "train.log").read_text()
    assert "[worker 0] hello from a worker" in log and "[worker 1] hello from a worker" in log


def test_threads_per_worker_is_applied_in_each_worker(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            *SMALL,
            "model._target_=faults.LoggingMLP",
            "trainer.start_method=fork",
            "trainer.num_workers=1",
            "trainer.threads_per_worker=2",
        ],
        run_dir,
    )
    assert result.returncode == 0, result.stderr  # and no OpenMP-after-fork hang
    assert "threads=2" in (run_dir / "train.log").read_text()
    assert math.isfinite(read_summary(run_dir)["test_loss"])


def test_mnist_experiment_trains_the_convnet_on_idx_files(tmp_path):
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    root.mkdir()
    learnable_mnist(root)
    result = run_cli(
        [
            "+experiment=mnist",
            f"data.root={root}",
            "data.download=false",
            "trainer.epochs=3",
            "trainer.start_method=fork",
        ],
        run_dir,
    )
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["total_samples"] == 3 * 3000 and s["test_accuracy"] >= 0.95
    assert (
        s["memory_format"] == "channels_last"
    )  # trainer.memory_format=auto, a conv net on the CPU
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "hogwild.models.ConvNet" in config and "load_mnist" in config


def test_a_run_follows_the_schedule_in_tensorboard(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            *SMALL,
            "schedule=linear",
            "schedule.min_lr_fraction=0.1",
            "trainer.start_method=fork",
            "trainer.epochs=4",
        ],
        run_dir,
    )
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["schedule"]["name"] == "linear"
    lrs = [v for _, v in tensorboard_scalars(run_dir, "train/lr")]
    assert len(lrs) >= 2 and lrs[0] > lrs[-1] and min(lrs) >= 0.05 * 0.1 - 1e-9


def test_a_single_worker_never_reads_stale_weights(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, "trainer.num_workers=1", "trainer.start_method=fork"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)["staleness"]
    assert s["steps"] > 0 and s["max"] == 0.0 and s["mean"] == 0.0


@pytest.mark.parametrize("wait", ["30", "0"])
def test_every_epoch_is_evaluated_in_order_at_the_step_it_ended(tmp_path, wait):
    """Two workers keep both cores busy: the per-epoch evaluations wait for the end of training
    (or, with eval_wait_seconds=0, run at once beside the workers), and each is logged and
    charted at the step its epoch ended, in order."""
    run_dir = tmp_path / "run"
    result = run_cli(
        [*SMALL, "trainer.epochs=4", "trainer.num_workers=2", f"trainer.eval_wait_seconds={wait}"],
        run_dir,
    )
    assert result.returncode == 0, result.stderr
    output = (result.stdout + result.stderr).splitlines()
    lines = [line for line in output if ": test loss" in line]
    assert [line.split("] ")[-1].split(":")[0] for line in lines] == [
        f"epoch {e}/4" for e in range(1, 5)
    ]
    points = tensorboard_scalars(run_dir, "eval/accuracy")
    steps = [step for step, _ in points]
    assert len(points) == 4 and steps == sorted(steps) and len(set(steps)) == 4
    s = read_summary(run_dir)
    assert steps[-1] == s["total_samples"]
    during = s["fixed_costs"]["during_training"]
    assert during["idle_core_evaluations"]["count"] == 3, during  # epochs 1-3; 4 is the final
    assert "queued_evaluations" in s["fixed_costs"]
