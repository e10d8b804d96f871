"""An orchestrator that runs out of memory while it shares the run's tensors (docs/fault-tolerance.md):
one line that says what could not be mapped and what to do, exit code 2, no run folder, and
nothing left in /dev/shm."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from support import assert_refused_cleanly, cli_command, cli_env, shm_entries

# 150,000 MNIST-shaped samples: 449 MiB of training data, built in private memory and then
# copied into a shared segment. Under this address-space limit the data set fits but its
# shared copy does not; either side has a margin of about 200 MB (torch, the data set's
# temporaries and the worker threads' stacks move the orchestrator's footprint a little).
ADDRESS_SPACE = 1_550_000_000
TOO_BIG_TO_SHARE = [
    "data=synthetic",
    "data.num_samples=150000",
    "data.num_test_samples=500",
    "model=mlp",
    "trainer.epochs=1",
    "trainer.num_workers=1",
]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_data_that_cannot_be_mapped_is_one_line_and_leaves_no_segment(tmp_path, strategy, no_leaks):
    run_dir = tmp_path / "run"
    command = [
        "prlimit",
        f"--as={ADDRESS_SPACE}",
        "--",
        *cli_command([*TOO_BIG_TO_SHARE, f"trainer.sharing_strategy={strategy}"], run_dir),
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    out, err = proc.communicate(timeout=300)  # prlimit execs python: proc.pid is the orchestrator
    result = subprocess.CompletedProcess(command, proc.returncode, out, err)
    line = assert_refused_cleanly(
        result,
        run_dir,
        "cannot map 448.6 MiB of shared memory for the training data",
        f"(address-space limit {ADDRESS_SPACE / 2**30:.1f} GiB: ulimit -v)",
        "raise the limit or use a smaller data set",
    )
    assert "unable to mmap" not in line
    assert not run_dir.exists()  # refused before it started: no folder, not even .hydra/
    own = f"torch_{proc.pid}_"
    assert not [name for name in shm_entries() if name.startswith(own)]
    assert not os.path.exists(tmp_path / "outputs")
