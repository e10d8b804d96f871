"""A benchmark never hangs: a row whose process does not end is killed within the row's cap, named
in one line, and marked missing in the table; the other rows still run (issue 31, case A)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from hogwild.bench.runs import EXIT_CAP_SECONDS, HANG_ENV

from support import REPO, cli_env, tagged_processes, wait_until


def test_a_ddp_process_stuck_in_its_exit_is_killed_and_its_row_marked_missing(tmp_path):
    tag, out = uuid.uuid4().hex, tmp_path / "bench.json"
    args = ["--tiny", "--workers", "2", "--no-cli", "--no-plot", "--out", str(out)]
    # the test-only seam: each DDP process sleeps forever once it has sent its figures
    env = cli_env(tag, **{HANG_ENV: "ddp"})
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,  # far above the rows' own caps: a hang fails here, not forever
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # a row is missing
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("bench: row 'mlp ddp fork/file_descriptor 2x1' did not finish in ")
    ]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].endswith("its processes were killed; the row is marked missing")
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    ddp = rows["ddp"]
    assert ddp["missing"] is True and ddp["samples_per_second"] is None
    assert ddp["error"].startswith("did not finish in ")
    assert f"FAILED mlp ddp fork/file_descriptor x2: {ddp['error']}" in result.stdout
    seconds = float(ddp["error"].split()[4])
    assert EXIT_CAP_SECONDS <= seconds < 300, ddp["error"]
    for impl in ("plain", "framework", "framework-step"):  # the other rows still ran
        assert rows[impl]["samples_per_second"] > 0 and "error" not in rows[impl], rows[impl]
    assert wait_until(lambda: not tagged_processes(tag), 30), [
        p.cmdline() for p in tagged_processes(tag)
    ]
