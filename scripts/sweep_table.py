"""One table for a Hydra sweep: `python scripts/sweep_table.py outputs/multirun/<date>_<time>`.

Reads every job folder of the sweep (0_<overrides>/, 1_<overrides>/, ...: summary.json and
.hydra/overrides.yaml), prints overrides, status, workers, samples/s, test accuracy and wall
time per job, and writes sweep.json (the same rows) and sweep.png (samples/s vs num_workers, one
line per combination of the other overrides) into the sweep folder. A job without summary.json
(refused before it started, or still running) is listed as `missing`; one that an interrupted
sweep never started left no folder, and only the sweep's own table (printed by the CLI) lists
it, as `not run`.

    python -m hogwild train -m trainer.num_workers=1,2 trainer.start_method=fork,forkserver \
        data=synthetic trainer.epochs=1
    python scripts/sweep_table.py outputs/multirun/2026-01-01_12-00-00
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hogwild.bench.report import pyplot
from hogwild.cli.sweep import print_table, read_sweep, varying


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
        print(
            f"sweep_table: no job folders (0_..., 1_..., or 0, 1, ...) in {args.folder}",
            file=sys.stderr,
        )
        return 2
    print_table(rows)
    (args.folder / "sweep.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.folder / 'sweep.json'}")
    if not args.no_plot:
        plot(rows, args.folder / "sweep.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
