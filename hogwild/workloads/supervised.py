"""Supervised training on in-memory tensors: the first workload.

The training split goes to shared memory once (or to the GPU); each epoch is one permutation of
it, seeded by (seed, epoch) only, cut into disjoint shards, one per rank, so that
`trainer.epochs=1` uses every sample once in total, not once per worker. A worker reads its
batches straight out of the shared tensors with index_select. The orchestrator evaluates the
shared model on the test split after every epoch (`SupervisedEvaluator`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hogwild.errors import ConfigError
from hogwild.process import sharing
from hogwild.protocol import Control
from hogwild.reporting.text import plural
from hogwild.workloads.device import HostBatches, Layout

log = logging.getLogger("hogwild")


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The same permutation in every process: seeded by (seed, epoch) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_samples, generator=g)


def shard(perm: torch.Tensor, rank: int, num_workers: int) -> torch.Tensor:
    """Rank's disjoint slice of the permutation; sizes differ by at most one sample."""
    n = perm.numel()
    return perm[rank * n // num_workers : (rank + 1) * n // num_workers]


@dataclasses.dataclass(frozen=True)
class SupervisedTask:
    """The worker half: its shard of every epoch, batch by batch."""

    train_x: torch.Tensor  # shared (or on the GPU)
    train_y: torch.Tensor
    epochs: int
    batch_size: int
    loss_fn: Callable[..., torch.Tensor]
    layout: Layout  # the memory format of 4-D batches (channels_last for conv nets on the CPU)

    def run(self, ctx) -> None:
        x_all, y_all, size = self.train_x, self.train_y, self.batch_size
        # data left in host memory for a CUDA run: batches staged through pinned buffers
        to_device = (
            HostBatches(x_all, y_all, size, ctx.device) if x_all.device != ctx.device else None
        )
        start_epoch, start_batch = ctx.position
        for epoch in range(start_epoch, self.epochs):
            indices = shard(
                epoch_permutation(x_all.shape[0], ctx.seed, epoch), ctx.rank, ctx.num_workers
            )
            indices = indices.to(x_all.device)
            for b in range(
                start_batch if epoch == start_epoch else 0, math.ceil(indices.numel() / size)
            ):
                if ctx.stopping():
                    return
                idx = indices[b * size : (b + 1) * size]
                x, y = (
                    to_device(idx)
                    if to_device
                    else (x_all.index_select(0, idx), y_all.index_select(0, idx))
                )
                x = self.layout(x)
                ctx.begin()
                ctx.step(self.loss_fn(ctx.model(x), y), idx.numel(), b + 1)
            ctx.end_epoch(epoch)


class SupervisedWorkload:
    """A `hogwild.data.DataSplits` trained for `epochs` epochs in batches of `batch_size`."""

    unit = "samples"

    def __init__(
        self, data, batch_size: int, epochs: int, loss_fn: Callable[..., torch.Tensor] | None = None
    ):
        self.data, self.batch_size, self.epochs = data, batch_size, epochs
        self.regression = getattr(data, "task", "classification") == "regression"
        self.loss_fn = loss_fn or (F.mse_loss if self.regression else F.cross_entropy)
        self.name = data.name
        self.total_units = epochs * data.num_train

    def describe(self) -> str:
        return f"{plural(self.data.num_train, 'sample')} x {plural(self.epochs, 'epoch')}"

    def facts(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "num_train": self.data.num_train,
            "epochs": self.epochs,
        }

    def finished(self, progress: torch.Tensor) -> bool:
        """Whether a checkpoint's progress table has every worker past the last epoch."""
        return bool((progress[:, Control.EPOCH] >= self.epochs).all())

    def host_tensors(self) -> list[torch.Tensor]:
        return [self.data.train_x, self.data.train_y]

    def check(self, num_workers: int) -> None:
        smallest = self.data.num_train // num_workers
        if self.batch_size > smallest:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than a worker's share of the training set "
                f"({smallest} of {self.data.num_train} samples for {num_workers} workers): no step would be "
                "a full batch; use a smaller batch size or fewer workers"
            )

    def task(self, home: torch.device, layout: Layout) -> SupervisedTask:
        train_x, train_y = layout(self.data.train_x.to(home)), self.data.train_y.to(home)
        sharing.share_tensors([train_x, train_y])
        return SupervisedTask(train_x, train_y, self.epochs, self.batch_size, self.loss_fn, layout)

    def evaluator(
        self, device: torch.device, layout: Layout, batch_size: int
    ) -> SupervisedEvaluator:
        return SupervisedEvaluator(
            self.data.test_x,
            self.data.test_y,
            self.loss_fn,
            self.regression,
            device,
            layout,
            batch_size,
            self.epochs,
        )


