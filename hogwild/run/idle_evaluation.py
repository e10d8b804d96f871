"""Evaluations during training that wait for a core the workers leave idle.

`EvaluationScheduler`, what the run loop owns and asks (it returns scores, the loop charts them):

    start(label, units)     an evaluation is due: on an idle core when the evaluator allows it,
                            else at once, in the loop's thread, as the workers go on
    completed()             every turn of the loop: start a waiting one if a core is idle;
                            the scores of those done, with the units they were due at
    drain(...)              after the workers: those still waiting, on every core

`IdleEvaluations`, the mechanism: `submit` holds a snapshot of the shared weights, `poll` hands
the oldest to the evaluation thread, `completed` returns the results, `drain` and `close` end it.

An evaluation run beside workers that keep every core busy takes its CPU time from them, and
in a torchrun run that slows the node that evaluates (docs/performance.md measures it). A core
is idle when fewer threads are runnable than this process may use cores (the kernel's count,
this thread included), twice in a row; with one worker on two cores, or a GPU run, that is at once. On busy cores the
evaluation waits, for `trainer.eval_wait_seconds` at most (then it runs beside the workers, as
without this module), or until the workers exit. It scores the weights of the moment it was
due, and its results go to TensorBoard at that moment's step: only the line in the log is late.
At most `MAX_PENDING` snapshots wait (then the oldest runs at once); evaluations run in the
order they were due. A model too large to hold that many copies of (`MAX_BYTES`) is evaluated
in place by the run loop, as before: what this module holds stays under `MAX_BYTES` whatever
the model's size (above about 50 MiB of weights it holds nothing). The thread's own copy counts
every tensor deepcopy copies, those outside the state dict too (non-persistent buffers, tensors
kept as plain attributes).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import torch

from hogwild.config.schema import usable_cores
from hogwild.reporting.timeline import Timeline

log = logging.getLogger("hogwild")

MAX_PENDING = 16  # snapshots waiting for an idle core (trainer.eval_wait_seconds bounds the wait)
MAX_BYTES = 1 << 30  # every copy this module may hold together
# An evaluation's scores (dashboard scalars), or what it raised (the loop raises it again)
EvaluationOutcome = dict[str, float] | BaseException
Scored = tuple[int, EvaluationOutcome]  # the units it was due at, and its outcome


def runnable_threads() -> int | None:
    """Threads runnable on the machine now (the kernel's nr_running, as /proc/loadavg's
    `running/total` field says it: cheap on any core count, unlike /proc/stat), None where
    there is no /proc."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def held_bytes(model: torch.nn.Module) -> int:
    """What a deepcopy of `model` allocates for tensors: every storage its modules hold
    (parameters, buffers persistent or not, plain tensor attributes), once each."""
    seen, total = set(), 0
    for m in model.modules():
        attributes = (v for v in vars(m).values() if isinstance(v, torch.Tensor))
        for t in (*m._parameters.values(), *m._buffers.values(), *attributes):
            if t is None or t.untyped_storage()._cdata in seen:
                continue
            seen.add(t.untyped_storage()._cdata)
            total += t.untyped_storage().nbytes()
    return total


