"""What a run is given, built once and passed to the parts that need it.

RunSetup     the process around the run, set up once by its owner: the CLI for each job
             (the claimed folder, the timeline, whether the process ends with the run);
             `Trainer.fit` makes its own for a Python API caller
RunContext   the run itself, frozen once its tensors are shared: config, model, workload,
             plan, control block, node, paths; the run loop, the evaluations, the
             checkpointer and the summary read what they need from it, and nothing reaches
             through another object for it
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hogwild.config.schema import CheckpointConfig, ScheduleConfig, TrainerConfig
from hogwild.distributed.node import Node
from hogwild.optim import shared_state
from hogwild.protocol import Control
from hogwild.reporting.timeline import Timeline
from hogwild.run.folder import Claim
from hogwild.run.preflight import Plan
from hogwild.workloads.base import Task, Workload


@dataclasses.dataclass
class RunSetup:
    timeline: Timeline  # the job's fixed costs, phase by phase (summary.json's fixed_costs)
    claim: Claim | None = None  # the run folder, held; None: the Trainer claims it itself
    # The process exits after this run and forks nothing more (the CLI's one job): the final
    # evaluation may widen this process's thread pool (hogwild.run.evaluation.every_core).
    last_run_in_process: bool = False

    @classmethod
    def for_python_api(cls, started_at: float | None = None) -> RunSetup:
        return cls(Timeline(started_at or time.time()))


@dataclasses.dataclass(frozen=True)
class RunContext:
    cfg: TrainerConfig  # every `auto` resolved (the plan's)
    model: torch.nn.Module  # its parameters in shared memory (or on the GPU)
    workload: Workload
    task: Task  # the workers' half of the workload, with the tensors it shared
    optimizer_factory: Callable[..., torch.optim.Optimizer]
    plan: Plan
    control: Control  # the shared control block: stop flag, progress table, staleness
    optimizer_state: shared_state.State  # the shared optimizer state ([] when per worker)
    node: Node  # LocalNode, or a torchrun NodeSync
    output_dir: str
    checkpointing: CheckpointConfig
    schedule: ScheduleConfig
    shared_optimizer: bool
    record: Mapping[str, Any]  # the composed config, stored in checkpoints
    started_at: float  # time.time() the process (or the Python API's fit) started
    stack_dir: str  # where hung workers' stacks are dumped
    setup: RunSetup
