"""Where a run's wall clock goes outside training: its fixed costs, phase by phase.

    timeline = Timeline(started_at, ...)  the CLI, once per job (the Python API: Trainer.fit)
    with timeline.phase("data"): ...      each part of the run, as it happens (wall seconds)
    timeline.mark("launch")               moments the breakdown measures from
    timeline.breakdown(...)               summary.json's `fixed_costs`, printed by `hogwild bench`

Phases are wall-clock intervals of the orchestrator's process, listed in the order they began.
Evaluations during training overlap the workers' steps: they are listed apart
(`during_training`), not subtracted. What no phase covers is `other`, so that the parts add up
to the run's wall clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# Phases that overlap the workers' training: listed apart, not subtracted from the wall clock.
# `idle_core_evaluations`: the CPU seconds of hogwild.run.idle_evaluation's thread.
DURING_TRAINING = ("evaluations", "idle_core_evaluations")


class Timeline:
    """One job's phases and marks. The CLI makes one per job (a sweep's next job gets a new
    one); `Trainer` makes its own for a Python API caller."""

    def __init__(self, started_at: float, before: dict[str, float] | None = None):
        """`before` holds what happened from `started_at` to now (the interpreter and imports,
        Hydra's compose), in that order."""
        self.phases: dict[str, list[float]] = {}  # name -> [first start, seconds in all, count]
        t = started_at
        for name, seconds in (before or {}).items():
            self.phases[name] = [t, seconds, 1]
            t += seconds
        self.marks: dict[str, float] = {"begin": started_at}

    def add(self, name: str, seconds: float, start: float | None = None, count: int = 1) -> None:
        entry = self.phases.setdefault(name, [start or time.time() - seconds, 0.0, 0])
        entry[1] += seconds
        entry[2] += count

    def mark(self, name: str) -> None:
        """A moment the breakdown measures from: `launch` (the first worker is started) and
        `joined` (every worker has exited)."""
        self.marks[name] = time.time()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.add(name, time.time() - t0, t0)

    def breakdown(
        self, wall_seconds: float, first_step: float | None, last_step: float | None
    ) -> dict[str, object]:
        """{phase: seconds} in the order the phases began, with three measured between marks:
        `start_to_first_step` (workers started and ready, their first step done), `training`
        (the first step of any worker to the last) and `last_step_to_exit` (workers stopped and
        joined); then `other` (what no phase covers), `fixed_total` (all but training) and
        `during_training` (phases that overlapped training, with their counts). `first_step`
        and `last_step` are time.time() values."""
        phases, marks = self.phases, self.marks
        rows = [
            (start, k, secs) for k, (start, secs, _) in phases.items() if k not in DURING_TRAINING
        ]
        if first_step and last_step and "launch" in marks:
            rows.append((marks["launch"], "start_to_first_step", first_step - marks["launch"]))
            rows.append((first_step, "training", last_step - first_step))
            if "joined" in marks:
                rows.append((last_step, "last_step_to_exit", marks["joined"] - last_step))
        out: dict[str, object] = {k: round(secs, 3) for _, k, secs in sorted(rows)}
        covered = sum(secs for _, _, secs in rows)
        training = last_step - first_step if first_step and last_step else 0.0
        out["other"] = round(max(wall_seconds - covered, 0.0), 3)
        out["fixed_total"] = round(wall_seconds - training, 3)
        out["during_training"] = {
            k: {"seconds": round(phases[k][1], 3), "count": int(phases[k][2])}
            for k in DURING_TRAINING
            if k in phases
        }
        return out
