"""The orchestrator: the run as a recipe (set up, prepare, share, start, watch, finish; drawn
with the modules behind each step in docs/design.md), and the owner of every side effect.

Usable without Hydra: build a model, a `DataSplits` (or any workload, hogwild.workloads.base)
and an optimizer factory, then `Trainer(...).fit()`. The CLI does exactly that from the composed
config, and hands in the job's set-up (hogwild.run.context.RunSetup).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hogwild.config.schema import CheckpointConfig, ScheduleConfig, TrainerConfig, resolve_trainer
from hogwild.data.base import DataSplits
from hogwild.distributed.node import LocalNode, Node
from hogwild.errors import PreflightError
from hogwild.optim import shared_state
from hogwild.process import forkserver, main_guard, sharing, signals
from hogwild.process.signals import SignalRelay
from hogwild.protocol import Control, WorkerSpec
from hogwild.reporting.text import plural
from hogwild.reporting.timeline import Timeline
from hogwild.run import folder as run_folder
from hogwild.run import preflight
from hogwild.run.context import RunContext, RunSetup
from hogwild.run.loop import RunLoop
from hogwild.run.state import RunFailed
from hogwild.run.summary import Summary
from hogwild.run.supervisor import Supervisor
from hogwild.worker.main import run_worker
from hogwild.workloads.base import Workload
from hogwild.workloads.supervised import SupervisedWorkload

log = logging.getLogger("hogwild")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        data: DataSplits | Workload,  # a data set, or any workload (hogwild.workloads.base)
        optimizer_factory: Callable[..., torch.optim.Optimizer],
        trainer: TrainerConfig = TrainerConfig(),
        batch_size: int = 64,
        output_dir: str | None = None,  # default: outputs/<model>/<date>_<time>, a fresh folder
        checkpointing: CheckpointConfig = CheckpointConfig(),
        # a checkpoint, or "auto": this run's own last one if there is one
        resume_from: str | None = None,
        record: Mapping[str, Any] | None = None,  # the composed config, stored in checkpoints
        # default: cross_entropy, or mse_loss for regression
        loss_fn: Callable[..., torch.Tensor] | None = None,
        started_at: float | None = None,  # time.time() the process started (for wall_seconds)
        # one optimizer state for all workers (hogwild.optim.shared_state); None: the
        # workload's default
        shared_optimizer: bool | None = None,
        schedule: ScheduleConfig = ScheduleConfig(),  # learning-rate rules (hogwild.optim.schedule)
        node: Node | None = None,  # a torchrun NodeSync; LocalNode (does nothing) otherwise
        overwrite: bool = False,  # start over in an output_dir that holds a finished run
        setup: RunSetup | None = None,  # the CLI's; None: fit() sets the run up itself
    ):
        self.cfg = resolve_trainer(trainer)
        self.model, self.optimizer_factory, self.ckpt_cfg = model, optimizer_factory, checkpointing
        self.workload: Workload = (
            data
            if isinstance(data, Workload)
            else SupervisedWorkload(data, batch_size, self.cfg.epochs, loss_fn)
        )
        if output_dir is None:
            output_dir = run_folder.fresh(run_folder.script_outputs())
        self.output_dir, self.resume_from = os.path.abspath(output_dir), resume_from
        self.overwrite = overwrite
        self.record, self.started_at = dict(record or {}), started_at or time.time()
        if shared_optimizer is None:  # A3C shares its optimizer state by default
            shared_optimizer = getattr(self.workload, "shared_optimizer", False)
        self.shared_optimizer, self.schedule = shared_optimizer, schedule
        self.node: Node = node or LocalNode()
        self.setup = setup
        self.summary: Summary | None = None
        # Held as long as the Trainer: the CLI keeps it until the process exits, since freeing
        # a file_system tensor after torch_shm_manager died aborts the process (hogwild.cli.main.run).
        self.shared: RunContext | None = None

    def fit(self) -> dict[str, Any]:
        """Train to the end (or to a failure or interrupt); returns the summary it wrote."""
        # A spawn or forkserver worker re-running a script without a `__main__` guard: no
        # second run inside it (no folder claimed, nothing written); its orchestrator says why.
        if main_guard.bootstrapping():
            main_guard.refuse_in_worker()
        # ... and the Python API refuses such a script itself, when it can tell, before anything
        # is written or started (the CLI's own entry points are guarded).
        if self.setup is None and main_guard.unguarded_main(self.cfg.start_method):
            raise PreflightError(main_guard.unguarded_message())
        stack_dir = tempfile.mkdtemp(prefix="hogwild-stacks-")  # hung workers' stacks
        try:
            if self.setup is not None:  # the CLI's job: set up already, before torch's import
                return self._fit(self.setup, stack_dir)
            return self._set_up_and_fit(stack_dir)
        finally:
            shutil.rmtree(stack_dir, ignore_errors=True)

    def _set_up_and_fit(self, stack_dir: str) -> dict[str, Any]:
        """The Python API: the run sets itself up, as the CLI does for a job. Signals from here;
        one run per folder (hogwild.run.folder), claimed by the node that writes; the fork
        server boots while pre-flight checks the run."""
        setup = RunSetup.for_python_api(self.started_at)
        previous = signals.install()
        try:
            if self.node.is_writer:
                setup.claim = run_folder.Claim(self.output_dir)
            with setup.claim or contextlib.nullcontext():
                forkserver.fork_server(self.cfg.start_method)
                if forkserver.needs_dynamo(
                    self.cfg.start_method, self.shared_optimizer, self.optimizer_factory
                ):
                    forkserver.import_dynamo()
                return self._fit(setup, stack_dir)
        finally:
            signals.restore(previous)

    def _fit(self, setup: RunSetup, stack_dir: str) -> dict[str, Any]:
        t_fit = time.monotonic()
        timeline = setup.timeline
        plan = self._prepare(timeline)
        # file_system: share_memory() may start torch_shm_manager
        with signals.born_deaf(), timeline.phase("sharing"):
            task, control, optimizer_state = self._share(plan)
        # the checkpoint's optimizer state is in the shared one now: its tensors map the
        # checkpoint file (hogwild.run.checkpoint.load), which must not stay mapped all run
        plan = dataclasses.replace(plan, optimizer_state=None)
        ctx = self.shared = RunContext(
            cfg=plan.trainer,
            model=self.model,
            workload=self.workload,
            task=task,
            optimizer_factory=self.optimizer_factory,
            plan=plan,
            control=control,
            optimizer_state=optimizer_state,
            node=self.node,
            output_dir=self.output_dir,
            checkpointing=self.ckpt_cfg,
            schedule=self.schedule,
            shared_optimizer=self.shared_optimizer,
            record=self.record,
            started_at=self.started_at,
            stack_dir=stack_dir,
            setup=setup,
        )
        self.node.attach(list(self.model.parameters()), control.progress)
        self.node.broadcast(
            [
                *self.model.parameters(),
                *self.model.buffers(),
                *shared_state.tensors(optimizer_state),
            ]
        )
        spec = worker_spec(ctx)
        # The model and the task's tensors are referenced here until the supervisor has joined
        # every worker (the finally below): a CUDA producer must outlive the consumers of its tensors.
        supervisor = Supervisor(
            self.cfg.start_method,
            run_worker,
            lambda rank: (spec, self.model, control, optimizer_state),
        )
        with SignalRelay() as relay:
            loop = RunLoop(ctx, supervisor, relay, t_fit)
            try:
                self._announce()
                if (
                    setup.claim is not None
                ):  # from here on the run's files are kept, whatever happens
                    setup.claim.started = True
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
                self.summary = loop.finish()
        return self.summary.to_dict()

    def _prepare(self, timeline: Timeline) -> preflight.Plan:
        """Everything that can refuse the run (hogwild.run.preflight), while the fork server boots."""
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
                self.shared_optimizer,
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

    def _share(self, plan: preflight.Plan):
        """The run's tensors into shared memory (or onto the GPU): the model (in the plan's
        layout), the workload's tensors, the shared optimizer state if any, and the control block."""
        sharing.set_sharing_strategy(self.cfg.sharing_strategy)
        self.model.to(plan.device)
        if plan.layout.channels_last:  # 4-D weights only; the shared data is laid out to match
            self.model.to(memory_format=torch.channels_last)
        self.model.zero_grad(set_to_none=True)  # each worker allocates its own grads
        # A failure to map a segment (the address-space limit: ulimit -v) is one line naming
        # what could not be shared, and leaves nothing in /dev/shm (hogwild.process.sharing).
        with sharing.translating_failures("the model", "a smaller model"):
            self.model.share_memory()  # CUDA tensors need no move: shared through CUDA IPC
        home = plan.device if plan.data_on_device else torch.device("cpu")
        with sharing.translating_failures("the training data", "a smaller data set"):
            task = self.workload.task(home, plan.layout)
        state: shared_state.State = []
        if (
            self.shared_optimizer
        ):  # built on the device, in the layout, the workers' parameters have
            what = "the shared optimizer state"
            with sharing.translating_failures(
                what, "a per-worker optimizer state or a smaller model"
            ):
                # big state tensors (row-wise Adagrad's) are made in shared memory, not copied there
                cpu = plan.device.type == "cpu"
                with sharing.born_shared(what=what) if cpu else contextlib.nullcontext():
                    state = shared_state.build(
                        self.optimizer_factory, list(self.model.parameters())
                    )
                if (
                    self.node.is_writer and plan.resume_from
                ):  # other nodes get rank 0's with the weights
                    shared_state.restore_or_warn(state, plan.optimizer_state, plan.resume_from)
                shared_state.share(state)
            preflight.check_fds(plan.num_shared + len(shared_state.tensors(state)), self.cfg)
        with sharing.translating_failures("the control block", "fewer workers"):
            control = Control(self.cfg.num_workers)
        if plan.progress is not None:
            control.progress.copy_(plan.progress)
        return task, control, state

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


def worker_spec(ctx: RunContext) -> WorkerSpec:
    c = ctx.cfg
    return WorkerSpec(
        num_workers=c.num_workers,
        seed=c.seed,
        threads=c.threads_per_worker,
        sharing_strategy=c.sharing_strategy,
        device=str(ctx.plan.device),
        log_every_n_steps=c.log_every_n_steps,
        optimizer_factory=ctx.optimizer_factory,
        skip_nonfinite=c.skip_nonfinite,
        schedule=ctx.schedule,
        total_units=ctx.workload.total_units,
        orchestrator_pid=os.getpid(),
        task=ctx.task,
        stack_dir=ctx.stack_dir,
    )
