"""The dashboards, as a user opens them: a real TensorBoard on loopback, asked over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from support import free_port, read_summary


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_multirun_gives_one_run_folder_per_value(two_run_sweep):
    sweep = two_run_sweep
    workers = sorted(read_summary(sweep / str(i))["num_workers"] for i in range(2))
    assert workers == [1, 2]


def test_tensorboard_serves_every_run_tag_and_hparams_of_a_sweep(two_run_sweep):
    sweep = two_run_sweep
    port = free_port()
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(sweep),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--reload_interval",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        runs = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(runs) < 2:
            if board.poll() is not None:
                pytest.skip(
                    f"tensorboard could not serve on 127.0.0.1:{port}: {board.stderr.read()[-300:]}"
                )
            try:
                runs = [r for r in get_json(f"{base}/data/runs") if r.endswith("tensorboard")]
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        assert sorted(runs) == ["0/tensorboard", "1/tensorboard"], runs
        tags = get_json(f"{base}/data/plugin/scalars/tags")
        for run in runs:
            for tag in (
                "train/loss",
                "train/lr",
                "perf/samples_per_second",
                "eval/loss",
                "eval/accuracy",
                "workers/loss/rank_00",
            ):
                assert tag in tags[run], (run, sorted(tags[run]))
        assert "workers/loss/rank_01" in tags["1/tensorboard"]  # the 2-worker run
        plugins = get_json(f"{base}/data/plugins_listing")
        assert plugins.get("hparams", {}).get("enabled"), plugins.get("hparams")
        request = urllib.request.Request(
            f"{base}/data/plugin/hparams/experiment",
            data=b'{"experimentName": ""}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            experiment = json.loads(response.read())
        hparams = {h["name"] for h in experiment["hparamInfos"]}
        assert {
            "num_workers",
            "start_method",
            "sharing_strategy",
            "device",
            "batch_size",
            "lr",
        } <= hparams
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert "hparam/test_accuracy" in metrics and "hparam/samples_per_second" in metrics
    finally:
        board.terminate()
        board.wait(timeout=10)
