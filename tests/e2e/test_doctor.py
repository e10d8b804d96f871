"""`hogwild doctor` from the command line: a report a user can act on, an exit status tools can rely on."""

from __future__ import annotations

import json
import subprocess
import sys

from hogwild.config.schema import usable_cores


def test_doctor_json_reports_the_machine_and_a_recommended_config():
    result = subprocess.run(
        [sys.executable, "-m", "hogwild", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is True and report["problems"] == []
    assert report["cores_usable"] == usable_cores()
    assert (
        "file_descriptor" in report["sharing_strategies"]
        and "forkserver" in report["start_methods"]
    )
    assert report["open_files"]["soft"] > 0 and report["shm"]["free_mib"] > 0
    assert report["recommended"]["trainer.num_workers"] == usable_cores()
    assert report["recommended"]["trainer.device"] == (
        "cuda" if report["cuda"]["available"] else "cpu"
    )
    if not report["cuda"]["available"]:
        assert report["cuda"]["why"]


def test_doctor_text_is_one_screen_with_the_command_to_run():
    result = subprocess.run(
        [sys.executable, "-m", "hogwild", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "python -m hogwild train trainer.num_workers=" in result.stdout
    assert "/dev/shm" in result.stdout and "CUDA" in result.stdout and "ready." in result.stdout
    assert len(result.stdout.splitlines()) < 25
