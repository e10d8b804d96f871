"""The worker process. One per rank; every one trains the same shared parameters, lock-free.

A worker is a polite tenant: before any torch work it sets the sharing strategy, its thread
count and its seed; then it hands a `WorkerContext` to the workload's task (hogwild.workloads),
which decides what one step is (a batch of the shared data, a rollout in an environment). The
context does the rest of every step the same way for every workload: the non-finite check, the
staleness count, the learning-rate schedule, the optimizer step on the shared parameters, the
progress counters and the reports (see protocol.py). A worker never touches TensorBoard,
progress bars or files.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback

import torch

from hogwild.optim import shared_state
from hogwild.optim.schedule import Scheduler
from hogwild.process.signals import ignore_terminal_signals
from hogwild.protocol import Control, Done, EpochEnd, Failure, Hello, Scalars, WorkerSpec
from hogwild.reporting import staleness
from hogwild.worker import heap, setup

log = logging.getLogger("hogwild")


def run_worker(rank: int, spec: WorkerSpec, model, control: Control, optimizer_state, conn) -> None:
    """Entry point of a worker process (a top-level function, so it pickles under spawn)."""
    # Ctrl-C and a hangup reach the whole process group; only the orchestrator decides.
    ignore_terminal_signals()
    # Visible to user code (models, data) that wants to know where it runs.
    os.environ["HOGWILD_RANK"], os.environ["HOGWILD_NUM_WORKERS"] = str(rank), str(spec.num_workers)
    setup.die_with_orchestrator(spec.orchestrator_pid)
    setup.dump_stack_on_request(spec.stack_dir, rank)
    torch.multiprocessing.set_sharing_strategy(spec.sharing_strategy)
    torch.set_num_threads(spec.threads)
    heap.keep_freed_memory()  # every step reuses the last one's pages (hogwild/worker/heap.py)
    torch.manual_seed(spec.seed + rank)
    # sparse gradients (nn.Embedding(sparse=True)) come from torch itself: an explicit opt-out of
    # the per-op invariant checks, which also keeps torch from warning about them in every worker
    torch.sparse.check_sparse_tensor_invariants.disable()
    root = logging.getLogger()
    root.handlers[:] = [setup.PipeLogHandler(rank, conn)]
    root.setLevel(logging.INFO)
    code = 0
    try:
        conn.send(
            Hello(rank, torch.multiprocessing.get_sharing_strategy(), torch.get_num_threads())
        )
        context = WorkerContext(rank, spec, model, control, optimizer_state, conn)
        spec.task.run(context)
        context.report.flush()
        conn.send(Done(rank))
    except NonFinite as e:
        code = 1
        _report_failure(conn, Failure(rank, "nonfinite", str(e), ""))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the orchestrator
        code = 1
        _report_failure(
            conn, Failure(rank, "exception", f"{type(e).__name__}: {e}", traceback.format_exc())
        )
    finally:
        conn.close()
        # Skip interpreter teardown (about a second with torch loaded, under spawn): nothing
        # here needs it. Shared segments are released by the kernel / torch_shm_manager.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _report_failure(conn, failure: Failure) -> None:
    try:
        conn.send(failure)
    except OSError:
        pass


def grads_finite(params: list[torch.Tensor]) -> bool:
    """Whether every gradient is finite: one sum per tensor (NaN and inf survive a sum; a sum
    that overflows is a gradient no step should take either). On the CPU each sum is read at
    once: a third of the cost of stacking them into one tensor first, for a small model."""
    sums = [
        (p.grad._values() if p.grad.is_sparse else p.grad).sum()
        for p in params
        if p.grad is not None
    ]
    if not sums:
        return True
    if sums[0].device.type == "cpu":
        return math.isfinite(sum(s.item() for s in sums))
    return bool(torch.isfinite(torch.stack(sums).float().sum()))  # one device sync


class NonFinite(RuntimeError):
    """A non-finite loss, with skip_nonfinite=false: the run fails (a restart would not help)."""


class _Reporter:
    """The worker's row of the shared report table (Control.reports): the loss summed over
    steps, published every `every` steps, plus the skipped batches, the learning rate and the
    times of the first and the latest step. The orchestrator samples the table when it is due;
    nothing is sent.

    The loss is summed where it lives: on the GPU `float()` is a device sync, paid once per
    publication instead of once per step.
    """

    def __init__(self, row, optimizer, device: torch.device, every: int):
        self.row, self.optimizer, self.device, self.every = row, optimizer, device, every
        self.warned = False
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self.loss_sum = 0.0 if self.device.type == "cpu" else torch.zeros((), device=self.device)

    def step(self, loss) -> None:
        self.loss_sum += loss
        self.steps += 1
        if not self.row[Control.T_FIRST]:
            self.row[Control.T_FIRST] = time.monotonic()
        if self.steps == self.every:
            self.flush()

    def skip(self, rank: int) -> None:
        """A batch whose loss or gradients were not finite, skipped (skip_nonfinite=true)."""
        self.row[Control.SKIPPED] += 1
        if not self.warned:
            self.warned = True
            log.warning("worker %d: skipping a batch with a non-finite loss or gradient", rank)

    def flush(self) -> None:
        if self.steps == 0:
            return
        total = float(self.loss_sum)
        if not math.isfinite(total):
            raise NonFinite(f"non-finite loss in the last {self.steps} steps")
        row = self.row
        row[Control.LR] = self.optimizer.param_groups[0]["lr"]
        row[Control.LOSS] += total
        row[Control.LOSS_STEPS] += self.steps
        row[Control.T_LAST] = time.monotonic()
        self._reset()


class WorkerContext:
    """What a workload's task sees of the framework inside one worker.

    A task's step is: `begin()`, forward, `step(loss, units, batch)`. The context owns the
    rest, identically for every workload."""

    def __init__(
        self,
        rank: int,
        spec: WorkerSpec,
        model: torch.nn.Module,
        control: Control,
        optimizer_state,
        conn,
    ):
        self.rank, self.num_workers, self.seed, self.model, self.conn = (
            rank,
            spec.num_workers,
            spec.seed,
            model,
            conn,
        )
        self.device = torch.device(spec.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # numpy views of shared memory: a flag read or a counter write costs nanoseconds
        self._stop = control.stop.numpy()
        self._row = control.progress.numpy()[rank]
        self._all_steps = control.progress.numpy()[:, Control.STEPS]  # others' updates
        self._all_samples = control.progress.numpy()[:, Control.SAMPLES]  # drives the lr
        self._stale_row = control.staleness.numpy()[rank]
        model.train()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = spec.optimizer_factory(model.parameters())
        if optimizer_state:  # optimizer.shared=true: adopt the one state every worker updates
            shared_state.attach(self.optimizer, list(model.parameters()), optimizer_state)
        self.scheduler = Scheduler(
            self.optimizer, spec.schedule, spec.num_workers, spec.total_units
        )
        self.log_every = spec.log_every_n_steps
        self.report = _Reporter(
            control.reports.numpy()[rank], self.optimizer, self.device, self.log_every
        )
        self.skip_nonfinite = spec.skip_nonfinite
        # On the CPU reading the loss is free, so a bad batch is caught before its update
        # reaches the shared weights. On CUDA that is a sync per step: checked per report,
        # unless the user asked to skip bad batches.
        self.check_each_step = self.device.type == "cpu" or spec.skip_nonfinite
        self._read_at = 0

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, batch) where this rank goes on: 0/0 for a fresh run; a replacement worker or
        a resumed run continues at the first batch not yet applied."""
        return int(self._row[Control.EPOCH]), int(self._row[Control.BATCH])

    def stopping(self) -> bool:
        return bool(self._stop[0])

    def global_units(self) -> int:
        """Samples (or environment steps) of all workers together so far."""
        return int(self._all_samples.sum())

    def begin(self) -> None:
        """Before the forward pass: fresh gradients, and the update count the read sees."""
        self.optimizer.zero_grad(set_to_none=True)
        self._read_at = int(self._all_steps.sum())

    def step(self, loss: torch.Tensor, units: int, batch: int, max_grad_norm: float = 0.0) -> bool:
        """Backward and update the shared weights; `batch` is where this rank stands in its
        epoch once this step is done; `max_grad_norm` > 0 clips the gradient's norm before the
        update. False when a non-finite batch was skipped."""
        value = loss.item() if self.check_each_step else loss.detach()
        problem = "loss" if self.check_each_step and not math.isfinite(value) else None
        if problem is None:
            loss.backward()
            if self.check_each_step and not grads_finite(self.params):
                problem = "gradient"  # a finite loss can still have NaN/inf gradients
        if problem is not None:  # caught before the optimizer touches the shared weights
            if self.skip_nonfinite:
                self.report.skip(self.rank)
                return False
            what = f"loss ({value})" if problem == "loss" else problem
            raise NonFinite(f"non-finite {what} at epoch {self.position[0]}, batch {batch - 1}")
        staleness.record(
            self._stale_row, int(self._all_steps.sum()) - self._read_at
        )  # others' updates since
        if self.scheduler.active:
            self.scheduler.update(self.global_units())
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
        self.optimizer.step()
        row = self._row
        row[Control.BATCH] = batch
        row[Control.SAMPLES] += units
        row[Control.STEPS] += 1
        self.report.step(value)
        return True

    def scalars(self, values: dict[str, float]) -> None:
        """The workload's own figures (Python floats) for the dashboards (protocol.Scalars)."""
        self.conn.send(Scalars(self.rank, values))

    def end_epoch(self, epoch: int) -> None:
        self._row[Control.EPOCH], self._row[Control.BATCH] = epoch + 1, 0
        self.report.flush()
        self.conn.send(EpochEnd(self.rank, epoch))
