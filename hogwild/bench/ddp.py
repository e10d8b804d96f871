"""The DDP row of the benchmark: torch DistributedDataParallel over gloo on the same model,
data, batch size and optimizer, one process per worker, each training its shard of one
permutation and all-reducing its gradients every step (what most people reach for first).

No hogwild imports in the training process, as for the plain loop: only the same recipe.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hogwild.bench.recipes import SEED
from hogwild.bench.runs import gather, hang_if_asked

# A collective that waits longer than this fails the process instead of waiting (torch's default
# is 30 minutes); the row's own cap (hogwild.bench.runs.gather) is the outer bound.
COLLECTIVE_TIMEOUT_SECONDS = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(
    rank, world, port, threads, epochs, model, x, y, queue, batch, make_optimizer, loss_fn
):
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_SECONDS),
    )
    code = 1
    try:
        # a private copy: DDP keeps every process's replica in step by all-reducing gradients
        net = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
        optimizer = make_optimizer(net.parameters())
        steps = x.shape[0] // world // batch  # the same step count on every rank (collectives)
        t_first = t_last = 0.0
        for epoch in range(epochs):
            g = torch.Generator().manual_seed(SEED + epoch)
            perm = torch.randperm(x.shape[0], generator=g)
            mine = perm[rank * len(perm) // world : (rank + 1) * len(perm) // world]
            for i in range(steps):
                idx = mine[i * batch : (i + 1) * batch]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(net(x.index_select(0, idx)), y.index_select(0, idx)).backward()
                optimizer.step()
                t_last = time.monotonic()
                t_first = t_first or t_last
        queue.put((rank, steps * batch * epochs, t_first, t_last))
        # the figures are in the pipe (the queue's feeder thread has written them) before
        # anything below can go wrong: the parent has them whatever happens to this process
        queue.close()
        queue.join_thread()
        hang_if_asked("ddp")
        code = 0
    except BaseException:  # noqa: BLE001 - shown here: the exit below skips Python's own report
        traceback.print_exc()
    finally:
        # Leave the group explicitly (while `net` still holds it), then end the process here,
        # before this frame's objects are freed: the last reference to the gloo process group
        # (DDP's reducer holds one) would run ~ProcessGroupGloo, which joins gloo's worker
        # thread with the GIL held, and a worker thread waiting for the GIL deadlocks the exit
        # (seen: `bench --quick` stuck at 0% CPU). Nothing is left to flush: the figures are
        # in the pipe, and gather reads a non-zero code as the process's failure.
        try:
            dist.destroy_process_group()
        finally:
            os._exit(code)


def run_ddp(
    model, data, start_method, strategy, num_workers, threads, recipe, epochs: int = 1, row=""
) -> dict:
    """One DDP run; the figures as the plain loop's (hogwild.bench.runs.run_plain)."""
    torch.multiprocessing.set_sharing_strategy(strategy)
    ctx = mp.get_context(start_method)
    t0 = time.monotonic()
    x, y = data.train_x.share_memory_(), data.train_y.share_memory_()
    queue, port = ctx.Queue(), _free_port()
    procs = [
        ctx.Process(
            target=ddp_worker,
            args=(r, num_workers, port, threads, epochs, model, x, y, queue, *recipe),
        )
        for r in range(num_workers)
    ]
    return gather(procs, queue, "DDP process", t0, row)
