"""Blame (issue 31, case B): when a node is killed, node 0's summary.json names the dead peer and
what happened, not one of its own workers' exit codes.

The two "nodes" are two orchestrators on loopback started with the environment torchrun gives
each rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), without torchrun's agent: an agent ends
the surviving node too (SIGTERM to its process group) as soon as one rank dies, which would race
with what this test checks; a peer on another machine under its own agent is gone the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from support import cli_env, free_port, read_summary, tagged_processes, wait_until


def test_a_killed_node_is_named_in_node_0s_summary(tmp_path):
    tag, port, marker = uuid.uuid4().hex, free_port(), tmp_path / "progress"
    run_dir = tmp_path / "run"
    args = [
        "distributed=torchrun",
        f"hydra.run.dir={run_dir}",
        "trainer.num_workers=1",
        "trainer.threads_per_worker=1",
        "trainer.start_method=fork",
        "data=synthetic",
        "data.num_samples=20000",
        "model._target_=faults.FaultyMLP",
        "+model.step_seconds=0.02",
        "distributed.sync_every_n_steps=5",
        "distributed.timeout_seconds=120",  # a lost peer is seen at once, not by timing out
    ]
    nodes = []
    for rank in (0, 1):
        env = cli_env(
            tag,
            HOGWILD_PROGRESS_FILE=str(marker),
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        nodes.append(
            subprocess.Popen(
                [sys.executable, "-m", "hogwild", "train", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=tmp_path,
            )
        )
    try:
        # both nodes' workers are training (each has taken 3 steps)
        assert wait_until(lambda: all(Path(f"{marker}.{n}0").exists() for n in (0, 1)), 180)
        os.kill(nodes[1].pid, signal.SIGKILL)
        _, stderr = nodes[0].communicate(timeout=120)
    finally:
        for p in nodes:
            p.kill()
            p.communicate()
    assert nodes[0].returncode == 1, stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "failed", s
    reason = s["error"]["reason"]
    assert reason.startswith("node 1 is gone (its process group connection closed"), reason
    assert "node 0: sync round " in reason and "exit code" not in reason, reason
    assert "node 1 is gone" in stderr
    assert wait_until(lambda: not tagged_processes(tag), 30), [
        p.cmdline() for p in tagged_processes(tag)
    ]


def test_blame_names_the_peer_and_what_happened():
    from hogwild.config.schema import DistributedConfig
    from hogwild.distributed.torchrun import blame

    cfg = DistributedConfig(timeout_seconds=20)
    closed = RuntimeError("[pair.cc:553] Connection closed by peer [10.0.0.7]:50826. Check logs")
    line = blame(0, 2, "sync round 3", closed, cfg)
    assert line.startswith("node 1 is gone (its process group connection closed")
    assert line.endswith("node 0: sync round 3 failed (RuntimeError: " + str(closed) + ")")
    assert blame(0, 3, "sync round 3", closed, cfg).startswith("the node at 10.0.0.7:50826 is gone")
    late = RuntimeError("[gloo] Timed out waiting 20000ms for recv operation to complete")
    assert blame(1, 2, "the final report", late, cfg).startswith(
        "node 0 did not answer within distributed.timeout_seconds=20; node 1: the final report"
    )
