"""Pre-flight checks: a run that would die deep inside torch ("Too many open files", "No space
left on device", a bare "Bus error") is refused up front with one line and a way out, and a run
that can be made to work (a soft open-file limit that can be raised) just works."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from collections import namedtuple

import pytest
import torch
from conftest import SMALL, cli_command, cli_env, read_summary, run_cli

from hogwild import HogwildError, sharing
from hogwild.sharing import FD_HEADROOM, PreflightError

# ~150 Linear layers: 302 parameter tensors, far more than 64 open files allow under file_descriptor
DEEP_MLP = ["model=mlp", "model.hidden_sizes=[" + ",".join(["8"] * 150) + "]"]
NOT_WRITTEN = ("summary.json", "tensorboard", "checkpoints")


def limits_setter(soft: int, hard: int | None = None):
    """A preexec_fn: the child starts with these open-file limits (hard None = keep the current one)."""

    def set_limits() -> None:
        current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current_hard if hard is None else hard))

    return set_limits


def hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return sys.maxsize if hard == resource.RLIM_INFINITY else hard


def run_python(code: str, preexec_fn=None) -> dict:
    """Runs `code` in a fresh interpreter (the limits of this test process stay untouched); the
    code prints one JSON object as its last line."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True,
                            timeout=120, preexec_fn=preexec_fn)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


BUDGET_PROBE = """
    import json, resource
    from hogwild import sharing
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        sharing.ensure_fd_budget({num_tensors}, {strategy!r})
        error = None
    except sharing.PreflightError as e:
        error = str(e)
    after = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(json.dumps({{"before": before, "after": after, "error": error}}))
"""
Budget = namedtuple("Budget", "before after error")


def budget(num_tensors: int, strategy: str, soft: int, hard: int | None = None) -> Budget:
    out = run_python(BUDGET_PROBE.format(num_tensors=num_tensors, strategy=strategy), limits_setter(soft, hard))
    return Budget(tuple(out["before"]), tuple(out["after"]), out["error"])


# ---- open files under file_descriptor ----


def test_fd_budget_raises_the_soft_limit_when_the_hard_limit_allows():
    needed = 300 + FD_HEADROOM
    if hard_limit() < needed:
        pytest.skip(f"the hard open-file limit here ({hard_limit()}) is below {needed}")
    b = budget(300, "file_descriptor", soft=64)
    assert b.error is None
    assert b.before[0] == 64
    assert b.after == (needed, b.before[1])  # raised to what is needed, the hard limit untouched


def test_fd_budget_leaves_a_sufficient_soft_limit_alone():
    if hard_limit() < 4096:
        pytest.skip(f"the hard open-file limit here ({hard_limit()}) is below 4096")
    b = budget(300, "file_descriptor", soft=4096)
    assert b.error is None and b.after == b.before  # never lowered


def test_fd_budget_refuses_when_the_hard_limit_is_too_low():
    b = budget(300, "file_descriptor", soft=64, hard=64)
    assert b.after == b.before == (64, 64)
    assert b.error is not None and "\n" not in b.error
    assert "trainer.sharing_strategy='file_descriptor'" in b.error
    assert "trainer.sharing_strategy=file_system" in b.error
    assert "300 shared tensors" in b.error and "64" in b.error


def test_fd_budget_refuses_one_short_of_the_headroom():
    hard = 300 + FD_HEADROOM - 1
    b = budget(300, "file_descriptor", soft=64, hard=hard)
    assert b.error is not None and f"hard {hard}" in b.error


@pytest.mark.parametrize("num_tensors", [300, 1_000_000])
def test_fd_budget_never_refuses_file_system(num_tensors):
    b = budget(num_tensors, "file_system", soft=64, hard=64)
    assert b.error is None and b.after == b.before == (64, 64)


def run_cli_with_limits(args, run_dir, soft: int, hard: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(args, run_dir), check=False, capture_output=True, text=True, timeout=180,
                          env=cli_env(), cwd=run_dir.parent, preexec_fn=limits_setter(soft, hard))


def assert_refused_cleanly(result, run_dir, *fragments) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hogwild: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    for output in NOT_WRITTEN:
        assert not (run_dir / output).exists(), output
    return lines[0]


