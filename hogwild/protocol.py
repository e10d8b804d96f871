"""The parent/worker protocol: everything that crosses the process boundary, in one place.

Data flow of a run::

    orchestrator                                        worker(rank)
    ------------                                        ------------
    WorkerSpec, shared model, shared data,  ─ args ─>   sets strategy, threads, seed;
    Control (shared int64 tensor)                       builds its own optimizer
    reads Control.progress (checkpoints)   <─ shm ─     writes its row of Control.progress
                                                        after every optimizer step
    sets Control.stop                      ─ shm ─>     reads Control.stop before every step
    drains one Pipe per worker             <─ pipe ─    Hello, Progress, EpochEnd, Scalars, Log,
    + waits on the process sentinels                    then Done  (or Failure, then exit 1)

Messages are small NamedTuples of Python scalars and strings: a tensor put on a pipe would be
copied into a new shared-memory segment, which is exactly what the hot path must not do.

Shutdown (owned by ``supervisor.Supervisor.stop``): set ``Control.stop`` -> workers finish their
step and send ``Done`` -> after a grace period SIGTERM -> SIGKILL -> join. A worker that dies
without ``Done`` is a failure: its ``Failure`` traceback when it managed to send one, otherwise
its exit code or the signal that killed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from hogwild import staleness
from hogwild.config import ScheduleConfig

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
    """Shared-memory control block: one stop flag plus one progress row per rank.

    Plain shared tensors instead of multiprocessing Events/Queues: reading or writing them costs
    nanoseconds through a numpy view, needs no semaphore (nothing to leak in /dev/shm) and no
    feeder thread (nothing to block interpreter exit).
    """

    # columns of `progress`
    EPOCH, BATCH, SAMPLES, STEPS = range(4)
    NUM_TENSORS = 2  # what tensors() returns: what a worker receives besides the model and data

    def __init__(self, num_workers: int):
        self.stop = torch.zeros(1, dtype=torch.int64).share_memory_()
        # One shared table, one storage (one fd to pass under file_descriptor): the progress
        # columns, then each rank's staleness histogram (hogwild.staleness). A rank writes its row only.
        self.table = torch.zeros(
            num_workers, 4 + staleness.COLUMNS, dtype=torch.int64
        ).share_memory_()
        self._views()

    def _views(self) -> None:
        self.progress = self.table[:, :4]
        self.staleness = self.table[:, 4:]

    def __getstate__(self) -> dict:  # send the storage once, not once per view
        return {"stop": self.stop, "table": self.table}

    def __setstate__(self, state: dict) -> None:
        self.stop, self.table = state["stop"], state["table"]
        self._views()

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.stop, self.table


# ---- worker -> orchestrator -------------------------------------------------------------------


class Hello(NamedTuple):
    """First message: proves which per-process settings the worker really runs with."""

    rank: int
    sharing_strategy: str
    num_threads: int


class Progress(NamedTuple):
    """Sent every `log_every_n_steps` steps and once at the end; counts are deltas."""

    rank: int
    steps: int
    samples: int
    loss_sum: float
    t_first: float  # monotonic time of the worker's first step (same in every message)
    t_last: float  # monotonic time of the latest step
    lr: float  # the worker's current learning rate (first parameter group)
    skipped: int = 0  # batches skipped for a non-finite loss or gradient (skip_nonfinite=true)


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
