"""The fork server dies with the process that started it.

Imported first of the fork server's preload modules (hogwild.process.forkserver.PRELOAD). The server is
started before the orchestrator imports torch, and imports torch itself for seconds; CPython's
fork server only notices that its parent is gone once its preload is done, so an orchestrator
killed at start-up would leave it importing, holding the terminal's pipes. With
PR_SET_PDEATHSIG the kernel kills it at once, and its workers follow (hogwild.worker.setup).

It acts only in the process the orchestrator marked (HOGWILD_FORKSERVER_PARENT, the
orchestrator's pid, set while it starts the server): importing it anywhere else does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_ENV = "HOGWILD_FORKSERVER_PARENT"
PR_SET_PDEATHSIG = 1


def guard() -> None:
    """Tie this process's life to the orchestrator's, if the orchestrator marked it."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent is None:
        return
    if parent != str(os.getppid()):
        try:
            os.kill(int(parent), 0)
        except ProcessLookupError:  # it died before this line (a Ctrl-C as the CLI starts)
            os._exit(1)
        return  # started through a wrapper (multiprocessing.set_executable): no guard
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # it died before prctl: nothing would signal us
        os._exit(1)


guard()
