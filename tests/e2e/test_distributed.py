"""Two "nodes" on loopback: torchrun starts two orchestrators (gloo), each with its own workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from hogwild.run import checkpoint

from support import (
    SMALL,
    cli_env,
    free_port,
    read_summary,
    run_cli,
    tagged_processes,
    tensorboard_tags,
    wait_until,
)


def torchrun(run_dir, *args) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "hogwild",
        "train",
        "distributed=torchrun",
        f"hydra.run.dir={run_dir}",
        "trainer.num_workers=1",
        "trainer.threads_per_worker=1",
        "trainer.start_method=fork",
        *args,
    ]


def test_torchrun_mode_without_torchrun_says_how_to_launch(tmp_path):
    result = run_cli(["distributed=torchrun"], tmp_path / "run")
    assert result.returncode == 2
    assert (
        "needs the environment torchrun sets" in result.stderr
        and "torchrun --nnodes" in result.stderr
    )


def test_two_loopback_nodes_train_and_end_with_the_same_model(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        torchrun(run_dir, *SMALL, "trainer.epochs=2", "distributed.sync_every_n_steps=10"),
        capture_output=True,
        text=True,
        timeout=240,
        env=cli_env(),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # both nodes log to one terminal: every line says which node it is from
        assert f"][INFO] [node {rank}] training MLP" in result.stderr, result.stderr[-3000:]
    s = read_summary(run_dir)  # written by rank 0 only
    d = s["distributed"]
    assert s["status"] == "completed" and d["world_size"] == 2 and d["rank"] == 0
    assert d["sync_rounds"] >= 2 and d["sync_bytes"] > 0
    # each node trained on its half of the data, every epoch
    assert [n["total_samples"] for n in d["per_node"]] == [2 * 1000, 2 * 1000]
    assert d["samples_seen_all_nodes"] == 2 * 2000
    assert d["samples_per_second_all_nodes"] == pytest.approx(
        sum(n["samples_per_second"] for n in d["per_node"]), abs=0.2
    )
    # the last round averaged both nodes into one model
    checksums = [n["param_checksum"] for n in d["per_node"]]
    assert checksums[0] == pytest.approx(checksums[1], rel=1e-6)
    assert s["test_accuracy"] > 0.8
    # the rounds overlap the training: the orchestrators never blocked on the collectives while
    # their workers trained (they land a round once its sums are in)
    for n in d["per_node"]:
        assert 0 <= n["sync_wait_seconds"] <= n["sync_seconds"] < n["train_seconds"], n
        assert 0 <= n["sync_transfer_seconds"] <= n["sync_in_flight_seconds"], n
        assert n["sync_end_wait_seconds"] >= 0, n
    assert {k: d[k] for k in d["per_node"][0] if k.startswith("sync_")} == {
        k: v for k, v in d["per_node"][0].items() if k.startswith("sync_")
    }  # the top-level figures are rank 0's own
    tags = tensorboard_tags(run_dir)
    for tag in ("seconds", "wait_seconds", "transfer_seconds", "in_flight_seconds", "bytes"):
        assert f"distributed/sync_{tag}" in tags
    # the same work on one node: as accurate
    one = run_cli([*SMALL, "trainer.epochs=2", "trainer.num_workers=1"], tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert abs(read_summary(tmp_path / "one")["test_accuracy"] - s["test_accuracy"]) <= 0.02
    assert "node 1: completed" in result.stdout
    assert "all nodes      2 nodes" in result.stdout and "samples/s      node 0: " in result.stdout


def test_killing_one_node_ends_the_other_and_leaves_nothing(tmp_path):
    tag = uuid.uuid4().hex
    run_dir = tmp_path / "run"
    slow = [
        "data=synthetic",
        "data.num_samples=20000",
        "model._target_=faults.FaultyMLP",
        "+model.step_seconds=0.05",
    ]
    marker = tmp_path / "progress"
    proc = subprocess.Popen(
        torchrun(run_dir, *slow, "distributed.timeout_seconds=20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tag, HOGWILD_PROGRESS_FILE=str(marker)),
        cwd=tmp_path,
    )

    def node(rank: int):
        for p in tagged_processes(tag):
            try:
                # a node's orchestrator is a child of the torchrun agent (its workers are its children)
                if p.ppid() == proc.pid and p.environ().get("RANK") == str(rank):
                    return p
            except psutil.Error:
                pass
        return None

    # both nodes' workers are training
    assert wait_until(lambda: all(Path(f"{marker}.{n}0").exists() for n in (0, 1)), 90)
    victim = node(1)
    assert victim is not None
    os.kill(victim.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "hogwild.train" in stderr or "FAILED" in stderr or "failed" in stderr
    # node 0, stopped by the agent's SIGTERM, names the node that never said it stopped
    summary = read_summary(run_dir)
    assert summary["status"] in ("interrupted", "failed"), summary["status"]
    assert summary["distributed"]["silent_nodes"] == [1], summary["distributed"]
    assert summary["distributed"]["torchrun_restarts"] == {"done": 0, "max_restarts": 0}
    assert "node 1 never said it stopped: killed or crashed" in stderr, stderr[-3000:]
    assert "--max-restarts=0 is spent: no restart follows" in stderr
    gone = time.monotonic() + 15
    while tagged_processes(tag) and time.monotonic() < gone:
        time.sleep(0.2)
    assert not tagged_processes(tag), [p.cmdline() for p in tagged_processes(tag)]


@pytest.mark.parametrize("agents", [1, 2], ids=["one-agent", "two-agents"])
def test_torchrun_restarts_a_failed_run_from_its_checkpoint_on_every_node(tmp_path, agents):
    """A worker of node 1 is killed once (HOGWILD_FAULT_FILE): its node fails, torchrun
    (--max-restarts=1) starts both nodes again, and resume_from=auto continues from the
    checkpoint taken at a sync round, which holds both nodes' progress. One agent with two
    ranks (the loopback command), or two agents meeting at a c10d rendezvous (two machines)."""
    run_dir, fault = tmp_path / "run", tmp_path / "fault"
    faulty = [
        "data=synthetic",
        "data.num_samples=4000",
        "data.num_test_samples=500",
        "data.noise=2.0",
        "trainer.epochs=2",
        "model._target_=faults.FaultyMLP",
        "+model.fault=sigkill",
        "+model.at_step=40",
        "+model.rank=0",
        "+model.step_seconds=0.005",
        "distributed.sync_every_n_steps=5",
        "checkpoint.every_n_steps=10",
        "resume_from=auto",
    ]
    command = [a for a in torchrun(run_dir, *faulty) if not a.startswith("--master_port")]
    command[command.index("--nproc_per_node=2") + 1 : 0] = [
        "--max-restarts=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
    ]
    # two agents: torch's own fresh-store-per-attempt switch (see hogwild.distributed.torchrun._attempt_store)
    env = cli_env(
        HOGWILD_FAULT_FILE=str(fault), TORCH_DISABLE_SHARE_RDZV_TCP_STORE=str(int(agents == 2))
    )
    if agents == 2:
        command[command.index("--nnodes=1")] = "--nnodes=2"
        command[command.index("--nproc_per_node=2")] = "--nproc_per_node=1"
        command.insert(command.index("--max-restarts=1"), f"--rdzv-id={uuid.uuid4().hex}")
    procs = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for _ in range(agents)
    ]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    stderr = "".join(err for _, err in outputs)
    assert fault.exists(), "the fault never fired"
    assert all(p.returncode == 0 for p in procs), stderr[-3000:]
    assert "killed by SIGKILL" in stderr  # the first attempt failed...
    s = read_summary(run_dir)  # ...and the summary is the restarted attempt's
    assert s["status"] == "completed" and s["resumed_from"] == str(
        run_dir / "checkpoints" / "last.pt"
    )
    d = s["distributed"]
    # the restart did only what was left: less than each node's 2 epochs of 2000 samples
    assert all(0 < n["total_samples"] < 4000 for n in d["per_node"]), d["per_node"]
    assert d["per_node"][0]["param_checksum"] == pytest.approx(
        d["per_node"][1]["param_checksum"], rel=1e-6
    )
    state = checkpoint.load(str(run_dir / "checkpoints" / "last.pt"))
    assert state["run"]["world_size"] == 2 and state["run"]["num_train"] == 4000
    table = state["progress"]  # rank-major: node 0's worker, node 1's worker
    assert table.shape == (2, 4) and table[:, 0].tolist() == [2, 2]  # both finished both epochs
    assert table[:, 2].tolist() == [4000, 4000] and state["run"]["samples_seen"] == 8000
    assert d["samples_seen_all_nodes"] == 8000
    assert s["test_accuracy"] > 0.8


def test_a_refusal_on_one_node_ends_every_node_with_its_reason(tmp_path):
    missing = tmp_path / "nowhere.pt"  # only rank 0 reads the checkpoint; node 1 hears why
    result = subprocess.run(
        torchrun(tmp_path / "run", *SMALL, f"resume_from={missing}"),
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert f"hogwild: error: resume_from={str(missing)!r}: no such file" in result.stderr
    assert (
        f"hogwild: error: node 0 refused the run: resume_from={str(missing)!r}: no such file"
        in result.stderr
    )
    assert not (tmp_path / "run" / "summary.json").exists()


def test_nodes_started_with_different_configs_are_refused(tmp_path):
    """Two torchrun processes meeting at a local c10d rendezvous, as on two machines."""
    port, run_id = free_port(), uuid.uuid4().hex
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={run_id}",
                "-m",
                "hogwild",
                "train",
                "distributed=torchrun",
                f"hydra.run.dir={tmp_path / f'node{i}'}",
                "trainer.num_workers=1",
                *[a for a in SMALL if not a.startswith("trainer.epochs=")],
                f"trainer.epochs={i + 1}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=tmp_path,
        )
        for i in range(2)
    ]
    try:
        errors = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode != 0 for p in procs)
    for e in errors:
        assert "was started with a different configuration (epochs=" in e, e[-2000:]
        assert "start every node with the same overrides" in e
    assert not any((tmp_path / f"node{i}" / "summary.json").exists() for i in range(2))


def test_ctrl_c_interrupts_every_node_and_keeps_the_last_round_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    slow = [
        "data=synthetic",
        "data.num_samples=20000",
        "model._target_=faults.FaultyMLP",
        "+model.step_seconds=0.02",
        "distributed.sync_every_n_steps=5",
        "checkpoint.every_n_steps=10",
        "checkpoint.every_seconds=0",
    ]
    proc = subprocess.Popen(
        torchrun(run_dir, *slow),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    ckpt = run_dir / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 90
    while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert ckpt.exists(), "no round checkpoint was written"
    proc.send_signal(signal.SIGINT)  # torchrun passes it to both nodes
    _, stderr = proc.communicate(timeout=60)
    s = read_summary(run_dir)
    assert s["status"] == "interrupted", stderr[-2000:]
    assert "error" not in s  # the peer leaving first is no failure
    state = checkpoint.load(str(ckpt))
    assert state["progress"].shape == (2, 4) and state["run"]["world_size"] == 2
    assert 0 < state["run"]["samples_seen"] < 2 * 20000


def test_the_scaling_script_runs_and_its_figures_add_up(tmp_path):
    # scripts/torchrun_scaling.py is how the two-node figures are measured: keep it working;
    # with --bracket one node runs before and after the two, and its figure is their mean
    out = tmp_path / "rows.json"
    script = Path(__file__).resolve().parents[2] / "scripts" / "torchrun_scaling.py"
    args = ["--pairs", "1", "--epochs", "1", "--samples", "2000", "--bracket", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert len(row["one_node_runs"]) == 2
    assert row["one_node"] == pytest.approx(sum(row["one_node_runs"]) / 2)
    assert row["ratio"] == pytest.approx(row["two_nodes"] / row["one_node"], rel=1e-3)
    assert len(row["per_node"]) == 2 and all(n["train_seconds"] > 0 for n in row["per_node"])
    assert "ratio median" in result.stdout
