"""The orchestrator: the run as a recipe, and the owner of every side effect.

    prepare    hogwild.run.preflight: everything that can refuse the run, before anything is written
    share      model.share_memory() (grads None), the workload's tensors, the control block
    start      N workers through a context of `trainer.start_method` (hogwild.run.supervisor)
    watch      worker pipes + process sentinels -> hogwild.run.state -> actions; the components
               that are due (evaluation, checkpoints, node sync, dashboards) decide for themselves
    finish     stop flag -> grace -> SIGTERM -> SIGKILL -> join; final evaluation, checkpoint,
               summary.json (hogwild.run.summary)

Usable without Hydra: build a model, a `DataSplits` (or any workload, hogwild.workloads) and an
optimizer factory, then `Trainer(...).fit()`. The CLI does exactly that from the composed config.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hogwild.config.schema import CheckpointConfig, ScheduleConfig, TrainerConfig, resolve_trainer
from hogwild.distributed.node import LocalNode
from hogwild.optim import shared_state
from hogwild.process import forkserver, sharing, signals
from hogwild.process.signals import SignalRelay
from hogwild.protocol import Control, WorkerSpec
from hogwild.reporting import timeline
from hogwild.reporting.text import plural
from hogwild.run import folder as run_folder
from hogwild.run import preflight
from hogwild.run.loop import RunLoop, finish
from hogwild.run.state import RunFailed
from hogwild.run.summary import Summary
from hogwild.run.supervisor import Supervisor
from hogwild.worker.main import run_worker
from hogwild.workloads.supervised import SupervisedWorkload

log = logging.getLogger("hogwild")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        data,  # a hogwild.data.DataSplits, or a workload (hogwild.workloads.base.Workload)
        optimizer_factory: Callable[..., torch.optim.Optimizer],
        trainer: TrainerConfig = TrainerConfig(),
        batch_size: int = 64,
        output_dir: str | None = None,  # default: outputs/<model>/<date>_<time>, a fresh folder
        checkpointing: CheckpointConfig = CheckpointConfig(),
        resume_from: str
        | None = None,  # a checkpoint, or "auto": this run's own last one if there is one
        record: Mapping[str, Any] | None = None,  # the composed config, stored in checkpoints
        loss_fn: Callable[..., torch.Tensor]
        | None = None,  # default: cross_entropy, or mse_loss for regression
        started_at: float | None = None,  # time.time() the process started (for wall_seconds)
        shared_optimizer: bool
        | None = None,  # one optimizer state for all workers (hogwild.optim.shared_state); None: the workload's default
        schedule: ScheduleConfig = ScheduleConfig(),  # learning-rate rules (hogwild.optim.schedule)
        node=None,  # hogwild.distributed.torchrun.NodeSync under torchrun; LocalNode (does nothing) otherwise
        overwrite: bool = False,  # start over in an output_dir that holds a finished run
    ):
        self.cfg = resolve_trainer(trainer)
        self.model, self.optimizer_factory, self.ckpt_cfg = model, optimizer_factory, checkpointing
        is_workload = callable(getattr(data, "evaluator", None))
        self.workload = (
            data if is_workload else SupervisedWorkload(data, batch_size, self.cfg.epochs, loss_fn)
        )
        if output_dir is None:
            output_dir = run_folder.fresh(os.path.join("outputs", type(model).__name__.lower()))
        self.output_dir, self.resume_from = os.path.abspath(output_dir), resume_from
        self.overwrite = overwrite
        self.record, self.started_at = dict(record or {}), started_at or time.time()
        if shared_optimizer is None:  # A3C shares its optimizer state by default
            shared_optimizer = getattr(self.workload, "shared_optimizer", False)
        self.shared_optimizer, self.schedule, self.node = (
            shared_optimizer,
            schedule,
            node or LocalNode(),
        )
        self.summary: Summary | None = None

    def fit(self) -> dict[str, Any]:
        """Train to the end (or to a failure or interrupt); returns the summary it wrote."""
        # One run per folder (hogwild.run.folder); only the node that writes claims it.
        folder = run_folder.claim(self.output_dir) if self.node.is_writer else run_folder.Claim("")
        self.stack_dir = tempfile.mkdtemp(prefix="hogwild-stacks-")  # hung workers' stacks
        previous = signals.install()  # the Python API: from here (the CLI has done it already)
        if not timeline.started():  # the Python API: the run's phases count from here
            timeline.begin(self.started_at)
        try:
            with folder if self.node.is_writer else contextlib.nullcontext():
                return self._fit(folder)
        finally:
            signals.restore(previous)
            shutil.rmtree(self.stack_dir, ignore_errors=True)

    def _fit(self, folder: run_folder.Claim) -> dict[str, Any]:
        t_fit = time.monotonic()
        plan = self._prepare()
        # file_system: share_memory() may start torch_shm_manager
        with signals.born_deaf(), timeline.phase("sharing"):
            task, control, optimizer_state = share(self, plan)
        # Held as long as the Trainer: the CLI keeps it until the process exits, since freeing a
        # file_system tensor after torch_shm_manager died aborts the process (hogwild.cli.main.run).
        self.shared = (task, control, optimizer_state)
        self.node.attach(list(self.model.parameters()), control.progress)
        self.node.broadcast(
            [
                *self.model.parameters(),
                *self.model.buffers(),
                *shared_state.tensors(optimizer_state),
            ]
        )
        spec = worker_spec(self, plan, task)
        # The model and the task's tensors are referenced here until the supervisor has joined
        # every worker (the finally below): a CUDA producer must outlive the consumers of its tensors.
        supervisor = Supervisor(
            self.cfg.start_method,
            run_worker,
            lambda rank: (spec, self.model, control, optimizer_state),
        )
        with SignalRelay() as relay:
            loop = RunLoop(self, plan, control, optimizer_state, supervisor, relay, t_fit)
            try:
                self._announce()
                folder.started = True  # from here on the run's files are kept, whatever happens
                timeline.mark("launch")
                for rank in range(self.cfg.num_workers):
                    supervisor.start(rank)
                loop.watch()
            except BaseException as e:
                loop.apply(RunFailed(f"orchestrator error: {type(e).__name__}: {e}"))
                raise
            finally:
                supervisor.terminate()
                timeline.mark("joined")
                self.summary = finish(loop)
        return self.summary.to_dict()

    def _prepare(self) -> preflight.Plan:
        """Everything that can refuse the run (hogwild.run.preflight), while the fork server boots."""
        forkserver.fork_server(self.cfg.start_method)
        if forkserver.needs_dynamo(self.cfg.start_method, self.shared_optimizer):
            forkserver.import_dynamo()
        with timeline.phase("checks"):
            plan = preflight.prepare(
                self.cfg,
                self.model,
                self.workload,
                self.optimizer_factory,
                self.output_dir,
                self.resume_from,
                self.node,
                self.overwrite,
            )
        if self.overwrite and self.node.is_writer:
            run_folder.clear_outputs(self.output_dir)  # checked: the run starts now
        if plan.resume_from and plan.progress is not None:
            log.info(
                "resumed from %s at %s %s",
                plan.resume_from,
                f"{int(plan.progress[:, Control.SAMPLES].sum()):,}",
                self.workload.unit,
            )
        return plan

    def _announce(self) -> None:
        c = self.cfg
        log.info(
            "training %s on %s: %s, %s (%s, %s, %s each)",
            type(self.model).__name__,
            self.workload.name,
            self.workload.describe(),
            plural(c.num_workers, "worker"),
            c.start_method,
            c.sharing_strategy,
            plural(c.threads_per_worker, "thread"),
        )


def share(t: Trainer, plan: preflight.Plan):
    """The run's tensors into shared memory (or onto the GPU): the model (in the plan's layout),
    the workload's tensors, the shared optimizer state if any, and the control block."""
    sharing.set_sharing_strategy(t.cfg.sharing_strategy)
    t.model.to(plan.device)
    if plan.layout.channels_last:  # 4-D weights only; the shared data is laid out to match, once
        t.model.to(memory_format=torch.channels_last)
    t.model.zero_grad(set_to_none=True)  # each worker allocates its own grads
    t.model.share_memory()  # CUDA tensors need no move: they are shared through CUDA IPC
    task = t.workload.task(plan.device if plan.data_on_device else torch.device("cpu"), plan.layout)
    state: shared_state.State = []
    if t.shared_optimizer:  # built on the device, in the layout, the workers' parameters have
        state = shared_state.build(t.optimizer_factory, list(t.model.parameters()))
        if t.node.is_writer and plan.resume_from:  # other nodes receive rank 0's with the weights
            shared_state.restore_or_warn(state, plan.optimizer_state, plan.resume_from)
        shared_state.share(state)
        preflight.check_fds(plan.num_shared + len(shared_state.tensors(state)), t.cfg)
    control = Control(t.cfg.num_workers)
    if plan.progress is not None:
        control.progress.copy_(plan.progress)
    return task, control, state


def worker_spec(t: Trainer, plan: preflight.Plan, task) -> WorkerSpec:
    c = t.cfg
    return WorkerSpec(
        num_workers=c.num_workers,
        seed=c.seed,
        threads=c.threads_per_worker,
        sharing_strategy=c.sharing_strategy,
        device=str(plan.device),
        log_every_n_steps=c.log_every_n_steps,
        optimizer_factory=t.optimizer_factory,
        skip_nonfinite=c.skip_nonfinite,
        schedule=t.schedule,
        total_units=t.workload.total_units,
        orchestrator_pid=os.getpid(),
        task=task,
        stack_dir=t.stack_dir,
    )
