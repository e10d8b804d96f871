"""The CUDA check: run it on a machine with a GPU (about 1-2 minutes).

    python scripts/gpu_check.py [--out gpu_check.json] [--samples 60000]

For 1, 2 and 4 workers on one GPU (forkserver), then the same model on the CPU, it trains an
MLP on MNIST-shaped synthetic data through the Python API and checks:

- CUDA-IPC sharing: the orchestrator's own copy of the parameters (on the GPU) changed, so the
  workers' updates landed in the orchestrator's memory, not in copies;
- no leaks: no process of the run is left, no new /dev/shm/torch_* entry, and no "producer
  process has been terminated" warning;
- the run completed and learned (test accuracy);

and prints samples/s per worker count next to the CPU's. Exit 0 when every check passes, 1 when
one fails, 3 (with the reason) when this machine has no CUDA device.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid


def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith("torch_")}
    except FileNotFoundError:
        return set()


def one_run(device: str, workers: int, samples: int, folder: str) -> dict:
    """One training run through the Python API, in this process (a child of main())."""
    import torch

    from hogwild import Trainer, TrainerConfig
    from hogwild.data import make_synthetic
    from hogwild.models import MLP

    torch.set_num_threads(1)  # before any torch work: the orchestrator stays off the workers' cores
    data = make_synthetic(num_samples=samples, num_test_samples=5000, noise=2.0)
    torch.manual_seed(0)
    model = MLP(data.input_shape, data.num_classes)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model,
        data,
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5),
        TrainerConfig(
            num_workers=workers,
            device=device,
            epochs=2,
            threads_per_worker=1,
            start_method="forkserver",
        ),
        batch_size=64,
        output_dir=os.path.join(folder, f"{device.replace(':', '')}-{workers}"),
    )
    summary = trainer.fit()
    after = list(trainer.model.parameters())
    return {
        "device": device,
        "workers": workers,
        "samples": summary["total_samples"],
        "samples_per_second": summary["samples_per_second"],
        "startup_seconds": summary.get("startup_seconds"),
        "test_accuracy": summary["test_accuracy"],
        "data_on_device": summary.get("data_on_device"),
        "status": summary["status"],
        # the orchestrator's own tensors: changed only if the workers wrote into them (CUDA IPC)
        "updates_seen_by_orchestrator": any(
            not torch.equal(b, a.detach().cpu()) for b, a in zip(before, after)
        ),
        "parameters_on": sorted({a.device.type for a in after}),
    }


def checked_run(device: str, workers: int, samples: int, folder: str) -> dict:
    """one_run in a child process whose whole tree (fork server, workers) is tagged and watched."""
    import psutil

    tag = f"gpu-check-{uuid.uuid4().hex}"
    shm = shm_entries()
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--one",
            device,
            str(workers),
            "--samples",
            str(samples),
            "--folder",
            folder,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "GPU_CHECK_TAG": tag},
        timeout=300,
    )
    wall = time.perf_counter() - t
    time.sleep(1.0)  # workers exit with their orchestrator; torch_shm_manager cleans up after them
    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("GPU_CHECK_TAG") == tag:
                left.append(p.pid)
    try:
        row = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        row = {
            "device": device,
            "workers": workers,
            "status": f"crashed ({proc.returncode})",
            "stderr_tail": proc.stderr[-2000:],
        }
    row["wall_seconds"] = round(wall, 2)
    row["checks"] = {
        "completed": row.get("status") == "completed",
        "learned": (row.get("test_accuracy") or 0) > 0.9,
        "updates_seen_by_orchestrator": bool(row.get("updates_seen_by_orchestrator")),
        "parameters_stay_on_device": row.get("parameters_on") == [torch_type(device)],
        "no_process_left": not left,
        "no_shm_left": not (shm_entries() - shm),
        "no_producer_warning": "Producer process has been terminated" not in proc.stderr,
    }
    return row


def torch_type(device: str) -> str:
    return device.split(":")[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="also write the results as JSON here")
    p.add_argument(
        "--samples", type=int, default=60_000, help="training samples (2 epochs are run)"
    )
    p.add_argument("--workers", default="1,2,4", help="GPU worker counts")
    p.add_argument(
        "--one", nargs=2, metavar=("DEVICE", "WORKERS"), help=argparse.SUPPRESS
    )  # the child
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.one[0], int(args.one[1]), args.samples, args.folder)))
        return 0

    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device here (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda}): nothing to check",
            file=sys.stderr,
        )
        return 3
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for device, workers in [
            *(("cuda", int(w)) for w in args.workers.split(",")),
            ("cpu", min(4, len(os.sched_getaffinity(0)))),
        ]:
            row = checked_run(device, workers, args.samples, folder)
            rows.append(row)
            failed = [k for k, ok in row["checks"].items() if not ok]
            print(
                f"  {device:4} {workers} worker(s): {row.get('samples_per_second') or 0:>10,.0f} samples/s, "
                f"{row['wall_seconds']:5.1f} s, accuracy {row.get('test_accuracy') or 0:.3f}, "
                f"data on device {row.get('data_on_device')}: "
                + ("ok" if not failed else "FAILED " + ", ".join(failed)),
                flush=True,
            )
            if "stderr_tail" in row:
                print(row["stderr_tail"], file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows},
                f,
                indent=2,
            )
    return 1 if any(not all(r["checks"].values()) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
