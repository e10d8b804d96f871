"""Signals from the first line of the CLI to the last write (docs/fault-tolerance.md).

SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) mean the same thing: stop. What
"stop" does depends on where the run stands:

    before the workers start   raise `Interrupted` in the main thread: nothing has been written
                               yet, the CLI says so in one line and exits 128 + signal
    while the run loop owns it record the signal (SignalRelay); hogwild.run.state decides (the
                               first stops the workers, a second shortens the grace period); the
                               final checkpoint and summary.json are always written

How. `install` blocks the three signals in the main thread, so every thread started after it
(torch's pools, TensorBoard's writer) blocks them too, and one receiver thread takes them with
sigwait; a thread that existed before (the Python API's caller may have some) still hands them
to the same Python handler. Children must not die of the Ctrl-C a terminal sends to the whole
process group, even while importing torch: `born_deaf` ignores Ctrl-C and hangups while a child
is started, and an ignored disposition survives fork and exec (Python keeps it). A signal sent
meanwhile waits in the receiver and is acted on when the child is out. Nothing is ever raised
inside what the orchestrator is doing while a run is live. SIGHUP also points stdout and stderr
at /dev/null: the terminal is gone, and a write to it would fail.

Where. An exception raised at an arbitrary instruction can leave a library's state broken: in
importlib's own code it left the import lock held (every later import hung: a sweep stuck for
good), in OmegaConf or logging a half-made node or a held handler lock. `Interrupted` is raised
only where the main thread runs hogwild's code or code it calls that keeps no such state (torch's
import, a data set's build, the user's factories); inside the libraries in `NOT_INSIDE`, inside
importlib's machinery or the receiver itself, the signal waits and is tried again a moment later
(`RETRY_SECONDS`). One swallowed by a callback (Python ignores exceptions from weakref callbacks
and `__del__`) is tried again too (`Receiver.unraisable`).
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import os
import signal
import sys
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TERMINAL = (signal.SIGINT, signal.SIGHUP)  # what a terminal sends to the whole process group
# Top-level packages whose code `Interrupted` is never raised in, called from hogwild: the
# CLI's config layer and logging (see "Where" above).
NOT_INSIDE = frozenset({"omegaconf", "hydra", "yaml", "antlr4", "logging"})
RETRY_SECONDS = 0.02  # a signal that waits for the main thread to leave such code
IDLE_SECONDS = 0.25  # how often the receiver looks for one (at most this late)


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


class Receiver:
    """Where signals arrive: the receiver thread (sigwait) or, for a thread that does not block
    them, the Python handler in the main thread. Each goes to the open SignalRelay, or is raised
    in the main thread as `Interrupted` (the receiver asks `_thread.interrupt_main` to run the
    handler there at its next instruction, and again while that instruction is not a place to
    raise it: `interruptible`)."""

    def __init__(self):
        self.relays: list[SignalRelay] = []
        self.deferred: list[int] = []  # signals to raise in the main thread
        self.forwarded = 0  # interrupt_main calls not yet handled there
        # signals to hand to the main thread again, as (signum, recorded): recorded when it is in
        # `deferred` already (forwarded by the receiver), not when it came to the main thread
        # directly or was swallowed by a callback. A deque: append and popleft need no lock
        # (the main thread may hold the receiver's lock where it adds one).
        self.retry: collections.deque[tuple[int, bool]] = collections.deque()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.unraisable_hook = sys.unraisablehook  # the one `install` replaced

    def start(self) -> None:
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="hogwild-signals", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread is None:
            return
        with self.lock:
            self.stopping = True  # no retry reaches the handlers `restore` puts back
        signal.pthread_kill(self.thread.ident, signal.SIGTERM)  # wakes its wait
        self.thread.join(timeout=5)
        self.thread = None

    def _run(self) -> None:
        while True:
            waited = signal.sigtimedwait(SIGNALS, RETRY_SECONDS if self.retry else IDLE_SECONDS)
            if self.stopping:
                return
            # None: the wait timed out. CPython 3.11 also returns an uninitialised siginfo
            # when the wait was interrupted (SIGSTOP, then SIGCONT) and its time ran out
            # meanwhile: a signal number that is not one of ours is a timeout too.
            if waited is None or waited.si_signo not in SIGNALS:
                self._forward_retry()
                continue
            if self._take(waited.si_signo):
                with self.lock:
                    self.forwarded += 1
                _thread.interrupt_main(waited.si_signo)

    def _forward_retry(self) -> None:
        """Hand the waiting signals to the main thread again; one it has not recorded yet is
        recorded now (or goes to the run's relay, when one has opened meanwhile): none is lost."""
        with self.lock:
            while self.retry:
                signum, recorded = self.retry.popleft()
                if self.stopping:
                    continue
                if self.relays:  # the run owns signals now (a recorded one moved with `open`)
                    if not recorded:
                        self.relays[-1].pending.append(signum)
                    continue
                if not recorded:
                    self.deferred.append(signum)
                    self.forwarded += 1
                _thread.interrupt_main(signum)  # a flag for the main thread: no wait here

    def _take(self, signum: int) -> bool:
        """Record `signum`; True when the main thread must raise it."""
        if signum == signal.SIGHUP:
            detach_terminal()
        with self.lock:
            if self.relays:
                self.relays[-1].pending.append(signum)
                return False
            self.deferred.append(signum)
            return True

    def on_main(self, signum: int, frame) -> None:
        """The Python handler of all three, run in the main thread."""
        if not interruptible(frame):  # not here: again in a moment (no lock taken: the main
            # thread may hold it, in this module's code; a forwarded one is recorded already)
            self.retry.append((signum, self.forwarded > 0))
            return
        with self.lock:
            forwarded = self.forwarded > 0
            self.forwarded -= forwarded
        if not forwarded and not self._take(signum):
            return
        self.raise_deferred()

    def unraisable(self, info) -> None:
        """sys.unraisablehook while installed: an `Interrupted` that a callback swallowed (Python
        only reports those) is raised again, from the next place it may be."""
        if isinstance(info.exc_value, Interrupted):
            self.retry.append((info.exc_value.signum, False))  # not deferred any more
            return
        self.unraisable_hook(info)

    def raise_deferred(self) -> None:
        with self.lock:
            if not self.deferred or self.relays:
                return
            first = self.deferred[0]
            self.deferred.clear()
            self.retry.clear()  # raised now: a retry pending from a refused place is done too
        raise Interrupted(first)

    def open(self, relay: SignalRelay) -> None:
        with self.lock:  # a signal just before the run took its signals: the run's first stop
            relay.pending.extend(self.deferred)
            self.deferred.clear()
            while self.retry:  # those not recorded yet go to the run too
                signum, recorded = self.retry.popleft()
                if not recorded:
                    relay.pending.append(signum)
            self.relays.append(relay)

    def close(self, relay: SignalRelay) -> None:
        with self.lock:
            self.relays.remove(relay)


def interruptible(frame) -> bool:
    """Whether `Interrupted` may be raised at `frame`, the main thread's next instruction: not
    in this module (it holds the receiver's lock), nor as the first thing inside importlib's
    machinery (its locks), nor under a C extension's initialisation (`create_module`), nor
    anywhere inside a NOT_INSIDE library called from the code that runs, up to the first frame
    of hogwild's own."""
    innermost = True
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        top = module.partition(".")[0]
        if module.startswith("hydra._internal.instantiate"):  # it calls the user's factory:
            innermost, frame = False, frame.f_back  # that code, not Hydra's state, runs
            continue
        if module == __name__ or top in NOT_INSIDE:
            return False
        if innermost and module.startswith("importlib._bootstrap"):
            return False
        if module.startswith("importlib._bootstrap") and frame.f_code.co_name == "create_module":
            return False  # a C extension's init, whose own imports' errors it may swallow
            # (torch._C imports numpy: an exception there left torch without numpy, unraised)
        if top == "hogwild":
            return True
        innermost, frame = False, frame.f_back
    return True


def receiver() -> Receiver | None:
    """The receiver `install` put in place, found where the process keeps it: the Python
    handler of SIGTERM is its bound method (SIGTERM: `born_deaf` leaves it in place). None when
    hogwild does not hold the signals."""
    owner = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return owner if isinstance(owner, Receiver) and owner.thread is not None else None


def install() -> dict[str, Any]:
    """Take SIGINT/SIGTERM/SIGHUP for hogwild (the CLI does this first thing); returns what it
    replaced, for `restore`. Nothing outside the main thread: there the caller owns signals."""
    if threading.current_thread() is not threading.main_thread() or installed():
        return {}
    taker = Receiver()
    previous = {
        "handlers": {s: signal.signal(s, taker.on_main) for s in SIGNALS},
        "mask": signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS)),
        "unraisablehook": sys.unraisablehook,
    }
    sys.unraisablehook = taker.unraisable
    taker.start()
    return previous


