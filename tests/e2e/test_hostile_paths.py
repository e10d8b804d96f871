"""Run folders a user can get wrong (docs/fault-tolerance.md, issue 31): a read-only one is a
one-line refusal that says what to do, exit 2, nothing written; a path Hydra's grammar takes
only quoted says how to quote it; the printed `tensorboard --logdir` command survives a paste."""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import SMALL, assert_refused_cleanly, cli_env

FAST = [*SMALL, "trainer.num_workers=1", "trainer.start_method=fork"]


def hogwild(*args: str) -> list[str]:
    return [sys.executable, "-m", "hogwild", "train", *args]


# ---- read-only run folders ----
#
# The tests run as root here, and root writes through directory permissions: a read-only
# tmpfs in a private mount namespace (unshare -m) makes the write really fail. A user without
# root gets the same from a folder without write permission.


@functools.cache
def read_only_mounts() -> bool:
    """Root, and a read-only tmpfs can be mounted in a private mount namespace here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o ro tmpfs /mnt && ! touch /mnt/x"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


needs_read_only = pytest.mark.skipif(
    os.geteuid() == 0 and not read_only_mounts(),
    reason="root ignores permissions, and no read-only tmpfs can be mounted here (unshare -m)",
)


def run_read_only(tmp_path: Path, args: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    """`hogwild train <args>` from tmp_path, where mnt/ (holding an empty existing/) is read
    only; returns the result and every path under mnt/ afterwards (what the run wrote)."""
    mnt = tmp_path / "mnt"
    (mnt / "existing").mkdir(parents=True)
    listing = tmp_path / "listing"
    if os.geteuid() != 0:  # a user: permissions are enough
        for folder in (mnt / "existing", mnt):
            folder.chmod(0o555)
        try:
            result = subprocess.run(
                hogwild(*args), capture_output=True, text=True, timeout=120, env=cli_env(),
                cwd=tmp_path,
            )  # fmt: skip
        finally:
            for folder in (mnt, mnt / "existing"):
                folder.chmod(0o755)
        found = sorted(str(p.relative_to(tmp_path)) for p in mnt.rglob("*"))
        return result, "\n".join(found)
    shell = (
        f"mount -t tmpfs tmpfs mnt && mkdir mnt/existing && mount -o remount,ro mnt && "
        f"{shlex.join(hogwild(*args))}; rc=$?; find mnt > {shlex.quote(str(listing))}; exit $rc"
    )
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120,
        env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    return result, "\n".join(sorted(listing.read_text().split()))


@needs_read_only
def test_a_new_run_folder_under_a_read_only_parent_is_one_line(tmp_path):
    result, written = run_read_only(tmp_path, ["hydra.run.dir=mnt/new/run", *FAST])
    line = assert_refused_cleanly(result, tmp_path / "mnt" / "new" / "run", "cannot write mnt/new")
    assert line.endswith("; choose a writable run folder with hydra.run.dir=<folder>"), line
    assert written == "mnt\nmnt/existing"


@needs_read_only
def test_an_existing_read_only_run_folder_is_one_line(tmp_path):
    result, written = run_read_only(tmp_path, ["hydra.run.dir=mnt/existing", *FAST])
    line = assert_refused_cleanly(
        result, tmp_path / "mnt" / "existing", f"cannot write {tmp_path / 'mnt' / 'existing'}: "
    )
    assert "hydra.run.dir=<folder>" in line
    assert written == "mnt\nmnt/existing"  # no train.log, no lock


@needs_read_only
def test_a_sweep_under_a_read_only_parent_is_one_line(tmp_path):
    args = ["-m", "hydra.sweep.dir=mnt/sweep", "trainer.num_workers=1,2", *FAST[:-2]]
    result, written = run_read_only(tmp_path, args)
    line = assert_refused_cleanly(result, tmp_path / "mnt" / "sweep", "cannot write mnt/sweep")
    assert "hydra.sweep.dir=<folder>" in line and "\nsweep: " not in result.stdout
    assert written == "mnt\nmnt/existing"


# ---- paths Hydra's grammar reads only quoted; paths a shell splits ----


def test_a_non_ascii_path_says_how_to_quote_it_and_the_hint_works(tmp_path):
    """`hydra.run.dir=runs/é only` is refused by Hydra's override grammar: the line gives the
    override to type instead, which runs; the report's tensorboard command is quoted for the
    shell (a space, a non-ASCII letter), so that pasted as it is, it names the run folder."""
    refused = subprocess.run(
        hogwild("hydra.run.dir=runs/é only", *FAST), capture_output=True, text=True,
        timeout=120, env=cli_env(), cwd=tmp_path,
    )  # fmt: skip
    line = assert_refused_cleanly(refused, tmp_path / "runs", "quote the value, as in ")
    assert not (tmp_path / "runs").exists()
    hint = line.split("quote the value, as in ", 1)[1].split(" (Hydra's override syntax", 1)[0]
    assert hint == "'hydra.run.dir=\"runs/é only\"'", line
    (override,) = shlex.split(hint)  # what the shell hands over when the hint is typed
    result = subprocess.run(
        hogwild(override, *FAST), capture_output=True, text=True, timeout=180, env=cli_env(),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "é only"
    assert (run_dir / "summary.json").exists()
    command = next(line for line in result.stdout.splitlines() if "tensorboard --logdir" in line)
    command = command.split("dashboards", 1)[1].strip()
    assert command == "tensorboard --logdir 'runs/é only'", command
    assert shlex.split(command) == ["tensorboard", "--logdir", "runs/é only"]
