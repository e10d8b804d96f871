"""The examples run as their READMEs say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO, read_summary, run_example


def test_python_api_example_trains_without_hydra_any_number_of_times(tmp_path):
    folders = []
    for _ in range(2):  # the second run gets a folder of its own
        result = run_example("python_api.py", tmp_path, timeout=180)
        assert result.returncode == 0, result.stderr
        assert "completed: test accuracy" in result.stdout
        folders.append(result.stdout.strip().rsplit(" in ", 1)[1])
        summary = read_summary(Path(folders[-1]))
        assert summary["test_accuracy"] > 0.9 and summary["total_samples"] == 5 * 10_000
    assert (
        folders[0] != folders[1] and Path(folders[0]).parent == tmp_path / "outputs" / "python_api"
    )


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


OVERWRITE = """
import functools, sys
import torch
from hogwild import Trainer, TrainerConfig
from hogwild.data import make_synthetic
from hogwild.errors import HogwildError
from hogwild.models import MLP

if __name__ == "__main__":
    data = make_synthetic(num_samples=400, num_test_samples=100, seed=0)
    for overwrite in (False, False, True):
        trainer = Trainer(
            MLP(data.input_shape, data.num_classes, (16,)), data,
            functools.partial(torch.optim.SGD, lr=0.05), TrainerConfig(num_workers=2, epochs=1,
            start_method="fork"), batch_size=32, output_dir="run", overwrite=overwrite,
        )
        try:
            print(trainer.fit()["status"])
        except HogwildError as e:
            print("refused:", e)
"""


def test_python_api_refuses_a_finished_folder_without_hydra_words_and_overwrites_on_request(
    tmp_path,
):
    script = tmp_path / "overwrite.py"
    script.write_text(OVERWRITE)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    first, refused, third = result.stdout.strip().splitlines()
    assert first == "completed" and third == "completed"
    assert refused.startswith("refused:") and "overwrite=True" in refused
    assert "hydra" not in refused.lower()
