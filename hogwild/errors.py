"""Every error hogwild raises on purpose, in one tree.

    HogwildError            a problem the user can fix: the CLI prints its message as one line
    ├── ConfigError         a config key with a value that is not allowed (names key, value, what is)
    ├── DataError           a data set that cannot be loaded as asked (missing files, bad values)
    ├── PreflightError      the machine cannot run this run (/dev/shm, open files, fd passing)
    │   └── SharedMemoryError   the run's tensors could not be put into shared memory (mmap, memory limit)
    ├── CheckpointError     a resume_from file that cannot be used
    ├── RunFolderError      the run folder cannot be claimed or written (locked, no space, ...)
    ├── NodeSyncError       another torchrun node is gone or did not answer in time
    └── WorkerFailure       a worker raised, exited or was killed (rank, exit code or signal, traceback)

The CLI's rule holds by type wherever the error was raised: a HogwildError is one line and exit
code 2 (1 for a failed run); anything else is a bug in hogwild and keeps its traceback.
"""

from __future__ import annotations

import signal


class HogwildError(Exception):
    """A problem the user can fix; its message is one line. `cli`, when given, says the same in
    the command line's words (Hydra overrides) where the Python API's words differ."""

    def __init__(self, *args, cli: str | None = None):
        super().__init__(*args)
        self.cli = cli


class ConfigError(HogwildError, ValueError):
    """A config value that is not allowed."""


class DataError(HogwildError, ValueError):
    """A data set that cannot be built as configured."""


class PreflightError(HogwildError):
    """The machine cannot run this configuration (checked before anything starts)."""


class SharedMemoryError(PreflightError):
    """The run's tensors could not be moved into shared memory (an mmap refused by the memory
    limit, ...): found as they are shared, before any worker starts; nothing is left in /dev/shm."""


class CheckpointError(HogwildError):
    """A checkpoint that cannot be resumed from."""


class RunFolderError(HogwildError):
    """The run folder cannot be claimed or written."""


class NodeSyncError(HogwildError):
    """A collective between torchrun nodes failed."""


class WorkerFailure(HogwildError):
    """A worker that ended without finishing, as a value: like torch's ProcessRaisedException /
    ProcessExitedException, it carries the rank, the exit code (negative: the signal) and the
    worker's own traceback when it could send one."""

    def __init__(
        self,
        rank: int,
        reason: str,
        exitcode: int | None = None,
        traceback: str = "",
        kind: str = "exit",
    ):
        super().__init__(f"worker {rank} failed: {reason}")
        self.rank, self.reason, self.exitcode, self.traceback, self.kind = (
            rank,
            reason,
            exitcode,
            traceback,
            kind,
        )

    @property
    def signal_name(self) -> str | None:
        """SIGKILL for a worker killed by it; None for one that exited or raised."""
        return (
            _signal_name(-self.exitcode)
            if self.exitcode is not None and self.exitcode < 0
            else None
        )

    @property
    def restartable(self) -> bool:
        """A non-finite loss, or a script that every new worker re-runs (no `__main__` guard),
        would only happen again: a replacement would not help."""
        return self.kind not in ("nonfinite", "unguarded")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(exitcode: int | None) -> str:
    """'exit code 3' or 'killed by SIGKILL' for a process's exitcode."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {_signal_name(-exitcode)}"
    return f"exit code {exitcode}"
