"""One node against two torchrun "nodes" on loopback, the same MLP work, side by side.

    python scripts/torchrun_scaling.py                    # 3 pairs, 60,000 x 3 epochs (~2 min on 2 cores)
    python scripts/torchrun_scaling.py --pairs 1 --epochs 1 --json out.json

Each pair runs `hogwild train` with 1 worker x 1 thread (one node), then the same command under
`torchrun --nnodes=1 --nproc_per_node=2 ... distributed=torchrun` (two nodes, 1 worker each, each
training its half of the data, models averaged every --sync-every local steps). Both are real
CLI runs; the figures come from their summary.json: one node's samples/s, the two nodes'
samples/s added up (each node over its own training time), and a stricter whole-run figure
(all samples / the slower node's training time). The issue's target: two nodes >= 1.7x one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(command: list[str], run_dir: str) -> dict:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def pair(args, folder: str, i: int) -> dict:
    common = [
        "trainer.num_workers=1",
        "trainer.threads_per_worker=1",
        f"trainer.start_method={args.start_method}",
        "data=synthetic",
        f"data.num_samples={args.samples}",
        f"trainer.epochs={args.epochs}",
        "checkpoint.every_seconds=0",
    ]
    one_dir, two_dir = os.path.join(folder, f"one_{i}"), os.path.join(folder, f"two_{i}")
    one = run(
        [sys.executable, "-m", "hogwild", "train", *common, f"hydra.run.dir={one_dir}"], one_dir
    )
    two = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "hogwild",
            "train",
            "distributed=torchrun",
            f"distributed.sync_every_n_steps={args.sync_every}",
            *common,
            f"hydra.run.dir={two_dir}",
        ],
        two_dir,
    )
    d = two["distributed"]
    nodes = d["per_node"]
    strict = sum(n["total_samples"] for n in nodes) / max(n["train_seconds"] for n in nodes)
    return {
        "one_node": one["samples_per_second"],
        "two_nodes": d["samples_per_second_all_nodes"],
        "per_node": [n["samples_per_second"] for n in nodes],
        "two_nodes_strict": round(strict, 1),
        "ratio": d["samples_per_second_all_nodes"] / one["samples_per_second"],
        "ratio_strict": strict / one["samples_per_second"],
        "sync_rounds": d["sync_rounds"],
        "sync_seconds": d["sync_seconds"],
        "sync_bytes": d["sync_bytes"],
        "accuracy": (one["test_accuracy"], two["test_accuracy"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--pairs", type=int, default=3, help="one-node / two-node pairs to run (default 3)"
    )
    p.add_argument(
        "--samples", type=int, default=60_000, help="training samples in all (default 60,000)"
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--sync-every", type=int, default=50, help="distributed.sync_every_n_steps (default 50)"
    )
    p.add_argument("--start-method", default="forkserver")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hogwild-torchrun-") as folder:
        print(
            f"{'pair':>4} {'1 node/s':>10} {'2 nodes/s':>10} {'per node':>17} {'strict/s':>10} "
            f"{'ratio':>6} {'strict':>6} {'rounds':>6} {'sync s':>7} {'accuracy 1 / 2':>15}"
        )
        for i in range(args.pairs):
            r = pair(args, folder, i)
            rows.append(r)
            print(
                f"{i + 1:>4} {r['one_node']:>10,.0f} {r['two_nodes']:>10,.0f} "
                f"{r['per_node'][0]:>8,.0f} {r['per_node'][1]:>8,.0f} {r['two_nodes_strict']:>10,.0f} "
                f"{r['ratio']:>5.2f}x {r['ratio_strict']:>5.2f}x {r['sync_rounds']:>6} {r['sync_seconds']:>7.3f} "
                f"{100 * r['accuracy'][0]:>6.2f}/{100 * r['accuracy'][1]:.2f}%"
            )
    ratios = [r["ratio"] for r in rows]
    strict = [r["ratio_strict"] for r in rows]
    print(
        f"median: two nodes {statistics.median(ratios):.2f}x one node (strict {statistics.median(strict):.2f}x); "
        f"range {min(ratios):.2f}-{max(ratios):.2f}x; target >= 1.7x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
