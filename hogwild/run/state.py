"""The run loop's state: events in, state changes and actions out. No processes, no clocks.

    state = RunState(num_workers=2, epochs_done=[0, 0], on_failure="restart", max_restarts=1)
    state.apply(Exited(rank=1, exitcode=-9))   # -> [Restart(rank=1, failure=..., count=1)]
    state.apply(Signal(signal.SIGINT))          # -> [StopWorkers(reason="SIGINT")]
    state.apply(Tick(now=12.0))                 # -> [Terminate()] once the grace period is over

The orchestrator feeds it what its workers send (protocol messages), what the supervisor sees
(`Exited`), the signals it receives and the time; it carries out the actions (start a worker,
raise the stop flag, escalate to SIGTERM) and asks the state for the run's outcome. Every rule
of supervision lives here and is tested with hand-made events (tests/unit/test_run_state.py).

Status: running -> completed | interrupted | failed, never back. A failure or an interrupt
raises the shared stop flag; after `grace_seconds` (or at once, on a second signal) the
remaining workers are terminated.
"""

from __future__ import annotations

import dataclasses
import enum
import signal as signals
from typing import Any

from hogwild.errors import WorkerFailure, describe_exit
from hogwild.protocol import Done, EpochEnd, Failure, Hello


class RunStatus(str, enum.Enum):
    """Where a run stands: running -> completed | interrupted | failed, never back. The value
    is what summary.json and the console say."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


# ---- events (besides the protocol's messages) ----


@dataclasses.dataclass(frozen=True)
class Exited:
    """A worker process is gone; `exitcode` is negative for a signal."""

    rank: int
    exitcode: int


@dataclasses.dataclass(frozen=True)
class Signal:
    signum: int


@dataclasses.dataclass(frozen=True)
class Tick:
    now: float  # time.monotonic()
    steps: tuple[int, ...] = ()  # every rank's optimizer steps so far (the stall watch)


@dataclasses.dataclass(frozen=True)
class RunFailed:
    """The orchestrator itself cannot go on (a node is gone, a write failed)."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Finished:
    """The workload says the run has reached its goal (e.g. a policy that solved its task)."""

    reason: str


# ---- actions ----


@dataclasses.dataclass(frozen=True)
class Restart:
    rank: int
    failure: WorkerFailure
    count: int  # restarts so far, this one included


@dataclasses.dataclass(frozen=True)
class Failed:
    failure: WorkerFailure


@dataclasses.dataclass(frozen=True)
class StopWorkers:
    reason: str  # what made the run stop: a signal's name, a failure, a goal reached


@dataclasses.dataclass(frozen=True)
class Stalled:
    """A worker has taken no step for `seconds`: log its stack and kill it (its exit is then a
    failure, judged like any other by on_worker_failure)."""

    rank: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Terminate:
    """The grace period is over (or a second signal came): SIGTERM, then SIGKILL, what is left."""


EXIT_CODES = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1}


