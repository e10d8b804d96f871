"""What a run starts early, so that its slow parts overlap instead of adding up.

    fork_server_ahead()         before Hydra composes the config: the default start method's fork
                                server, a fresh interpreter that imports torch, hogwild.worker.main and
                                torch._dynamo (~2.3 s, the longest chain of a run's start-up)
    fork_server(start_method)   once the config is known: keeps that server, starts it again if
                                the job changed the environment or the working directory the
                                workers would inherit (hydra.job.env_set, hydra.job.chdir), or
                                stops it when the config picks fork or spawn
    stop_unused_server()        the CLI, after its jobs: a server no config kept (a refused run)
    import_dynamo()             after torch, when this process needs torch._dynamo (see
                                `needs_dynamo`): imported in a thread while the data set is built
    dynamo_imported()           waits for that thread (before any fork)

Otherwise this process never imports torch._dynamo: the optimizer check does without it
(hogwild.run.preflight), and the workers get it from the fork server or import it themselves.
Nothing here imports torch, so the CLI can call `fork_server_ahead` first thing.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading

from hogwild.process import server_guard, signals

PRELOAD = ["hogwild.process.server_guard", "hogwild.worker.main", "torch._dynamo"]
_dynamo: threading.Thread | None = None
# The fork server this module started before the config was known, and what its workers would
# inherit from it (the environment and working directory at its start); None once a config kept
# it or it was stopped.
_ahead: tuple[dict[str, str], str] | None = None


def fork_server_ahead() -> None:
    """Start the default start method's fork server before the config is composed (~0.35 s
    sooner). `fork_server` keeps it, starts it again, or stops it, once the config is known."""
    global _ahead
    from hogwild.config.schema import TrainerConfig

    if TrainerConfig().start_method == "forkserver":
        fork_server("forkserver")
        _ahead = (dict(os.environ), os.getcwd())


def fork_server(start_method: str) -> None:
    """Boot the fork server now (it takes seconds); fork needs nothing, spawn needs the
    resource tracker only."""
    global _ahead
    if _ahead is not None:
        if start_method != "forkserver" or _ahead != (dict(os.environ), os.getcwd()):
            stop_unused_server()  # workers forked from it would miss what the job set
        _ahead = None
    if start_method == "fork":
        return
    from multiprocessing import forkserver, resource_tracker

    with signals.born_deaf():  # the resource tracker and the fork server ignore Ctrl-C
        resource_tracker.ensure_running()
        if start_method == "forkserver":
            # torch and torch._dynamo are imported once, in the fork server; each worker is then
            # a cheap fork of it. The same server as torch.multiprocessing's forkserver context.
            forkserver.set_forkserver_preload(PRELOAD)
            os.environ[server_guard.PARENT_ENV] = str(os.getpid())  # hogwild.process.server_guard
            try:
                forkserver.ensure_running()
            finally:
                del os.environ[server_guard.PARENT_ENV]


def stop_unused_server() -> None:
    """Stop the server `fork_server_ahead` started, unless a config kept it (a fork server
    anyone else started is none of our business). It may still be importing, and reads its
    stop request only once its imports are done: kill it."""
    global _ahead
    if _ahead is None:
        return
    _ahead = None
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's singleton, as forkserver.ensure_running uses
    if server._forkserver_pid is not None:
        try:
            os.kill(server._forkserver_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()  # reaps it and forgets its address (CPython's own way to stop it)


def needs_dynamo(start_method: str, shared_optimizer: bool) -> bool:
    """Whether this process needs torch._dynamo (~1.1 s), which every optimizer step imports:
    forked workers inherit it, and a shared optimizer state is built here with one step."""
    return start_method == "fork" or shared_optimizer


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
