"""What a worker process sets up for itself before any work (hogwild.worker.main.run_worker): it
never outlives the orchestrator, it dumps its stack when the orchestrator judges it hung, and
its log records travel over its pipe to the orchestrator's console and train.log.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import threading
import time

from hogwild.protocol import Log

PR_SET_PDEATHSIG = 1


def die_with_orchestrator(orchestrator_pid: int) -> None:
    """Never outlive the orchestrator, even when it is killed with SIGKILL.

    PR_SET_PDEATHSIG covers fork and spawn (our parent is the orchestrator) and forkserver
    (our parent is the fork server, which exits when the orchestrator's end of its pipe closes).
    The watchdog thread covers the rest (a parent that died before prctl ran, non-Linux).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            try:
                os.kill(orchestrator_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            if os.getppid() == 1:  # re-parented to init: our parent is gone
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, name="hogwild-watchdog", daemon=True).start()


def dump_stack_on_request(folder: str, rank: int) -> None:
    """SIGUSR1 writes every thread's Python stack to <folder>/<rank>.txt: what the orchestrator
    logs about a worker it judges hung (trainer.stall_seconds). faulthandler does it from C, so
    it works even while the worker is stuck inside a call that never returns."""
    if not folder:
        return
    try:
        out = open(os.path.join(folder, f"{rank}.txt"), "w")
    except OSError:
        return
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)


class PipeLogHandler(logging.Handler):
    """Forwards log records to the orchestrator, which prints them without breaking its bar."""

    def __init__(self, rank: int, conn):
        super().__init__()
        self.rank, self.conn = rank, conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.conn.send(Log(self.rank, record.levelno, self.format(record)))
        except Exception:  # noqa: BLE001 - the orchestrator is gone; logging must never raise
            pass
