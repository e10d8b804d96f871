"""One benchmark run each: the plain hand-written loop, the framework through its Python API,
and the peak memory of the whole process tree while one runs."""

from __future__ import annotations

import os
import queue as queue_lib
import shutil
import sys
import tempfile
import threading
import time

import psutil
import torch
import torch.multiprocessing as mp

from hogwild.bench.recipes import SEED

# ---- the plain loop: what a careful user writes by hand (no hogwild imports) ----


def plain_worker(
    rank, num_workers, threads, strategy, epochs, model, x, y, queue, batch, make_optimizer, loss_fn
):
    torch.multiprocessing.set_sharing_strategy(strategy)
    torch.set_num_threads(threads)
    torch.manual_seed(SEED + rank)
    optimizer = make_optimizer(model.parameters())
    t_first = t_last = 0.0
    for epoch in range(epochs):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(SEED + epoch))
        mine = perm[rank * len(perm) // num_workers : (rank + 1) * len(perm) // num_workers]
        for i in range(0, len(mine), batch):
            idx = mine[i : i + batch]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x.index_select(0, idx)), y.index_select(0, idx)).backward()
            optimizer.step()
            t_last = time.monotonic()
            t_first = t_first or t_last
    queue.put((rank, len(mine) * epochs, t_first, t_last))
    hang_if_asked("plain")


def run_plain(
    model, data, start_method, strategy, num_workers, threads, recipe, epochs: int = 1, row=""
) -> dict:
    torch.multiprocessing.set_sharing_strategy(strategy)
    ctx = mp.get_context(start_method)
    t0 = time.monotonic()
    model.share_memory()
    x, y = data.train_x.share_memory_(), data.train_y.share_memory_()
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=plain_worker,
            args=(r, num_workers, threads, strategy, epochs, model, x, y, queue, *recipe),
        )
        for r in range(num_workers)
    ]
    return gather(procs, queue, "plain worker", t0, row)


# How long a row may take, as caps (never a measurement): a row is its processes' start-up and
# one epoch of training, seconds to a few minutes. Until the first process has sent its figures
# the cap is START_CAP_SECONDS; from then on the others have max(FOLLOW_CAP_SECONDS, 3 x the time
# the first one took) to send theirs, and every process has max(EXIT_CAP_SECONDS, the time the
# row took so far) to exit once it has (an exit takes milliseconds: a process still there after
# that is stuck, e.g. a gloo teardown that deadlocked, and is killed).
START_CAP_SECONDS = 900.0
FOLLOW_CAP_SECONDS = 60.0
EXIT_CAP_SECONDS = 30.0
# Test-only seam (tests/e2e/test_bench_hang.py): a benchmark process whose impl ("plain" or
# "ddp") is named by this environment variable sleeps forever once it has sent its figures, as
# a process stuck in its exit would; gather must then kill it and mark the row missing.
HANG_ENV = "HOGWILD_BENCH_TEST_HANG_AFTER_FIGURES"


class RowUnfinished(RuntimeError):
    """A row's processes did not finish within the cap: they were killed, the row is missing."""


def hang_if_asked(impl: str) -> None:
    """The test-only seam above (no effect unless the variable names `impl`)."""
    if os.environ.get(HANG_ENV) == impl:
        while True:
            time.sleep(3600)


def _end(procs, grace: float = 5.0) -> None:
    """SIGTERM every process still alive, SIGKILL what is left after `grace`, reap them all."""
    for send in ("terminate", "kill"):
        live = [p for p in procs if p.is_alive()]
        for p in live:
            getattr(p, send)()
        deadline = time.monotonic() + grace
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        p.join(grace)


