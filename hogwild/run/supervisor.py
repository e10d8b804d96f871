"""Start, watch and stop the worker processes.

The supervisor waits on every worker's pipe *and* every process sentinel at once
(`multiprocessing.connection.wait`), so a worker that dies silently — SIGKILL, segfault,
`os._exit` — is noticed as soon as the kernel reaps it, not when a message fails to arrive.
Stopping is graded: the orchestrator raises the shared stop flag and keeps draining for a grace
period (hogwild.run.state decides when it is over); `terminate` then sends SIGTERM, waits a
little, sends SIGKILL and joins everything.

"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any

import torch.multiprocessing as mp

from hogwild.process import signals
from hogwild.process.main_guard import (
    UNGUARDED_EXIT,
    UNGUARDED_KIND,
    WORKER_NAME,
    unguarded_message,
)
from hogwild.protocol import Failure
from hogwild.run.state import Exited


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _state(pid: int) -> str:
    """'stopped (SIGSTOP)' and the like, from /proc: why a process did not answer."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "not answering"
    return {
        "T": "stopped (SIGSTOP)",
        "t": "stopped by a debugger",
        "D": "in an uninterruptible wait",
        "Z": "a zombie",
    }.get(state, f"not answering (state {state})")


class Supervisor:
    def __init__(
        self,
        start_method: str,
        target: Callable[..., None],
        args: Callable[[int], tuple[Any, ...]],
        ctx: Any = None,  # a multiprocessing context (the unit tests pass one of fake processes)
    ):
        # A context, never mp.set_start_method: a Hydra multirun starts several runs in one process.
        self.ctx = ctx or mp.get_context(start_method)
        self.target, self.args = target, args
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Any] = {}

    def start(self, rank: int) -> None:
        reader, writer = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=self.target,
            args=(rank, *self.args(rank), writer),
            name=f"{WORKER_NAME}{rank}",
            daemon=True,
        )
        # A Ctrl-C during the child's start-up (spawn: seconds of importing torch) cannot kill
        # it: it begins life ignoring it (hogwild.process.signals).
        with signals.born_deaf():
            proc.start()
        writer.close()  # only the child writes; its EOF then means "gone"
        self.procs[rank], self.conns[rank] = proc, reader

    def kill(self, rank: int) -> None:
        """SIGKILL one worker (a hung one); its exit arrives as an `Exited` event."""
        proc = self.procs.get(rank)
        if proc is not None and proc.is_alive():
            proc.kill()

    def stack(self, rank: int, folder: str, wait_seconds: float = 2.0) -> str:
        """Ask a worker for its Python stack (SIGUSR1, handled by hogwild.worker.setup) and wait for it."""
        proc = self.procs.get(rank)
        if proc is None or proc.pid is None:
            return "(the process is gone)"
        path = os.path.join(folder, f"{rank}.txt")
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(the process is gone)"
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if _read(path):  # faulthandler writes it all at once, from the signal handler
                time.sleep(0.1)
                break
            time.sleep(0.05)
        text = _read(path).strip()
        return text or f"(no stack: the process is {_state(proc.pid)})"

    @property
    def alive(self) -> list[int]:
        return sorted(self.procs)

    def events(self, timeout: float) -> Iterator[Any]:
        """Messages from the workers, then an `Exited` for each worker that is gone."""
        by_handle = {conn: rank for rank, conn in self.conns.items()}
        by_handle.update({p.sentinel: rank for rank, p in self.procs.items()})
        for handle in wait(list(by_handle), timeout):
            rank = by_handle[handle]
            yield from self._drain(rank)
            proc = self.procs.get(rank)
            if proc is not None and handle == proc.sentinel:
                proc.join()
                del self.procs[rank]
                self._close(rank)
                if proc.exitcode == UNGUARDED_EXIT:  # it re-ran an unguarded script: say so
                    yield Failure(rank, UNGUARDED_KIND, unguarded_message(), "")
                yield Exited(rank, proc.exitcode)

    def _drain(self, rank: int) -> Iterator[Any]:
        conn = self.conns.get(rank)
        try:
            while conn is not None and conn.poll():
                yield conn.recv()
        except (EOFError, OSError):  # the worker closed its end (or died mid-message)
            self._close(rank)

    def _close(self, rank: int) -> None:
        conn = self.conns.pop(rank, None)
        if conn is not None:
            conn.close()

    def terminate(self, wait_seconds: float = 2.0) -> None:
        """SIGTERM every live worker, SIGKILL what is left after `wait_seconds`, join all."""
        for send in ("terminate", "kill"):  # SIGTERM, then SIGKILL
            for proc in self.procs.values():
                if proc.is_alive():
                    getattr(proc, send)()
            deadline = time.monotonic() + wait_seconds
            while self.procs and time.monotonic() < deadline:
                for _ in self.events(timeout=max(0.0, deadline - time.monotonic())):
                    pass  # messages of workers being stopped are no longer news
        for rank in list(self.procs):
            self.procs.pop(rank).join()
            self._close(rank)
        for rank in list(self.conns):
            self._close(rank)
