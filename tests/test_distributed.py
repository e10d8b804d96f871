"""Two "nodes" on loopback: torchrun starts two orchestrators (gloo), each with its own workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from conftest import SMALL, cli_env, read_summary, run_cli, tagged_processes
from test_config import run_config
from test_train import tensorboard_tags

from hogwild.config import ConfigError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(run_dir, *args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
            f"--master_port={free_port()}", "-m", "hogwild", "train", "distributed=torchrun",
            f"hydra.run.dir={run_dir}", "trainer.num_workers=1", "trainer.threads_per_worker=1",
            "trainer.start_method=fork", *args]


@pytest.mark.parametrize(
    "override, message",
    [("distributed.mode=mpi", "distributed.mode='mpi'.*none, torchrun"),
     ("distributed.backend=mpi", "distributed.backend='mpi'.*auto, gloo, nccl"),
     ("distributed.timeout_seconds=0", "distributed.timeout_seconds=0.*>= 1.0")],
)
def test_bad_distributed_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        run_config(["distributed=torchrun", override])


def test_a_torchrun_run_that_never_syncs_is_refused():
    with pytest.raises(ConfigError, match="would never average"):
        run_config(["distributed=torchrun", "distributed.sync_every_n_steps=0"])


def test_torchrun_mode_without_torchrun_says_how_to_launch(tmp_path):
    result = run_cli(["distributed=torchrun"], tmp_path / "run")
    assert result.returncode == 2
    assert "needs the environment torchrun sets" in result.stderr and "torchrun --nnodes" in result.stderr


def test_two_loopback_nodes_train_and_end_with_the_same_model(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(torchrun(run_dir, *SMALL, "trainer.epochs=2", "distributed.sync_every_n_steps=10"),
                            capture_output=True, text=True, timeout=240, env=cli_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    s = read_summary(run_dir)  # written by rank 0 only
    d = s["distributed"]
    assert s["status"] == "completed" and d["world_size"] == 2 and d["rank"] == 0
    assert d["sync_rounds"] >= 2 and d["sync_bytes"] > 0
    # each node trained on its half of the data, every epoch
    assert [n["total_samples"] for n in d["per_node"]] == [2 * 1000, 2 * 1000]
    # the last round averaged both nodes into one model
    checksums = [n["param_checksum"] for n in d["per_node"]]
    assert checksums[0] == pytest.approx(checksums[1], rel=1e-6)
    assert s["test_accuracy"] > 0.8
    assert "distributed/sync_seconds" in tensorboard_tags(run_dir)
    assert "node 1: completed" in result.stdout


def test_killing_one_node_ends_the_other_and_leaves_nothing(tmp_path):
    tag = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    slow = ["data=synthetic", "data.num_samples=20000", "model._target_=faults.FaultyMLP", "+model.step_seconds=0.05"]
    proc = subprocess.Popen(torchrun(run_dir, *slow, "distributed.timeout_seconds=20"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(tag), cwd=tmp_path)

    def node(rank: int):
        for p in tagged_processes(tag):
            try:
                # a node's orchestrator is a child of the torchrun agent (its workers are its children)
                if p.ppid() == proc.pid and p.environ().get("RANK") == str(rank):
                    return p
            except psutil.Error:
                pass
        return None

    deadline = time.monotonic() + 60
    while (node(1) is None or len(tagged_processes(tag)) < 5) and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = node(1)
    assert victim is not None
    time.sleep(3.0)  # let them train and sync a few times
    os.kill(victim.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "hogwild.train" in stderr or "FAILED" in stderr or "failed" in stderr
    gone = time.monotonic() + 15
    while tagged_processes(tag) and time.monotonic() < gone:
        time.sleep(0.2)
    assert not tagged_processes(tag), [p.cmdline() for p in tagged_processes(tag)]
