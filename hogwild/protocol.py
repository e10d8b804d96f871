"""The parent/worker protocol: everything that crosses the process boundary, in one place.

Data flow of a run::

    orchestrator                                        worker(rank)
    ------------                                        ------------
    WorkerSpec, shared model, shared data,  ─ args ─>   sets strategy, threads, seed;
    Control (shared int64 tensor)                       builds its own optimizer
    samples Control (progress bar, TensorBoard,  <─ shm ─ after every optimizer step: its row's
    checkpoints, stall watch) when it is due            counters; every N steps its loss sum
    sets Control.stop                      ─ shm ─>     reads Control.stop before every step
    drains one Pipe per worker             <─ pipe ─    Hello, EpochEnd, Scalars, Log,
    + waits on the process sentinels                    then Done  (or Failure, then exit 1)

Progress never crosses a pipe: a worker adds to its own row of the shared table (a few numpy
writes, nanoseconds) and the orchestrator reads the table when something is due, so reporting
every step costs about what reporting every hundred does, and the orchestrator sleeps while
nothing happens. Messages are rare and small: NamedTuples of Python scalars and strings (a
tensor put on a pipe would be copied into a new shared-memory segment).

Shutdown (the run loop raises ``Control.stop``, hogwild.run.state decides when to escalate,
``hogwild.run.supervisor.Supervisor.terminate`` ends it): workers finish their step and send
``Done`` -> after a grace period SIGTERM -> SIGKILL -> join. A worker that dies
without ``Done`` is a failure: its ``Failure`` traceback when it managed to send one, otherwise
its exit code or the signal that killed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from hogwild.config.schema import ScheduleConfig
from hogwild.reporting import staleness

# ---- orchestrator -> worker -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """The few plain values a worker needs; never the whole config (it must pickle under spawn)."""

    num_workers: int
    seed: int  # worker `rank` seeds torch with seed + rank
    threads: int  # intra-op threads, set before any torch work
    sharing_strategy: str
    device: str
    log_every_n_steps: int
    optimizer_factory: Callable[..., torch.optim.Optimizer]  # called on the shared parameters
    skip_nonfinite: bool  # skip a step whose loss is NaN/inf instead of failing the run
    schedule: ScheduleConfig  # learning-rate rules, driven by the global sample count
    total_units: int  # samples (or environment steps) of the whole run: the schedule's 100%
    orchestrator_pid: int  # the worker exits by itself when this process is gone
    task: Any  # the workload's worker half (hogwild.workloads): what one worker does, step by step
    stack_dir: str = ""  # where a worker dumps its Python stack on SIGUSR1 (<dir>/<rank>.txt)


class Control:
    """Shared-memory control block: one stop flag plus one row per rank of counters.

    Plain shared tensors instead of multiprocessing Events/Queues: reading or writing them costs
    nanoseconds through a numpy view, needs no semaphore (nothing to leak in /dev/shm) and no
    feeder thread (nothing to block interpreter exit). A rank writes its own row only; the
    orchestrator reads every row whenever it likes (8-byte aligned words: no torn values).
    """

    # columns of `progress` (int64): where a rank stands; checkpointed
    EPOCH, BATCH, SAMPLES, STEPS = range(4)
    # columns of `reports` (float64): what the dashboards show; not checkpointed
    LOSS, LOSS_STEPS, SKIPPED, LR, T_FIRST, T_LAST = range(6)
    NUM_TENSORS = 2  # what tensors() returns: what a worker receives besides the model and data

    def __init__(self, num_workers: int):
        self.stop = torch.zeros(1, dtype=torch.int64).share_memory_()
        # One shared table, one storage (one fd to pass under file_descriptor): the progress
        # columns, the report columns (float64 bit patterns) and each rank's staleness
        # histogram (hogwild.reporting.staleness).
        self.table = torch.zeros(
            num_workers, 4 + 6 + staleness.COLUMNS, dtype=torch.int64
        ).share_memory_()
        self._views()

    def _views(self) -> None:
        self.progress = self.table[:, :4]
        self.reports = self.table[:, 4:10].view(torch.float64)  # same bytes, read as doubles
        self.staleness = self.table[:, 10:]

    def __getstate__(self) -> dict:  # send the storage once, not once per view
        return {"stop": self.stop, "table": self.table}

    def __setstate__(self, state: dict) -> None:
        self.stop, self.table = state["stop"], state["table"]
        self._views()

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.stop, self.table

    def train_span(self) -> tuple[float, float] | None:
        """(monotonic time of the first step of any rank, of the last step of any rank), or
        None before the first step: the steady state the summary's samples/s divides by."""
        r = self.reports.numpy()
        started = r[:, self.T_FIRST][r[:, self.T_FIRST] > 0]
        if started.size == 0:
            return None
        return float(started.min()), float(r[:, self.T_LAST].max())


# ---- worker -> orchestrator -------------------------------------------------------------------


class Hello(NamedTuple):
    """First message: proves which per-process settings the worker really runs with."""

    rank: int
    sharing_strategy: str
    num_threads: int


class EpochEnd(NamedTuple):
    rank: int
    epoch: int


class Log(NamedTuple):
    """A log record from a worker, re-emitted by the orchestrator's logger."""

    rank: int
    level: int
    message: str


class Scalars(NamedTuple):
    """A workload's own figures since its last report, for the dashboards (A3C: episode
    return and length, entropy, policy and value loss): `train/<key>` and `workers/<key>/rank_NN`."""

    rank: int
    values: dict[str, float]


class Done(NamedTuple):
    rank: int


class Failure(NamedTuple):
    """A worker's own account of why it is about to exit non-zero."""

    rank: int
    kind: str  # "exception" | "nonfinite"
    message: str
    traceback: str
