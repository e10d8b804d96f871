"""Signals from the first line to the last write (hogwild.process.signals): one receiver thread takes
them; before a run they raise Interrupted in the main thread, during a run they are recorded;
children are born ignoring what a terminal sends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hogwild.process import signals

from support import wait_until


@pytest.fixture
def installed():
    previous = signals.install()
    yield
    signals.restore(previous)


def test_a_signal_before_the_run_raises_interrupted_in_the_main_thread(installed):
    # Sent to the receiver thread, where the kernel delivers it in the CLI: there install() runs
    # before torch is imported, so every other thread blocks the signal. In this test process
    # torch's own threads predate install() and would take a process-directed signal, and
    # CPython notices a signal taken by a thread it does not run only once the main thread
    # next waits (here: when the 30 s loop below ends, just inside or outside pytest.raises).
    signal.pthread_kill(signals.receiver().thread.ident, signal.SIGINT)
    with pytest.raises(signals.Interrupted) as info:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the main thread runs Python: it is raised here
            sum(range(1000))
    assert info.value.signum == signal.SIGINT and info.value.exit_code == 130


def test_during_a_run_signals_are_recorded_not_raised(installed):
    with signals.SignalRelay() as relay:
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(lambda: len(relay.pending) == 1, 30), relay.pending
        os.kill(os.getpid(), signal.SIGINT)
        assert wait_until(lambda: len(relay.pending) == 2, 30), relay.pending
        assert relay.drain() == [signal.SIGTERM, signal.SIGINT] and relay.pending == []


def in_module(name: str, source: str):
    """The function `f` of `source`, as if defined in the module `name`."""
    namespace = {"__name__": name, "sys": sys}
    exec(source, namespace)
    return namespace["f"]


def test_where_interrupted_may_be_raised():
    here = in_module("x", "def f():\n    return sys._getframe()")
    assert signals.interruptible(here())  # the user's code, torch's import, a test
    machinery = in_module("importlib._bootstrap", "def f():\n    return sys._getframe()")
    assert not signals.interruptible(machinery())  # its own locks: the import lock held for good
    # a C extension's init importing Python code (torch._C imports numpy): it swallows errors
    init = in_module(
        "importlib._bootstrap_external", "def create_module(g):\n    return g()\nf = create_module"
    )
    assert not signals.interruptible(init(here)) and signals.interruptible(here())
    for library in ("omegaconf.dictconfig", "hydra._internal.utils", "logging", "yaml.emitter"):
        inner = in_module(library, "def f():\n    return sys._getframe()")
        assert not signals.interruptible(inner())
        # ... nor in what such a library calls, up to hogwild's own code, where it may again
        called = in_module("copy", "def f(g):\n    return g()")
        assert not signals.interruptible(
            in_module(library, "def f(g, h):\n    return g(h)")(called, here)
        )
    ours = in_module("hogwild.cli.job", "def f(g, h):\n    return g(h)")
    assert signals.interruptible(ours(in_module("torch", "def f(g):\n    return g()"), here))
    # Hydra's instantiate calling the user's factory: the factory's code runs, not Hydra's state
    instantiate = in_module(
        "hydra._internal.instantiate._instantiate2", "def f(g):\n    return g()"
    )
    assert signals.interruptible(ours(instantiate, here))


def test_a_signal_raised_once_leaves_no_retry_to_raise_it_again(installed):
    taker = signals.receiver()
    with taker.lock:
        taker.deferred.append(signal.SIGINT)
    taker.retry.append(signal.SIGINT)  # refused once in a library, then raised by born_deaf
    with pytest.raises(signals.Interrupted):
        taker.raise_deferred()
    assert not taker.retry and not taker.deferred


def test_a_signal_inside_a_library_waits_until_the_main_thread_is_out(installed, monkeypatch):
    refused = []

    def counting(frame):
        allowed = signals.interruptible.__wrapped__(frame)
        refused.extend([] if allowed else [frame])
        return allowed

    counting.__wrapped__ = signals.interruptible
    monkeypatch.setattr(signals, "interruptible", counting)
    busy = in_module(
        "omegaconf.busy",
        "def f(done):\n    while not done():\n        sum(range(1000))\n    return 'out'",
    )
    deadline = time.monotonic() + 30
    signal.pthread_kill(signals.receiver().thread.ident, signal.SIGINT)
    # refused three times (tried again every RETRY_SECONDS), then raised once out
    assert busy(lambda: len(refused) >= 3 or time.monotonic() > deadline) == "out"
    assert len(refused) >= 3
    with pytest.raises(signals.Interrupted) as info:
        while time.monotonic() < deadline:
            sum(range(1000))
    assert info.value.signum == signal.SIGINT


def test_one_a_callback_swallowed_is_raised_again(installed):
    import weakref

    class Thing:
        pass

    def callback(ref):  # Python reports this one to sys.unraisablehook and goes on
        raise signals.Interrupted(signal.SIGTERM)

    thing = Thing()
    ref = weakref.ref(thing, callback)
    with pytest.raises(signals.Interrupted) as info:
        del thing
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sum(range(1000))
    assert info.value.signum == signal.SIGTERM and ref() is None


def test_every_thread_blocks_them_and_restore_gives_them_back():
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    previous = signals.install()
    assert set(signals.SIGNALS) <= signal.pthread_sigmask(signal.SIG_BLOCK, set())
    signals.restore(previous)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not signals.installed()


def test_a_child_started_born_deaf_ignores_ctrl_c_and_hangups(installed):
    code = "import signal as s; print([s.getsignal(n) == s.SIG_IGN for n in (s.SIGINT, s.SIGHUP)])"
    with signals.born_deaf():
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.communicate(timeout=60)[0].strip() == "[True, True]"
    assert signal.getsignal(signal.SIGINT) != signal.SIG_IGN  # only while it was started


def test_a_signal_while_a_child_starts_is_acted_on_once_it_is_out(installed):
    with pytest.raises(signals.Interrupted):
        with signals.born_deaf():
            # to the receiver thread itself: a thread that predates install() (this test
            # process has torch's) would drop it now, while Ctrl-C is ignored for the child
            signal.pthread_kill(signals.receiver().thread.ident, signal.SIGINT)
            assert wait_until(lambda: signals.receiver().deferred, 30)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # as the tracker does
    assert set(signals.SIGNALS) <= signal.pthread_sigmask(signal.SIG_BLOCK, set())


class Exited(Exception):
    pass


def test_a_fork_server_whose_orchestrator_died_before_its_guard_exits_at_once(monkeypatch):
    # a Ctrl-C as the CLI starts can end the orchestrator while the fork server it just
    # started is still booting: without this it would import torch for seconds, then exit
    import subprocess

    from hogwild.process import server_guard

    def exit_(code):
        raise Exited(code)

    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: no process has its pid now
    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setenv(server_guard.PARENT_ENV, str(finished.pid))
    with pytest.raises(Exited):
        server_guard.guard()
    assert server_guard.PARENT_ENV not in os.environ  # its workers do not inherit the mark
    # marked by a live process that is not its parent (a wrapper executable): no guard, no exit
    monkeypatch.setenv(server_guard.PARENT_ENV, str(os.getpid()))
    server_guard.guard()
    server_guard.guard()  # unmarked (any process but that fork server): nothing happens


def test_the_resource_tracker_is_launched_with_the_signals_blocked_again(installed):
    signals.start_resource_tracker()  # CPython unblocks SIGINT and SIGTERM as it launches it
    assert set(signals.SIGNALS) <= signal.pthread_sigmask(signal.SIG_BLOCK, set())
