"""Pre-flight through the CLI: a run that would die deep inside torch ("Too many open files", "No
space left on device", a bare "Bus error") is refused up front with one line and a way out, and
a run that can be made to work (a soft open-file limit that can be raised) just works."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys

import pytest

from support import SMALL, assert_refused_cleanly, cli_command, cli_env, read_summary, run_cli

# ~150 Linear layers: 302 parameter tensors, far more than 64 open files allow under file_descriptor
DEEP_MLP = ["model=mlp", "model.hidden_sizes=[" + ",".join(["8"] * 150) + "]"]


def limits_setter(soft: int, hard: int | None = None):
    """A preexec_fn: the child starts with these open-file limits (hard None = keep the current one)."""

    def set_limits() -> None:
        current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current_hard if hard is None else hard))

    return set_limits


def hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return sys.maxsize if hard == resource.RLIM_INFINITY else hard


def run_cli_with_limits(
    args, run_dir, soft: int, hard: int | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(args, run_dir),
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=cli_env(),
        cwd=run_dir.parent,
        preexec_fn=limits_setter(soft, hard),
    )


def test_cli_refuses_file_descriptor_with_a_low_hard_limit(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli_with_limits(
        [*SMALL, *DEEP_MLP, "trainer.start_method=fork"], run_dir, soft=64, hard=64
    )
    assert_refused_cleanly(
        result,
        run_dir,
        "trainer.sharing_strategy='file_descriptor'",
        "trainer.sharing_strategy=file_system",
        "open-file limit is 64",
    )


def test_cli_file_system_runs_with_a_low_hard_limit(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli_with_limits(
        [*SMALL, *DEEP_MLP, "trainer.sharing_strategy=file_system"], run_dir, soft=64, hard=64
    )
    assert result.returncode == 0, result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["total_samples"] == 2000
    assert summary["worker_sharing_strategies"] == ["file_system", "file_system"]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_cli_file_descriptor_raises_a_low_soft_limit_and_runs(tmp_path, start_method):
    if hard_limit() < 1024:
        pytest.skip(
            f"the hard open-file limit here ({hard_limit()}) is too low to raise the soft one"
        )
    run_dir = tmp_path / "run"
    result = run_cli_with_limits(
        [*SMALL, *DEEP_MLP, f"trainer.start_method={start_method}"], run_dir, soft=64
    )
    assert result.returncode == 0, result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["total_samples"] == 2000
    assert summary["worker_sharing_strategies"] == ["file_descriptor", "file_descriptor"]


def test_cli_forkserver_runs_at_the_fd_passing_limit(tmp_path):
    # 121 hidden layers: 244 parameter tensors + data (2) + control (2) = 248, the most allowed
    run_dir = tmp_path / "run"
    args = [
        *SMALL,
        "model=mlp",
        "model.hidden_sizes=[" + ",".join(["8"] * 121) + "]",
        "trainer.start_method=forkserver",
    ]
    result = run_cli(args, run_dir)
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["status"] == "completed"


def test_cli_forkserver_with_too_many_tensors_is_refused_up_front(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, *DEEP_MLP, "trainer.start_method=forkserver"], run_dir)
    assert_refused_cleanly(
        result, run_dir, "trainer.start_method='forkserver'", "trainer.sharing_strategy=file_system"
    )


def _small_shm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs over /dev/shm in a private mount namespace"
    if not shutil.which("unshare"):
        return "`unshare` is not installed"
    try:
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`unshare -m` failed: {e}"
    if probe.returncode != 0:
        return f"`unshare -m` + mount tmpfs failed here: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.fixture(scope="module")
def small_shm():
    """Runs the CLI in its own mount namespace with a fresh tmpfs of the given size on /dev/shm
    (the real /dev/shm is never touched)."""
    reason = _small_shm_unavailable()
    if reason:
        pytest.skip(reason)

    def run(args, run_dir, size: str) -> subprocess.CompletedProcess:
        script = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", script, "sh", *cli_command(args, run_dir)]
        return subprocess.run(
            command,
            check=False,
            capture_output=True,
            text=True,
            timeout=180,
            env=cli_env(),
            cwd=run_dir.parent,
        )

    return run


def test_cli_refuses_data_bigger_than_dev_shm(tmp_path, small_shm):
    run_dir = tmp_path / "run"
    # 2000 x 784 float32 = 6.3 MB of training data for a 1 MiB /dev/shm
    result = small_shm([*SMALL], run_dir, size="1m")
    line = assert_refused_cleanly(result, run_dir, "/dev/shm", "MiB")
    assert "/dev/shm has 1.0 MiB free" in line  # the small tmpfs, not the machine's /dev/shm


def test_cli_runs_when_the_data_fits_in_dev_shm(tmp_path, small_shm):
    run_dir = tmp_path / "run"
    result = small_shm([*SMALL, "trainer.sharing_strategy=file_system"], run_dir, size="64m")
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["status"] == "completed"


def test_a_table_that_cannot_fit_in_memory_is_refused_before_it_is_built(tmp_path):
    """A 600 GB embedding table: refused as its first tensor is created in shared memory, before
    a page of it is touched (hogwild.process.sharing.born_shared), and nothing is written."""
    run_dir = tmp_path / "run"
    huge = ["+experiment=matrix_factorization", "data.num_users=1000000", "model.dim=100000"]
    result = run_cli([*huge, "data.num_ratings=1000", "data.num_test_ratings=100"], run_dir)
    line = assert_refused_cleanly(result, run_dir, "the model needs at least", "of memory but")
    assert line.endswith("use a smaller model"), line
