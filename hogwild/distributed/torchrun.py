"""Beyond one machine: Hogwild inside each node, model averaging between nodes (`distributed=torchrun`).

Launch one orchestrator per node with torchrun (its rendezvous sets RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT); each trains its node's shard of the data with its local Hogwild
workers. Every `distributed.sync_every_n_steps` local steps (and/or `sync_every_seconds`), the
orchestrators start one sync ROUND: an all-reduce (gloo on the CPU, nccl on CUDA) of a snapshot
of all parameters, started without waiting; when the sums are in, the average is folded into the
shared parameters (`params += avg - snapshot`) while the local workers keep training (overlapped
model averaging, as in local SGD; `averaging.py`). A node whose workers have finished keeps
joining rounds until every node has finished, so no collective is left waiting; the last round
leaves every node with the same model. Only global rank 0 writes TensorBoard, checkpoints and
summary.json; a failed collective (a node died, or no answer within
`distributed.timeout_seconds`) ends the run on every node with that reason.

Checkpoints are taken AT a round, where the nodes' models have just been averaged: rank 0 raises
a flag in the round when its checkpoint is due, and every node sends its progress rows with every
round, so the checkpoint holds all nodes' rows, rank-major. Before training, `agree` is the one
collective that settles the run: every node's set-up outcome and facts, and rank 0's resume
decision, so a refusal on any node ends every node with that line.

The orchestrator talks to every run through one node object: `LocalNode` for one machine (it
does nothing), `NodeSync` under torchrun, so its loop has no torchrun branches.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from hogwild.config.schema import DistributedConfig
from hogwild.data.mapped import mapped_array, take_rows
from hogwild.distributed.averaging import Averaging
from hogwild.errors import ConfigError, HogwildError, NodeSyncError

log = logging.getLogger("hogwild")

STOPPED = "hogwild/stopped"  # store key prefix: a node's last word (NodeSync.stopping)
STORE_SECONDS = 2.0  # a store call's limit when a node stops: its host may be gone
SILENT_SECONDS = 3.0  # how long rank 0 waits for the other nodes' last word


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
    if (
        env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and env.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0"
    ):
        log.warning(
            "torchrun --max-restarts across %s agents: a restarted rank can read the previous "
            "attempt's keys from the agents' shared store; start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per attempt)",
            env.get("GROUP_WORLD_SIZE"),
        )
    return store


def _join(cfg: DistributedConfig, device: torch.device):
    """Join the process group torchrun's environment describes: the device collectives use,
    and the rendezvous store."""
    import torch.distributed as dist

    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise ConfigError(
            f"distributed.mode='torchrun' needs the environment torchrun sets ({', '.join(missing)} missing): "
            "launch with `torchrun --nnodes=N --nproc_per_node=1 ... -m hogwild train distributed=torchrun`"
        )
    backend = (
        cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    timeout = datetime.timedelta(seconds=cfg.timeout_seconds)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store = _attempt_store(dist, store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return device if backend == "nccl" else torch.device("cpu"), store


def _differences(mine: dict[str, Any], theirs: dict[str, Any], rank: int) -> str:
    return ", ".join(
        f"{k}={mine.get(k)!r} here but {theirs.get(k)!r} on node {rank}"
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    )


class NodeSync:
    """One torchrun node: a `hogwild.distributed.node.Node`, as LocalNode is, with collectives
    behind it."""

    weights_change_at_end = True  # the last round averaged the nodes after their last epoch

    def __init__(self, cfg: DistributedConfig, device: torch.device):
        import torch.distributed as dist

        self.cfg, self.dist = cfg, dist
        self.device, self.store = _join(cfg, device)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.said_stop = False
        self.is_writer = self.rank == 0
        self.num_train_total: int | None = None  # the whole training split, before sharding
        self.params: list[torch.Tensor] = []
        self.averaging: Averaging | None = None  # set by attach

    def shard(self, data):
        """This node's part of the training split: a seeded permutation cut in `world` pieces
        (the test split stays whole, so every node evaluates the same thing). A mapped data set
        (hogwild.data.mapped) is cut into contiguous row ranges instead, which stay mapped: a
        permutation would copy the node's part into memory."""
        n = self.num_train_total = data.num_train
        if mapped_array(data.train_x) is not None:
            lo, hi = self.rank * n // self.world, (self.rank + 1) * n // self.world
            data.train_x, data.train_y = (
                take_rows(data.train_x, lo, hi),
                take_rows(data.train_y, lo, hi),
            )
            return data
        order = torch.randperm(n, generator=torch.Generator().manual_seed(12345))
        mine = order[self.rank * n // self.world : (self.rank + 1) * n // self.world].sort().values
        data.train_x, data.train_y = data.train_x[mine], data.train_y[mine]
        return data

    def global_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The facts of the whole run: the unsharded data size, the node count."""
        total = (
            {"num_train": self.num_train_total}
            if self.num_train_total and "num_train" in facts
            else {}
        )
        return {**facts, **total, "world_size": self.world}

    def agree(self, facts: dict[str, Any], plan: Any = None, error: str | None = None) -> Any:
        """Settle the run before training: every node sends its set-up outcome and the facts the
        nodes must share; rank 0 also sends its plan (the resume decision). Raises on every node
        if any node refused or the facts differ; returns rank 0's plan."""
        out: list[Any] = [None] * self.world
        self.collective(
            "the start-up check",
            self.dist.all_gather_object,
            out,
            {"error": error, "facts": facts, "plan": plan},
        )
        if error:
            return None  # the caller raises its own error
        refused = [(r, o["error"]) for r, o in enumerate(out) if o["error"]]
        if refused:
            r, why = refused[0]
            raise HogwildError(f"node {r} refused the run: {why}")
        for r, o in enumerate(out):
            if o["facts"] != facts:
                raise ConfigError(
                    f"node {self.rank}: node {r} was started with a different configuration "
                    f"({_differences(facts, o['facts'], r)}); start every node with the same overrides"
                )
        return out[0]["plan"]

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """This node's rows of an all-node progress table."""
        n = table.shape[0] // self.world
        return table[self.rank * n : (self.rank + 1) * n]

    def attach(self, params: list[torch.Tensor], progress: torch.Tensor) -> None:
        """What the rounds average (the shared parameters) and report (this node's progress)."""
        self.params = params
        self.averaging = Averaging(self, params, progress)

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Start every node from rank 0's weights (initial or resumed), parameters and buffers."""
        with torch.no_grad():
            for p in tensors:
                t = p.detach().to(self.device)
                self.dist.broadcast(t, src=0)
                if t is not p:
                    p.copy_(t)

    def tick(self, running: bool) -> dict[str, float]:
        """A round when one is due; the dashboard figures of that round."""
        return self.averaging.tick() if running else {}

    def reach_goal(self) -> None:
        """This node's evaluation reached the run's goal: the next rounds tell every node."""
        self.averaging.goal = True

    @property
    def goal_reached(self) -> bool:
        """A round said that some node reached the run's goal: stop this node's workers too."""
        return self.averaging.goal_reached

    def checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        """Taken at the next round, where the nodes' models are one (rank 0 asks, every node
        sends its progress rows)."""
        self.averaging.save_at_next_round(save if self.is_writer else None)

    def finish(self) -> None:
        """Keep joining rounds until every node is done; the last one leaves all nodes alike."""
        self.averaging.finish()

    def final_checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        """With every node's progress from the last round; without one (a failed or interrupted
        run), the last round's checkpoint stands."""
        if self.averaging.final_table is not None:
            save(self.averaging.final_table)

    def collective(self, what: str, fn, *args) -> None:
        """One collective; a failure is one NodeSyncError line that names the node at fault
        (`blame`)."""
        try:
            fn(*args)
        # gloo/nccl raise RuntimeError (or DistBackendError, or others) on a lost peer or a timeout
        except Exception as e:  # noqa: BLE001 - each of them means the same to the run
            raise NodeSyncError(blame(self.rank, self.world, what, e, self.cfg)) from None

    def stopping(self, status: str) -> None:
        """This node's last word, `hogwild/stopped/<rank>` in the rendezvous store (torchrun's
        agent keeps it while it stops the nodes): a node killed outright never says it, which
        is how rank 0 names it (`silent_nodes`). Said once; a store that is gone is no news."""
        if self.said_stop:
            return
        self.said_stop = True
        try:
            self.store.set_timeout(datetime.timedelta(seconds=STORE_SECONDS))
            self.store.set(f"{STOPPED}/{self.rank}", status)
        except Exception:  # noqa: BLE001 - the store's host is gone too: nothing to tell
            pass

    def silent_nodes(self, wait: float) -> list[int] | None:
        """The other nodes that have not said they stopped within `wait` seconds: killed or
        crashed (a node that stopped says so at once). None when the store cannot be read."""
        others = [r for r in range(self.world) if r != self.rank]
        deadline = time.monotonic() + wait
        try:
            self.store.set_timeout(datetime.timedelta(seconds=STORE_SECONDS))
            while True:
                silent = [r for r in others if not self.store.check([f"{STOPPED}/{r}"])]
                if not silent or time.monotonic() >= deadline:
                    return silent
                time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the store's host is gone: nobody to ask
            return None

    def figures(self, mine: dict[str, Any]) -> dict[str, Any]:
        """The summary's `distributed` section (`all_nodes_figures`)."""
        return all_nodes_figures(self, mine)

    def close(self) -> None:
        """Leave the process group explicitly, while this thread holds no collective: what
        torch would otherwise do in ~ProcessGroupGloo at interpreter exit, where joining gloo's
        worker thread with the GIL held can deadlock (or abort) the process. A group that a
        lost peer broke may raise here; the run's outcome is already decided, so that is
        logged, never raised."""
        if not self.dist.is_initialized():
            return
        try:
            self.dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - leaving must not turn a failed run into a traceback
            log.warning("node %d: leaving the process group: %s", self.rank, e)


def all_nodes_figures(node: NodeSync, mine: dict[str, Any]) -> dict[str, Any]:
    """The summary's `distributed` section; every node's figures when all got through."""
    avg = node.averaging
    sync = avg.figures() if avg else {}
    mine = {
        "rank": node.rank,
        **mine,
        "param_checksum": float(sum(p.detach().double().sum() for p in node.params)),
        **{k: v for k, v in sync.items() if k.endswith("_seconds")},
    }
    # a collective: only when every node got through its final rounds (else it would wait)
    per_node: list[Any] = [mine]
    gone: dict[str, Any] = {}
    if mine["status"] == "completed":
        per_node = [None] * node.world
        node.collective("the final report", node.dist.all_gather_object, per_node, mine)
    else:
        node.stopping(mine["status"])
        gone = stopped_nodes(node) if node.is_writer else {}
    rates = [p["samples_per_second"] for p in per_node]
    table = avg.final_table if avg else None
    return {
        "world_size": node.world,
        "rank": node.rank,
        **(sync or {"sync_rounds": 0, "sync_seconds": 0.0, "sync_bytes": 0}),
        "sync_every_n_steps": node.cfg.sync_every_n_steps,
        # the whole run's figures: every node's samples/s added up, and every node's samples
        "samples_per_second_all_nodes": round(sum(rates), 1)
        if len(rates) == node.world and all(rates)
        else None,
        "samples_seen_all_nodes": None if table is None else int(table[:, 2].sum()),
        "per_node": per_node,
        **gone,
    }


def stopped_nodes(node: NodeSync) -> dict[str, Any]:
    """Rank 0 of a run that stopped early: which nodes never said they stopped (killed or
    crashed; under torchrun's agent the SIGTERM that stopped this node came from the agent,
    after one of them died), logged and in the summary, and whether torchrun restarts the
    nodes or its `--max-restarts` is spent."""
    silent = node.silent_nodes(SILENT_SECONDS)
    out: dict[str, Any] = {} if silent is None else {"silent_nodes": silent}
    env = os.environ
    restarts = ""
    if "TORCHELASTIC_RESTART_COUNT" in env and "TORCHELASTIC_MAX_RESTARTS" in env:
        count, most = int(env["TORCHELASTIC_RESTART_COUNT"]), int(env["TORCHELASTIC_MAX_RESTARTS"])
        out["torchrun_restarts"] = {"done": count, "max_restarts": most}
        restarts = (
            f"; torchrun's --max-restarts={most} is spent: no restart follows"
            if count >= most
            else f"; torchrun restarts the nodes (restart {count + 1} of {most})"
        )
    if silent:
        who = ", ".join(f"node {r}" for r in silent)
        log.error(
            "%s never said %s stopped: killed or crashed (torchrun's own report gives how it "
            "exited)%s",
            who,
            "it" if len(silent) == 1 else "they",
            restarts,
        )
    elif restarts:
        log.warning("the run stopped%s", restarts)
    return out


# What gloo / nccl / the TCP store say when the other end of a connection went away (a node
# that was killed or crashed), and when it did not answer in time.
GONE = (
    "connection closed",
    "connection reset",
    "connection was likely closed",
    "broken pipe",
    "connection refused",
    "econnreset",
    "epipe",
)
TIMEOUT = ("timed out", "timeout")


def blame(rank: int, world: int, what: str, error: BaseException, cfg: DistributedConfig) -> str:
    """The one line a failed collective becomes: which node is at fault and what happened, then
    torch's own words. With two nodes the peer is the other one; with more, gloo names the
    peer's address, which is given as is."""
    said = str(error).splitlines()[0] if str(error) else ""
    text = said.lower()
    others = [r for r in range(world) if r != rank]
    if len(others) == 1:
        who = f"node {others[0]}"
    else:
        found = re.search(r"peer \[?([0-9A-Za-z.:-]+?)\]?:(\d+)", said)
        who = f"the node at {found[1]}:{found[2]}" if found else "another node"
    if any(g in text for g in GONE):
        why = f"{who} is gone (its process group connection closed: killed, crashed or stopped)"
    elif any(t in text for t in TIMEOUT):
        why = f"{who} did not answer within distributed.timeout_seconds={cfg.timeout_seconds:g}"
    else:
        why = (
            f"{who} stopped or did not answer within "
            f"distributed.timeout_seconds={cfg.timeout_seconds:g}"
        )
    return f"{why}; node {rank}: {what} failed ({type(error).__name__}: {said})"
