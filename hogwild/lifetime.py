"""Signals from the first line of the CLI to the last write (docs/fault-tolerance.md).

SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) mean the same thing: stop. What
"stop" does depends on where the run stands:

    before the workers start   raise `Interrupted` in the main thread: nothing has been written
                               yet, the CLI says so in one line and exits 128 + signal
    while the run loop owns it record the signal (SignalRelay); hogwild.run_state decides (the
                               first stops the workers, a second shortens the grace period); the
                               final checkpoint and summary.json are always written

How: `install` blocks the three signals in the main thread, so every thread started later (torch's
pools, TensorBoard's writer) blocks them too, and one receiver thread takes them with sigwait.
Ctrl-C and hangups are also *ignored* in this process, and an ignored disposition survives fork
and exec: every child (the fork server, spawned workers still importing torch) is born deaf to
the terminal, which sends them to the whole process group. The kernel still queues a signal
that every thread blocks, so the receiver gets it all the same. Nothing is ever raised inside
what the orchestrator is doing while a run is live. SIGHUP also points stdout and stderr at
/dev/null: the terminal is gone, and a write to it would fail.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINAL = (signal.SIGINT, signal.SIGHUP)  # what a terminal sends to the whole process group


class Interrupted(KeyboardInterrupt):
    """A signal before the run loop owned signals: the run never started, nothing was written.
    A KeyboardInterrupt: no `except Exception` on the way swallows it, and Python API callers
    catch it as they would Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def ignore_terminal_signals() -> None:
    """For the workers: the orchestrator alone decides what Ctrl-C and a hangup mean; SIGTERM
    (the supervisor's "stop now") ends the worker as usual."""
    for s in TERMINAL:
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # fork: not the orchestrator's handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNALS))


def detach_terminal() -> None:
    """The terminal hung up: later writes to it would raise EIO; send them nowhere instead."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


class _Receiver:
    """The one place signals arrive: a thread in sigwait. It hands each to the open SignalRelay,
    or has the main thread raise `Interrupted` (through SIGTERM's Python handler, which
    `_thread.interrupt_main` runs there at its next instruction)."""

    def __init__(self):
        self.relays: list[SignalRelay] = []
        self.deferred: list[int] = []  # signals to raise in the main thread
        self.forwarded = 0  # interrupt_main calls not yet handled there
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopping = False

    def start(self) -> None:
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="hogwild-signals", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread is None:
            return
        self.stopping = True
        signal.pthread_kill(self.thread.ident, signal.SIGTERM)  # wakes its sigwait
        self.thread.join(timeout=5)
        self.thread = None

    def _run(self) -> None:
        while True:
            signum = signal.sigwait(SIGNALS)
            if self.stopping:
                return
            self.deliver(signum)

    def deliver(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            detach_terminal()
        with self.lock:
            if self.relays:
                self.relays[-1].pending.append(signum)
                return
            self.deferred.append(signum)
            self.forwarded += 1
        _thread.interrupt_main(signal.SIGTERM)

    def on_main(self, signum: int, frame) -> None:
        """SIGTERM's Python handler, run in the main thread: a signal forwarded by `deliver`, or
        a real SIGTERM that found the main thread unblocked (see `reblock`)."""
        with self.lock:
            if self.forwarded:
                self.forwarded -= 1
            elif self.relays:
                self.relays[-1].pending.append(signum)
            else:
                self.deferred.append(signum)
            if not self.deferred or self.relays:
                return
            first = self.deferred[0]
            self.deferred.clear()
        raise Interrupted(first)

    def open(self, relay: SignalRelay) -> None:
        with self.lock:  # a signal just before the run took its signals: the run's first stop
            relay.pending.extend(self.deferred)
            self.deferred.clear()
            self.relays.append(relay)

    def close(self, relay: SignalRelay) -> None:
        with self.lock:
            self.relays.remove(relay)


_RECEIVER = _Receiver()


def install() -> dict[str, Any]:
    """Take SIGINT/SIGTERM/SIGHUP for hogwild (the CLI does this first thing); returns what it
    replaced, for `restore`. Nothing outside the main thread: there the caller owns signals."""
    if threading.current_thread() is not threading.main_thread() or installed():
        return {}
    previous = {
        "handlers": {s: signal.getsignal(s) for s in SIGNALS},
        "mask": signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS)),
    }
    for s in TERMINAL:
        signal.signal(s, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _RECEIVER.on_main)
    _RECEIVER.start()
    return previous


def restore(previous: dict[str, Any]) -> None:
    if not previous:
        return
    _RECEIVER.stop()
    with _RECEIVER.lock:
        _RECEIVER.deferred.clear()
    for s, old in previous["handlers"].items():
        signal.signal(s, signal.SIG_DFL if old is None else old)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous["mask"])


def reblock() -> None:
    """After starting a child with spawn or forkserver: Python's resource tracker, started with
    the first such child, unblocks SIGINT and SIGTERM in the main thread (CPython's
    multiprocessing/resource_tracker.py); block them again."""
    if installed() and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))


def installed() -> bool:
    return _RECEIVER.thread is not None


class SignalRelay:
    """While open, signals become events for the run loop instead of exceptions. Opened by the
    Trainer just before the first worker starts, closed after summary.json is written."""

    def __init__(self):
        self.pending: list[int] = []
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> SignalRelay:
        self.saved = install()  # the Python API without the CLI: for this run only
        _RECEIVER.open(self)
        return self

    def __exit__(self, *exc) -> None:
        _RECEIVER.close(self)
        restore(self.saved)

    def drain(self) -> list[int]:
        out, self.pending[:] = list(self.pending), []
        return out
