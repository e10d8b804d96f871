"""Bad input from the command line: one clear line, a non-zero exit, nothing started or written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import SMALL, assert_refused_cleanly, cli_env, run_cli, run_sweep


def test_bad_config_is_one_line_from_a_real_process(tmp_path):
    """The unit tier checks every refusal in-process (tests/unit/test_refusals.py); this is the
    same rule through `python -m hogwild`: the exit code and stderr a shell sees."""
    run_dir = tmp_path / "run"
    result = run_cli(["trainer.num_workers=0"], run_dir)
    assert_refused_cleanly(result, run_dir, "trainer.num_workers=0", "integer >= 1")


def test_fork_with_cuda_is_refused_first(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        ["trainer.device=cuda", "trainer.start_method=fork", "data.batch_size=0"], run_dir
    )
    assert_refused_cleanly(result, run_dir, "trainer.start_method='fork'", "cuda")


@pytest.mark.parametrize(
    "override, said",
    [
        ("trainer.num_wokers=3", "trainer.num_wokers is not a config key; did you mean trainer.num_workers?"),
        ("data=imagenet", "data=imagenet is not an option of data (allowed: digits, "),
        ("+experiment=mnsit", "; did you mean mnist?"),
        ("trainer.num_workers=[1", "cannot read the override 'trainer.num_workers=[1'"),
    ],
)  # fmt: skip
def test_composition_errors_are_one_line_with_the_closest_valid_choice(tmp_path, override, said):
    result = run_cli([override], tmp_path / "run")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hogwild: error: ") and said in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_finished_run_folder_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert first.returncode == 0, first.stderr
    before = (run_dir / "summary.json").read_text()
    second = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert second.returncode == 2 and "already holds a finished run" in second.stderr
    assert (run_dir / "summary.json").read_text() == before


def test_a_refused_run_leaves_no_folder_at_all(tmp_path):
    """Without hydra.run.dir: not even the empty outputs/<date>/ Hydra made for it."""
    result = subprocess.run(
        [sys.executable, "-m", "hogwild", "train", "trainer.num_workers=0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=cli_env(),
    )  # fmt: skip
    assert result.returncode == 2 and "trainer.num_workers=0" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "sweep, fragment",
    [
        ("trainer.num_workers=[1,2", "cannot read the override 'trainer.num_workers=[1,2'"),
        ("trainer.epochs=interval(1,3)", "BasicSweeper does not support sweep type"),
    ],
)
def test_a_sweep_hydra_cannot_expand_is_one_line(tmp_path, sweep, fragment):
    result = run_sweep([sweep], tmp_path / "sweep")
    assert_refused_cleanly(result, tmp_path / "sweep", fragment)
    assert not (tmp_path / "sweep").exists()
