"""The scale benchmark: the framework's own costs as the model grows (`hogwild bench --scale`).

Per embedding-table size (matrix factorization, 33 floats per row, users = 2 x items), one
whole CLI run (`python -m hogwild train +experiment=matrix_factorization ...`, in a fresh
interpreter, as a user runs it) and, beside it, a plain hand-written Hogwild loop on the same
table and the same ratings (fork, shared model, the same optimizer), each in its own process
tree. Printed per size: the peak memory of all the run's processes (PSS) against the model's
bytes, each fixed cost from the run's summary.json, the final checkpoint's MB/s against `dd`
writing as many bytes into the same folder (with fdatasync), and the samples/s of the
framework and of the plain loop. Written to bench-scale.json (and a PNG beside it).

    python -m hogwild bench --scale                       # 2 MB, 755 MB, 3 GiB
    python -m hogwild bench --scale --sizes 2MB,10GiB --ratings 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from hogwild.bench.runs import PeakPSS, run_plain

ROW_BYTES = 33 * 4  # dim 32 + the row's bias, float32
SIZES = "2MB,755MB,3GiB"
UNITS = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def table_users(size: str) -> int:
    """Users for a table of `size` bytes ("755MB", "3GiB"): rows = users + users / 2."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]i?B)\s*", size)
    if m is None or m[2] not in UNITS:
        raise argparse.ArgumentTypeError(f"--sizes: {size!r} is not a size like 2MB, 755MB or 3GiB")
    return max(2, round(float(m[1]) * UNITS[m[2]] / ROW_BYTES / 1.5))


def _run(cmd: list[str], cwd: str, timeout: float) -> tuple[int, int, float, str]:
    """(exit code, peak PSS, wall seconds, output tail) of one command's process tree."""
    t0 = time.monotonic()
    env = {**os.environ, "HOGWILD_PROGRESS": "0"}
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with PeakPSS(p.pid, interval=0.5) as pss:  # twice a second: see PeakPSS
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
    return p.returncode, pss.peak, time.monotonic() - t0, out[-2000:]


def framework(users: int, ratings: int, workers: int, optimizer: str, workdir: str) -> dict:
    folder = os.path.join(workdir, f"run-{users}")
    cmd = [
        sys.executable,
        "-m",
        "hogwild",
        "train",
        "+experiment=matrix_factorization",
        f"optimizer={optimizer}",
        f"trainer.num_workers={workers}",
        "trainer.epochs=1",
        f"data.num_ratings={ratings}",
        f"data.num_users={users}",
        f"data.num_items={users // 2}",
        f"hydra.run.dir={folder}",
    ]
    code, peak, wall, out = _run(cmd, workdir, timeout=1800)
    if code != 0:
        return {"error": f"exit {code}: {out.strip().splitlines()[-1] if out.strip() else ''}"}
    with open(os.path.join(folder, "summary.json")) as f:
        s = json.load(f)
    ckpt = os.path.join(folder, "checkpoints", "last.pt")
    fixed = s["fixed_costs"]
    row = {
        "peak_pss": peak,
        "wall_seconds": wall,
        "samples_per_second": s["samples_per_second"],
        "checkpoint_bytes": os.path.getsize(ckpt),
        "test_rmse": s.get("test_rmse"),
        **{k: fixed.get(k) for k in FIXED},
        "fixed_total": fixed.get("fixed_total"),
    }
    row["checkpoint_mb_per_s"] = row["checkpoint_bytes"] / 1e6 / max(row["final_checkpoint"], 1e-9)
    shutil.rmtree(folder, ignore_errors=True)
    return row


FIXED = (
    "python_and_imports",
    "data_and_model",
    "sharing",
    "start_to_first_step",
    "final_checkpoint",
)


