"""One model-averaging round between torchrun nodes, in flight while the workers train.

A round is two all-reduces, started one after the other without waiting (`async_op=True`):

    meta    int64: [finished, checkpoint, goal], then a table with a slot for every node's
            progress rows in which this node fills its own (summed: every node's rows, rank-major)
    params  float32: a snapshot of this node's shared parameters, flattened

When both have completed, the average is folded into the live parameters:
`params += sum / world - snapshot`, so what the workers wrote since the snapshot stays
(overlapped local SGD). A node whose workers are done writes the average itself (`exact`): the
final round leaves every node with the same model.

Times: the completion of each all-reduce is stamped by a callback on its future. The meta
all-reduce (a few bytes) completes as soon as every node has joined the round, so
`params done - meta done` estimates the collective's own duration for the parameters
(`transfer`; gloo may run both at once, and a transfer below the stamps' resolution reads 0),
and `params done - start` is how long the round was in flight (the wait for the slowest node,
then the transfer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

FLAGS = 3  # finished, checkpoint, goal


def flatten(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The parameters in one float32 vector (a copy)."""
    return torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in params])


def fold_in(
    params: list[torch.Tensor],
    summed: torch.Tensor,
    snapshot: torch.Tensor,
    world: int,
    exact: bool = False,
) -> None:
    """`params += summed / world - snapshot`, or `params = summed / world` when `exact`.

    `summed` is consumed (it becomes the average, or the change it brings)."""
    change = summed.div_(world) if exact else summed.div_(world).sub_(snapshot)
    offset = 0
    with torch.no_grad():
        for p in params:
            part = change[offset : offset + p.numel()].view_as(p)
            if exact:
                p.copy_(part)
            else:
                p.add_(part.to(p.device, p.dtype))
            offset += p.numel()


def pack_meta(flags: list[bool], progress: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The flags, then a world-sized progress table holding this node's rows only."""
    size = progress.numel()
    meta = torch.zeros(FLAGS + world * size, dtype=torch.int64)
    meta[:FLAGS] = torch.tensor([int(f) for f in flags])
    meta[FLAGS + rank * size : FLAGS + (rank + 1) * size] = progress.reshape(-1)
    return meta


@dataclass
class Outcome:
    """What the nodes said in a round (the summed meta)."""

    finished: int  # how many nodes have finished
    checkpoint: bool  # rank 0 asked for a checkpoint
    goal: bool  # some node reached the run's goal
    table: torch.Tensor  # every node's progress rows at the round's start, rank-major

    @classmethod
    def read(cls, meta: torch.Tensor, world: int, columns: int) -> Outcome:
        meta = meta.cpu()
        return cls(
            int(meta[0]), bool(meta[1]), bool(meta[2]), meta[FLAGS:].view(-1, columns).clone()
        )


class Round:
    """One round, started on construction; `land` folds the average in once it completed."""

    def __init__(self, node, number: int, params, progress: torch.Tensor, flags: list[bool]):
        self.number, self.node, self.columns = number, node, progress.shape[1]
        self.started = time.monotonic()
        self.snapshot = flatten(params, node.device)
        self.flat = self.snapshot.clone()  # summed over the nodes in place
        self.meta = pack_meta(flags, progress, node.rank, node.world).to(node.device)
        self.bytes = self.flat.numel() * 4 + self.meta.numel() * 8
        self.stamps: dict[str, float] = {}
        self.works: list = []
        node.collective(self.what, self._start)
        self.cost = time.monotonic() - self.started  # the orchestrator's time: start + land
        self.waited = 0.0  # of which blocked on the collective

    @property
    def what(self) -> str:
        return f"sync round {self.number}"

    def _start(self) -> None:
        for name, tensor in (("meta", self.meta), ("params", self.flat)):
            work = self.node.dist.all_reduce(tensor, async_op=True)
            work.get_future().add_done_callback(
                lambda _, name=name: self.stamps.setdefault(name, time.monotonic())
            )
            self.works.append(work)

    @property
    def completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self) -> None:
        """Block until every node has joined and the sums are in (`waited`: how long)."""
        t = time.monotonic()
        self.node.collective(self.what, lambda: [w.wait() for w in self.works])
        now = time.monotonic()
        for name in ("meta", "params"):  # the futures' callbacks may run just after wait()
            self.stamps.setdefault(name, now)
        self.waited = now - t
        self.cost += self.waited

    def land(self, params: list[torch.Tensor], exact: bool) -> Outcome:
        """Fold the average into `params` (see `fold_in`); what the nodes said."""
        t = time.monotonic()
        fold_in(params, self.flat, self.snapshot, self.node.world, exact)
        said = Outcome.read(self.meta, self.node.world, self.columns)
        self.cost += time.monotonic() - t
        return said

    @property
    def transfer_seconds(self) -> float:
        """The parameters' all-reduce once every node had joined (0 until it completed)."""
        meta, params = self.stamps.get("meta"), self.stamps.get("params")
        return max(0.0, params - meta) if meta is not None and params is not None else 0.0

    @property
    def in_flight_seconds(self) -> float:
        """From the start to the sums being in (0 until it completed)."""
        params = self.stamps.get("params")
        return params - self.started if params is not None else 0.0
