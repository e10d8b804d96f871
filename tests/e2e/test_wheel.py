"""The package installs like any other: a built wheel carries the configs and runs from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from support import REPO


@pytest.mark.slow
def test_built_wheel_contains_configs_and_trains_from_another_folder(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("hogwild-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for config in ("train.yaml", "data/digits.yaml", "model/convnet.yaml", "experiment/mnist.yaml"):
        assert f"hogwild/configs/{config}" in names, config
    # Install it (without dependencies: they are in this environment) into a folder of its own,
    # which PYTHONPATH puts ahead of the editable checkout.
    site = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import hogwild.cli.main as c; print(c.__file__, c.config_dir())"],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
    )
    assert where.stdout.startswith(str(site)) and str(site) in where.stdout.split()[1], where.stdout
    run = subprocess.run(
        [sys.executable, "-m", "hogwild", "train", "trainer.epochs=2", "trainer.start_method=fork"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=elsewhere,
    )
    assert run.returncode == 0, run.stderr
    assert list((elsewhere / "outputs").glob("*/*/summary.json"))
