"""What a run starts early, so that its slow parts overlap instead of adding up.

    ServerAhead.start()         before Hydra composes the config: the default start method's fork
                                server, a fresh interpreter that imports torch, hogwild.worker.main
                                and torch._dynamo (~2.3 s, the longest chain of a run's start-up)
    ahead.settle(start_method)  once the config is known: keeps that server, starts it again if
                                the job changed the environment or the working directory the
                                workers would inherit (hydra.job.env_set, hydra.job.chdir), or
                                stops it when the config picks fork or spawn
    ahead.stop_unless_kept()    the CLI, after its jobs: a server no config kept (a refused run)
    fork_server(start_method)   what the start method needs, booted now (the Python API's way)
    import_dynamo()             after torch, when this process needs torch._dynamo (see
                                `needs_dynamo`): imported in a thread while the data set is built
    dynamo_imported()           waits for that thread (before any fork)

Otherwise this process never imports torch._dynamo: the optimizer check does without it
(hogwild.run.preflight), and the workers get it from the fork server or import it themselves.
Nothing here imports torch, so the CLI can call `ServerAhead.start` first thing.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

from hogwild.process import server_guard, signals

PRELOAD = ["hogwild.process.server_guard", "hogwild.worker.main", "torch._dynamo"]
DYNAMO_THREAD = "hogwild-import"  # the thread that imports torch._dynamo (`import_dynamo`)


class ServerAhead:
    """The fork server started before the config was known, and what its workers would inherit
    from it (the environment and working directory at its start). The CLI owns it: `settle`
    once a job's config is known, `stop_unless_kept` after its jobs."""

    def __init__(self):
        self.inherited: tuple[dict[str, str], str] | None = None  # None: kept, stopped or none

    @classmethod
    def start(cls) -> ServerAhead:
        """Start the default start method's fork server before the config is composed (~0.35 s
        sooner)."""
        from hogwild.config.schema import TrainerConfig

        ahead = cls()
        if TrainerConfig().start_method == "forkserver":
            fork_server("forkserver")
            ahead.inherited = (dict(os.environ), os.getcwd())
        return ahead

    def settle(self, start_method: str) -> None:
        """The config is known: keep the server, or stop it when the config picks fork or spawn
        or the job changed what its workers would inherit (hydra.job.env_set, hydra.job.chdir);
        then boot what the start method needs (`fork_server`)."""
        if self.inherited is not None:
            if start_method != "forkserver" or self.inherited != (dict(os.environ), os.getcwd()):
                self.stop_unless_kept()  # workers forked from it would miss what the job set
            self.inherited = None
        fork_server(start_method)

    def stop_unless_kept(self) -> None:
        """Stop the server started ahead, unless a config kept it (a fork server anyone else
        started is none of our business). It may still be importing, and reads its stop
        request only once its imports are done: kill it."""
        if self.inherited is None:
            return
        self.inherited = None
        from multiprocessing import forkserver

        server = forkserver._forkserver  # the module's singleton, as forkserver.ensure_running uses
        if server._forkserver_pid is not None:
            try:
                os.kill(server._forkserver_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server._stop()  # reaps it and forgets its address (CPython's own way to stop it)


def fork_server(start_method: str) -> None:
    """Boot the fork server now (it takes seconds; a running one is kept); fork needs nothing,
    spawn needs the resource tracker only."""
    if start_method == "fork":
        return
    from multiprocessing import forkserver

    signals.start_resource_tracker()  # first: it unblocks the signals it launches with
    with signals.born_deaf():  # the fork server ignores Ctrl-C
        if start_method == "forkserver":
            # torch and torch._dynamo are imported once, in the fork server; each worker is then
            # a cheap fork of it. The same server as torch.multiprocessing's forkserver context.
            forkserver.set_forkserver_preload(PRELOAD)
            os.environ[server_guard.PARENT_ENV] = str(os.getpid())  # hogwild.process.server_guard
            try:
                forkserver.ensure_running()
            finally:
                del os.environ[server_guard.PARENT_ENV]


def needs_dynamo(start_method: str, shared_optimizer: bool, optimizer: object = None) -> bool:
    """Whether this process needs torch._dynamo (~1.1 s), which every optimizer step imports:
    forked workers inherit it, and a shared optimizer state is built here with one step, unless
    the optimizer class (`optimizer`, or the factory of one) says its state itself
    (`initial_state`, hogwild.optim.shared_state.build)."""
    cls = getattr(optimizer, "func", optimizer)
    return start_method == "fork" or (shared_optimizer and not hasattr(cls, "initial_state"))


def import_dynamo() -> None:
    """Start importing torch._dynamo in a thread (the module lock makes any other importer
    wait for this one instead of importing twice). Call after `import torch`."""
    if "torch._dynamo" in sys.modules or _dynamo_thread() is not None:
        return
    threading.Thread(
        target=importlib.import_module, args=("torch._dynamo",), name=DYNAMO_THREAD, daemon=True
    ).start()


def dynamo_imported() -> None:
    """Wait for `import_dynamo`'s thread; before the first optimizer, and before any fork (a
    thread inside an import when the process forks would leave the child its lock)."""
    if (thread := _dynamo_thread()) is not None:
        thread.join()


def _dynamo_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == DYNAMO_THREAD), None)
