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

Checkpoints are taken AT a round, where the nodes' models have just become one: rank 0 raises a
flag in the round's all-reduce when its checkpoint is due, and every node then contributes its
progress table (`gather_progress`), so the checkpoint holds all nodes' rows, rank-major. Before
training, `agree` is the one collective that settles the run: every node's set-up outcome and
facts, and rank 0's resume decision, so a refusal on any node ends every node with that line.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from typing import Any

import torch

from hogwild.config import ConfigError, DistributedConfig, HogwildError

log = logging.getLogger("hogwild")


class NodeSyncError(HogwildError):
    """A sync round failed: another node is gone or did not answer in time."""


def _attempt_store(dist, store):
    """The store, scoped to this attempt when one torchrun agent restarts its ranks.

    Under one agent (`--nnodes=1`, as on loopback) the agent keeps ONE store across
    `--max-restarts` attempts, so a restarted rank can read a gloo address that the previous
    attempt left there and dial a dead port. The agent's restart count is then the same for
    every rank and scopes the keys. Several agents restart on different counts (pytorch#108158),
    so there the fix is torch's own: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every attempt a
    fresh store (measured here: 5 of 5 two-agent restarts resumed; without it 2 of 3)."""
    env = os.environ
    if env.get("GROUP_WORLD_SIZE", "1") == "1" and "TORCHELASTIC_RESTART_COUNT" in env:
        return dist.PrefixStore(f"hogwild/attempt_{env['TORCHELASTIC_RESTART_COUNT']}", store)
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and env.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
        log.warning("torchrun --max-restarts across %s agents: a restarted rank can read the previous "
                    "attempt's keys from the agents' shared store; start torchrun with "
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per attempt)", env.get("GROUP_WORLD_SIZE"))
    return store


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
        timeout = datetime.timedelta(seconds=cfg.timeout_seconds)
        store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
        dist.init_process_group(backend, store=_attempt_store(dist, store), rank=rank, world_size=world, timeout=timeout)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device if backend == "nccl" else torch.device("cpu")
        self.rounds, self.seconds, self.bytes = 0, 0.0, 0
        self.steps_at_sync, self.time_at_sync = 0, time.monotonic()
        self.num_train_total: int | None = None  # the whole training split, before sharding

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def shard(self, data):
        """This node's part of the training split: a seeded permutation cut in `world` pieces
        (the test split stays whole, so every node evaluates the same thing)."""
        n = self.num_train_total = data.num_train
        order = torch.randperm(n, generator=torch.Generator().manual_seed(12345))
        mine = order[self.rank * n // self.world : (self.rank + 1) * n // self.world].sort().values
        data.train_x, data.train_y = data.train_x[mine], data.train_y[mine]
        return data

    def agree(self, facts: dict[str, Any], error: str | None = None, plan: Any = None) -> Any:
        """Settle the run before training: every node sends its set-up outcome and the facts the
        nodes must share; rank 0 also sends its plan (the resume decision). Raises on every node
        if any node refused or the facts differ; returns rank 0's plan."""
        out: list[Any] = [None] * self.world
        self._collective("the start-up check", self.dist.all_gather_object, out,
                         {"error": error, "facts": facts, "plan": plan})
        if error:
            return None  # the caller raises its own error
        refused = [(r, o["error"]) for r, o in enumerate(out) if o["error"]]
        if refused:
            r, why = refused[0]
            raise HogwildError(f"node {r} refused the run: {why}")
        for r, o in enumerate(out):
            if o["facts"] != facts:
                diff = ", ".join(f"{k}={facts.get(k)!r} here but {o['facts'].get(k)!r} on node {r}"
                                 for k in sorted(set(facts) | set(o["facts"])) if facts.get(k) != o["facts"].get(k))
                raise ConfigError(f"node {self.rank}: node {r} was started with a different configuration ({diff}); "
                                  "start every node with the same overrides")
        return out[0]["plan"]

    def broadcast(self, params: list[torch.Tensor]) -> None:
        """Start every node from rank 0's weights (initial or resumed), parameters and buffers."""
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

    def round(self, params: list[torch.Tensor], finished: bool, local_steps: int,
              progress: torch.Tensor, checkpoint: bool = False) -> tuple[bool, torch.Tensor | None]:
        """Average the parameters over the nodes. Returns (every node has finished, the progress
        table of all nodes) -- the table only when rank 0 asked for a checkpoint or all are done."""
        t = time.monotonic()
        flags = torch.tensor([float(finished), float(checkpoint)], device=self.device)
        flat = torch.cat([p.detach().reshape(-1).to(self.device, torch.float32) for p in params] + [flags])
        self._collective(f"sync round {self.rounds + 1}", self.dist.all_reduce, flat)
        flat /= self.world
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        done = round(float(flat[-2]) * self.world) == self.world
        table = None
        if done or float(flat[-1]) > 0:
            table = self.gather_progress(progress)
        self.rounds += 1
        self.seconds += time.monotonic() - t
        self.bytes += flat.numel() * flat.element_size() + (0 if table is None else table.numel() * 8)
        self.steps_at_sync, self.time_at_sync = local_steps, time.monotonic()
        return done, table

    def gather_progress(self, progress: torch.Tensor) -> torch.Tensor:
        """Every node's progress table, stacked rank-major: (world * num_workers, 4), int64."""
        mine = progress.to(self.device).clone(memory_format=torch.contiguous_format)
        out = torch.empty((self.world * mine.shape[0], mine.shape[1]), dtype=mine.dtype, device=self.device)
        self._collective(f"sync round {self.rounds + 1}", self.dist.all_gather_single, out, mine)
        return out.cpu()

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """This node's rows of an all-node progress table."""
        n = table.shape[0] // self.world
        return table[self.rank * n : (self.rank + 1) * n]

    def _collective(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # gloo/nccl raise RuntimeError (or DistBackendError) on a lost peer or timeout
            raise NodeSyncError(f"node {self.rank}: {what} failed, another node stopped "
                                f"or did not answer within distributed.timeout_seconds={self.cfg.timeout_seconds:g} "
                                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None

    def gather(self, figures: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * self.world
        self._collective("the final report", self.dist.all_gather_object, out, figures)
        return out

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
