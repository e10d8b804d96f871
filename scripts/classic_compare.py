"""The framework against the classic PyTorch MNIST Hogwild example, same work, one run.

    python scripts/classic_compare.py            # 60,000 samples x 2 processes (~2.5 min on 2 cores)
    python scripts/classic_compare.py --samples 3000 --json out.json

The classic example (pytorch/examples, mnist_hogwild) trains the conv net with N processes that
each make a full pass over the training set through a DataLoader (one loader worker, per-sample
PIL -> tensor -> normalize transforms) and no thread cap, then tests once. It is rebuilt here
from its published structure (no torchvision needed: the per-sample transform does what
ToTensor + Normalize do), on MNIST-shaped data generated offline. The framework does the same
work: 2 workers x (samples x 2) in total, the same net, batch size, SGD(lr 0.01, momentum 0.5).
Both are timed as whole processes, start-up and final test included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROCESSES = 2


def classic(samples: int) -> None:
    """The classic example's shape, inline and framework-free (runs in its own process)."""
    import numpy as np
    import torch
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
    from PIL import Image

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
            self.conv2_drop, self.fc1, self.fc2 = (
                nn.Dropout2d(),
                nn.Linear(320, 50),
                nn.Linear(50, 10),
            )

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
            x = F.dropout(F.relu(self.fc1(x.view(-1, 320))), training=self.training)
            return F.log_softmax(self.fc2(x), dim=1)

    class Images(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            rng = np.random.default_rng(seed)
            self.x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
            self.y = rng.integers(0, 10, n)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):  # what torchvision's MNIST + ToTensor + Normalize do per sample
            img = Image.fromarray(self.x[i])  # 2-D uint8: mode "L", as MNIST does
            t = (
                torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
                .view(1, 28, 28)
                .float()
                .div(255)
            )
            return (t - 0.1307) / 0.3081, int(self.y[i])

    def train(rank, model, dataset):
        torch.manual_seed(1 + rank)
        loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()

    torch.manual_seed(1)
    model = Net()
    model.share_memory()
    train_set, test_set = Images(samples, 0), Images(10_000, 1)
    procs = [mp.Process(target=train, args=(rank, model, train_set)) for rank in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    model.eval()
    with torch.no_grad():
        for data, target in torch.utils.data.DataLoader(test_set, batch_size=1000, num_workers=1):
            F.nll_loss(model(data), target, reduction="sum")


def timed(
    cmd: list[str], cwd: str, env: dict | None = None, stall_seconds: float = 15.0
) -> float | None:
    """Wall seconds of a whole process tree, or None when it hung (no CPU used for a while)."""
    import psutil

    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL
    )
    root, last_cpu, last_change = psutil.Process(proc.pid), -1.0, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.5)
        cpu = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:  # user, system, and the reaped children's (an exited worker's CPU stays counted)
                cpu += sum(p.cpu_times()[:4])
            except psutil.Error:  # it exited between the two calls
                pass
        if cpu > last_cpu + 0.05:
            last_cpu, last_change = cpu, time.monotonic()
        elif time.monotonic() - last_change > stall_seconds:
            for p in [*root.children(recursive=True), root]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            proc.wait()
            return None
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--samples",
        type=int,
        default=60_000,
        help="training set size (each process passes over it once)",
    )
    p.add_argument(
        "--start-method", default="forkserver", help="the framework's trainer.start_method"
    )
    p.add_argument("--json", help="also write the figures here")
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=15.0,
        help="a process tree that uses no CPU this long is reported as hung and killed (default 15)",
    )
    p.add_argument(
        "--classic-only", action="store_true", help=argparse.SUPPRESS
    )  # the child process
    args = p.parse_args(argv)
    if args.classic_only:
        classic(args.samples)
        return 0

    total = args.samples * PROCESSES
    with tempfile.TemporaryDirectory() as tmp:
        classic_cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--classic-only",
            "--samples",
            str(args.samples),
        ]
        # as published: no thread cap. On torch 2.13 here its workers hang (OpenMP after fork:
        # the parent's share_memory() starts the thread pool), so the capped variant runs too.
        classic_s = timed(classic_cmd, tmp, stall_seconds=args.stall_seconds)
        capped_s = timed(
            classic_cmd, tmp, env={"OMP_NUM_THREADS": "1"}, stall_seconds=args.stall_seconds
        )
        framework_s = timed(
            [
                sys.executable,
                "-m",
                "hogwild",
                "train",
                "+experiment=mnist",
                "data=synthetic",
                f"data.num_samples={args.samples}",
                f"trainer.epochs={PROCESSES}",
                f"trainer.num_workers={PROCESSES}",
                f"trainer.start_method={args.start_method}",
                f"hydra.run.dir={tmp}/run",
            ],
            tmp,
            stall_seconds=args.stall_seconds,
        )
        with open(os.path.join(tmp, "run", "summary.json")) as f:
            summary = json.load(f)
    result = {
        "samples": total,
        "classic_wall_seconds": classic_s and round(classic_s, 2),  # None: it hung
        "classic_omp1_wall_seconds": capped_s and round(capped_s, 2),
        "framework_wall_seconds": round(framework_s, 2),
        "speedup": classic_s and round(classic_s / framework_s, 2),
        "speedup_vs_omp1": capped_s and round(capped_s / framework_s, 2),
        "framework_train_seconds": summary["train_seconds"],
        "framework_startup_seconds": summary["startup_seconds"],
        "framework_start_method": args.start_method,
    }
    print(f"{total:,} samples, conv net, {PROCESSES} processes, whole process wall clock")
    for name, s in (("classic example  ", classic_s), ("classic, 1 thread", capped_s)):
        if s is None:
            print(f"  {name}    hung  (no CPU used for {args.stall_seconds:g} s: killed)")
        else:
            print(
                f"  {name} {s:7.1f} s  ({total / s:,.0f} samples/s, {s / framework_s:.1f}x the framework's time)"
            )
    print(
        f"  hogwild {args.start_method:9} {framework_s:7.1f} s  ({total / framework_s:,.0f} samples/s; "
        f"{summary['startup_seconds']:.1f} s start-up, {summary['train_seconds']:.1f} s training)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
