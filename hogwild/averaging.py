"""Model averaging between torchrun nodes: the rounds.

Every `distributed.sync_every_n_steps` local optimizer steps (and/or `sync_every_seconds`) each
node's orchestrator contributes its shared parameters to one all-reduce, divides by the node
count and writes the average back into the shared model while its workers keep training (local
SGD). Three flags ride along in the same all-reduce: "this node has finished" (when every node
has, the round is the last), "rank 0 wants a checkpoint" (then every node also sends its
progress table, so the checkpoint holds all nodes' rows, rank-major) and "the run's goal is
reached" (rank 0's evaluation solved the task: every node stops its workers).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hogwild.cadence import Cadence
from hogwild.protocol import Control


class Averaging:
    def __init__(self, node, params: list[torch.Tensor], progress: torch.Tensor):
        self.node, self.params, self.progress = node, params, progress
        self.device, self.world = node.device, node.world
        self.every = Cadence(node.cfg.sync_every_n_steps, node.cfg.sync_every_seconds)
        self.every.mark(self._local_steps())
        self.rounds, self.seconds, self.bytes = 0, 0.0, 0
        self.final_table: torch.Tensor | None = None  # every node's progress, from the last round
        self._save: Callable[[torch.Tensor | None], None] | None = None  # a checkpoint asked for
        self.goal = False  # this node reached the run's goal; sent with every round from now
        self.goal_reached = False  # some node did (learnt from a round)

    def tick(self) -> dict[str, float]:
        if not self.every.due(self._local_steps()):
            return {}
        before = (self.seconds, self.bytes)
        self._round(finished=False)
        return {
            "distributed/sync_seconds": self.seconds - before[0],
            "distributed/sync_bytes": self.bytes - before[1],
        }

    def save_at_next_round(self, save: Callable[[torch.Tensor | None], None] | None) -> None:
        self._save = save

    def finish(self) -> None:
        while not self._round(finished=True):
            pass

    def _local_steps(self) -> int:
        return int(self.progress[:, Control.STEPS].sum())

    def _round(self, finished: bool) -> bool:
        """Average the parameters over the nodes; True when every node has finished."""
        t, steps = time.monotonic(), self._local_steps()
        flags = torch.tensor(
            [float(finished), float(self._save is not None), float(self.goal)], device=self.device
        )
        flat = torch.cat(
            [p.detach().reshape(-1).to(self.device, torch.float32) for p in self.params] + [flags]
        )
        self.node.collective(f"sync round {self.rounds + 1}", self.node.dist.all_reduce, flat)
        flat /= self.world
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        done = round(float(flat[-3]) * self.world) == self.world
        self.goal_reached = self.goal_reached or float(flat[-1]) > 0
        table = self._gather_progress() if done or float(flat[-2]) > 0 else None
        self.rounds += 1
        self.seconds += time.monotonic() - t
        self.bytes += flat.numel() * flat.element_size() + (
            0 if table is None else table.numel() * 8
        )
        self.every.mark(steps)
        if table is not None:
            if done:
                self.final_table = table  # saved after the final evaluation
            elif self._save is not None:
                self._save(table)
            self._save = None
        return done

    def _gather_progress(self) -> torch.Tensor:
        """Every node's progress table, stacked rank-major: (world * num_workers, 4), int64."""
        mine = self.progress.to(self.device).clone(memory_format=torch.contiguous_format)
        out = torch.empty(
            (self.world * mine.shape[0], mine.shape[1]), dtype=mine.dtype, device=self.device
        )
        gather = self.node.dist.all_gather_single
        self.node.collective(f"sync round {self.rounds + 1}", gather, out, mine)
        return out.cpu()