class StallWatch:
    """When each worker's step counter last moved; a worker whose counter has not moved for
    `seconds` is hung."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.moved: dict[int, tuple[int, float]] = {}  # rank -> (its steps, when they last moved)

    def forget(self, rank: int) -> None:
        self.moved.pop(rank, None)  # a replacement's clock starts at its first Tick

    def hung(self, now: float, steps: tuple[int, ...], judged: set[int]) -> list[tuple[int, float]]:
        """(rank, seconds without a step) of each hung worker, skipping the ranks in `judged`."""
        out = []
        for rank, count in enumerate(steps):
            if rank in judged:  # finished, or already judged
                continue
            was = self.moved.get(rank)
            if was is None or was[0] != count:
                self.moved[rank] = (count, now)
            elif now - was[1] >= self.seconds:
                out.append((rank, now - was[1]))
        return out


class RunState:
    def __init__(
        self,
        num_workers: int,
        epochs_done: list[int] | None = None,
        on_failure: str = "stop",
        max_restarts: int = 0,
        grace_seconds: float = 5.0,
        stall_seconds: float = 0.0,  # 0: never judge a worker hung
    ):
        self.num_workers, self.on_failure, self.max_restarts = num_workers, on_failure, max_restarts
        self.grace_seconds, self.stall_seconds = grace_seconds, stall_seconds
        self.stalls = StallWatch(stall_seconds)
        self.status = RunStatus.RUNNING
        self.signal: int | None = None
        self.failure: WorkerFailure | None = None  # rank -1: the orchestrator itself
        self.epochs_done = list(epochs_done or [0] * num_workers)
        self.done: set[int] = set()
        self.failures: dict[int, Failure] = {}
        self.hello: dict[int, Hello] = {}
        self.restarts = 0
        self.force = False
        self.stop_deadline: float | None = None
        self.finished_reason: str | None = None

    @property
    def running(self) -> bool:
        return self.status is RunStatus.RUNNING

    @property
    def epochs_complete(self) -> int:
        """Epochs every rank has finished: the shared model has then seen each of them whole."""
        return min(self.epochs_done)

    @property
    def exit_code(self) -> int:
        if self.status is RunStatus.INTERRUPTED:
            return 128 + (self.signal or signals.SIGINT)
        return EXIT_CODES.get(self.status, 1)

    @property
    def error(self) -> dict[str, Any] | None:
        return (
            None
            if self.failure is None
            else {"rank": self.failure.rank, "reason": self.failure.reason}
        )

    def apply(self, event: Any) -> list[Any]:
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        return handler(event) if handler else []

    # ---- what the workers say ----

    def _on_Hello(self, e: Hello) -> list[Any]:
        self.hello[e.rank] = e
        return []

    def _on_EpochEnd(self, e: EpochEnd) -> list[Any]:
        self.epochs_done[e.rank] = max(self.epochs_done[e.rank], e.epoch + 1)
        return []

    def _on_Done(self, e: Done) -> list[Any]:
        self.done.add(e.rank)
        return []

    def _on_Failure(self, e: Failure) -> list[Any]:
        self.failures[e.rank] = e
        return []

    def _on_Exited(self, e: Exited) -> list[Any]:
        self.stalls.forget(e.rank)
        if e.rank in self.done and e.exitcode == 0:
            return []
        said = self.failures.pop(e.rank, None)
        failure = (
            WorkerFailure(e.rank, said.message, e.exitcode, said.traceback, said.kind)
            if said
            else WorkerFailure(e.rank, describe_exit(e.exitcode), e.exitcode)
        )
        if not self.running:  # already stopping: a worker ended by the shutdown is no news
            return []
        if (
            self.on_failure == "restart"
            and failure.restartable
            and self.restarts < self.max_restarts
        ):
            self.restarts += 1
            return [Restart(e.rank, failure, self.restarts)]
        if self.on_failure == "restart" and failure.restartable:  # the budget is spent: say so
            failure = WorkerFailure(
                failure.rank,
                f"{failure.reason}; no restart left (trainer.max_restarts={self.max_restarts}"
                + (" used)" if self.max_restarts else ")"),
                failure.exitcode,
                failure.traceback,
                failure.kind,
            )
        self._stop(RunStatus.FAILED)
        self.failure = failure
        return [Failed(failure), StopWorkers(f"worker {e.rank} failed")]

    # ---- what the orchestrator sees ----

    def _on_Signal(self, e: Signal) -> list[Any]:
        if not self.running:
            self.force = True  # a second signal: do not wait out the grace period
            return []
        self._stop(RunStatus.INTERRUPTED)
        self.signal = e.signum
        return [StopWorkers(signals.Signals(e.signum).name)]

    def _on_RunFailed(self, e: RunFailed) -> list[Any]:
        if not self.running:  # e.g. Ctrl-C reaches every node: a peer that left first is no news
            return []
        self._stop(RunStatus.FAILED)
        self.failure = WorkerFailure(-1, e.reason)
        return [StopWorkers(e.reason)]

    def _on_Finished(self, e: Finished) -> list[Any]:
        if not self.running:
            return []
        self._stop(RunStatus.COMPLETED)
        self.finished_reason = e.reason
        return [StopWorkers(e.reason)]

    def _on_Tick(self, e: Tick) -> list[Any]:
        if self.running:
            return self._stalls(e) if self.stall_seconds else []
        if self.stop_deadline is None:
            self.stop_deadline = e.now + self.grace_seconds
        if self.force or e.now >= self.stop_deadline:
            return [Terminate()]
        return []

    def _stalls(self, e: Tick) -> list[Any]:
        out = []
        for rank, seconds in self.stalls.hung(e.now, e.steps, self.done | set(self.failures)):
            reason = (
                f"hung: no step for {seconds:.0f} s (trainer.stall_seconds={self.stall_seconds:g})"
            )
            self.failures[rank] = Failure(rank, "stall", reason, "")
            out.append(Stalled(rank, seconds))
        return out

    def all_exited(self) -> None:
        """Every worker is gone: a run that nothing stopped has completed."""
        if self.running:
            self.status = RunStatus.COMPLETED

    def fail_late(self, reason: str) -> None:
        """The orchestrator failed after the workers were gone (the final checkpoint could not
        be written): the run has failed, whatever it was about to be."""
        if self.status is not RunStatus.FAILED:
            self.status, self.failure = RunStatus.FAILED, WorkerFailure(-1, reason)

    def _stop(self, status: RunStatus) -> None:
        self.status = status
