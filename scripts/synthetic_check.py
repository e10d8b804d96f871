"""The figures quoted for `data=synthetic`, rerun: how fast it is made, how well models learn it.

    python scripts/synthetic_check.py                  # seeds 0 and 1 (~1 min on 2 cores)
    python scripts/synthetic_check.py --seeds 0 data.noise=5.0 --json out.json

Times `make_synthetic()` with its defaults (60,000 training + 10,000 test samples of 1x28x28:
the process's first call, as a run makes it, and best and median of --repeats), then, per seed
(data.seed and trainer.seed), trains through the CLI exactly as a user would, each run in a
temporary hydra.run.dir:

    conv net  python -m hogwild train data=synthetic data.num_samples=60000 model=convnet trainer.epochs=2
    MLP       python -m hogwild train data=synthetic model=mlp trainer.epochs=1

and prints their test accuracy and training time from summary.json. Any further arguments are
Hydra overrides added to every run (e.g. data.noise=5.0); the timing always uses the defaults.
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

JOBS = {
    "conv net": ["data=synthetic", "data.num_samples=60000", "model=convnet", "trainer.epochs=2"],
    "MLP": ["data=synthetic", "model=mlp", "trainer.epochs=1"],
}


def generation_seconds(repeats: int) -> list[float]:
    from hogwild.data import make_synthetic

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        make_synthetic(num_samples=60000, num_test_samples=10000)
        times.append(time.perf_counter() - start)
    return times


def train(args: list[str], run_dir: str) -> dict:
    command = [sys.executable, "-m", "hogwild", "train", *args, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--repeats", type=int, default=5, help="generation timings (default 5)")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("overrides", nargs="*", help="Hydra overrides added to every run")
    args = p.parse_args()

    times = generation_seconds(args.repeats)
    print(
        f"make_synthetic, 60,000 + 10,000 samples of 1x28x28: first call {times[0]:.3f} s, "
        f"best {min(times):.3f} s, median {statistics.median(times):.3f} s of {len(times)}"
    )
    rows = []
    print(f"{'job':<9} {'seed':>4} {'test accuracy':>13} {'train s':>8} {'wall s':>7}")
    with tempfile.TemporaryDirectory(prefix="hogwild-synthetic-") as folder:
        for seed in args.seeds:
            for job, job_args in JOBS.items():
                run_dir = os.path.join(folder, f"{job.replace(' ', '_')}_{seed}")
                s = train(
                    [*job_args, f"data.seed={seed}", f"trainer.seed={seed}", *args.overrides],
                    run_dir,
                )
                row = {
                    "job": job,
                    "seed": seed,
                    "test_accuracy": s["test_accuracy"],
                    "train_seconds": s["train_seconds"],
                    "wall_seconds": s["wall_seconds"],
                }
                rows.append(row)
                print(
                    f"{job:<9} {seed:>4} {100 * row['test_accuracy']:>12.2f}% "
                    f"{row['train_seconds']:>8.1f} {row['wall_seconds']:>7.1f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "generation_seconds": times, "runs": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