def test_cli_refuses_file_descriptor_with_a_low_hard_limit(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli_with_limits([*SMALL, *DEEP_MLP, "trainer.start_method=fork"], run_dir, soft=64, hard=64)
    assert_refused_cleanly(result, run_dir, "trainer.sharing_strategy='file_descriptor'",
                           "trainer.sharing_strategy=file_system", "open-file limit is 64")


def test_cli_file_system_runs_with_a_low_hard_limit(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli_with_limits([*SMALL, *DEEP_MLP, "trainer.sharing_strategy=file_system"], run_dir,
                                 soft=64, hard=64)
    assert result.returncode == 0, result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["total_samples"] == 2000
    assert summary["worker_sharing_strategies"] == ["file_system", "file_system"]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_cli_file_descriptor_raises_a_low_soft_limit_and_runs(tmp_path, start_method):
    if hard_limit() < 1024:
        pytest.skip(f"the hard open-file limit here ({hard_limit()}) is too low to raise the soft one")
    run_dir = tmp_path / "run"
    result = run_cli_with_limits([*SMALL, *DEEP_MLP, f"trainer.start_method={start_method}"], run_dir, soft=64)
    assert result.returncode == 0, result.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["total_samples"] == 2000
    assert summary["worker_sharing_strategies"] == ["file_descriptor", "file_descriptor"]


# ---- forkserver hands a worker at most 256 fds (multiprocessing.forkserver.MAXFDS_TO_SEND) ----


def test_fd_passing_limit_applies_to_forkserver_with_file_descriptor_only():
    most = sharing.multiprocessing.forkserver.MAXFDS_TO_SEND - sharing.FORKSERVER_EXTRA_FDS - 1
    sharing.check_fd_passing(most, "forkserver", "file_descriptor")
    with pytest.raises(PreflightError) as info:
        sharing.check_fd_passing(most + 1, "forkserver", "file_descriptor")
    message = str(info.value)
    assert "\n" not in message and f"at most {most} shared tensors" in message and f"have {most + 1}" in message
    assert "trainer.start_method='forkserver'" in message and "trainer.sharing_strategy=file_system" in message
    for start_method, strategy in [("forkserver", "file_system"), ("fork", "file_descriptor"),
                                   ("spawn", "file_descriptor")]:
        sharing.check_fd_passing(10_000, start_method, strategy)


def test_cli_forkserver_runs_at_the_fd_passing_limit(tmp_path):
    # 121 hidden layers: 244 parameter tensors + data (2) + control (2) = 248, the most allowed
    run_dir = tmp_path / "run"
    args = [*SMALL, "model=mlp", "model.hidden_sizes=[" + ",".join(["8"] * 121) + "]",
            "trainer.start_method=forkserver"]
    result = run_cli(args, run_dir)
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["status"] == "completed"


def test_cli_forkserver_with_too_many_tensors_is_refused_up_front(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL, *DEEP_MLP, "trainer.start_method=forkserver"], run_dir)
    assert_refused_cleanly(result, run_dir, "trainer.start_method='forkserver'",
                           "trainer.sharing_strategy=file_system")


# ---- /dev/shm space ----


def test_storage_bytes_counts_whole_cpu_storages():
    big = torch.zeros(1000, dtype=torch.float32)
    view = big[:10]  # shares (and pins) the whole storage
    small = torch.zeros(3, dtype=torch.int64)
    assert sharing.storage_bytes([view, small]) == 4000 + 24
    assert sharing.storage_bytes([]) == 0


def test_shm_space_refuses_more_than_is_free(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(PreflightError) as info:
        sharing.check_shm_space(2 * free + 2**30, shm_dir=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path} has ") and "MiB free" in message
    assert f"{(2 * free + 2**30) / 2**20:.1f} MiB of shared memory" in message
    sharing.check_shm_space(4096, shm_dir=str(tmp_path))  # what fits passes


def test_shm_space_keeps_headroom(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sharing.shutil, "disk_usage", lambda path: usage(100 * 2**20, 0, 100 * 2**20))
    sharing.check_shm_space(90 * 2**20, shm_dir=str(tmp_path))
    with pytest.raises(PreflightError, match="100.0 MiB free .* need 99.0 MiB"):
        sharing.check_shm_space(99 * 2**20, shm_dir=str(tmp_path))


def test_shm_space_without_the_folder_is_not_an_error(tmp_path):
    sharing.check_shm_space(2**60, shm_dir=str(tmp_path / "no-such-dir"))


def _small_shm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs over /dev/shm in a private mount namespace"
    if not shutil.which("unshare"):
        return "`unshare` is not installed"
    try:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], check=False,
                               capture_output=True, text=True, timeout=30)
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
        return subprocess.run(command, check=False, capture_output=True, text=True, timeout=180, env=cli_env(),
                              cwd=run_dir.parent)

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


def test_api_refuses_fork_with_threads_when_the_parent_runs_a_thread_pool(tmp_path):
    """OpenMP after fork: such workers hang forever, so the run is refused before anything starts."""
    from hogwild import Trainer, TrainerConfig
    from hogwild.data import make_synthetic

    data = make_synthetic(num_samples=256, num_test_samples=64, input_shape=[8], num_classes=2)
    trainer = Trainer(torch.nn.Linear(8, 2), data, torch.optim.SGD,
                      TrainerConfig(start_method="fork", threads_per_worker=2), batch_size=32,
                      output_dir=str(tmp_path / "run"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(HogwildError, match="threads_per_worker=2.*forkserver"):
            trainer.fit()
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / "run").exists()
