"""Bad input from the command line: one clear line, a non-zero exit, nothing started or written."""

from __future__ import annotations

from support import SMALL, assert_refused_cleanly, run_cli


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


def test_hydra_composition_errors_keep_hydras_format(tmp_path):
    result = run_cli(["data=imagenet"], tmp_path / "run")
    assert result.returncode != 0
    assert "Could not find 'data/imagenet'" in result.stderr and "HYDRA_FULL_ERROR" in result.stderr


def test_finished_run_folder_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert first.returncode == 0, first.stderr
    before = (run_dir / "summary.json").read_text()
    second = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert second.returncode == 2 and "already holds a finished run" in second.stderr
    assert (run_dir / "summary.json").read_text() == before
