"""A Python API script without `if __name__ == '__main__':` under spawn or forkserver: every
worker re-imports it. The run says so in one line and writes nothing extra: the orchestrator
refuses before it starts anything when it can read the script, and a worker that re-runs the
script anyway refuses before it claims a folder, its orchestrator naming the cause."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

GUARD = "has no `if __name__ == '__main__':` guard: spawn and forkserver workers re-import it"
DOCS = (
    "https://docs.python.org/3/library/multiprocessing.html#the-spawn-and-forkserver-start-methods"
)

SCRIPT = """\
import functools
import sys

import torch
from torch import nn

from hogwild import Trainer, TrainerConfig
from hogwild.data import DataSplits

g = torch.Generator().manual_seed(0)
x = torch.randn(600, 8, generator=g)
y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).long()
data = DataSplits(x[:500], y[:500], x[500:], y[500:], num_classes=2, name="tiny")
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
trainer = Trainer(
    model,
    data,
    functools.partial(torch.optim.SGD, lr=0.05),
    TrainerConfig(num_workers=2, epochs=1, start_method=sys.argv[1]),
    batch_size=50,
)
{call}
"""
# At the top level, as the script does it: the orchestrator reads it and refuses.
PLAIN = "summary = trainer.fit()\nsys.exit(summary['status'] != 'completed')"
# Behind an `if` that is no guard: the orchestrator cannot tell, the workers refuse.
HIDDEN = """\
if len(sys.argv) > 1:  # true in the workers too
    summary = trainer.fit()
    print("status", summary["status"], summary["error"]["reason"])
    sys.exit(summary["status"] != "completed")
"""


def run_script(tmp_path, call: str, start_method: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train_unguarded.py"
    script.write_text(SCRIPT.format(call=textwrap.dedent(call)))
    return subprocess.run(
        [sys.executable, str(script), start_method],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_unguarded_script_is_refused_before_anything_starts(tmp_path, start_method, no_leaks):
    result = run_script(tmp_path, PLAIN, start_method)
    assert result.returncode == 1, result.stderr  # an uncaught exception, as Python ends a script
    last = lines(result.stderr)[-1]
    assert last.startswith("hogwild.errors.PreflightError: the script that calls Trainer.fit()")
    assert GUARD in last and DOCS in last and "train_unguarded.py" in last
    assert len(lines(result.stderr)) < 10, result.stderr  # the traceback of one call, no worker's
    assert "failed" not in result.stderr and "bootstrapping phase" not in result.stderr
    assert not (tmp_path / "outputs").exists()  # nothing written, no worker started


def test_workers_that_rerun_an_unguarded_script_refuse_and_say_why(tmp_path, no_leaks):
    result = run_script(tmp_path, HIDDEN, "spawn")
    assert result.returncode == 1, result.stderr
    # one line on the console: the orchestrator's account of the first worker that refused
    (line,) = lines(result.stderr)
    assert line.startswith("worker ") and GUARD in line and DOCS in line, line
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith("status failed the script that calls Trainer.fit()")
    assert GUARD in result.stdout  # summary.json's reason is the same line
    # the orchestrator's own run folder, failed; the workers claimed none
    folders = list((tmp_path / "outputs").glob("*/*"))
    assert len(folders) == 1, folders
    assert (folders[0] / "summary.json").exists()
