"""One rule for "every N steps or every N seconds", used wherever something is due now and then:
periodic checkpoints, model-averaging rounds between nodes, writes to the dashboards,
evaluations of a reinforcement-learning policy.

    every = Cadence(every_n=500, every_seconds=60)
    if every.due(steps):     # N more steps since the last mark, or N seconds
        save()
        every.mark(steps)

0 switches a half off; both 0 and it is never due. The clock is injectable, so the rule is
tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Cadence:
    def __init__(
        self,
        every_n: int = 0,
        every_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        start: int = 0,
    ):
        self.every_n, self.every_seconds, self.clock = every_n, every_seconds, clock
        self.count_at, self.time_at = start, clock()

    @property
    def enabled(self) -> bool:
        return bool(self.every_n or self.every_seconds)

    def due(self, count: int) -> bool:
        return bool(
            (self.every_n and count - self.count_at >= self.every_n)
            or (self.every_seconds and self.clock() - self.time_at >= self.every_seconds)
        )

    def mark(self, count: int) -> None:
        self.count_at, self.time_at = count, self.clock()

    def seconds_left(self) -> float:
        """How long until the time half is due (inf without one): how long a loop may sleep."""
        if not self.every_seconds:
            return float("inf")
        return max(0.0, self.every_seconds - (self.clock() - self.time_at))
