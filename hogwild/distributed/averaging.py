"""Model averaging between torchrun nodes: the rounds, overlapped with training.

Every `distributed.sync_every_n_steps` local optimizer steps (and/or `sync_every_seconds`) each
node's orchestrator starts a round (`sync_round.Round`): an all-reduce of a snapshot of its
shared parameters, started without waiting. Its workers and its loop go on; when the sums are in
(a later tick), the average is folded into the shared model, `params += avg - snapshot`, which
keeps what the workers wrote meanwhile (overlapped local SGD). One round is in flight at a time;
the next is due N steps after the last one started.

Three flags ride along in every round, with every node's progress rows: "this node has
finished" (when every node has, the round is the last), "rank 0 wants a checkpoint" (rank 0
saves at the round's end, with every node's rows as they were at its start) and "the run's goal
is reached" (rank 0's evaluation solved the task: every node stops its workers). A node whose
workers are done waits for each round (`finish`) and writes the average exactly, so the last
round leaves every node with the same model.

The figures (`figures()`, and per round for TensorBoard): `seconds`, the orchestrator's own time
in the rounds it landed while its workers trained (snapshot, fold-in and any blocking wait; a
checkpoint's write is not counted), of which `waited` blocked on the collective; `transfer`, the
collectives' own duration once every node had joined; `in_flight`, start to sums (the wait for
the slowest node, while the workers trained); `end_wait`, the time a node whose workers were
done waited for the others' last rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from hogwild.cadence import Cadence
from hogwild.distributed.rounds import Outcome, Round
from hogwild.protocol import Control


class Averaging:
    def __init__(self, node, params: list[torch.Tensor], progress: torch.Tensor):
        self.node, self.params, self.progress = node, params, progress
        self.world = node.world
        self.every = Cadence(node.cfg.sync_every_n_steps, node.cfg.sync_every_seconds)
        self.every.mark(self._local_steps())
        self.flight: Round | None = None  # the round in flight
        self.rounds, self.bytes = 0, 0
        self.seconds = self.waited = self.transfer = self.in_flight = self.end_wait = 0.0
        self.final_table: torch.Tensor | None = None  # every node's progress, from the last round
        self._save: Callable[[torch.Tensor | None], None] | None = None  # a checkpoint asked for
        self.goal = False  # this node reached the run's goal; sent with every round from now
        self.goal_reached = False  # some node did (learnt from a round)

    def tick(self) -> dict[str, float]:
        """Land the round in flight if its sums are in; start the next one when due. The
        figures of a landed round (for TensorBoard), else nothing."""
        out = {}
        if self.flight is not None and self.flight.completed:
            r = self.flight
            self._land(exact=False)
            self.seconds += r.cost
            self.waited += r.waited
            out = {
                "distributed/sync_seconds": r.cost,
                "distributed/sync_wait_seconds": r.waited,
                "distributed/sync_transfer_seconds": r.transfer_seconds,
                "distributed/sync_in_flight_seconds": r.in_flight_seconds,
                "distributed/sync_bytes": r.bytes,
            }
        if self.flight is None and self.every.due(self._local_steps()):
            self._start(finished=False)
        return out

    def save_at_next_round(self, save: Callable[[torch.Tensor | None], None] | None) -> None:
        self._save = save

    def finish(self) -> None:
        """This node's workers are done: land the round in flight, then join rounds (waiting for
        each) until every node has finished; the last one leaves all nodes alike."""
        t = time.monotonic()
        try:
            if self.flight is not None:
                self._land(exact=False)
            done = False
            while not done:
                self._start(finished=True)
                done = self._land(exact=True).finished == self.world
        finally:
            self.end_wait += time.monotonic() - t

    def figures(self) -> dict[str, float | int]:
        """This node's sync figures for the summary (see the module's docstring)."""
        return {
            "sync_rounds": self.rounds,
            "sync_seconds": round(self.seconds, 4),
            "sync_wait_seconds": round(self.waited, 4),
            "sync_transfer_seconds": round(self.transfer, 4),
            "sync_in_flight_seconds": round(self.in_flight, 4),
            "sync_end_wait_seconds": round(self.end_wait, 4),
            "sync_bytes": self.bytes,
        }

    def _local_steps(self) -> int:
        return int(self.progress[:, Control.STEPS].sum())

    def _start(self, finished: bool) -> None:
        steps = self._local_steps()
        flags = [finished, self._save is not None, self.goal]
        self.flight = Round(self.node, self.rounds + 1, self.params, self.progress, flags)
        self.every.mark(steps)

    def _land(self, exact: bool) -> Outcome:
        """Wait for the round in flight (no time when its sums are in), fold it in and act on
        what the nodes said."""
        r, self.flight = self.flight, None
        r.wait()
        said = r.land(self.params, exact)
        self.rounds += 1
        self.bytes += r.bytes
        self.transfer += r.transfer_seconds
        self.in_flight += r.in_flight_seconds
        self.goal_reached = self.goal_reached or said.goal
        if said.finished == self.world:
            self.final_table = said.table  # saved after the final evaluation
        elif said.checkpoint:
            if self._save is not None:
                self._save(said.table)
            self._save = None
        return said
