"""The fixed costs: where a run's wall clock goes outside training, phase by phase
(hogwild.reporting.timeline; summary.json's `fixed_costs`).

The framework rows run through the Python API inside the benchmark's process, so their
breakdown starts at `Trainer.fit`; one whole CLI run (`python -m hogwild train ...` in a fresh
interpreter) adds what a user's command pays first: the interpreter and imports, Hydra's
compose, the torch import, the data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from hogwild.reporting.text import print_cells

SKIP = ("fixed_total", "during_training")


def cli_run(model: str, samples: int, test_samples: int, workdir: str) -> dict:
    """One `hogwild train` on synthetic data, 1 epoch, default start method; its summary."""
    run_dir = tempfile.mkdtemp(prefix="cli-", dir=workdir)
    command = [
        *(sys.executable, "-m", "hogwild", "train", "data=synthetic", f"model={model}"),
        *(f"data.num_samples={samples}", f"data.num_test_samples={test_samples}"),
        *("trainer.epochs=1", f"hydra.run.dir={run_dir}"),
    ]
    env = {**os.environ, "HOGWILD_PROGRESS": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return {"error": f"exit code {done.returncode}: {done.stderr.strip()[-500:]}"}
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    summary["command"] = " ".join(command[1:-1])
    summary["model_name"] = model
    return summary


def print_breakdowns(rows: list[dict], cli: dict | None) -> None:
    """One column per run: the first framework row of each model, and the CLI run."""
    runs = {}
    for r in rows:
        label = f"{r['model']} x{r['num_workers']} {r['start_method']}"
        if (
            r["impl"] == "framework"
            and r.get("fixed_costs")
            and r["model"] not in {k.split()[0] for k in runs}
        ):
            runs[label + " (API)"] = r["fixed_costs"]
    if cli and cli.get("fixed_costs"):
        runs[f"{cli['model_name']} CLI"] = cli["fixed_costs"]
    if not runs:
        return
    longest_first = sorted(runs.values(), key=len, reverse=True)  # the CLI's order: it has all
    phases = list(dict.fromkeys(k for costs in longest_first for k in costs if k not in SKIP))
    cells = [["seconds", *runs]]
    for phase in [*phases, "fixed_total"]:
        cells.append([phase, *(_cell(costs.get(phase)) for costs in runs.values())])
    print("\nfixed costs (summary.json's fixed_costs; training is the steady state):")
    print_cells(cells, left=1)
    if cli and cli.get("command"):
        print(f"CLI run: {cli['command']}")
    elif cli and cli.get("error"):
        print(f"CLI run failed: {cli['error']}")


def _cell(value) -> str:
    return "-" if value is None else f"{value:.2f}"
