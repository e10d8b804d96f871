"""The training process. One per rank; every one trains the same shared parameters, lock-free.

A worker is a polite tenant: before any torch work it sets the sharing strategy, its thread
count and its seed; it reads its own disjoint shard of each epoch's permutation straight out of
the shared data tensors; it reports small messages (see protocol.py) and never touches
TensorBoard, progress bars or files.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import sys
import threading
import time
import traceback

import torch

from hogwild import optim_state, protocol, staleness
from hogwild.device import HostBatches
from hogwild.schedule import Scheduler
from hogwild.protocol import Control, WorkerSpec

PR_SET_PDEATHSIG = 1


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The same permutation in every process: seeded by (seed, epoch) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_samples, generator=g)


def shard(perm: torch.Tensor, rank: int, num_workers: int) -> torch.Tensor:
    """Rank's disjoint slice of the permutation; sizes differ by at most one sample."""
    n = perm.numel()
    return perm[rank * n // num_workers : (rank + 1) * n // num_workers]


def _die_with_orchestrator(orchestrator_pid: int) -> None:
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


class _PipeLogHandler(logging.Handler):
    """Forwards log records to the orchestrator, which prints them without breaking its bar."""

    def __init__(self, rank: int, conn):
        super().__init__()
        self.rank, self.conn = rank, conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.conn.send(protocol.Log(self.rank, record.levelno, self.format(record)))
        except Exception:  # the orchestrator is gone; logging must never raise
            pass


def run_worker(rank: int, spec: WorkerSpec, model, data, control: Control, optimizer_state, conn) -> None:
    """Entry point of a worker process (a top-level function, so it pickles under spawn)."""
    # Ctrl-C reaches the whole process group; only the orchestrator decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # Visible to user code (models, data) that wants to know where it runs.
    os.environ["HOGWILD_RANK"], os.environ["HOGWILD_NUM_WORKERS"] = str(rank), str(spec.num_workers)
    _die_with_orchestrator(spec.orchestrator_pid)
    torch.multiprocessing.set_sharing_strategy(spec.sharing_strategy)
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed + rank)
    # sparse gradients (nn.Embedding(sparse=True)) come from torch itself: an explicit opt-out of
    # the per-op invariant checks, which also keeps torch from warning about them in every worker
    torch.sparse.check_sparse_tensor_invariants.disable()
    root = logging.getLogger()
    root.handlers[:] = [_PipeLogHandler(rank, conn)]
    root.setLevel(logging.INFO)
    code = 0
    try:
        conn.send(
            protocol.Hello(
                rank, os.getpid(), torch.multiprocessing.get_sharing_strategy(), torch.get_num_threads(), time.monotonic()
            )
        )
        stopped_early = _train(rank, spec, model, data, control, optimizer_state, conn)
        conn.send(protocol.Done(rank, stopped_early))
    except _NonFinite as e:
        code = 1
        _report_failure(conn, protocol.Failure(rank, "nonfinite", str(e), ""))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the orchestrator
        code = 1
        _report_failure(conn, protocol.Failure(rank, "exception", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        conn.close()
        # Skip interpreter teardown (about a second with torch loaded, under spawn): nothing
        # here needs it. Shared segments are released by the kernel / torch_shm_manager.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _report_failure(conn, failure: protocol.Failure) -> None:
    try:
        conn.send(failure)
    except OSError:
        pass


class _NonFinite(RuntimeError):
    pass


class _Reporter:
    """Accumulates loss and counts between reports; one Progress message every N steps.

    The loss is summed where it lives: on the GPU `float()` is a device sync, paid once per
    report instead of once per step.
    """

    def __init__(self, conn, rank: int, optimizer, device: torch.device):
        self.conn, self.rank, self.optimizer, self.device = conn, rank, optimizer, device
        self.t_first = self.t_last = 0.0
        self._reset()

    def _reset(self) -> None:
        self.steps = self.samples = 0
        self.loss_sum = 0.0 if self.device.type == "cpu" else torch.zeros((), device=self.device)

    def step(self, loss, samples: int) -> None:
        self.loss_sum += loss
        self.t_last = time.monotonic()
        self.t_first = self.t_first or self.t_last
        self.steps += 1
        self.samples += samples

    def flush(self) -> None:
        if self.steps == 0:
            return
        total = float(self.loss_sum)
        if not math.isfinite(total):
            raise _NonFinite(f"worker {self.rank}: non-finite loss in the last {self.steps} steps")
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.conn.send(protocol.Progress(self.rank, self.steps, self.samples, total, self.t_first, self.t_last, lr))
        self._reset()


def _train(rank: int, spec: WorkerSpec, model, data, control: Control, optimizer_state, conn) -> bool:
    """The hot loop. Returns True when the stop flag ended it early."""
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    train_x, train_y = data.train_x, data.train_y
    stop = control.stop.numpy()  # numpy views: a flag read or a counter write costs nanoseconds
    progress = control.progress.numpy()[rank]
    all_steps = control.progress.numpy()[:, Control.STEPS]  # every rank's step count (others' updates)
    all_samples = control.progress.numpy()[:, Control.SAMPLES]  # the global sample count drives the lr
    stale_row = control.staleness.numpy()[rank]
    model.train()
    optimizer = spec.optimizer_factory(model.parameters())
    if optimizer_state:  # optimizer.shared=true: adopt the one state every worker updates
        optim_state.attach(optimizer, list(model.parameters()), optimizer_state)
    scheduler = Scheduler(optimizer, spec.schedule, spec.num_workers, spec.epochs * train_x.shape[0])
    report = _Reporter(conn, rank, optimizer, device)
    # data left in host memory for a CUDA run: batches staged through pinned buffers
    to_device = HostBatches(train_x, train_y, spec.batch_size, device) if train_x.device != device else None
    check_each_step = device.type == "cpu" or spec.skip_nonfinite
    # Where this rank starts: 0/0 for a fresh run; a replacement worker or a resumed run
    # continues the shard at the first batch not yet applied.
    start_epoch, start_batch = int(progress[Control.EPOCH]), int(progress[Control.BATCH])
    for epoch in range(start_epoch, spec.epochs):
        indices = shard(epoch_permutation(train_x.shape[0], spec.seed, epoch), rank, spec.num_workers)
        indices = indices.to(train_x.device)
        num_batches = math.ceil(indices.numel() / spec.batch_size)
        for b in range(start_batch if epoch == start_epoch else 0, num_batches):
            if stop[0]:
                report.flush()
                return True
            idx = indices[b * spec.batch_size : (b + 1) * spec.batch_size]
            x, y = to_device(idx) if to_device else (train_x.index_select(0, idx), train_y.index_select(0, idx))
            if spec.channels_last and x.dim() == 4:  # a no-op for 1-channel images
                x = x.contiguous(memory_format=torch.channels_last)
            optimizer.zero_grad(set_to_none=True)
            read_at = int(all_steps.sum())  # updates applied so far, as this step reads the weights
            loss = spec.loss_fn(model(x), y)
            # On the CPU reading the loss is free, so a bad batch is caught before its update
            # reaches the shared weights. On CUDA that is a sync per step: checked per report,
            # unless the user asked to skip bad batches.
            value = loss.item() if check_each_step else loss.detach()
            if check_each_step and not math.isfinite(value):
                if spec.skip_nonfinite:
                    continue
                raise _NonFinite(f"worker {rank}: non-finite loss ({value}) at epoch {epoch}, batch {b}")
            loss.backward()
            staleness.record(stale_row, int(all_steps.sum()) - read_at)  # others' updates since the read
            if scheduler.active:
                scheduler.update(int(all_samples.sum()))
            optimizer.step()
            n = idx.numel()
            report.step(value, n)
            progress[Control.BATCH] = b + 1
            progress[Control.SAMPLES] += n
            progress[Control.STEPS] += 1
            if report.steps == spec.log_every_n_steps:
                report.flush()
        progress[Control.EPOCH], progress[Control.BATCH] = epoch + 1, 0
        report.flush()
        conn.send(protocol.EpochEnd(rank, epoch))
    return False
