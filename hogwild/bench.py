"""Benchmark: the hogwild framework against a plain hand-written Hogwild loop, on the same work.

    python scripts/bench.py --quick            # ~1-2 min on 2 cores: MLP + conv net, fork/forkserver
    python scripts/bench.py                    # everything: 3 start methods x 2 sharing strategies
    python scripts/bench.py --tiny             # seconds: a smoke test (the test suite runs it)
    python scripts/bench.py --models mlp --workers 1,2 --samples 30000 --out /tmp/b.json --no-plot

Each row is one training run (1 epoch; mlp/convnet: batch 64, SGD lr 0.05 momentum 0.5, synthetic
MNIST-shaped data; mf: matrix factorization on synthetic ratings, batch 256, Adagrad; sparse:
logistic regression on 100,000 sparse features, batch 64, Adagrad; data regenerated per run; the
sparse models run in the full mode or with --models mf,sparse) in fresh worker processes:

    plain       ~40 lines below (`plain_worker`, `run_plain`): share the model and the data
                tensors, start N processes, each sets its threads, builds its own SGD, trains on its
                shard of one permutation with index_select batches. No framework code. The reference.
    framework   `hogwild.Trainer(...).fit()` through the Python API, on the same model and data.
    Nx1 / 1xN   N workers with 1 intra-op thread each; or the "best single process": 1 worker
                with threads = cores (rows with threads > 1).

How to read the columns:

    samples/s   steady state: all samples / (last optimizer step - first optimizer step), over
                all workers together. Start-up and evaluation are not in it.
    speed-up    samples/s over the 1-worker, 1-thread row of the same kind (same impl, start
                method, strategy). Perfect scaling is N; memory bandwidth and the shared weights'
                cache lines keep it below (1.7-1.8x on 2 cores for the MLP, per DESIGN.md).
    vs 1proc    samples/s over the best single process (the fastest 1 worker x cores threads row
                of the model, plain or framework): above 1 means the extra processes beat simply
                giving one process all the cores.
    fw/plain    framework samples/s over plain samples/s, same model, workers and threads (and
                start method when the plain loop ran it; else fork). 1.00 = as fast as the
                hand-written loop; the goal is >= 0.95. Noise on a shared machine is ~ +-10%.
    start-up    seconds from "start" (share the tensors, launch the processes) to the end of the
                first optimizer step of any worker. spawn re-imports torch per worker (~2 s).
                The fork server is started once per benchmark, before the first row (its cost is
                `forkserver_start_seconds` in bench.json), so forkserver rows show the per-run cost.
    PSS MB      peak proportional set size of this process plus all its descendants (workers,
                fork server, resource tracker), sampled every 0.2 s: shared memory is counted
                once in total, so N workers sharing a dataset do not count it N times.

Outputs: the table on stdout, `--out` (bench.json: machine info + one dict per row) and a
scaling plot next to it (bench.png: samples/s vs workers, one panel per model).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import queue as queue_lib
import shutil
import sys
import tempfile
import threading
import time

import psutil
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

BATCH, LR, MOMENTUM, SEED = 64, 0.05, 0.5, 0
TEST_SAMPLES = 500  # the framework evaluates once after the epoch; keep that short
FD, FS = "file_descriptor", "file_system"
# The sparse models (opt-in: --models mf,sparse; in the full mode) train with Adagrad, the
# dense ones with SGD; MF is a regression (MSE) on batches of 256 ratings.
SPARSE = {"mf": dict(batch=256, lr=0.1), "sparse": dict(batch=64, lr=0.5)}
MODELS = ("mlp", "convnet", *SPARSE)


MODES = {  # samples per run (1 epoch), which (start method, strategy) pairs, best single process?
    "tiny": dict(models=["mlp"], samples={"mlp": 1024, "mf": 4096, "sparse": 2048}, plain=[("fork", FD)], framework=[("fork", FD)], single=False, max_workers=2),
    "quick": dict(models=["mlp", "convnet"], samples={"mlp": 30_000, "convnet": 6_000, "mf": 200_000, "sparse": 100_000}, plain=[("fork", FD), ("forkserver", FD)],
                  framework=[("fork", FD), ("forkserver", FD)], single=True, max_workers=None),
    "full": dict(models=list(MODELS), samples={"mlp": 60_000, "convnet": 15_000, "mf": 400_000, "sparse": 200_000},
                 plain=[("fork", FD), ("forkserver", FD)],
                 framework=[(m, s) for m in ("fork", "spawn", "forkserver") for s in (FD, FS)],
                 single=True, max_workers=None),
}


def recipe(model_name: str) -> tuple[int, functools.partial, object]:
    """(batch size, optimizer factory, loss function) of a model, the same for plain and framework."""
    if model_name in SPARSE:
        s = SPARSE[model_name]
        return s["batch"], functools.partial(torch.optim.Adagrad, lr=s["lr"]), (
            F.mse_loss if model_name == "mf" else F.cross_entropy)
    return BATCH, functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM), F.cross_entropy


def build(model_name: str, num_samples: int):
    from hogwild.data import make_synthetic, make_synthetic_ratings, make_synthetic_sparse
    from hogwild.models import MLP, ConvNet, MatrixFactorization, SparseLinear

    torch.manual_seed(SEED)  # the same initial weights for plain and framework
    if model_name == "mf":
        data = make_synthetic_ratings(num_ratings=num_samples, num_test_ratings=TEST_SAMPLES, seed=SEED)
        return MatrixFactorization(**data.model_kwargs), data
    if model_name == "sparse":
        data = make_synthetic_sparse(num_samples=num_samples, num_test_samples=TEST_SAMPLES, seed=SEED)
        return SparseLinear(**data.model_kwargs), data
    model = MLP([1, 28, 28], 10, [256]) if model_name == "mlp" else ConvNet([1, 28, 28], 10)
    return model, make_synthetic(num_samples=num_samples, num_test_samples=TEST_SAMPLES, seed=SEED)


# ---- the plain loop: what a careful user writes by hand (no hogwild imports) ----

def plain_worker(rank, num_workers, threads, strategy, model, x, y, queue, batch, make_optimizer, loss_fn):
    torch.multiprocessing.set_sharing_strategy(strategy)
    torch.set_num_threads(threads)
    torch.manual_seed(SEED + rank)
    optimizer = make_optimizer(model.parameters())
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(SEED))
    mine = perm[rank * len(perm) // num_workers : (rank + 1) * len(perm) // num_workers]
    t_first = t_last = 0.0
    for i in range(0, len(mine), batch):
        idx = mine[i : i + batch]
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x.index_select(0, idx)), y.index_select(0, idx)).backward()
        optimizer.step()
        t_last = time.monotonic()
        t_first = t_first or t_last
    queue.put((rank, len(mine), t_first, t_last))


def run_plain(model, data, start_method, strategy, num_workers, threads, recipe) -> dict:
    torch.multiprocessing.set_sharing_strategy(strategy)
    ctx = mp.get_context(start_method)
    t0 = time.monotonic()
    model.share_memory()
    x, y = data.train_x.share_memory_(), data.train_y.share_memory_()
    queue = ctx.Queue()
    procs = [ctx.Process(target=plain_worker, args=(r, num_workers, threads, strategy, model, x, y, queue, *recipe))
             for r in range(num_workers)]
    for p in procs:
        p.start()
    results = []
    while len(results) < num_workers:  # results first, then join: a full queue would block exit
        try:
            results.append(queue.get(timeout=1.0))
        except queue_lib.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError(f"plain worker died: exit codes {[p.exitcode for p in procs]}")
    for p in procs:
        p.join()
    samples = sum(r[1] for r in results)
    t_first, t_last = min(r[2] for r in results), max(r[3] for r in results)
    return dict(samples=samples, train_seconds=t_last - t_first, samples_per_second=samples / (t_last - t_first),
                startup_seconds=t_first - t0, wall_seconds=time.monotonic() - t0)


# ---- the framework, through its Python API ----

def run_framework(model, data, start_method, strategy, num_workers, threads, workdir, recipe) -> dict:
    from hogwild import Trainer, TrainerConfig

    cfg = TrainerConfig(num_workers=num_workers, start_method=start_method, sharing_strategy=strategy,
                        threads_per_worker=threads, epochs=1, seed=SEED, log_every_n_steps=10)
    out = tempfile.mkdtemp(prefix="run-", dir=workdir)
    batch, make_optimizer, loss_fn = recipe
    trainer = Trainer(model, data, make_optimizer, cfg, batch_size=batch, output_dir=out, started_at=time.time(),
                      loss_fn=loss_fn)
    s = trainer.fit()
    shutil.rmtree(out, ignore_errors=True)
    if s["status"] != "completed":
        raise RuntimeError(f"framework run {s['status']}: {s.get('error')}")
    return {k: s.get(k) for k in ("samples_per_second", "train_seconds", "startup_seconds", "wall_seconds")} | {
        "samples": s["total_samples"]}


class PeakPSS:
    """Max over time of the summed PSS of this process and all its descendants (a thread)."""

    def __init__(self, interval: float = 0.2):
        self.me, self.interval, self.peak, self.stop = psutil.Process(), interval, 0, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        total = 0
        for p in [self.me, *self.me.children(recursive=True)]:
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
    ctx.set_forkserver_preload(["hogwild.worker", "torch._dynamo", __name__])
    t0 = time.monotonic()
    p = ctx.Process(target=_noop)
    p.start()
    p.join()
    return time.monotonic() - t0


# ---- the sweep, the figures, the outputs ----

def plan(mode: dict, models: list[str], workers: list[int], cores: int) -> list[tuple]:
    """(model, impl, start_method, strategy, num_workers, threads); plain and framework of one
    setting run back to back, so that a change in machine load hits both alike."""
    runs = []
    for model in models:
        for n in workers:
            for start, strategy in dict.fromkeys(mode["plain"] + mode["framework"]):
                for impl in ("plain", "framework"):
                    if (start, strategy) in mode[impl]:
                        runs.append((model, impl, start, strategy, n, 1))
        if mode["single"] and cores > 1:  # 1 process x all cores, in the plain loop's settings
            runs += [(model, impl, start, strategy, 1, cores) for start, strategy in mode["plain"]
                     for impl in ("plain", "framework")]
    return runs


def add_ratios(rows: list[dict]) -> None:
    def find(**want):
        return next((r for r in rows if r["samples_per_second"] and all(r[k] == v for k, v in want.items())), None)

    def ratio(row, ref):
        return round(row["samples_per_second"] / ref["samples_per_second"], 3) if ref and row["samples_per_second"] else None

    for r in rows:
        same = dict(model=r["model"], impl=r["impl"])
        r["speedup"] = ratio(r, find(**same, start_method=r["start_method"], sharing_strategy=r["sharing_strategy"],
                                     num_workers=1, threads=1))
        singles = [x for x in rows if x["model"] == r["model"] and x["threads"] > 1 and x["samples_per_second"]]
        r["vs_single_process"] = ratio(r, max(singles, key=lambda x: x["samples_per_second"], default=None))
        key = dict(model=r["model"], impl="plain", num_workers=r["num_workers"], threads=r["threads"])
        ref = find(**key, start_method=r["start_method"]) or find(**key, start_method="fork")
        r["vs_plain"] = ratio(r, ref) if r["impl"] == "framework" else None


def print_table(rows: list[dict]) -> None:
    cols = [("model", "model", "{}"), ("impl", "impl", "{}"), ("start", "start_method", "{}"),
            ("sharing", "sharing_strategy", "{}"), ("workers", "num_workers", "{}"), ("thr", "threads", "{}"),
            ("samples/s", "samples_per_second", "{:,.0f}"), ("speed-up", "speedup", "{:.2f}x"),
            ("vs 1proc", "vs_single_process", "{:.2f}x"), ("fw/plain", "vs_plain", "{:.2f}"),
            ("start-up s", "startup_seconds", "{:.2f}"), ("PSS MB", "pss_mb", "{:,.0f}")]
    cells = [[c[0] for c in cols]] + [
        [("-" if r.get(k) is None else f.format(r[k])) for _, k, f in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) if j < 4 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for r in rows:
        if r.get("error"):
            print(f"FAILED {r['model']} {r['impl']} {r['start_method']}/{r['sharing_strategy']} "
                  f"x{r['num_workers']}: {r['error']}")


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no plot written to {path}: matplotlib is not installed (pip install 'hogwild[bench]')", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model and r["samples_per_second"]]
        settings = list(dict.fromkeys((r["start_method"], r["sharing_strategy"]) for r in mine))
        for kind in dict.fromkeys((r["impl"], r["start_method"], r["sharing_strategy"]) for r in mine):
            pts = sorted((r["num_workers"], r["samples_per_second"]) for r in mine
                         if (r["impl"], r["start_method"], r["sharing_strategy"]) == kind and r["threads"] == 1)
            if pts:  # one colour per start method + strategy; plain dashed, framework solid
                ax.plot(*zip(*pts), "--o" if kind[0] == "plain" else "-s", label=" ".join(kind),
                        color=f"C{settings.index(kind[1:]) % 10}")
        for r in (r for r in mine if r["threads"] > 1):
            ax.axhline(r["samples_per_second"], ls="--" if r["impl"] == "plain" else ":", lw=1,
                       color=f"C{settings.index((r['start_method'], r['sharing_strategy'])) % 10}",
                       label=f"{r['impl']} {r['start_method']}: 1 process x {r['threads']} threads")
        ax.set(title=model, xlabel="workers", ylabel="samples/s (steady state)", ylim=(0, None))
        ax.set_xticks(sorted({r["num_workers"] for r in mine}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def machine_info(cores: int, mode: str) -> dict:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return dict(cores=cores, cpu=cpu, torch=torch.__version__, python=platform.python_version(),
                platform=platform.platform(), load_average=os.getloadavg(), mode=mode,
                date=time.strftime("%Y-%m-%d %H:%M:%S"))


def worker_counts(text: str) -> list[int]:
    return [int(w) for w in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="see the module docstring of hogwild.bench")
    p.add_argument("--quick", action="store_true", help="MLP + conv net, fork/forkserver, small runs (~1-2 min)")
    p.add_argument("--tiny", action="store_true", help="a smoke test: MLP, fork, a thousand samples (seconds)")
    p.add_argument("--models", help="comma list of mlp,convnet,mf,sparse (default: the mode's)")
    p.add_argument("--workers", type=worker_counts, help="comma list, e.g. 1,2,4 (default: 1..cores)")
    p.add_argument("--samples", type=int, help="training samples per run, for every model")
    p.add_argument("--out", default="bench.json", help="where to write the JSON (the PNG goes next to it)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = p.parse_args(argv)

    # Before any torch work here: with fork, workers inherit this process's OpenMP state, and a
    # child that asks for more threads than an already-started parent pool hangs (DESIGN.md).
    # One thread in the parent also keeps it from competing with the workers for the cores.
    torch.set_num_threads(1)
    os.environ["HOGWILD_PROGRESS"] = "0"  # no progress bar between the table's lines
    # The first optimizer import pulls in torch._dynamo (~1 s). The framework does it in the parent
    # before it starts workers; do it here for both, so no row's start-up depends on run order.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    mode = MODES[mode_name]
    cores = len(os.sched_getaffinity(0))
    models = args.models.split(",") if args.models else mode["models"]
    if unknown := set(models) - set(MODELS):
        p.error(f"--models: unknown {sorted(unknown)}; choose from {', '.join(MODELS)}")
    workers = args.workers or list(range(1, min(cores, mode["max_workers"] or cores) + 1))
    runs = plan(mode, models, workers, cores)
    info = machine_info(cores, mode_name)
    if any(r[2] == "forkserver" for r in runs):
        info["forkserver_start_seconds"] = round(start_forkserver(), 3)
    print(f"{len(runs)} runs on {cores} cores ({info['cpu']}), torch {torch.__version__}, "
          f"load average {info['load_average'][0]:.1f}", flush=True)

    rows, workdir = [], tempfile.mkdtemp(prefix="hogwild-bench-")
    try:
        for i, (model_name, impl, start, strategy, n, threads) in enumerate(runs):
            num_samples = args.samples or mode["samples"].get(model_name, MODES["full"]["samples"][model_name])
            row = dict(model=model_name, impl=impl, start_method=start, sharing_strategy=strategy, num_workers=n,
                       threads=threads, samples=None, samples_per_second=None, train_seconds=None,
                       startup_seconds=None, wall_seconds=None, pss_mb=None)
            print(f"[{i + 1}/{len(runs)}] {model_name} {impl} {start}/{strategy} {n} worker(s) x {threads} "
                  f"thread(s), {num_samples:,} samples", file=sys.stderr, flush=True)
            model, data = build(model_name, num_samples)
            try:
                with PeakPSS() as pss:
                    if impl == "plain":
                        result = run_plain(model, data, start, strategy, n, threads, recipe(model_name))
                    else:
                        result = run_framework(model, data, start, strategy, n, threads, workdir, recipe(model_name))
                row.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()})
                row["pss_mb"] = round(pss.peak / 2**20, 1)
            except Exception as e:  # noqa: BLE001 - one broken combination must not hide the rest
                row["error"] = f"{type(e).__name__}: {e}"
            del model, data  # free this run's shared tensors before the next run samples its PSS
            gc.collect()
            rows.append(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    add_ratios(rows)
    print_table(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": info, "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")
    if not args.no_plot:
        png = os.path.splitext(args.out)[0] + ".png"
        plot(rows, png)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