def gather(procs, queue, what: str, t0: float, row: str = "") -> dict:
    """Start the processes, collect one (rank, samples, first step, last step) from each,
    join them; the row's figures (steady state: all samples / first to last step).

    Bounded (the caps above): a row that does not finish in time has its processes killed, one
    line on stderr names it, and RowUnfinished says so (the table marks the row missing)."""
    for p in procs:
        p.start()
    results: list = []
    cap = START_CAP_SECONDS  # until the first figures are in
    try:
        while len(results) < len(procs):  # results first, then join: a full queue blocks exit
            if time.monotonic() - t0 > cap:
                _unfinished(procs, row or what, t0)
            try:
                results.append(queue.get(timeout=1.0))
                if len(results) == 1:
                    first = time.monotonic() - t0
                    cap = first + max(FOLLOW_CAP_SECONDS, 3 * first)
            except queue_lib.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    codes = [p.exitcode for p in procs]
                    _end(procs)
                    raise RuntimeError(f"{what} died: exit codes {codes}") from None
        deadline = time.monotonic() + max(EXIT_CAP_SECONDS, time.monotonic() - t0)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if any(p.is_alive() for p in procs):
            _unfinished(procs, row or what, t0)
    except BaseException:
        _end(procs)  # never leave a process behind, whatever went wrong here (Ctrl-C included)
        raise
    samples = sum(r[1] for r in results)
    t_first, t_last = min(r[2] for r in results), max(r[3] for r in results)
    return dict(
        samples=samples,
        train_seconds=t_last - t_first,
        samples_per_second=samples / (t_last - t_first),
        startup_seconds=t_first - t0,
        wall_seconds=time.monotonic() - t0,
    )


def _unfinished(procs, row: str, t0: float) -> None:
    stuck = sum(p.is_alive() for p in procs)
    _end(procs)
    seconds = time.monotonic() - t0
    print(
        f"bench: row '{row}' did not finish in {seconds:.0f} s ({stuck} of {len(procs)} "
        "process(es) still running): its processes were killed; the row is marked missing",
        file=sys.stderr,
        flush=True,
    )
    raise RowUnfinished(f"did not finish in {seconds:.0f} s: its processes were killed")


# ---- the framework, through its Python API ----


def run_framework(
    model,
    data,
    start_method,
    strategy,
    num_workers,
    threads,
    workdir,
    recipe,
    epochs: int = 1,
    log_every: int = 10,
) -> dict:
    from hogwild.config.schema import TrainerConfig
    from hogwild.run.trainer import Trainer

    cfg = TrainerConfig(
        num_workers=num_workers,
        start_method=start_method,
        sharing_strategy=strategy,
        threads_per_worker=threads,
        epochs=epochs,
        seed=SEED,
        log_every_n_steps=log_every,
    )
    out = tempfile.mkdtemp(prefix="run-", dir=workdir)
    batch, make_optimizer, loss_fn = recipe
    trainer = Trainer(
        model,
        data,
        make_optimizer,
        cfg,
        batch_size=batch,
        output_dir=out,
        started_at=time.time(),
        loss_fn=loss_fn,
    )
    s = trainer.fit()
    shutil.rmtree(out, ignore_errors=True)
    if s["status"] != "completed":
        raise RuntimeError(f"framework run {s['status']}: {s.get('error')}")
    keys = ("samples_per_second", "train_seconds", "startup_seconds", "wall_seconds", "fixed_costs")
    return {k: s.get(k) for k in keys} | {"samples": s["total_samples"]}


class PeakPSS:
    """Max over time of the summed PSS of a process (default: this one) and all its descendants
    (a thread). Each sample walks the page tables of every mapping (smaps_rollup): with a
    GiB-sized shared table, sampling ten times a second costs the workers 10-40%."""

    def __init__(self, pid: int | None = None, interval: float = 0.2):
        self.me, self.interval, self.peak, self.stop = (
            psutil.Process(pid),
            interval,
            0,
            threading.Event(),
        )
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        total = 0
        try:
            tree = [self.me, *self.me.children(recursive=True)]
        except psutil.NoSuchProcess:  # the root has exited: nothing more to add
            return
        for p in tree:
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # it exited between the two calls
                pass
        self.peak = max(self.peak, total)

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._sample()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _noop() -> None:
    pass


def start_forkserver() -> float:
    """Start the one fork server of this process (shared by every forkserver run) with the modules
    the framework preloads, so that no row pays its start-up; return what it cost."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["hogwild.worker.main", "torch._dynamo", __name__])
    t0 = time.monotonic()
    p = ctx.Process(target=_noop)
    p.start()
    p.join()
    return time.monotonic() - t0
