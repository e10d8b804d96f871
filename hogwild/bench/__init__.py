"""Benchmark: the hogwild framework against a plain hand-written Hogwild loop, on the same work.

    python scripts/bench.py --quick            # ~1-2 min on 2 cores: MLP + conv net, fork/forkserver
    python scripts/bench.py                    # everything: 3 start methods x 2 sharing strategies
    python scripts/bench.py --tiny             # seconds: a smoke test (the test suite runs it)
    python scripts/bench.py --models mlp --workers 1,2 --samples 30000 --out /tmp/b.json --no-plot

Each row is one training run (1 epoch; mlp/convnet: batch 64, SGD lr 0.05 momentum 0.5, synthetic
MNIST-shaped data; mf: matrix factorization on synthetic ratings, batch 256, Adagrad; sparse:
logistic regression on 100,000 sparse features, batch 64, Adagrad; data regenerated per run; the
sparse models run in the full mode or with --models mf,sparse) in fresh worker processes:

    plain       ~40 lines in hogwild/bench/runs.py (`plain_worker`, `run_plain`): share the model and the data
                tensors, start N processes, each sets its threads, builds its own SGD, trains on its
                shard of one permutation with index_select batches. No framework code. The reference.
    framework   `hogwild.Trainer(...).fit()` through the Python API, on the same model and data,
                the loss published every 10 steps (`trainer.log_every_n_steps`, the default).
    framework-step  the same, publishing every step: what per-step reporting costs (fork, N > 1).
    ddp         torch DistributedDataParallel over gloo (hogwild/bench/ddp.py): one process per
                worker, each with its own replica, gradients all-reduced every step (fork, N > 1).
    Nx1 / 1xN   N workers with 1 intra-op thread each; or the "best single process": 1 worker
                with threads = cores (rows with threads > 1).

How to read the columns:

    samples/s   steady state: all samples / (last optimizer step - first optimizer step), over
                all workers together. Start-up and evaluation are not in it.
    speed-up    samples/s over the 1-worker, 1-thread row of the same kind (same impl, start
                method, strategy). Perfect scaling is N; memory bandwidth and the shared weights'
                cache lines keep it below (1.7-1.8x on 2 cores for the MLP, docs/performance.md).
    vs 1proc    samples/s over the best single process (the fastest 1 worker x cores threads row
                of the model, plain or framework): above 1 means the extra processes beat simply
                giving one process all the cores.
    fw/plain    framework samples/s over plain samples/s, same model, workers and threads (and
                start method when the plain loop ran it; else fork). 1.00 = as fast as the
                hand-written loop; the goal is >= 0.97. Noise on a shared machine is ~ +-10%.
    fw/ddp      framework samples/s over the DDP row's, same model and workers: how much faster
                lock-free Hogwild is than synchronous data parallelism on this machine.
    start-up    seconds from "start" (share the tensors, launch the processes) to the end of the
                first optimizer step of any worker. spawn re-imports torch per worker (~2 s).
                The fork server is started once per benchmark, before the first row (its cost is
                `forkserver_start_seconds` in bench.json), so forkserver rows show the per-run cost.
    PSS MB      peak proportional set size of this process plus all its descendants (workers,
                fork server, resource tracker), sampled every 0.2 s: shared memory is counted
                once in total, so N workers sharing a dataset do not count it N times.

After the table, the fixed costs (hogwild.reporting.timeline, summary.json's `fixed_costs`): where each
framework run's wall clock went outside training, and the same for one whole CLI run in a fresh
interpreter (`python -m hogwild train data=synthetic ...`, 1 epoch; skip it with --no-cli),
which adds the interpreter, imports, Hydra's compose, torch's import and the data.

Outputs: the tables on stdout, `--out` (bench.json: machine info, one dict per row, cli_run) and a
scaling plot next to it (bench.png: samples/s vs workers, one panel per model).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile

import torch

from hogwild.bench.ddp import run_ddp
from hogwild.bench.fixed import cli_run, print_breakdowns
from hogwild.bench.recipes import LR, MODELS, MODES, TEST_SAMPLES, build, plan, recipe
from hogwild.bench.report import add_ratios, machine_info, plot, print_table
from hogwild.bench.runs import (
    PeakPSS,
    RowUnfinished,
    run_framework,
    run_plain,
    start_forkserver,
)
from hogwild.bench.scale import SIZES, table_users
from hogwild.bench.scale import main as scale_main

__all__ = ["main", "plot"]


def worker_counts(text: str) -> list[int]:
    return [int(w) for w in text.split(",")]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hogwild bench",
        description=__doc__.split("\n\n")[0],
        epilog="see the module docstring of hogwild.bench",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="MLP + conv net, fork/forkserver, small runs (~1-2 min)",
    )
    p.add_argument(
        "--tiny", action="store_true", help="a smoke test: MLP, fork, a thousand samples (seconds)"
    )
    p.add_argument("--models", help="comma list of mlp,convnet,mf,sparse (default: the mode's)")
    p.add_argument(
        "--workers", type=worker_counts, help="comma list, e.g. 1,2,4 (default: 1..cores)"
    )
    p.add_argument("--samples", type=int, help="training samples per run, for every model")
    p.add_argument(
        "--out", default="bench.json", help="where to write the JSON (the PNG goes next to it)"
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument(
        "--no-cli", action="store_true", help="skip the whole CLI run (its fixed-cost breakdown)"
    )
    scale = p.add_argument_group("the scale benchmark (hogwild.bench.scale)")
    scale.add_argument(
        "--scale",
        action="store_true",
        help="matrix factorization at growing table sizes: memory, fixed costs, checkpoint "
        "MB/s against dd, samples/s against a plain loop (minutes)",
    )
    scale.add_argument("--sizes", default=SIZES, help=f"embedding-table sizes (default: {SIZES})")
    scale.add_argument(
        "--ratings", type=int, default=2_000_000, help="training ratings per run (default: 2M)"
    )
    scale.add_argument(
        "--optimizer",
        default="rowwise_adagrad",
        choices=("rowwise_adagrad", "adagrad", "sgd"),
        help="the optimizer, for both (default: the experiment's, rowwise_adagrad)",
    )
    scale.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="framework and plain runs per size, alternating; samples/s is each side's median "
        "(default: 1; a single pair's ratio moves by +-15%% on a busy machine)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.scale:
        out = args.out if args.out != "bench.json" else "bench-scale.json"
        workers = args.workers[0] if args.workers else 2
        for size in args.sizes.split(","):
            try:
                table_users(size)
            except argparse.ArgumentTypeError as e:
                p.error(str(e))
        if args.pairs < 1:
            p.error(f"--pairs={args.pairs}: must be an integer >= 1")
        return scale_main(
            args.sizes, args.ratings, workers, args.optimizer, out, not args.no_plot, args.pairs
        )

    # Before any torch work here: with fork, workers inherit this process's OpenMP state, and a
    # child that asks for more threads than an already-started parent pool hangs (docs/performance.md).
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
    print(
        f"{len(runs)} runs on {cores} cores ({info['cpu']}), torch {torch.__version__}, "
        f"load average {info['load_average'][0]:.1f}",
        flush=True,
    )

    rows = measure(runs, mode, args.samples)
    add_ratios(rows)
    print_table(rows)
    info["busy"] = say_if_busy(info["load_average"][0], cores, rows)
    cli = None
    if not args.no_cli:  # a whole command, in a fresh interpreter: what a user's run pays first
        dense = [m for m in models if m in ("mlp", "convnet")] or ["mlp"]
        samples = args.samples or mode["samples"][dense[0]]
        with tempfile.TemporaryDirectory(prefix="hogwild-bench-cli-") as workdir:
            cli = cli_run(dense[0], samples, TEST_SAMPLES, workdir)
    print_breakdowns(rows, cli)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": info, "rows": rows, "cli_run": cli}, f, indent=2)
    print(f"wrote {args.out}")
    if not args.no_plot:
        png = os.path.splitext(args.out)[0] + ".png"
        plot(rows, png)
    return 1 if any(r.get("error") for r in rows) else 0


def say_if_busy(load: float, cores: int, rows: list[dict]) -> bool:
    """Other work on the cores as the bench began: a row that runs more threads than the idle
    cores collapses (1 process x 2 threads ran 0.04x beside a test suite on 2 cores), so its
    figures and the ratios against it are the load's, not the code's. Said, not hidden."""
    idle = max(0, cores - int(load))
    crowded = [r for r in rows if r["num_workers"] * r["threads"] > idle]
    if load < 0.5 or not crowded:
        return False
    print(
        f"the machine was busy as the bench began (load average {load:.1f} on {cores} cores): "
        f"{len(crowded)} of {len(rows)} rows ran more threads than the {idle} idle core(s), and "
        "their figures are the other work's as much as the code's; rerun on a quiet machine",
        file=sys.stderr,
    )
    return True


def measure(runs: list[tuple], mode: dict, samples: int | None) -> list[dict]:
    """One row per run, in order; a run that breaks gets its error, the others still run."""
    rows, workdir = [], tempfile.mkdtemp(prefix="hogwild-bench-")
    try:
        for i, (model_name, impl, start, strategy, n, threads) in enumerate(runs):
            num_samples = samples or mode["samples"].get(
                model_name, MODES["full"]["samples"][model_name]
            )
            row = dict(
                model=model_name,
                impl=impl,
                start_method=start,
                sharing_strategy=strategy,
                num_workers=n,
                threads=threads,
                samples=None,
                samples_per_second=None,
                train_seconds=None,
                startup_seconds=None,
                wall_seconds=None,
                pss_mb=None,
            )
            print(
                f"[{i + 1}/{len(runs)}] {model_name} {impl} {start}/{strategy} {n} worker(s) x {threads} "
                f"thread(s), {num_samples:,} samples",
                file=sys.stderr,
                flush=True,
            )
            model, data = build(model_name, num_samples)
            try:
                setting = (model, data, start, strategy, n, threads)
                label = f"{model_name} {impl} {start}/{strategy} {n}x{threads}"
                with PeakPSS() as pss:
                    if impl == "plain":
                        result = run_plain(*setting, recipe(model_name), row=label)
                    elif impl == "ddp":
                        result = run_ddp(*setting, recipe(model_name), row=label)
                    else:  # framework-step: the loss published every step
                        every = 1 if impl == "framework-step" else 10
                        result = run_framework(
                            *setting, workdir, recipe(model_name), log_every=every
                        )
                row.update(
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}
                )
                row["pss_mb"] = round(pss.peak / 2**20, 1)
            except RowUnfinished as e:  # its processes were killed (gather said so on stderr)
                row.update(error=str(e), missing=True)
            except Exception as e:  # noqa: BLE001 - one broken combination must not hide the rest
                row["error"] = f"{type(e).__name__}: {e}"
            del model, data  # free this run's shared tensors before the next run samples its PSS
            gc.collect()
            rows.append(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
