"""One run per folder, and write errors as one line (docs/fault-tolerance.md).

    with Claim("outputs/run") as claim:   # RunFolderError if another run holds it
        ...                              # claim.started = True once workers run

The claim is an exclusive `fcntl.flock` on `<folder>/.hogwild.lock`, which holds the PID of
the run that owns it. The kernel releases it when that process ends however it ends, so a
crashed run never leaves a folder locked. One claim per run: the CLI claims before writing
`.hydra/` and hands the claim to the Trainer; the Python API's Trainer claims for itself. A
run refused before it started leaves no folder behind when the folder was new (or empty)
when it was claimed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time

from hogwild.errors import RunFolderError

LOCK = ".hogwild.lock"
HYDRA_LOG = "train.log"  # the CLI's log, begun by the run's first line: part of a fresh folder


def write_error(path: str, e: OSError) -> RunFolderError:
    """'cannot write <path>: No space left on device' for any OSError writing a run file."""
    reason = os.strerror(e.errno) if e.errno else str(e)
    hint = " (free some space, or point the run elsewhere)" if e.errno == errno.ENOSPC else ""
    return RunFolderError(f"cannot write {path}: {reason}{hint}")


class Claim:
    """One run's hold on its folder, from `with` to the end of the block: a lock file that a
    second run cannot take, and a fresh folder removed again if the run never started. Made
    once by whoever sets the run up (the CLI, or Trainer.fit for the Python API) and handed on."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)
        self.fd: int | None = None
        self.fresh = False
        self.started = False  # set once the run has started: from then on its files are kept

    def __enter__(self) -> Claim:
        self._acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self.fresh and not self.started:  # refused or interrupted before it began: no litter
            _close_log_files_in(self.folder)
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None

    def _acquire(self) -> None:
        lock = os.path.join(self.folder, LOCK)
        try:
            self.fresh = not os.path.isdir(self.folder) or not any(
                e.name not in (LOCK, HYDRA_LOG) for e in os.scandir(self.folder)
            )
            os.makedirs(self.folder, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise write_error(lock, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            self.fresh = False
            raise RunFolderError(
                f"run folder {self.folder} is in use by another hogwild run (PID {holder}); "
                "give this run its own folder (hydra.run.dir=... or output_dir) or wait for it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd


def fresh(parent: str) -> str:
    """A new folder's name under `parent`: the time, and -2, -3, ... within the same second."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    path, n = os.path.join(parent, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(parent, f"{stamp}-{n}")
    return path


OUTPUTS = ("summary.json", "checkpoints", "tensorboard")  # what a run writes (not .hydra/, logs)


def clear_outputs(folder: str) -> None:
    """Trainer(overwrite=True): remove the finished run's outputs before this run writes its
    own. Nothing else in the folder is touched."""
    for name in OUTPUTS:
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
        except OSError as e:
            raise write_error(path, e) from None


def _close_log_files_in(folder: str) -> None:
    """A log file in a folder being removed (Hydra's train.log) would be re-created by the next
    line logged: detach it first."""
    for logger in (logging.getLogger(), logging.getLogger("hogwild")):
        for h in list(logger.handlers):
            if isinstance(h, logging.FileHandler) and h.baseFilename.startswith(folder + os.sep):
                logger.removeHandler(h)
                h.close()
