"""The framework's hot-path tax: the same Hogwild job through a plain hand-written loop and
through `hogwild.Trainer`, reporting every 10 steps (the default), every step and every 100
steps, and the same job under torch DDP (gloo, one process per worker); runs interleaved,
medians of the repeats.

    python scripts/hot_path.py                      # MLP 784-256-10, 2 workers x 1 thread, fork,
                                                    # 60,000 samples x 4 epochs, 5 repeats (~3 min)
    python scripts/hot_path.py --repeats 1 --epochs 1 --json out.json

samples/s is the steady state (all samples / first to last optimizer step, every worker
together), the figure `hogwild bench` reports. The ratios divide each framework median by the
plain loop's median; 1.00 means the framework costs nothing. The last column is the framework
(every 10) over the plain loop and over DDP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch

from hogwild.bench.ddp import run_ddp
from hogwild.bench.recipes import build, recipe
from hogwild.bench.runs import run_framework, run_plain

KINDS = {"plain": None, "every 10": 10, "every step": 1, "every 100": 100, "ddp": "ddp"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=60_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of: {', '.join(KINDS)}")
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args()
    torch.set_num_threads(1)  # the parent must not start an OpenMP pool before fork
    os.environ["HOGWILD_PROGRESS"] = "0"
    kinds = {k: KINDS[k] for k in args.kinds.split(",")}
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.repeats):
            for kind, every in kinds.items():
                model, data = build("mlp", args.samples)
                common = (model, data, args.start_method, "file_descriptor", args.workers, 1)
                if every is None:
                    r = run_plain(*common, recipe("mlp"), epochs=args.epochs)
                elif every == "ddp":
                    r = run_ddp(*common, recipe("mlp"), epochs=args.epochs)
                else:
                    r = run_framework(
                        *common, workdir, recipe("mlp"), epochs=args.epochs, log_every=every
                    )
                runs[kind].append(r["samples_per_second"])
                print(f"[{i + 1}/{args.repeats}] {kind:<10} {r['samples_per_second']:>10,.0f}/s")
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n{'run':<12}{'median samples/s':>18}{'/ plain':>9}{'framework / it':>16}")
    for kind, m in medians.items():
        fw = medians.get("every 10")
        vs = f"{fw / m:>16.2f}" if fw and kind in ("plain", "ddp") else ""
        base = medians.get("plain")
        print(f"{kind:<12}{m:>18,.0f}{m / base if base else float('nan'):>9.3f}{vs}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
