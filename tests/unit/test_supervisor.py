"""The supervisor with fake processes: real pipes and sentinels, no worker process started."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os

import pytest

from hogwild.protocol import Done, Hello
from hogwild.run.state import Exited
from hogwild.run.supervisor import Supervisor


class FakeProcess:
    """A "child" the test drives: it sends on the pipe the supervisor gave it and exits when told;
    its sentinel becomes ready when it exits, as a real process's does."""

    def __init__(self, target, args, name, daemon, obeys_sigterm=True):
        self.args, self.name, self.exitcode = args, name, None
        self.obeys_sigterm = obeys_sigterm
        self._r, self._w = os.pipe()
        self.sentinel = self._r
        # the writing end of the worker's pipe, duplicated as a child inherits it (the
        # supervisor closes its own copy once the "child" has started)
        self.conn = multiprocessing.connection.Connection(os.dup(args[-1].fileno()), readable=False)
        self.started = False

    def start(self):
        self.started = True

    def send(self, message):
        self.conn.send(message)

    def exit(self, code: int) -> None:
        if self.exitcode is None:
            self.exitcode = code
            self.conn.close()
            os.close(self._w)  # the sentinel is now readable (EOF)

    def is_alive(self) -> bool:
        return self.started and self.exitcode is None

    def terminate(self):
        if self.obeys_sigterm:
            self.exit(-15)

    def kill(self):
        self.exit(-9)

    def join(self, timeout=None):
        assert self.exitcode is not None, "joined a live process"


class FakeContext:
    def __init__(self, **process_options):
        self.procs: dict[int, FakeProcess] = {}
        self.options = process_options

    def Pipe(self, duplex=False):
        return multiprocessing.Pipe(duplex=duplex)

    def Process(self, target, args, name, daemon):
        proc = FakeProcess(target, args, name, daemon, **self.options)
        self.procs[args[0]] = proc
        return proc


def supervisor(**options) -> tuple[Supervisor, FakeContext]:
    ctx = FakeContext(**options)
    return Supervisor("fork", target=print, args=lambda rank: ("spec",), ctx=ctx), ctx


def drain(sup: Supervisor, rounds: int = 20) -> list:
    events = []
    for _ in range(rounds):
        events += list(sup.events(timeout=0.05))
    return events


def test_messages_arrive_in_order_then_the_exit():
    sup, ctx = supervisor()
    sup.start(0)
    assert ctx.procs[0].args[:2] == (0, "spec") and ctx.procs[0].name == "hogwild-worker-0"
    ctx.procs[0].send(Hello(0, "file_system", 1))
    ctx.procs[0].send(Done(0))
    ctx.procs[0].exit(0)
    assert drain(sup) == [Hello(0, "file_system", 1), Done(0), Exited(0, 0)]
    assert sup.alive == []


def test_a_silent_death_is_seen_through_the_sentinel():
    sup, ctx = supervisor()
    for rank in (0, 1):
        sup.start(rank)
    ctx.procs[1].exit(-9)
    assert drain(sup) == [Exited(1, -9)]
    assert sup.alive == [0]


def test_a_restarted_rank_gets_a_fresh_process_and_pipe():
    sup, ctx = supervisor()
    sup.start(0)
    first = ctx.procs[0]
    first.exit(-9)
    drain(sup)
    sup.start(0)
    assert ctx.procs[0] is not first and sup.alive == [0]
    ctx.procs[0].send(Done(0))
    assert drain(sup, rounds=2) == [Done(0)]


def test_terminate_sends_sigterm_and_joins_everything():
    sup, ctx = supervisor()
    for rank in (0, 1):
        sup.start(rank)
    sup.terminate(wait_seconds=1.0)
    assert [p.exitcode for p in ctx.procs.values()] == [-15, -15] and sup.alive == []


def test_terminate_escalates_to_sigkill_for_a_worker_that_ignores_sigterm():
    sup, ctx = supervisor(obeys_sigterm=False)
    sup.start(0)
    sup.terminate(wait_seconds=0.2)
    assert ctx.procs[0].exitcode == -9 and sup.alive == []


@pytest.mark.parametrize("messages", [0, 3])
def test_a_worker_that_closed_its_pipe_mid_run_is_still_watched_by_its_sentinel(messages):
    sup, ctx = supervisor()
    sup.start(0)
    for _ in range(messages):
        ctx.procs[0].send(Done(0))
    ctx.procs[0].conn.close()  # e.g. a crash in the middle of a send
    events = drain(sup, rounds=4)
    assert events == [Done(0)] * messages and sup.alive == [0]
    ctx.procs[0].exitcode = 1
    os.close(ctx.procs[0]._w)
    assert drain(sup, rounds=4) == [Exited(0, 1)]
