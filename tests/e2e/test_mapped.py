"""Mapped data end to end: a run on a set written with data.cache_dir completes, its workers map
the files themselves, and /dev/shm holds no copy of the data while they train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import read_summary, start_run, tagged_processes

# 2 workers x 63 steps of >= 0.05 s: seconds of training to look at, under forkserver, with
# torch's shared segments as files in /dev/shm (file_system) so that they can be counted.
MAPPED_RUN = [
    "data=synthetic",
    "data.num_samples=8000",
    "data.num_test_samples=200",
    "trainer.epochs=1",
    "trainer.start_method=forkserver",
    "trainer.sharing_strategy=file_system",
    "model._target_=faults.FaultyMLP",
    "+model.step_seconds=0.05",
]


def shm_bytes_of(pids: set[int]) -> dict[str, int]:
    """The /dev/shm files torch made for these processes (torch_<pid>_*), with their sizes."""
    out = {}
    for name in os.listdir("/dev/shm"):
        parts = name.split("_")
        if name.startswith("torch_") and len(parts) > 2 and parts[1].isdigit():
            if int(parts[1]) in pids:
                try:
                    out[name] = os.stat(f"/dev/shm/{name}").st_size
                except FileNotFoundError:
                    pass
    return out


def maps(pid: int, path: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().endswith(path) for line in f)
    except OSError:
        return False


def test_a_run_on_mapped_data_shares_no_copy_of_it(tmp_path, no_leaks):
    cache = tmp_path / "cache"
    proc, run_dir, tag = start_run(tmp_path, f"data.cache_dir={cache}", base=MAPPED_RUN)
    try:
        (folder,) = cache.iterdir()
        train_x = folder / "train_x.npy"
        pids = {p.pid for p in tagged_processes(tag)}
        segments = shm_bytes_of(pids)
        workers = [pid for pid in pids if pid != proc.pid and maps(pid, str(train_x))]
        still_training = proc.poll() is None
    finally:
        out, err = proc.communicate(timeout=120)
    assert still_training, err[-3000:]
    data_bytes = train_x.stat().st_size  # 25 MB of images
    assert segments and sum(segments.values()) < data_bytes / 20, segments  # the model, counters
    assert len(workers) == 2  # each worker maps the file itself
    assert proc.returncode == 0, err[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["total_samples"] == 8000
    assert "mapped from" in out + err and Path(folder).name.startswith("synthetic-")


def test_the_block_order_is_the_same_in_another_process():
    from hogwild.workloads.supervised import BlockShard

    code = (
        "from hogwild.workloads.supervised import BlockShard\n"
        "print([BlockShard(5000, 9, 1, r, 2, block=97)[:].tolist() for r in range(2)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        BlockShard(5000, 9, 1, r, 2, block=97)[:].tolist() for r in range(2)
    ]
