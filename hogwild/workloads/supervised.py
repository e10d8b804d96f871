"""Supervised training on a data set's tensors: the first workload.

In-memory data goes to shared memory once (or to the GPU); each epoch is one permutation of it,
seeded by (seed, epoch) only, cut into disjoint shards, one per rank, so that `trainer.epochs=1`
uses every sample once in total, not once per worker. A worker reads its batches straight out
of the shared tensors with index_select. The orchestrator evaluates the shared model on the test
split after every epoch (`SupervisedEvaluator`).

Mapped data (hogwild.data.mapped: files larger than memory) is never copied: each worker maps
the files itself (the task carries their MappedArray, not the tensors), and an epoch is a
`BlockShard` order, which needs no N-sized permutation: the same guarantees (every sample once
per epoch in total, disjoint shards, the same order in every process, resumable at any batch)
in memory that does not grow with the data, and a bounded resident share of the file per worker.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from hogwild.data.mapped import MappedArray, mapped_array
from hogwild.errors import ConfigError
from hogwild.process import sharing
from hogwild.protocol import Control
from hogwild.reporting.text import plural
from hogwild.workloads.device import HostBatches, Layout

log = logging.getLogger("hogwild")

BLOCK_SAMPLES = 65536  # a BlockShard's block: 1.3 MB of a ratings file, 200 MB of MNIST images


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The same permutation in every process: seeded by (seed, epoch) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_samples, generator=g)


def shard(perm: torch.Tensor, rank: int, num_workers: int) -> torch.Tensor:
    """Rank's disjoint slice of the permutation; sizes differ by at most one sample."""
    n = perm.numel()
    return perm[rank * n // num_workers : (rank + 1) * n // num_workers]


def _generator(*words: int) -> torch.Generator:
    """A generator seeded from the words alone (SeedSequence mixes them): the same in every process."""
    state = np.random.SeedSequence([w & (2**64 - 1) for w in words]).generate_state(1, np.uint64)
    return torch.Generator().manual_seed(int(state[0]))


class Pages(Protocol):
    """What a BlockShard tells of the rows it reads (hogwild.data.mapped.MappedFile)."""

    def release(self, lo: int, hi: int) -> None: ...

    def prefetch(self, lo: int, hi: int) -> None: ...


class BlockShard:
    """Rank's share of one epoch over `num_samples` samples, without an N-sized permutation.

    The epoch visits the data in contiguous blocks of `block` samples (the last one shorter), the
    blocks in a seeded order, each block's samples in a seeded order of its own, made when the
    rank reaches that block; this sequence of N positions is cut into one contiguous range per
    rank, as `shard` cuts a permutation (sizes differ by at most one). Everything is seeded by
    (seed, epoch) and the block's number only, so every process computes the same order, and a
    resumed rank starts at any batch directly. Memory: the block order (N / block numbers) and one
    block's order. `pages` are told which rows come next (prefetch) and which are done (release).
    `shard[lo:hi]` is the rank's positions lo..hi-1 as sample indices, like a tensor's slice."""

    def __init__(
        self,
        num_samples: int,
        seed: int,
        epoch: int,
        rank: int,
        num_workers: int,
        block: int = BLOCK_SAMPLES,
        pages: Sequence[Pages] = (),
    ):
        self.block, self.pages = block, pages
        count = -(-num_samples // block)
        self.order = torch.randperm(count, generator=_generator(seed, epoch))
        sizes = (num_samples - self.order * block).clamp(max=block)
        self.ends = sizes.cumsum(0)  # where each visited block ends, in positions
        self.seed, self.epoch = seed, epoch
        self.lo = rank * num_samples // num_workers
        self.hi = (rank + 1) * num_samples // num_workers
        self.current: tuple[int, torch.Tensor] | None = None  # (visit, that block's order)
        self.held: set[int] = set()  # visits whose rows the last slice returned
        self.span = (0, 0, 0)  # the last visit read, and its positions in the sequence

    def __len__(self) -> int:
        return self.hi - self.lo

    def _rows(self, visit: int) -> tuple[int, int]:
        first = int(self.order[visit]) * self.block
        return first, first + int(self.ends[visit] - (self.ends[visit - 1] if visit else 0))

    def _block(self, visit: int) -> torch.Tensor:
        """The sample indices of a visited block, in its own order (made once, when reached)."""
        if self.current is None or self.current[0] != visit:
            first, stop = self._rows(visit)
            for p in self.pages:
                p.prefetch(first, stop)
                if visit + 1 < len(self.order):
                    p.prefetch(*self._rows(visit + 1))
            inner = torch.randperm(stop - first, generator=_generator(self.seed, self.epoch, visit))
            self.current = (visit, inner.add_(first))
        return self.current[1]

    def __getitem__(self, where: slice) -> torch.Tensor:
        start, stop, step = where.indices(len(self))
        if step != 1:
            raise ValueError("a BlockShard is read in contiguous slices")
        pieces, touched, at, stop = [], set(), self.lo + start, self.lo + max(start, stop)
        while at < stop:
            visit, begins, ends = self.span
            if not begins <= at < ends:  # another block: where it lies in the epoch's sequence
                visit = int(torch.searchsorted(self.ends, at, right=True))
                begins, ends = int(self.ends[visit - 1]) if visit else 0, int(self.ends[visit])
                self.span = (visit, begins, ends)
            end = min(stop, ends)
            pieces.append(self._block(visit)[at - begins : end - begins])
            touched.add(visit)
            at = end
        # the rows the last slice returned have been read by now: blocks left behind go back
        self._release(self.held - touched)
        self.held = touched
        return torch.cat(pieces) if len(pieces) != 1 else pieces[0]

    def _release(self, visits) -> None:
        for visit in visits:
            for p in self.pages:
                p.release(*self._rows(visit))

    def close(self) -> None:
        """The rows returned last are read: their pages go back too."""
        self._release(self.held)
        self.held = set()


@dataclasses.dataclass(frozen=True)
class SupervisedTask:
    """The worker half: its shard of every epoch, batch by batch."""

    # shared (or on the GPU); or, for mapped data, the files, which the worker maps itself
    train_x: torch.Tensor | MappedArray
    train_y: torch.Tensor | MappedArray
    epochs: int
    batch_size: int
    loss_fn: Callable[..., torch.Tensor]
    layout: Layout  # the memory format of 4-D batches (channels_last for conv nets on the CPU)

    def run(self, ctx) -> None:
        size, pages = self.batch_size, []
        if isinstance(self.train_x, MappedArray) and isinstance(self.train_y, MappedArray):
            pages = [self.train_x.open(), self.train_y.open()]
            x_all, y_all = pages[0].tensor, pages[1].tensor
        else:
            x_all, y_all = self.train_x, self.train_y
        # data left in host memory for a CUDA run: batches staged through pinned buffers
        to_device = (
            HostBatches(x_all, y_all, size, ctx.device) if x_all.device != ctx.device else None
        )
        start_epoch, start_batch = ctx.position
        for epoch in range(start_epoch, self.epochs):
            if pages:
                indices = BlockShard(
                    x_all.shape[0], ctx.seed, epoch, ctx.rank, ctx.num_workers, pages=pages
                )
            else:
                indices = shard(
                    epoch_permutation(x_all.shape[0], ctx.seed, epoch), ctx.rank, ctx.num_workers
                ).to(x_all.device)
            for b in range(
                start_batch if epoch == start_epoch else 0, math.ceil(len(indices) / size)
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
            if pages:
                indices.close()
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
        self.kind = "regression" if self.regression else "classification"
        self.total_units = epochs * data.num_train

    def describe(self) -> str:
        mapped = f", mapped from {os.path.dirname(self.mapped[0].path)}" if self.mapped else ""
        return f"{plural(self.data.num_train, 'sample')} x {plural(self.epochs, 'epoch')}{mapped}"

    def facts(self) -> dict[str, Any]:
        # mapped data is visited in another order (BlockShard): a resumed run must agree
        order = {"shuffle": f"blocks of {BLOCK_SAMPLES}"} if self.mapped else {}
        return {
            "batch_size": self.batch_size,
            "num_train": self.data.num_train,
            "epochs": self.epochs,
            **order,
        }

    def finished(self, progress: torch.Tensor) -> bool:
        """Whether a checkpoint's progress table has every worker past the last epoch."""
        return bool((progress[:, Control.EPOCH] >= self.epochs).all())

    @property
    def mapped(self) -> tuple[MappedArray, MappedArray] | None:
        """The training split's files when it is mapped (hogwild.data.mapped), else None.
        Mapped data stays in its files, on the host, also for a CUDA run (batches are staged)."""
        x, y = mapped_array(self.data.train_x), mapped_array(self.data.train_y)
        return (x, y) if x is not None and y is not None else None

    def host_tensors(self) -> list[torch.Tensor]:
        return [] if self.mapped else [self.data.train_x, self.data.train_y]

    def check(self, num_workers: int) -> None:
        smallest = self.data.num_train // num_workers
        if self.batch_size > smallest:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than a worker's share of the training set "
                f"({smallest} of {self.data.num_train} samples for {num_workers} workers): no step would be "
                "a full batch; use a smaller batch size or fewer workers"
            )

    def task(self, home: torch.device, layout: Layout) -> SupervisedTask:
        if self.mapped:  # each worker maps the files: nothing to copy, nothing in /dev/shm
            train_x, train_y = self.mapped
        else:
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
