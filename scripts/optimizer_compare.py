"""Adagrad against RowwiseAdagrad on the sparse experiments: quality, speed and memory.

    python scripts/optimizer_compare.py                  # MF + sparse_logreg, 3 seeds each (~4 min on 2 cores)
    python scripts/optimizer_compare.py --experiments matrix_factorization --seeds 0 --extra optimizer.lr=0.2
    python scripts/optimizer_compare.py --memory         # peak PSS of the run's processes, a 3M-row MF

Each run is `python -m hogwild train +experiment=E optimizer=O trainer.seed=S` in a temporary
folder, read back from its summary.json. `--memory` samples the summed PSS (proportional set
size: shared pages split between the processes that map them) of the run's whole process tree
every 0.1 s, on a table of 2M users + 1M items (3M rows x 33 floats: 378 MiB of model): over the
whole run (the final checkpoint included), while the workers run, and of the largest worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

OPTIMIZERS = ("adagrad", "rowwise_adagrad")
METRIC = {"matrix_factorization": "test_rmse", "sparse_logreg": "test_accuracy"}
MEMORY_RUN = (
    "+experiment=matrix_factorization",
    "data.num_users=2000000",
    "data.num_items=1000000",
    "data.num_ratings=500000",
    "trainer.epochs=1",
    "trainer.num_workers=2",
)


def peak_pss(process: subprocess.Popen) -> dict[str, int]:
    """Peaks of summed PSS while `process` runs, in bytes: of its whole process tree, of that tree
    while workers run (the fork server's children), and of the largest worker."""
    root, peaks = psutil.Process(process.pid), {"run": 0, "training": 0, "worker": 0}
    while process.poll() is None:
        try:
            direct = root.children()
            workers = [w for d in direct for w in d.children(recursive=True)]
        except psutil.Error:
            break
        sizes = {}
        for p in [root, *direct, *workers]:
            try:
                sizes[p.pid] = p.memory_full_info().pss
            except psutil.Error:
                pass  # it exited between the listing and the read
        total, in_workers = sum(sizes.values()), [sizes.get(w.pid, 0) for w in workers]
        peaks["run"] = max(peaks["run"], total)
        if in_workers:
            peaks["training"] = max(peaks["training"], total)
            peaks["worker"] = max(peaks["worker"], *in_workers)
        time.sleep(0.1)
    return peaks


def train(overrides: list[str], memory: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="hogwild-optcmp-") as folder:
        command = [sys.executable, "-m", "hogwild", "train", *overrides, f"hydra.run.dir={folder}"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        peaks = peak_pss(process) if memory else {}
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{err.decode()[-2000:]}")
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
    summary["peak_pss"] = peaks
    return summary


def spread(values: list[float], fmt: str) -> str:
    mean = statistics.mean(values)
    return f"{fmt.format(mean)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def quality(args) -> None:
    """Seeds outermost, optimizers alternating: a busy machine slows both alike."""
    print("| experiment | optimizer | metric, mean (min-max) | samples/s, mean (min-max) |")
    print("| --- | --- | --- | --- |")
    for experiment in args.experiments:
        runs = {optimizer: [] for optimizer in args.optimizers}
        for seed in args.seeds:
            for optimizer in args.optimizers:
                overrides = [f"+experiment={experiment}", f"optimizer={optimizer}"]
                runs[optimizer].append(train([*overrides, f"trainer.seed={seed}", *args.extra]))
        metric = METRIC[experiment]
        fmt = "{:.4f}" if metric == "test_rmse" else "{:.2%}"
        for optimizer, done in runs.items():
            scores = [r[metric] for r in done]
            speed = [r["samples_per_second"] for r in done]
            print(
                f"| {experiment} | {optimizer} | {metric} {spread(scores, fmt)} "
                f"| {spread(speed, '{:,.0f}')} |",
                flush=True,
            )


def memory(args) -> None:
    for optimizer in args.optimizers:
        run = train([*MEMORY_RUN, f"optimizer={optimizer}", *args.extra], memory=True)
        mib = {k: f"{v / 2**20:,.0f} MiB" for k, v in run["peak_pss"].items()}
        print(
            f"{optimizer} (optimizer.shared={str(run['optimizer_shared']).lower()}): peak PSS "
            f"{mib['run']} over the run, {mib['training']} while training, {mib['worker']} "
            f"the largest worker; {run['wall_seconds']:.1f} s in all",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", default=list(METRIC), choices=list(METRIC))
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    parser.add_argument("--memory", action="store_true", help="peak PSS on a 3M-row MF instead")
    args = parser.parse_args()
    (memory if args.memory else quality)(args)


if __name__ == "__main__":
    main()
