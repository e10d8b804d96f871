"""One table for a Hydra sweep: `python scripts/sweep_table.py outputs/multirun/<date>_<time>`.

Reads every job folder of the sweep (0/, 1/, ...: summary.json and .hydra/overrides.yaml),
prints overrides, status, workers, samples/s, test accuracy and wall time per job, and writes
sweep.json (the same rows) and sweep.png (samples/s vs num_workers, one line per combination
of the other overrides) into the sweep folder. A job without summary.json (refused before it
started, or still running) is listed as `missing`.

    python -m hogwild train -m trainer.num_workers=1,2 trainer.start_method=fork,forkserver \
        data=synthetic trainer.epochs=1
    python scripts/sweep_table.py outputs/multirun/2026-01-01_12-00-00
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from hogwild.bench.report import print_cells, pyplot

FIELDS = ("status", "num_workers", "samples_per_second", "test_accuracy", "wall_seconds")


def read_job(job: Path) -> dict:
    overrides_file = job / ".hydra" / "overrides.yaml"
    overrides = (
        (yaml.safe_load(overrides_file.read_text()) or []) if overrides_file.is_file() else []
    )
    summary_file = job / "summary.json"
    summary = (
        json.loads(summary_file.read_text()) if summary_file.is_file() else {"status": "missing"}
    )
    return {"job": job.name, "overrides": list(overrides), **{k: summary.get(k) for k in FIELDS}}


def read_sweep(folder: Path) -> list[dict]:
    jobs = sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    return [read_job(job) for job in jobs]


def varying(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The overrides every job shares, and per job the ones that differ (what the sweep varies)."""
    common = [o for o in rows[0]["overrides"] if all(o in r["overrides"] for r in rows)]
    return common, [[o for o in r["overrides"] if o not in common] for r in rows]


def print_table(rows: list[dict]) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    common, own = varying(rows)
    print("all jobs:", " ".join(common) or "(no common overrides)")
    cells = [["job", "overrides", "status", "workers", "samples/s", "test acc %", "wall s"]] + [
        [
            r["job"],
            " ".join(mine) or "(none)",
            r["status"],
            fmt(r["num_workers"], "d"),
            fmt(r["samples_per_second"], ",.0f"),
            fmt(r["test_accuracy"] and 100 * r["test_accuracy"], ".2f"),
            fmt(r["wall_seconds"], ".1f"),
        ]
        for r, mine in zip(rows, own)
    ]
    print_cells(cells, left=3)


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot(path)
    if plt is None:
        return

    lines: dict[str, list[tuple[int, float]]] = {}
    for r, mine in zip(rows, varying(rows)[1]):
        if r["num_workers"] and r["samples_per_second"]:
            others = (
                " ".join(o for o in mine if not o.startswith("trainer.num_workers=")) or "all jobs"
            )
            lines.setdefault(others, []).append((r["num_workers"], r["samples_per_second"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in lines.items():
        ax.plot(*zip(*sorted(pts)), "-o", label=label)
    ax.set(title=path.parent.name, xlabel="num_workers", ylabel="samples/s", ylim=(0, None))
    ax.set_xticks(sorted({r["num_workers"] for r in rows if r["num_workers"]}))
    ax.grid(alpha=0.3)
    if lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="one table (+ sweep.json, sweep.png) for a Hydra multirun folder"
    )
    p.add_argument(
        "folder", type=Path, help="the sweep folder, e.g. outputs/multirun/<date>_<time>"
    )
    p.add_argument("--no-plot", action="store_true", help="skip sweep.png")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        print(f"sweep_table: {args.folder} is not a folder", file=sys.stderr)
        return 2
    rows = read_sweep(args.folder)
    if not rows:
        print(f"sweep_table: no job folders (0/, 1/, ...) in {args.folder}", file=sys.stderr)
        return 2
    print_table(rows)
    (args.folder / "sweep.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.folder / 'sweep.json'}")
    if not args.no_plot:
        plot(rows, args.folder / "sweep.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
