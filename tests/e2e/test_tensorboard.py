"""The dashboards, as a user opens them: a real TensorBoard on loopback, asked over HTTP, and
looked at in a headless browser where one is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support import free_port, read_summary, wait_until

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def post_json(url: str, body: dict):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


# the sweep's job folders, named by what each job varies: TensorBoard's names for its runs
JOBS = ("0_trainer.num_workers=1", "1_trainer.num_workers=2")
RUNS = {f"{job}/tensorboard" for job in JOBS}


@pytest.fixture(scope="module")
def board(two_run_sweep):
    """TensorBoard over the sweep folder, once it serves both runs: its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(two_run_sweep)]
        + ["--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def serves_both_runs() -> bool:
        if process.poll() is not None:
            return True  # reported below
        try:
            return RUNS <= set(get_json(f"{base}/data/runs"))
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            return False

    try:
        wait_until(serves_both_runs, timeout=60, interval=0.5)
        if process.poll() is not None:
            pytest.skip(f"tensorboard could not serve on 127.0.0.1:{port}: {process.stderr.read()}")
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_multirun_gives_one_run_folder_per_value(two_run_sweep):
    sweep = two_run_sweep
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == list(JOBS)
    assert [read_summary(sweep / job)["num_workers"] for job in JOBS] == [1, 2]


def test_tensorboard_serves_every_run_tag_and_one_run_per_worker(board):
    runs = set(get_json(f"{board}/data/runs"))
    workers = {f"{JOBS[0]}/tensorboard/w0", f"{JOBS[1]}/tensorboard/w1"}
    assert RUNS | workers <= runs, runs
    tags = get_json(f"{board}/data/plugin/scalars/tags")
    for run in RUNS:
        for tag in ("train/loss", "train/lr", "perf/samples_per_second", "eval/accuracy"):
            assert tag in tags[run], (run, sorted(tags[run]))
    for run in workers:  # the same tag in every worker's run: one chart, one line per worker
        assert "workers/loss" in tags[run], (run, sorted(tags[run]))


def test_the_custom_scalars_tab_lays_out_the_runs_task_with_its_own_charts(board):
    (category,) = get_json(f"{board}/data/plugin/custom_scalars/layout")["category"]
    charts = [chart["title"] for chart in category["chart"]]
    assert category["title"] == "classification", category["title"]
    assert {"train/loss", "eval/accuracy", "workers/loss"} <= set(charts), charts
    assert "eval/rmse" not in charts and charts == sorted(charts)


def test_the_hparams_tab_has_what_ran_as_columns_and_the_final_figures(board):
    plugins = get_json(f"{board}/data/plugins_listing")
    assert plugins.get("hparams", {}).get("enabled"), plugins.get("hparams")
    experiment = post_json(f"{board}/data/plugin/hparams/experiment", {"experimentName": ""})
    titles = [h.get("displayName") for h in experiment["hparamInfos"]]
    assert titles[:5] == ["data", "model", "optimizer", "workers", "lr"], titles
    assert {"experiment", "batch size", "start method", "sharing strategy", "device"} <= set(titles)
    metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"summary/test_accuracy", "summary/ksamples_per_second"} <= metrics
    groups = post_json(
        f"{board}/data/plugin/hparams/session_groups",
        {"experimentName": "", "allowedStatuses": ["STATUS_SUCCESS"], "startIndex": 0}
        | {"sliceSize": 10, "colParams": []},
    )["sessionGroups"]
    rows = {g["name"]: g["hparams"] for g in groups}
    assert sorted(name[:3] for name in rows) == ["#0 ", "#1 "], rows  # job number, then time
    assert sorted(row["04_num_workers"] for row in rows.values()) == [
        "1",
        "2",
    ]  # text: "1", not "1.0000"
    assert {row["01_data"] for row in rows.values()} == {"synthetic"}
    assert {row["05_lr"] for row in rows.values()} == {0.05}  # shown at first, a number


def browser() -> str | None:
    return next(filter(None, map(shutil.which, BROWSERS)), None)


@pytest.mark.skipif(
    browser() is None,
    reason=f"no headless browser ({' / '.join(BROWSERS)} on PATH) to screenshot TensorBoard with; "
    "`apt-get install chromium` gives one",
)
def test_a_browser_renders_the_scalars_and_hparams_pages(board, tmp_path):
    """Screenshots for a person to look at: HOGWILD_SCREENSHOTS=<folder> keeps them there."""
    from PIL import Image

    folder = Path(os.environ.get("HOGWILD_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    # the workers' charts, and the whole HParams table (columns, number formats)
    pages = {"scalars": ("#scalars&tagFilter=workers", 1400), "hparams": ("#hparams", 2200)}
    for page, (fragment, width) in pages.items():
        png = folder / f"tensorboard_{page}.png"
        command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic"]
        command += ["--no-first-run", "--disable-background-networking", "--disable-sync"]
        command += ["--disable-component-update", f"--user-data-dir={tmp_path / 'profile'}"]
        command += [f"--screenshot={png}", f"--window-size={width},1000"]
        command += ["--virtual-time-budget=15000", board + "/" + fragment]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert png.is_file(), result.stderr[-500:]
        colours = Image.open(png).convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 100, f"{png} is nearly blank"  # a drawn page
