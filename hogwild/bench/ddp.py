"""The DDP row of the benchmark: torch DistributedDataParallel over gloo on the same model,
data, batch size and optimizer, one process per worker, each training its shard of one
permutation and all-reducing its gradients every step (what most people reach for first).

No hogwild imports in the training process, as for the plain loop: only the same recipe.
"""

from __future__ import annotations

import copy
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hogwild.bench.recipes import SEED
from hogwild.bench.runs import gather


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(
    rank, world, port, threads, epochs, model, x, y, queue, batch, make_optimizer, loss_fn
):
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
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
    finally:
        dist.destroy_process_group()


def run_ddp(
    model, data, start_method, strategy, num_workers, threads, recipe, epochs: int = 1
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
    return gather(procs, queue, "DDP process", t0)