class IdleEvaluations:
    def __init__(
        self,
        evaluate: Callable[[torch.nn.Module, str], dict[str, float]],
        wait_seconds: float,
        runnable: Callable[[], int | None] = runnable_threads,
        cores: int | None = None,
    ):
        self.evaluate, self.wait_seconds, self.runnable = evaluate, wait_seconds, runnable
        self.cores = cores or usable_cores()
        self.model: torch.nn.Module | None = None  # the thread's own copy, made at first use
        self.waiting: collections.deque = collections.deque()  # (label, units, tensors, since)
        self.queue: collections.deque = collections.deque()  # handed to the thread
        self.ready: collections.deque = collections.deque()  # (label, units, outcome)
        self.busy = self.stopped = self.in_place = False
        self.idle_turns = 0
        self.cpu_seconds, self.count = 0.0, 0  # the thread's own CPU time, its evaluations
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def submit(self, model: torch.nn.Module, label: str, units: int) -> bool:
        """Hold a copy of `model`'s weights as they are now; False for a model too large to
        hold `MAX_PENDING` copies of, or one deepcopy cannot copy (the caller then evaluates
        in place, always). With `MAX_PENDING` snapshots waiting, the oldest goes to the thread
        at once; with two queued there, this waits for the thread (as an evaluation in place
        would)."""
        tensors = list(model.state_dict().values())
        size = sum(t.numel() * t.element_size() for t in tensors)  # a snapshot (clones)
        if self.in_place or (MAX_PENDING + 3) * size + held_bytes(model) > MAX_BYTES:
            return False  # snapshots waiting, queued, running, and the thread's copy
        if self.model is None:
            try:
                self.model = copy.deepcopy(model)  # private memory: deepcopy does not share it
            except Exception:  # noqa: BLE001 - a model that cannot be copied: evaluated in place
                self.in_place = True
                return False
            self.thread = threading.Thread(target=self._run, name="hogwild-evaluation", daemon=True)
            self.thread.start()
        if len(self.waiting) >= MAX_PENDING:
            self._release(1)
        with self.cond:
            while len(self.queue) > 1:
                self.cond.wait()
        self.waiting.append((label, units, [t.detach().clone() for t in tensors], time.monotonic()))
        self.poll()
        return True

    def poll(self) -> None:
        """Hand the oldest waiting snapshot to the thread when it is free and a core is idle
        (twice in a row), or the snapshot has waited long enough."""
        if not self.waiting:
            self.idle_turns = 0
            return
        runnable = self.runnable()
        idle = runnable is None or runnable - 1 < self.cores  # this thread is one of them
        self.idle_turns = self.idle_turns + 1 if idle else 0
        waited = time.monotonic() - self.waiting[0][3]
        if (
            not self.busy
            and not self.queue
            and (self.idle_turns >= 2 or waited >= self.wait_seconds)
        ):
            self._release(1)

    def _release(self, n: int) -> None:
        # with the intra-op threads the caller runs with now (one while the workers train, every
        # core in the drain): a thread keeps the count it first ran with (OpenMP's is per thread)
        threads = torch.get_num_threads()
        with self.cond:
            for _ in range(min(n, len(self.waiting))):
                self.queue.append((*self.waiting.popleft()[:3], threads))
            self.cond.notify_all()

    def completed(self) -> list[tuple[str, int, EvaluationOutcome]]:
        out = []
        while self.ready:
            out.append(self.ready.popleft())
        return out

    def drain(self, interrupted: Callable[[], bool], poll: float = 0.1) -> int:
        """Run every snapshot still held; `interrupted()` is asked every `poll` seconds and
        True drops those not started (the one running ends first: the evaluator is not shared
        with a second thread). How many were dropped (0: all ran)."""
        self._release(len(self.waiting))
        dropped = 0
        with self.cond:
            while self.queue or self.busy:
                if self.queue and interrupted():
                    dropped = len(self.queue)
                    self.queue.clear()
                self.cond.wait(poll)
        return dropped

    def close(self) -> int:
        """Drop what has not started and end the thread once its current evaluation is done
        (torch must not run in a thread the interpreter abandons at exit: that aborts the
        process). How many were dropped."""
        with self.cond:
            dropped = len(self.waiting) + len(self.queue)
            self.stopped = True
            self.waiting.clear()
            self.queue.clear()
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()
        return dropped

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.stopped:
                    self.cond.wait()
                if not self.queue:
                    return
                label, units, snapshot, threads = self.queue.popleft()
                self.busy = True
            t0 = time.thread_time()
            try:
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
                with torch.no_grad():  # grad mode is per thread: on in a new one
                    for dst, src in zip(self.model.state_dict().values(), snapshot, strict=True):
                        dst.copy_(src)
                    del snapshot
                    outcome: EvaluationOutcome = self.evaluate(self.model, label)
            except Exception as e:  # noqa: BLE001 - raised again by the run loop, in its thread
                outcome = e
            with self.cond:
                self.cpu_seconds += time.thread_time() - t0
                self.count += 1
                self.ready.append((label, units, outcome))
                self.busy = False
                self.cond.notify_all()


@dataclasses.dataclass
class Drained:
    scored: list[Scored]  # in the order they were due
    dropped: int  # not run: dropped by a signal during the drain (or all, when skipped)


class EvaluationScheduler:
    """The run loop's evaluations during training: on a core the workers leave idle when the
    evaluator allows it (`idle_cores`) and a snapshot can be held, else at once, in the loop's
    thread, while the workers go on. It returns what was scored; the loop charts it."""

    def __init__(self, evaluator, model: torch.nn.Module, timeline: Timeline, wait_seconds: float):
        self.evaluator, self.model, self.timeline = evaluator, model, timeline
        self.idle = (
            IdleEvaluations(evaluator.evaluate, wait_seconds) if evaluator.idle_cores else None
        )

    @property
    def holds_any(self) -> bool:
        """Whether the end of the run has a queue to drain and a thread to close."""
        return self.idle is not None

    def start(self, label: str, units: int) -> list[Scored]:
        """An evaluation is due: a snapshot waits for an idle core (nothing scored yet), or it
        runs now and its scores are returned."""
        if self.idle and self.idle.submit(self.model, label, units):
            return []
        with self.timeline.phase("evaluations"):  # overlaps the workers' training
            return [(units, self.evaluator.evaluate(self.model, label))]

    def completed(self) -> list[Scored]:
        """Start a waiting evaluation if a core is idle; those done since the last call."""
        if self.idle is None:
            return []
        self.idle.poll()
        return [(units, outcome) for _, units, outcome in self.idle.completed()]

    def drain(
        self, interrupted: Callable[[], bool], skip: bool, every_core: ContextManager
    ) -> Drained:
        """After the workers: those still waiting, run now (within `every_core`) unless `skip`;
        `interrupted()` true meanwhile drops those not started. Ends the thread."""
        idle, dropped = self.idle, 0
        assert idle is not None, "nothing to drain: see holds_any"
        try:
            if not skip:
                with self.timeline.phase("queued_evaluations"), every_core:
                    dropped = idle.drain(interrupted)
            scored = [(units, outcome) for _, units, outcome in idle.completed()]
        finally:
            left = idle.close()  # after the one running, if any
            if idle.count:
                self.timeline.add("idle_core_evaluations", idle.cpu_seconds, count=idle.count)
        return Drained(scored, dropped + left if skip else dropped)
