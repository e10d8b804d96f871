"""Beyond one machine: Hogwild inside each node, model averaging between nodes (`distributed=torchrun`).

Launch one orchestrator per node with torchrun (its rendezvous sets RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT); each trains its node's shard of the data with its local Hogwild
workers. Every `distributed.sync_every_n_steps` local steps (and/or `sync_every_seconds`), the
orchestrators run one sync ROUND: an all-reduce (gloo on the CPU, nccl on CUDA) of all
parameters, divided by the node count and written back into the shared parameters while the
local workers keep training (model averaging, as in local SGD). A node whose workers have
finished keeps joining rounds until every node has finished, so no collective is left waiting;
the last round leaves every node with the same model. Only global rank 0 writes TensorBoard,
checkpoints and summary.json; a failed collective (a node died, or no answer within
`distributed.timeout_seconds`) ends the run on every node with that reason.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch

from hogwild.config import ConfigError, DistributedConfig, HogwildError


class NodeSyncError(HogwildError):
    """A sync round failed: another node is gone or did not answer in time."""


class NodeSync:
    def __init__(self, cfg: DistributedConfig, device: torch.device):
        import torch.distributed as dist

        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise ConfigError(
                f"distributed.mode='torchrun' needs the environment torchrun sets ({', '.join(missing)} missing): "
                "launch with `torchrun --nnodes=N --nproc_per_node=1 ... -m hogwild train distributed=torchrun`"
            )
        self.cfg, self.dist = cfg, dist
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.timeout_seconds))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device if backend == "nccl" else torch.device("cpu")
        self.rounds, self.seconds, self.bytes = 0, 0.0, 0
        self.steps_at_sync, self.time_at_sync = 0, time.monotonic()

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def shard(self, data):
        """This node's part of the training split: a seeded permutation cut in `world` pieces
        (the test split stays whole, so every node evaluates the same thing)."""
        n = data.num_train
        order = torch.randperm(n, generator=torch.Generator().manual_seed(12345))
        mine = order[self.rank * n // self.world : (self.rank + 1) * n // self.world].sort().values
        data.train_x, data.train_y = data.train_x[mine], data.train_y[mine]
        return data

    def broadcast(self, params: list[torch.Tensor]) -> None:
        """Start every node from rank 0's initial weights."""
        with torch.no_grad():
            for p in params:
                t = p.detach().to(self.device)
                self.dist.broadcast(t, src=0)
                if t is not p:
                    p.copy_(t)

    def due(self, local_steps: int) -> bool:
        every_n, every_s = self.cfg.sync_every_n_steps, self.cfg.sync_every_seconds
        return bool((every_n and local_steps - self.steps_at_sync >= every_n)
                    or (every_s and time.monotonic() - self.time_at_sync >= every_s))

    def round(self, params: list[torch.Tensor], finished: bool, local_steps: int) -> bool:
        """Average the parameters over the nodes; True once every node has finished training."""
        t = time.monotonic()
        flat = torch.cat([p.detach().reshape(-1).to(self.device, torch.float32) for p in params]
                         + [torch.tensor([float(finished)], device=self.device)])
        try:
            self.dist.all_reduce(flat)
        except Exception as e:  # gloo/nccl raise RuntimeError (or DistBackendError) on a lost peer or timeout
            raise NodeSyncError(f"node {self.rank}: sync round {self.rounds + 1} failed, another node stopped "
                                f"or did not answer within distributed.timeout_seconds={self.cfg.timeout_seconds:g} "
                                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        flat /= self.world
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        self.rounds += 1
        self.seconds += time.monotonic() - t
        self.bytes += flat.numel() * flat.element_size()
        self.steps_at_sync, self.time_at_sync = local_steps, time.monotonic()
        return round(float(flat[-1]) * self.world) == self.world

    def gather(self, figures: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, figures)
        return out

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
