"""One run per folder, and write errors as one line (docs/fault-tolerance.md).

    with Claim("outputs/run") as claim:   # RunFolderError if another run holds it
        ...                              # claim.started = True once workers run
        claim.check()                    # RunFolderError if the folder was removed meanwhile

The claim is an exclusive `fcntl.flock` on a lock file BESIDE the folder, in its parent:
`<parent>/.<name>.hogwild.lock` (for a parent that takes no new file, e.g. read-only, in
`/tmp/hogwild-<uid>/`, named after the folder's path). It holds the PID of the run that owns
it and the identity (device, inode) of the folder it claimed. Beside, not inside: `rm -rf` of
the run folder cannot take the lock with it, so a second run into the same path is refused for
as long as the first one lives. The kernel releases the lock when that process ends however it
ends, so a crashed run never leaves a folder locked; a run that ends removes its lock file (one
killed outright leaves it, unlocked and harmless).

One claim per run: the CLI claims before writing `.hydra/` and hands the claim to the Trainer;
the Python API's Trainer claims for itself. A run refused before it started leaves no folder
behind when the folder was new (or empty) when it was claimed. A claim proves that no other run
writes to the folder: it removes the partial checkpoints (`checkpoints/.last.*.tmp`) that a run
killed while writing one left behind. `check()` tells the run loop, cheaply (one stat), that
the folder it claimed is gone or was replaced by another.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import sys
import time

from hogwild.errors import RunFolderError

log = logging.getLogger("hogwild")

LOCK = ".hogwild.lock"  # the lock file's suffix (beside the folder); inside it: an older version's
HYDRA_LOG = "train.log"  # the CLI's log, begun by the run's first line: part of a fresh folder
CHECKPOINTS = "checkpoints"
# a checkpoint being written (hogwild.run.checkpoint): `checkpoints/.last.<random>.tmp` until it
# is renamed over last.pt; one still there when a run claims the folder was left by a killed run
PARTIAL = (".last.", ".tmp")
# where a folder whose parent takes no new file is locked: one folder per user, this user's only
LOCKS_FALLBACK = "/tmp"


def write_error(path: str, e: OSError) -> RunFolderError:
    """'cannot write <path>: No space left on device' for any OSError writing a run file."""
    reason = os.strerror(e.errno) if e.errno else str(e)
    hint = " (free some space, or point the run elsewhere)" if e.errno == errno.ENOSPC else ""
    return RunFolderError(f"cannot write {path}: {reason}{hint}")


def lock_path(folder: str) -> str:
    """The lock file of run folder `folder` (an absolute, real path): `<parent>/.<name>.hogwild.lock`,
    or, when the parent takes no new file (read-only, another user's) and holds none yet,
    `/tmp/hogwild-<uid>/<hash of the path>.hogwild.lock`. Every run into the folder computes
    the same one, as long as the parent's permissions do not change while one runs."""
    parent, name = os.path.split(folder.rstrip(os.sep) or os.sep)
    beside = os.path.join(parent, f".{name or 'root'}{LOCK}")
    if os.path.lexists(beside) or os.access(parent, os.W_OK | os.X_OK):
        return beside
    digest = hashlib.sha256(folder.encode()).hexdigest()[:24]
    return os.path.join(LOCKS_FALLBACK, f"hogwild-{os.getuid()}", f"{digest}{LOCK}")


class Claim:
    """One run's hold on its folder, from `with` to the end of the block: a lock file beside it
    that a second run cannot take (nor `rm -rf` of the folder remove), and a fresh folder
    removed again if the run never started. Made once by whoever sets the run up (the CLI, or
    Trainer.fit for the Python API) and handed on."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)
        self.lock = ""  # the lock file, once known (lock_path)
        self.fd: int | None = None
        # the claimed folder's (st_dev, st_ino), and the folder itself held open: its inode
        # cannot be reused by a new folder of the same name while the run holds it
        self.identity: tuple[int, int] | None = None
        self.folder_fd: int | None = None
        self.fresh = False
        self.started = False  # set once the run has started: from then on its files are kept

    def __enter__(self) -> Claim:
        self._acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self.fresh and not self.started:  # refused or interrupted before it began: no litter
            self._remove_folder()
        if self.fd is not None:
            if _same_file(self.fd, self.lock):  # ours still: no one else can hold it now
                with contextlib.suppress(OSError):
                    os.unlink(self.lock)  # a run that opened it meanwhile sees it gone, retries
            os.close(self.fd)  # releases the lock
            self.fd = None
        if self.folder_fd is not None:
            os.close(self.folder_fd)
            self.folder_fd = None

    def check(self) -> None:
        """RunFolderError if the folder this claim holds was removed (or replaced by another
        folder of the same name) since it was claimed. One stat: cheap enough for every write."""
        if self.identity is None:
            return
        try:
            st = os.stat(self.folder)
        except FileNotFoundError:
            now = None
        except OSError:  # cannot tell (e.g. a parent made unreadable): the next write will say
            return
        else:
            now = (st.st_dev, st.st_ino)
        if now != self.identity:
            replaced = " (another folder now has its name)" if now else ""
            raise RunFolderError(
                f"run folder {self.folder} was removed while the run was running{replaced}: "
                "stopping it; its train.log, .hydra/, dashboards and checkpoints went with the "
                "folder, and nothing more is written there"
            )

    def _acquire(self) -> None:
        try:
            self.fresh = not os.path.isdir(self.folder) or not any(
                e.name not in (LOCK, HYDRA_LOG) for e in os.scandir(self.folder)
            )
            os.makedirs(self.folder, exist_ok=True)
            self.folder_fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise write_error(self.folder, e) from None
        st = os.fstat(self.folder_fd)
        self.identity = (st.st_dev, st.st_ino)
        self.lock = lock_path(os.path.realpath(self.folder))
        while True:
            fd = self._open_lock()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._refuse(fd)
            if _same_file(fd, self.lock):
                break
            os.close(fd)  # removed by the run that held it as we opened it: take the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{st.st_dev}:{st.st_ino}\n".encode(), 0)
        self.fd = fd
        self._remove_partial_checkpoints()

    def _open_lock(self) -> int:
        try:
            if os.path.basename(os.path.dirname(self.lock)) == f"hogwild-{os.getuid()}":
                _private_folder(os.path.dirname(self.lock))
            return os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        except (OSError, RunFolderError) as e:
            self._let_go()
            if self.fresh:  # never started, nothing of it to keep
                self._remove_folder()
            self.fresh = False
            reason = str(e) if isinstance(e, RunFolderError) else str(write_error(self.lock, e))
            raise RunFolderError(f"cannot lock run folder {self.folder}: {reason}") from None

    def _refuse(self, fd: int) -> None:
        """Another run holds the lock: refuse, naming its PID. The folder stays, unless it is
        fresh and not the holder's (the holder's was removed, and this run's CLI made this one)."""
        lines = os.pread(fd, 64, 0).decode(errors="replace").split()
        os.close(fd)
        self._let_go()
        holder = lines[0] if lines else "unknown"
        # what the holder wrote, not what a killed run left (the holder may not have written yet)
        theirs = len(lines) > 1 and holder.isdigit() and _alive(int(holder))
        if self.fresh and theirs and lines[1] != "{}:{}".format(*self.identity):
            self._remove_folder()
        self.fresh = False
        raise RunFolderError(
            f"run folder {self.folder} is in use by another hogwild run (PID {holder}); "
            "give this run its own folder (hydra.run.dir=... or output_dir) or wait for it"
        )

    def _let_go(self) -> None:
        """Refused: the folder is not held (nor pinned) by this claim."""
        if self.folder_fd is not None:
            os.close(self.folder_fd)
            self.folder_fd = None

    def _remove_folder(self) -> None:
        _close_log_files_in(self.folder)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _remove_partial_checkpoints(self) -> None:
        """The temp files of checkpoints that were being written when their run was killed:
        no other run writes here (this claim proves it), so none of them is being written."""
        folder = os.path.join(self.folder, CHECKPOINTS)
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # none yet (or unreadable: pre-flight says so)
            return
        prefix, suffix = PARTIAL
        removed = 0
        for name in names:
            if not (name.startswith(prefix) and name.endswith(suffix)):
                continue
            path = os.path.join(folder, name)
            try:
                size = os.path.getsize(path)
                os.unlink(path)
                removed += size
            except FileNotFoundError:
                pass
            except OSError as e:  # not worth refusing the run for: it only takes room
                log.warning("%s; left in place", write_error(path, e))
        if removed:
            log.info(
                "removed %.1f MiB of partial checkpoints left in %s by a run killed while writing",
                removed / 2**20,
                folder,
            )


def _same_file(fd: int, path: str) -> bool:
    """Is `path` still the file open as `fd` (not removed, nor replaced)?"""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _private_folder(path: str) -> None:
    """/tmp/hogwild-<uid>: made for this user alone, and refused if someone else made it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RunFolderError(f"{path} is not a folder of this user's; remove it")


def job_number(name: str) -> int | None:
    """The job number of a sweep's job folder (`0`, `3_trainer.num_workers=2`: its number, then
    what it varies, hogwild.cli.sweep.job_folder), or None for any other name."""
    m = re.match(r"(\d+)(?:_|$)", name)
    return int(m[1]) if m else None


def script_outputs() -> str:
    """Where a Python API run without an output_dir writes: outputs/<the script's name>
    (`python train_mine.py` -> outputs/train_mine/<date>_<time>), outputs/python from a
    session with no script. The model's class said little (every nn.Sequential: `sequential`)."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = script[: -len(".py")] if script.endswith(".py") and len(script) > 3 else "python"
    return os.path.join("outputs", name)


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
