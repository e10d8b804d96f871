"""The examples run as their READMEs say."""

from __future__ import annotations

import os
import subprocess
import sys

from support import REPO, read_summary


def test_python_api_example_trains_without_hydra(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "python_api.py")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "completed: test accuracy" in result.stdout
    summary = read_summary(tmp_path / "outputs" / "python_api")
    assert summary["test_accuracy"] > 0.9 and summary["total_samples"] == 5 * 10_000


def test_custom_model_through_config_dir_and_target(tmp_path):
    example = REPO / "examples" / "custom_model"
    env = {**os.environ, "PYTHONPATH": str(example)}
    cmd = [
        sys.executable,
        "-m",
        "hogwild",
        "train",
        "--config-dir",
        str(example / "configs"),
        "model=wide_mlp",
        "model.width=64",
        "trainer.epochs=2",
        "trainer.start_method=fork",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "my_models.WideMLP" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert read_summary(tmp_path / "run")["test_accuracy"] > 0.9
