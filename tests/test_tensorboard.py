"""The dashboards, as a user opens them: a real TensorBoard on loopback, asked over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import SMALL, cli_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def sweep(tmp_path):
    folder = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "hogwild", "train", "-m", "trainer.num_workers=1,2", f"hydra.sweep.dir={folder}",
           "trainer.start_method=fork", *SMALL]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=cli_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return folder


def test_tensorboard_serves_every_run_tag_and_hparams_of_a_sweep(sweep):
    port = free_port()
    board = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(sweep), "--host", "127.0.0.1",
                              "--port", str(port), "--reload_interval", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        runs = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(runs) < 2:
            if board.poll() is not None:
                pytest.skip(f"tensorboard could not serve on 127.0.0.1:{port}: {board.stderr.read()[-300:]}")
            try:
                runs = [r for r in get_json(f"{base}/data/runs") if r.endswith("tensorboard")]
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        assert sorted(runs) == ["0/tensorboard", "1/tensorboard"], runs
        tags = get_json(f"{base}/data/plugin/scalars/tags")
        for run in runs:
            for tag in ("train/loss", "train/lr", "perf/samples_per_second", "eval/loss", "eval/accuracy",
                        "workers/loss/rank_00"):
                assert tag in tags[run], (run, sorted(tags[run]))
        assert "workers/loss/rank_01" in tags["1/tensorboard"]  # the 2-worker run
        plugins = get_json(f"{base}/data/plugins_listing")
        assert plugins.get("hparams", {}).get("enabled"), plugins.get("hparams")
        request = urllib.request.Request(f"{base}/data/plugin/hparams/experiment", data=b'{"experimentName": ""}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            experiment = json.loads(response.read())
        hparams = {h["name"] for h in experiment["hparamInfos"]}
        assert {"num_workers", "start_method", "sharing_strategy", "device", "batch_size", "lr"} <= hparams
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert "hparam/test_accuracy" in metrics and "hparam/samples_per_second" in metrics
    finally:
        board.terminate()
        board.wait(timeout=10)
