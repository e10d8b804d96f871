"""Signals during a run: SIGINT and SIGTERM become events for the run loop (hogwild.run_state
decides what they mean: the first stops the workers, a second forces the stop). The handler
only records the signal; nothing is raised inside whatever the orchestrator is doing.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalRelay:
    def __init__(self):
        self.pending: list[int] = []
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> SignalRelay:
        if threading.current_thread() is threading.main_thread():  # elsewhere the caller owns them
            self.saved = {s: signal.signal(s, self._record) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self.saved.items():
            signal.signal(s, old)

    def _record(self, signum: int, frame) -> None:
        self.pending.append(signum)

    def drain(self) -> list[int]:
        out, self.pending[:] = list(self.pending), []
        return out