def dd(folder: str, nbytes: int) -> float:
    """MB/s of `dd` writing `nbytes` (at least 64 MiB) into `folder`, fdatasync'd."""
    count = max(1, -(-nbytes // 2**26))
    path = os.path.join(folder, "dd.tmp")
    t0 = time.monotonic()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=64M", f"count={count}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    seconds = time.monotonic() - t0
    os.unlink(path)
    return count * 2**26 / 1e6 / seconds


def plain(users: int, ratings: int, workers: int, optimizer: str, workdir: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "hogwild.bench.scale",
        "--plain-child",
        f"{users},{ratings},{workers},{optimizer}",
    ]
    code, peak, wall, out = _run(cmd, workdir, timeout=1800)
    found = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not found:
        return {"error": f"exit {code}: {out.strip().splitlines()[-1] if out.strip() else ''}"}
    return {**json.loads(found[-1]), "peak_pss": peak, "wall_seconds": wall}


class SharedRowwise:
    """What a careful user writes for a PyTorch-BigGraph-style shared row-wise Adagrad: the
    state made once in the parent, in shared memory, adopted by every worker's optimizer."""

    def __init__(self, states: list[dict]):
        self.states = states
        for state in states:
            for t in state.values():
                t.share_memory_()

    def __call__(self, params, lr: float):
        from hogwild.optim import RowwiseAdagrad

        params = list(params)
        optimizer = RowwiseAdagrad(params, lr=lr)
        for p, state in zip(params, self.states):
            optimizer.state[p] = dict(state)
        return optimizer


def plain_child(users: int, ratings: int, workers: int, optimizer: str) -> None:
    """The plain loop (hogwild.bench.runs.run_plain) on the experiment's data and model."""
    import functools

    import torch
    import torch.nn.functional as F

    from hogwild.data import make_synthetic_ratings
    from hogwild.models import MatrixFactorization

    torch.set_num_threads(1)  # before any torch work: fork children ask for threads later
    data = make_synthetic_ratings(
        num_users=users, num_items=users // 2, num_ratings=ratings, num_test_ratings=20_000
    )
    torch.manual_seed(0)
    model = MatrixFactorization(**data.model_kwargs, dim=32)
    from hogwild.optim import RowwiseAdagrad  # the optimizer class only, none of the framework

    make = {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}.get(optimizer)
    if optimizer == "rowwise_adagrad":  # shared, as the framework shares it: the same work
        make = SharedRowwise([RowwiseAdagrad.initial_state(p) for p in model.parameters()])
    recipe = (256, functools.partial(make, lr=0.1), F.mse_loss)
    result = run_plain(model, data, "fork", "file_descriptor", workers, 1, recipe)
    print(json.dumps({"samples_per_second": result["samples_per_second"]}), flush=True)


def main(
    sizes: str, ratings: int, workers: int, optimizer: str, out: str, plot: bool, pairs: int = 1
) -> int:
    users = [table_users(s) for s in sizes.split(",")]
    workdir = tempfile.mkdtemp(prefix="hogwild-scale-", dir=os.path.dirname(os.path.abspath(out)))
    rows = []
    print(
        f"{'table':>9} {'peak PSS':>9} {'growth':>7} {'data+model':>10} {'sharing':>7} "
        f"{'1st step':>8} {'ckpt':>6} {'ckpt MB/s':>9} {'dd MB/s':>8} {'fixed':>6} "
        f"{'samples/s':>9} {'plain':>9} {'ratio':>5}",
        flush=True,
    )
    try:
        for u, label in zip(users, sizes.split(",")):
            model_bytes = round(u * 1.5) * ROW_BYTES
            row = {"size": label, "users": u, "model_bytes": model_bytes}
            row["framework"] = framework(u, ratings, workers, optimizer, workdir)
            row["dd_mb_per_s"] = dd(workdir, model_bytes)
            row["plain"] = plain(u, ratings, workers, optimizer, workdir)
            if pairs > 1:  # more of both, alternating: samples/s as each side's median
                runs = {
                    side: [row[side].get("samples_per_second")] for side in ("framework", "plain")
                }
                for _ in range(pairs - 1):
                    for side, run in (("framework", framework), ("plain", plain)):
                        extra = run(u, ratings, workers, optimizer, workdir)
                        runs[side].append(extra.get("samples_per_second"))
                for side, values in runs.items():
                    done = [v for v in values if v]
                    row[side]["runs"] = values
                    row[side]["samples_per_second"] = statistics.median(done) if done else None
            rows.append(row)
            print(_line(row, rows[0]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if plot and rows:
        png = os.path.splitext(out)[0] + ".png"
        draw(rows, png)
        print(f"wrote {png}")
    with open(out, "w") as f:
        json.dump(
            {"ratings": ratings, "workers": workers, "optimizer": optimizer, "rows": rows},
            f,
            indent=2,
        )
    print(f"wrote {out}")
    return 1 if any("error" in r["framework"] or "error" in r["plain"] for r in rows) else 0


def draw(rows: list[dict], png: str) -> None:
    """Three panels by table size: memory against the model, the fixed costs, samples/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r["framework"]]
    gib = [r["model_bytes"] / 2**30 for r in ok]
    fig, (mem, fixed, speed) = plt.subplots(1, 3, figsize=(15, 4.2))
    mem.plot(
        gib, [r["framework"]["peak_pss"] / 2**30 for r in ok], "o-", label="peak PSS, all processes"
    )
    base = ok[0]["framework"]["peak_pss"] / 2**30 if ok else 0
    mem.plot(
        gib, [base + 1.5 * (g - gib[0]) for g in gib], "--", color="grey", label="+1.5x the model"
    )
    mem.set(xlabel="embedding table (GiB)", ylabel="GiB", title="memory")
    mem.legend(loc="upper left", fontsize=8)
    labels = [r["size"] for r in ok]
    bottom = [0.0] * len(ok)
    for key in FIXED:
        values = [r["framework"].get(key) or 0.0 for r in ok]
        fixed.bar(labels, values, bottom=bottom, label=key.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    fixed.set(ylabel="seconds", title="fixed costs (wall clock minus training)")
    fixed.legend(fontsize=7, loc="upper left")
    x = range(len(ok))
    speed.bar(
        [i - 0.2 for i in x],
        [r["framework"]["samples_per_second"] for r in ok],
        0.4,
        label="framework",
    )
    speed.bar(
        [i + 0.2 for i in x],
        [r["plain"].get("samples_per_second") or 0 for r in ok],
        0.4,
        label="plain loop",
    )
    speed.set_xticks(list(x), labels)
    speed.set(ylabel="samples/s", title="training throughput")
    speed.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _line(row: dict, first: dict) -> str:
    f, p = row["framework"], row["plain"]
    if "error" in f:
        return f"{row['size']:>9} framework failed: {f['error']}"
    growth = (f["peak_pss"] - first["framework"].get("peak_pss", 0)) / max(
        row["model_bytes"] - first["model_bytes"], 1
    )
    sps, plain_sps = f["samples_per_second"], p.get("samples_per_second")
    return (
        f"{row['size']:>9} {f['peak_pss'] / 2**20:>7.0f}Mi {growth if row is not first else 0:>6.2f}x "
        f"{f['data_and_model']:>9.1f}s {f['sharing']:>6.1f}s {f['start_to_first_step']:>7.1f}s "
        f"{f['final_checkpoint']:>5.1f}s {f['checkpoint_mb_per_s']:>9.0f} {row['dd_mb_per_s']:>8.0f} "
        f"{f['fixed_total']:>5.1f}s {sps:>9,.0f} {plain_sps or 0:>9,.0f} "
        f"{(sps / plain_sps) if plain_sps else float('nan'):>5.2f}"
    )


def _child(argv: list[str]) -> None:
    """`python -m hogwild.bench.scale --plain-child users,ratings,workers,optimizer`."""
    users, ratings, workers, optimizer = argv[1].split(",")
    plain_child(int(users), int(ratings), int(workers), optimizer)


if __name__ == "__main__" and sys.argv[1:2] == ["--plain-child"]:
    _child(sys.argv[1:])
