"""What a run starts early, so that its slow parts overlap instead of adding up.

    fork_server(start_method)   before this process imports torch: the fork server is a fresh
                                interpreter that imports torch, hogwild.worker and torch._dynamo
                                (~3 s) while this process imports torch and builds the data
    import_dynamo()             after torch: torch._dynamo (~1.5 s, what the first optimizer
                                imports) in a thread, while the data set is generated or loaded
    dynamo_imported()           waits for it (the optimizer check needs it; fork workers inherit it)

Nothing here imports torch, so the CLI can call `fork_server` first thing.
"""

from __future__ import annotations

import importlib
import os
import threading

from hogwild import lifetime, server_guard

PRELOAD = ["hogwild.server_guard", "hogwild.worker", "torch._dynamo"]
_dynamo: threading.Thread | None = None


def fork_server(start_method: str) -> None:
    """Boot the fork server now (it takes seconds); fork needs nothing, spawn needs the
    resource tracker only."""
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
