"""What a run starts early, and what it leaves out (hogwild.process.forkserver): the fork server starts
before the config is composed and is stopped when the config picks another start method; the
orchestrator never imports torch._dynamo unless its workers are forks of it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

from support import SMALL, cli_command, cli_env, tagged_processes, wait_until, worker_processes

FIT = textwrap.dedent(
    """
    import functools, sys
    import torch
    from hogwild import Trainer, TrainerConfig
    from hogwild.data import make_synthetic

    data = make_synthetic(num_samples=512, num_test_samples=64, input_shape=[8], num_classes=2)
    trainer = Trainer(
        torch.nn.Linear(8, 2),
        data,
        functools.partial(torch.optim.Adam, lr=1e-3),
        TrainerConfig(start_method=sys.argv[1], num_workers=2),
        batch_size=32,
        output_dir=sys.argv[2],
        shared_optimizer=sys.argv[3] == "shared",
    )
    assert trainer.fit()["status"] == "completed"
    print("torch._dynamo" in sys.modules)
    """
)


@pytest.mark.parametrize(
    "start_method, optimizer, imported",
    [
        ("forkserver", "own", False),
        ("spawn", "own", False),
        ("fork", "own", True),  # forked workers inherit it
        ("forkserver", "shared", True),  # the shared state is built here with one step
    ],
)
def test_the_orchestrator_imports_torch_dynamo_only_when_it_needs_it(
    tmp_path, start_method, optimizer, imported
):
    # ~1.1 s of CPU, which every optimizer step imports; a fork server or a spawned worker
    # imports it itself
    result = subprocess.run(
        [sys.executable, "-c", FIT, start_method, str(tmp_path / "run"), optimizer],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(imported)


def fork_servers(tag: str) -> list[psutil.Process]:
    found = []
    for p in tagged_processes(tag):
        try:
            if "forkserver" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_a_fork_server_started_ahead_of_the_config_is_stopped_when_it_picks_spawn(tmp_path):
    tag = f"startup-{tmp_path.name}"
    run_dir = tmp_path / "run"
    args = [*SMALL, "trainer.start_method=spawn", "trainer.epochs=40"]
    proc = subprocess.Popen(
        cli_command(args, run_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tag),
        cwd=tmp_path,
    )
    try:
        assert wait_until(lambda: len(worker_processes(tag, proc.pid)) >= 2, 120), "no workers"
        assert not fork_servers(tag), [p.cmdline() for p in fork_servers(tag)]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 143, 130), err[-3000:]


BOOT = textwrap.dedent(
    """
    import os, sys
    from multiprocessing import forkserver as mp_forkserver
    import psutil
    from hogwild.process.forkserver import ServerAhead

    def server():
        return mp_forkserver._forkserver._forkserver_pid

    def gone(pid):
        return not psutil.pid_exists(pid)  # killed and reaped, not a zombie

    ahead = ServerAhead.start()
    first = server()
    assert first and psutil.Process(first).ppid() == os.getpid()
    case = sys.argv[1]
    if case == "spawn":  # the config picks another start method
        ahead.settle("spawn")
        assert server() is None and gone(first)
    elif case == "env":  # the job sets what workers must see (hydra.job.env_set)
        os.environ["HOGWILD_TEST_JOB_ENV"] = "1"
        ahead.settle("forkserver")
        assert server() not in (None, first) and gone(first)
    elif case == "kept":  # the config says forkserver: the same server, and it stays
        ahead.settle("forkserver")
        ahead.stop_unless_kept()
        assert server() == first and not gone(first)
    elif case == "refused":  # no config kept it
        ahead.stop_unless_kept()
        assert server() is None and gone(first)
    print("ok")
    """
)


@pytest.mark.parametrize("case", ["spawn", "env", "kept", "refused"])
def test_the_fork_server_started_ahead_is_kept_restarted_or_stopped(case):
    result = subprocess.run(
        [sys.executable, "-c", BOOT, case], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