def restore(previous: dict[str, Any]) -> None:
    if not previous:
        return
    taker = receiver()
    if taker is not None:
        taker.stop()
    for s, old in previous["handlers"].items():
        signal.signal(s, signal.SIG_DFL if old is None else old)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous["mask"])
    sys.unraisablehook = previous["unraisablehook"]


@contextlib.contextmanager
def born_deaf():
    """Around starting children (workers, the fork server, torch_shm_manager): they begin life
    ignoring Ctrl-C and hangups. Afterwards the signals are blocked again (a child that launches
    Python's resource tracker unblocks SIGINT and SIGTERM in this thread: launch it before,
    with `start_resource_tracker`), and one that came meanwhile is acted on."""
    taker = receiver()
    if taker is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in TERMINAL}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))
        with taker.lock:
            taker.forwarded = 0  # forwarded to SIG_IGN: lost there, still deferred here
        taker.raise_deferred()


def start_resource_tracker() -> None:
    """Python's resource tracker (spawn and forkserver need it), launched with hogwild's own
    handlers in place. CPython unblocks SIGINT and SIGTERM in the thread that launches it
    (multiprocessing/resource_tracker.py): inside `born_deaf`, a terminal's Ctrl-C in that
    moment met an ignored disposition in the main thread and was lost (the run went on to the
    end). Here it meets the handler, and the signals are blocked again at once. The tracker
    ignores both signals itself."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if receiver() is not None and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNALS))


def installed() -> bool:
    return receiver() is not None


class SignalRelay:
    """While open, signals become events for the run loop instead of exceptions. Opened by the
    Trainer just before the first worker starts, closed after summary.json is written; the
    signals were taken by whoever set the run up (`install`: the CLI, or Trainer.fit)."""

    def __init__(self):
        self.pending: list[int] = []
        self.receiver: Receiver | None = None

    def __enter__(self) -> SignalRelay:
        self.receiver = receiver()
        if self.receiver is not None:  # None outside the main thread: the caller owns signals
            self.receiver.open(self)
        return self

    def __exit__(self, *exc) -> None:
        if self.receiver is not None:
            self.receiver.close(self)

    def drain(self) -> list[int]:
        out, self.pending[:] = list(self.pending), []
        return out
