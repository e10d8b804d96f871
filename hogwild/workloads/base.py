"""The workload seam: what workers do per step, and how the orchestrator judges the result.

A workload has two halves. The orchestrator keeps the `Workload` (it shares what the workers
need, evaluates the shared model, fills its part of the summary); each worker receives the
`Task` it returns, a small picklable object whose `run(ctx)` loop takes steps through the
worker's `hogwild.worker.main.WorkerContext`:

    def run(self, ctx):
        while not ctx.stopping():
            ctx.begin()                          # fresh gradients; the read that staleness counts
            loss = ...                           # a batch of shared data, or a rollout
            ctx.step(loss, units=n, batch=b)     # backward, checks, update, counters, reports

Everything else (processes, sharing, signals, checkpoints, metrics, torchrun) is the
framework's and does not change with the workload. Supervised training on in-memory tensors
(hogwild.workloads.supervised) is the first implementation; A3C on gymnasium environments
(hogwild.workloads.a3c) the second.

The three seams are `typing.runtime_checkable` Protocols: `isinstance(obj, Workload)` tells a
workload from a data set (it checks that every member is there, not their signatures). Three
members are optional, so they are not in the Protocol: `shared_optimizer = True` makes one
shared optimizer state a workload's default (hogwild.optim.shared_state), as A3C does;
`finished(progress) -> bool`, whether a checkpoint's progress table leaves nothing to do (a
workload without it is never judged finished on resume), as the supervised workload has; and
`kind`, what is learnt ("classification", "regression", "reinforcement learning"), the
dashboards' Custom Scalars category ("training" without it).
`NullEvaluator` is the evaluator of nodes that do not evaluate (torchrun's ranks but 0).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Task(Protocol):
    """The worker half: pickled once into every worker process."""

    def run(self, ctx: Any) -> None: ...


@runtime_checkable
class Evaluator(Protocol):
    """Judges the shared model from the orchestrator, while the workers go on."""

    idle_cores: bool  # may run on the cores the workers leave idle (hogwild.run.idle_evaluation)

    def due(self, epochs_complete: int, units: int) -> str | None:
        """A label ('epoch 3/10') when an evaluation is due, else None."""

    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        """Evaluate now; returns the dashboard scalars."""

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        """Whether the end of the run needs one more evaluation."""

    def results(self) -> dict[str, Any]:
        """The summary's fields (None for what was never measured)."""

    def goal(self) -> str | None:
        """Why the run may stop now (a task solved), else None."""


@runtime_checkable
class Workload(Protocol):
    """The orchestrator half: kept by the orchestrator, which shares, evaluates and reports."""

    name: str  # what is trained on: the start line and the dashboards
    unit: str  # what the progress counts: "samples", "env steps"
    total_units: int  # in the whole run: the progress bar's end and the lr schedule's 100%

    def describe(self) -> str:
        """How much work, for the start line: '1437 samples x 10 epochs'."""

    def facts(self) -> dict[str, Any]:
        """What a resumed run (and every torchrun node) must agree on."""

    def host_tensors(self) -> list[torch.Tensor]:
        """Tensors the workers read from shared memory (for the /dev/shm and fd checks)."""

    def check(self, num_workers: int) -> None:
        """Refuse a run that cannot work (a HogwildError), before anything is written."""

    def task(self, home: torch.device, layout: Any) -> Task:
        """Share what the workers need (on `home`, in `layout`) and return the worker half."""

    def evaluator(self, device: torch.device, layout: Any, batch_size: int) -> Evaluator:
        """The orchestrator's judge of the shared model (on `device`, batches of `batch_size`)."""


class NullEvaluator:
    """Evaluates nothing: the evaluator of nodes other than torchrun's rank 0, whose cores go
    to their workers."""

    idle_cores = False

    def due(self, epochs_complete: int, units: int) -> str | None:
        return None

    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        return {}

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        return False

    def results(self) -> dict[str, Any]:
        return {}

    def goal(self) -> str | None:
        return None
