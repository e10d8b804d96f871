"""CUDA end to end: training on a GPU needs one and skips without it, with the reason. On a
CUDA machine `python scripts/gpu_check.py` is the wider check (1, 2 and 4 workers, IPC, leaks,
throughput against the CPU). The placement rules are unit-tested (tests/unit/test_cuda.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from support import REPO, SMALL, cli_env, read_summary, run_cli

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize(
    "start_method, data_on_device", [("forkserver", "auto"), ("spawn", "false")]
)
def test_trains_one_shared_model_on_the_gpu(tmp_path, start_method, data_on_device):
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            *SMALL,
            "trainer.device=cuda",
            f"trainer.start_method={start_method}",
            f"trainer.data_on_device={data_on_device}",
        ],
        run_dir,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["device"] == "cuda" and s["test_accuracy"] > 0.8
    assert s["data_on_device"] is (data_on_device == "auto")
    assert "Producer process has been terminated" not in result.stderr


@needs_cuda
@pytest.mark.cuda
def test_gpu_index_selects_the_device(tmp_path):
    index = torch.cuda.device_count() - 1
    run_dir = tmp_path / "run"
    result = run_cli(
        [*SMALL, f"trainer.device=cuda:{index}", "trainer.start_method=spawn"], run_dir, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert read_summary(run_dir)["device"] == f"cuda:{index}"


def test_gpu_check_says_why_it_cannot_run_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the real check")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check.py")],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3
    assert "no CUDA device here" in result.stderr and "nothing to check" in result.stderr


def test_gpu_check_machinery_passes_its_own_checks_on_the_cpu(tmp_path):
    """The same checks (IPC-visible updates, no process or shm left, learned) on a CPU run."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    row = gpu_check.checked_run("cpu", 2, 3000, str(tmp_path))
    assert row["checks"] and all(row["checks"].values()), row
    assert row["samples"] == 2 * 3000 and row["samples_per_second"] > 0
