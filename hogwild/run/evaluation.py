"""The orchestrator's part of evaluation: the mechanism around it, not what it measures.

What an evaluation measures belongs to its workload (hogwild.workloads.base's `Evaluator`):
the supervised test split (hogwild.workloads.supervised), the greedy policy of A3C
(hogwild.workloads.a3c). The run loop only asks the evaluator when it is due. Here:
`every_core`, the thread pool the final evaluation runs with once the workers have exited.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from hogwild.config.schema import usable_cores


@contextlib.contextmanager
def every_core(start_method: str, may_widen: bool) -> Iterator[None]:
    """The workers have exited: the final evaluation may use every core this process may run
    on, when nothing is forked from it afterwards (`may_widen`: the CLI's one job, after which
    the process exits) nor was during the run (fork workers). Otherwise it stays at one thread,
    as during training: a process whose pool ran wide hangs any child it forks that asks for
    more than one thread (OpenMP after fork), such as a sweep's next job or a Python API
    caller's own fork after `fit()`."""
    cores = usable_cores()
    if not may_widen or start_method == "fork" or cores == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        yield
    finally:
        torch.set_num_threads(before)
