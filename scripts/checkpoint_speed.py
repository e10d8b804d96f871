"""How fast a checkpoint is written, against `dd` into the same folder, and what memory it takes.

    python scripts/checkpoint_speed.py --gib 3                 # an nn.Embedding of 3 GiB
    python scripts/checkpoint_speed.py --gib 3 --module /tmp/old_checkpoint.py   # another save

The model is one nn.Embedding in shared memory (as a run's model is), 33 floats a row (the
matrix factorization's width), built without a private copy. Each round times `dd if=/dev/zero
bs=64M conv=fdatasync` of the same size, then `checkpoint.save` (into a folder with no earlier
checkpoint: both write a new file), and prints MB/s of each, their ratio, and how far the
process's peak RSS rose during the save (the kernel's high-water mark, reset just before it).
Other scale benchmarks call `save_figures(model, folder)` or `measure(gib, folder)`.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType

import torch

from hogwild.run import checkpoint

WIDTH = 33  # floats a row: matrix factorization's embeddings (plus their bias)
DD_BLOCK = 64 << 20


def shared_embedding(gib: float) -> torch.nn.Embedding:
    """An nn.Embedding of about `gib` GiB whose weight lives in shared memory, filled a block
    at a time: the process never holds a private copy of it."""
    rows = max(1, int(gib * 2**30 / (WIDTH * 4)))
    weight = torch.empty(rows, WIDTH).share_memory_()  # untouched pages: nothing copied
    block = max(1, (16 << 20) // (WIDTH * 4))
    for start in range(0, rows, block):
        weight[start : start + block].uniform_(-0.1, 0.1)
    return torch.nn.Embedding(rows, WIDTH, _weight=weight)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the RSS of now; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def save_figures(
    model: torch.nn.Module,
    folder: str,
    module: ModuleType = checkpoint,
    optimizer_state: list | None = None,
    **save_kwargs,
) -> dict[str, float | None]:
    """Write one checkpoint of `model` to `<folder>/last.pt` (removed first) and say what it
    cost: seconds, bytes, MB/s (10^6 bytes), and the rise of the process's peak RSS during the
    save in bytes (None where /proc cannot tell)."""
    path = os.path.join(folder, "last.pt")
    if os.path.exists(path):
        os.unlink(path)
    progress = torch.zeros(2, 4, dtype=torch.int64)
    run = {"data": "bench", "model": type(model).__name__, "num_workers": 2}
    rss_before = _status_kib("VmRSS") if _reset_peak() else None
    t0 = time.perf_counter()
    module.save(path, model, progress, run, {"bench": True}, optimizer_state, **save_kwargs)
    seconds = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    size = os.path.getsize(path)
    return {
        "seconds": seconds,
        "bytes": size,
        "mb_s": size / seconds / 1e6,
        "rss_growth": None if rss_before is None or peak is None else (peak - rss_before) * 1024,
    }


def dd_figures(folder: str, nbytes: int) -> dict[str, float]:
    """`dd` of `nbytes` (whole 64 MiB blocks) of zeros into a new file in `folder`, fdatasync'd."""
    count = max(1, math.ceil(nbytes / DD_BLOCK))
    target = os.path.join(folder, f".dd.{os.getpid()}.tmp")
    t0 = time.perf_counter()
    try:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={target}", f"bs={DD_BLOCK}", f"count={count}"]
            + ["conv=fdatasync"],
            check=True,
            capture_output=True,
        )
        seconds = time.perf_counter() - t0
    finally:
        if os.path.exists(target):
            os.unlink(target)
    return {"seconds": seconds, "bytes": count * DD_BLOCK, "mb_s": count * DD_BLOCK / seconds / 1e6}


def measure(
    gib: float,
    folder: str,
    rounds: int = 2,
    module: ModuleType = checkpoint,
    **save_kwargs,
) -> dict:
    """`rounds` of dd then a save, for an embedding of `gib` GiB; the rounds and their medians."""
    model = shared_embedding(gib)
    model_bytes = model.weight.numel() * model.weight.element_size()
    out: dict = {"model_bytes": model_bytes, "rounds": []}
    try:
        for _ in range(rounds):
            dd = dd_figures(folder, model_bytes)
            save = save_figures(model, folder, module, **save_kwargs)
            out["rounds"].append({"dd": dd, "save": save, "ratio": save["mb_s"] / dd["mb_s"]})
    finally:
        leftover = os.path.join(folder, "last.pt")
        if os.path.exists(leftover):
            os.unlink(leftover)
    out["ratio"] = statistics.median(r["ratio"] for r in out["rounds"])
    out["dd_mb_s"] = statistics.median(r["dd"]["mb_s"] for r in out["rounds"])
    out["save_mb_s"] = statistics.median(r["save"]["mb_s"] for r in out["rounds"])
    growth = [r["save"]["rss_growth"] for r in out["rounds"]]
    out["rss_growth"] = None if None in growth else max(growth)
    return out


def _load_module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkpoint_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=0.5, help="model size (GiB)")
    parser.add_argument("--folder", default=None, help="where to write (default: a new temp dir)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunk-mib", type=float, default=None, help="the save's chunk size")
    parser.add_argument("--module", default=None, help="a checkpoint.py to time instead")
    args = parser.parse_args()
    module = _load_module(args.module) if args.module else checkpoint
    kwargs = {} if args.chunk_mib is None else {"chunk_bytes": int(args.chunk_mib * 2**20)}
    folder = args.folder or tempfile.mkdtemp(prefix="checkpoint_speed.")
    try:
        out = measure(args.gib, folder, args.rounds, module, **kwargs)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    mib = 2**20
    print(f"model {out['model_bytes'] / 2**30:.2f} GiB, {module.__file__}, into {folder}")
    for i, r in enumerate(out["rounds"], 1):
        growth = r["save"]["rss_growth"]
        print(
            f"round {i}: dd {r['dd']['mb_s']:7.0f} MB/s ({r['dd']['seconds']:5.2f} s)   "
            f"save {r['save']['mb_s']:7.0f} MB/s ({r['save']['seconds']:5.2f} s)   "
            f"ratio {r['ratio']:.2f}   peak RSS +"
            + ("?" if growth is None else f"{growth / mib:.0f} MiB")
        )
    growth = out["rss_growth"]
    print(
        f"median: dd {out['dd_mb_s']:.0f} MB/s, save {out['save_mb_s']:.0f} MB/s, "
        f"ratio {out['ratio']:.2f} (target >= 0.5); peak RSS growth "
        + ("?" if growth is None else f"{growth / mib:.0f} MiB")
        + f" ({(growth or 0) / out['model_bytes']:.2f}x the model)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