class SupervisedEvaluator:
    """The test split, scored by the orchestrator while the workers go on: after every epoch
    (the first moment every rank has finished its shard of it), the last epoch once the workers
    have exited (the orchestrator then has every core, and never evaluates the same weights
    twice), and an interrupted run's weights at the end. Test loss and accuracy for
    classification, test MSE and RMSE for regression. It decides for itself when it is due; the
    run loop only asks (`due`), as torchtitan's validator does."""

    idle_cores = True  # may run on the cores the workers leave idle (hogwild.run.idle_evaluation)

    def __init__(
        self,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        loss_fn: Callable[..., torch.Tensor],
        regression: bool,
        device: torch.device,
        layout: Callable[[torch.Tensor], torch.Tensor],
        batch_size: int,
        epochs: int,
    ):
        self.x, self.y, self.loss_fn, self.regression = test_x, test_y, loss_fn, regression
        self.device, self.layout, self.batch_size, self.epochs = device, layout, batch_size, epochs
        self.evaluated_epochs: int | None = (
            None  # set by the first `due` to the epochs done at the start
        )
        self.last: tuple[float, float] | None = (
            None  # (loss, accuracy or RMSE) of the latest evaluation
        )
        self.last_label: str | None = None
        self.epochs_complete = 0

    def due(self, epochs_complete: int, units: int) -> str | None:
        if self.evaluated_epochs is None:  # a resumed run does not evaluate the epochs it inherited
            self.evaluated_epochs = epochs_complete
        self.epochs_complete = epochs_complete
        if epochs_complete <= self.evaluated_epochs or epochs_complete >= self.epochs:
            return None  # the last epoch: at the end (`needs_final`)
        self.evaluated_epochs = epochs_complete
        return f"epoch {epochs_complete}/{self.epochs}"

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        if label == "final" and self.epochs_complete >= self.epochs:
            label = f"epoch {self.epochs}/{self.epochs}"  # what a completed run's last line says
        was_training = model.training
        model.eval()
        loss_sum, correct, n = 0.0, 0, self.x.shape[0]
        try:
            for i in range(0, n, self.batch_size):
                x = self.layout(self.x[i : i + self.batch_size].to(self.device))
                y = self.y[i : i + self.batch_size].to(self.device)
                out = model(x)
                loss_sum += float(self.loss_fn(out, y, reduction="sum"))
                if not self.regression:
                    correct += int((out.argmax(1) == y).sum())
        finally:
            model.train(was_training)
        loss = loss_sum / n
        self.last, self.last_label = (loss, loss**0.5 if self.regression else correct / n), label
        if self.regression:
            log.info("%s: test loss %.4f, test RMSE %.4f", label, *self.last)
            return {"eval/loss": loss, "eval/rmse": self.last[1]}
        log.info("%s: test loss %.4f, test accuracy %.2f%%", label, loss, 100 * self.last[1])
        return {"eval/loss": loss, "eval/accuracy": self.last[1]}

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        # the last epoch's evaluation waits for this call (see `due`); only a run whose
        # final weights were scored already skips it
        seen = completed and self.last is not None and self.evaluated_epochs == self.epochs
        return weights_changed or not seen

    def results(self) -> dict[str, Any]:
        loss, score = self.last or (None, None)
        return {
            "test_loss": loss,
            "task": "regression" if self.regression else "classification",
            "test_accuracy": None if self.regression else score,
            "test_rmse": score if self.regression else None,
        }

    def goal(self) -> str | None:
        return None  # supervised runs end when every epoch is done
