"""The node seam: every run talks to one node object, so the run loop has no torchrun branches.

`LocalNode` is one machine and does nothing; `hogwild.distributed.torchrun.NodeSync` is one torchrun node
with the same methods, collectives behind them:

    global_facts(facts)   the facts of the whole run (the unsharded data size, the node count)
    agree(facts, plan)    settle the run before training (a refusal anywhere ends every node)
    rows(table)           this node's rows of an all-node progress table
    attach / broadcast    what the rounds average; every node starts from rank 0's weights
    tick(running)         land the averaging round in flight, start one when due (figures)
    reach_goal()          this node solved the run's task; `goal_reached`: some node did
    checkpoint(save)      save now (one node) or at the next round, where the models are one
    finish()              keep joining rounds until every node is done
    final_checkpoint      the last checkpoint, with every node's progress
    figures(mine)         the summary's `distributed` section (None on one machine)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class LocalNode:
    """One machine: the node seam's do-nothing side."""

    rank, world, is_writer = 0, 1, True
    weights_change_at_end = False  # no averaging after the last epoch
    final_table: torch.Tensor | None = None
    goal_reached = False  # no other node can reach the run's goal

    def shard(self, data):
        return data

    def global_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        return {**facts, "world_size": 1}

    def agree(self, facts: dict[str, Any], plan: Any = None, error: str | None = None) -> Any:
        return plan

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        return table

    def attach(self, params: list[torch.Tensor], progress: torch.Tensor) -> None: ...

    def broadcast(self, tensors: list[torch.Tensor]) -> None: ...

    def tick(self, running: bool) -> dict[str, float]:
        return {}

    def reach_goal(self) -> None: ...

    def checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        save(None)  # now, from the live progress table

    def finish(self) -> None: ...

    def final_checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        save(None)

    def figures(self, mine: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def close(self) -> None: ...
