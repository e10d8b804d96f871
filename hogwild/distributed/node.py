"""The node seam: every run talks to one `Node`, so the run loop has no torchrun branches.

`Node` is the seam (a `typing.runtime_checkable` Protocol); `LocalNode` is one machine and does
nothing; `hogwild.distributed.torchrun.NodeSync` is one torchrun node with the same members,
collectives behind them:

    rank, world, is_writer  this node's place; only the writer (global rank 0) writes files
    shard(data)           this node's part of the training split
    global_facts(facts)   the facts of the whole run (the unsharded data size, the node count)
    agree(facts, plan)    settle the run before training (a refusal anywhere ends every node)
    rows(table)           this node's rows of an all-node progress table
    attach / broadcast    what the rounds average; every node starts from rank 0's weights
    tick(running)         land the averaging round in flight, start one when due (figures)
    reach_goal()          this node solved the run's task; `goal_reached`: some node did
    checkpoint(save)      save now (one node) or at the next round, where the models are one
    finish()              keep joining rounds until every node is done
    final_checkpoint      the last checkpoint, with every node's progress
    weights_change_at_end whether the last round changed the weights after the last epoch
    figures(mine)         the summary's `distributed` section (None on one machine)
    close()               leave the process group
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Node(Protocol):
    """What the orchestrator asks of the machine(s) it runs on: `LocalNode`, or a torchrun node
    (hogwild.distributed.torchrun.NodeSync)."""

    rank: int  # this node's global rank
    world: int  # how many nodes
    is_writer: bool  # global rank 0: the one node that writes TensorBoard, checkpoints, summary
    # the last round averaged the nodes after their last epoch: the final evaluation is due
    weights_change_at_end: bool

    @property
    def goal_reached(self) -> bool:
        """A round said that some node reached the run's goal: stop this node's workers too."""

    def shard(self, data: Any) -> Any:
        """This node's part of the training split (the test split stays whole)."""

    def global_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The facts of the whole run: the unsharded data size, the node count."""

    def agree(self, facts: dict[str, Any], plan: Any = None, error: str | None = None) -> Any:
        """Settle the run before training (a refusal on any node ends every node); rank 0's plan."""

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """This node's rows of an all-node progress table."""

    def attach(self, params: list[torch.Tensor], progress: torch.Tensor) -> None:
        """What the rounds average (the shared parameters) and report (this node's progress)."""

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Start every node from rank 0's weights (initial or resumed), parameters and buffers."""

    def tick(self, running: bool) -> dict[str, float]:
        """A round when one is due; the dashboard figures of that round."""

    def reach_goal(self) -> None:
        """This node's evaluation reached the run's goal: the next rounds tell every node."""

    def checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        """Save now (one machine) or at the next round, where the nodes' models are one."""

    def finish(self) -> None:
        """Keep joining rounds until every node is done; the last one leaves all nodes alike."""

    def final_checkpoint(self, save: Callable[[torch.Tensor | None], None]) -> None:
        """The last checkpoint, with every node's progress from the last round."""

    def stopping(self, status: str) -> None:
        """This node's run stops early (interrupted or failed): said where the other nodes can
        read it, so that one node killed outright is told from those that stopped."""

    def figures(self, mine: dict[str, Any]) -> dict[str, Any] | None:
        """The summary's `distributed` section (None on one machine)."""

    def close(self) -> None:
        """Leave the process group (nothing on one machine)."""


class LocalNode:
    """One machine: the `Node` seam's do-nothing side."""

    rank, world, is_writer = 0, 1, True
    weights_change_at_end = False  # no averaging after the last epoch
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

    def stopping(self, status: str) -> None: ...

    def figures(self, mine: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def close(self) -> None: ...
