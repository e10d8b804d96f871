"""A Hydra sweep as one table, one row per job (docs/performance.md): what the CLI prints at the
end of `python -m hogwild train -m ...`, and what scripts/sweep_table.py prints (and plots) for
a sweep folder afterwards. Reads each job folder's summary.json and .hydra/overrides.yaml; a
job without summary.json (refused before it started, or still running) is listed as `missing`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from hogwild.reporting.text import print_cells

FIELDS = (
    "status",
    "num_workers",
    "samples_per_second",
    "test_accuracy",
    "test_rmse",
    "wall_seconds",
)


def read_job(job: Path) -> dict:
    overrides_file = job / ".hydra" / "overrides.yaml"
    overrides = (
        (yaml.safe_load(overrides_file.read_text()) or []) if overrides_file.is_file() else []
    )
    summary_file = job / "summary.json"
    summary = (
        json.loads(summary_file.read_text()) if summary_file.is_file() else {"status": "missing"}
    )
    return {
        "job": job.name,
        "folder": str(job),
        "overrides": list(overrides),
        **{k: summary.get(k) for k in FIELDS},
    }


def read_sweep(folder: Path) -> list[dict]:
    jobs = sorted(
        (p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    return [read_job(job) for job in jobs]


def varying(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The overrides every job shares, and per job the ones that differ (what the sweep varies)."""
    common = [o for o in rows[0]["overrides"] if all(o in r["overrides"] for r in rows)]
    return common, [[o for o in r["overrides"] if o not in common] for r in rows]


def _result(r: dict) -> str:
    if r["test_rmse"] is not None:
        return f"RMSE {r['test_rmse']:.4f}"
    if r["test_accuracy"] is not None:
        return f"{100 * r['test_accuracy']:.2f}%"
    return "-"


def print_table(rows: list[dict]) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    common, own = varying(rows)
    print("all jobs:", " ".join(common) or "(no common overrides)")
    cells = [
        [
            "job",
            "overrides",
            "status",
            "workers",
            "samples/s",
            "test result",
            "wall s",
            "run folder",
        ]
    ] + [
        [
            r["job"],
            " ".join(mine) or "(none)",
            r["status"],
            fmt(r["num_workers"], "d"),
            fmt(r["samples_per_second"], ",.0f"),
            _result(r),
            fmt(r["wall_seconds"], ".1f"),
            _short(r["folder"]),
        ]
        for r, mine in zip(rows, own)
    ]
    print_cells(cells, left=3)


def _short(folder: str) -> str:
    rel = os.path.relpath(folder)
    return folder if rel.startswith("..") else rel
