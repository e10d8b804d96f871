"""What a run starts early, so that its slow parts overlap instead of adding up.

    fork_server_ahead()         before Hydra composes the config: the default start method's fork
                                server, a fresh interpreter that imports torch, hogwild.worker and
                                torch._dynamo (~2.3 s, the longest chain of a run's start-up)
    fork_server(start_method)   once the config is known: keeps that server, or stops it when the
                                config picks fork or spawn (and starts what those need)
    import_dynamo()             after torch, for start_method=fork only: torch._dynamo (~1.1 s,
                                what every optimizer step imports) in a thread while the data set
                                is built, so that forked workers inherit it
    dynamo_imported()           waits for that thread (before any fork)

With forkserver or spawn this process never imports torch._dynamo: the optimizer check does
without it (hogwild.preflight), and the workers get it from the server or import it themselves.
Nothing here imports torch, so the CLI can call `fork_server_ahead` first thing.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading

from hogwild import lifetime, server_guard

PRELOAD = ["hogwild.server_guard", "hogwild.worker", "torch._dynamo"]
_dynamo: threading.Thread | None = None
_ahead = False  # the running fork server was started before the config was known


def fork_server_ahead() -> None:
    """Start the default start method's fork server before the config is composed (~0.35 s
    sooner). `fork_server` stops it again if the config picks another start method."""
    global _ahead
    from hogwild.config import TrainerConfig

    if TrainerConfig().start_method == "forkserver":
        fork_server("forkserver")
        _ahead = True


def fork_server(start_method: str) -> None:
    """Boot the fork server now (it takes seconds); fork needs nothing, spawn needs the
    resource tracker only."""
    if start_method != "forkserver":
        _stop_server_started_ahead()
    if start_method == "fork":
        return
    from multiprocessing import forkserver, resource_tracker

    with lifetime.born_deaf():  # the resource tracker and the fork server ignore Ctrl-C
        resource_tracker.ensure_running()
        if start_method == "forkserver":
            # torch and torch._dynamo are imported once, in the fork server; each worker is then
            # a cheap fork of it. The same server as torch.multiprocessing's forkserver context.
            forkserver.set_forkserver_preload(PRELOAD)
            os.environ[server_guard.PARENT_ENV] = str(os.getpid())  # hogwild.server_guard
            try:
                forkserver.ensure_running()
            finally:
                del os.environ[server_guard.PARENT_ENV]


def _stop_server_started_ahead() -> None:
    """The config picked fork or spawn: the server started ahead of it is not needed. It is
    still importing, and only reads its stop request once its imports are done: kill it."""
    global _ahead
    if not _ahead:
        return  # a fork server the caller started is none of our business
    _ahead = False
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's singleton, as forkserver.ensure_running uses
    if server._forkserver_pid is not None:
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()  # reaps it and forgets its address (CPython's own way to stop it)


def import_dynamo() -> None:
    """Start importing torch._dynamo in a thread (the module lock makes any other importer
    wait for this one instead of importing twice). Call after `import torch`."""
    global _dynamo
    if _dynamo is None:
        _dynamo = threading.Thread(
            target=importlib.import_module,
            args=("torch._dynamo",),
            name="hogwild-import",
            daemon=True,
        )
        _dynamo.start()


def dynamo_imported() -> None:
    """Wait for `import_dynamo`'s thread; before the first optimizer, and before any fork (a
    thread inside an import when the process forks would leave the child its lock)."""
    if _dynamo is not None:
        _dynamo.join()
