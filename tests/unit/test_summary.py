"""The run's summary: one dataclass for summary.json and the console report; strict JSON."""

from __future__ import annotations

import json

import pytest

from hogwild.reporting.text import plural
from hogwild.run.summary import Summary

from support import wait_until


def summary(**overrides) -> Summary:
    fields = dict(
        status="completed", exit_code=0, num_workers=2, start_method="fork", sharing_strategy="file_system",
        worker_sharing_strategies=["file_system"] * 2, device="cpu", threads_per_worker=1,
        memory_format="contiguous", data_on_device=False, total_samples=4000, samples_seen=4000,
        resumed_from=None, wall_seconds=5.0, train_seconds=0.5, startup_seconds=2.0,
        samples_per_second=8000.0, final_train_loss=0.3, skipped_steps=0, worker_restarts=0, staleness=None,
        optimizer_shared=False, schedule={"name": "constant"}, optimizer_state_steps=None,
        workload={"epochs": 2, "task": "classification", "test_loss": 0.2, "test_accuracy": 0.95,
                  "test_rmse": None},
    )  # fmt: skip
    return Summary(**{**fields, **overrides})


def test_the_json_is_flat_with_the_workload_fields_and_without_empty_sections(tmp_path):
    path = tmp_path / "summary.json"
    summary().write(str(path))
    data = json.loads(path.read_text())
    assert data["epochs"] == 2 and data["test_accuracy"] == 0.95 and "workload" not in data
    assert "error" not in data and "distributed" not in data
    assert not list(tmp_path.glob("*.tmp"))


def test_non_finite_figures_are_null_never_a_bare_nan(tmp_path):
    path = tmp_path / "summary.json"
    nan = float("nan")
    s = summary(final_train_loss=nan, workload={"test_loss": float("inf"), "nested": [nan, 1.0]})
    s.write(str(path))
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert (
        data["final_train_loss"] is None
        and data["test_loss"] is None
        and data["nested"] == [None, 1.0]
    )


def test_a_failed_run_reports_the_rank_and_reason_on_stderr(tmp_path):
    s = summary(status="failed", exit_code=1, error={"rank": 1, "reason": "killed by SIGKILL"})
    failure, lines = s.console_lines(str(tmp_path))
    assert failure == "hogwild: run failed: worker 1: killed by SIGKILL"
    assert lines[0] == "run failed"
    orchestrator = summary(
        status="failed", exit_code=1, error={"rank": -1, "reason": "node 1 is gone"}
    )
    assert orchestrator.console_lines(str(tmp_path))[0] == "hogwild: run failed: node 1 is gone"


def test_the_report_says_where_everything_is(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"x")
    failure, lines = summary().console_lines(str(tmp_path))
    text = "\n".join(lines)
    assert failure is None and lines[0] == "run completed"
    assert "test accuracy  95.00%" in text and "8,000 (2 workers, fork, file_system)" in text
    assert "checkpoints/last.pt" in text and "tensorboard --logdir" in text


@pytest.mark.parametrize("name", ["my run", "it's", "runs/é $HOME"])
def test_the_tensorboard_hint_is_quoted_for_the_shell(tmp_path, name):
    """The printed command works when pasted: a folder with spaces, quotes or `$` is quoted."""
    import shlex

    folder = tmp_path / name
    line = next(
        line for line in summary().console_lines(str(folder))[1] if "tensorboard --logdir" in line
    )
    command = line.split("dashboards", 1)[1].strip()
    assert shlex.split(command) == ["tensorboard", "--logdir", str(folder)]


def test_a_regression_run_reports_its_rmse(tmp_path):
    s = summary(
        workload={"task": "regression", "test_loss": 0.1, "test_rmse": 0.316, "test_accuracy": None}
    )
    assert "test RMSE      0.3160" in "\n".join(s.console_lines(str(tmp_path))[1])


@pytest.mark.parametrize("n, text", [(1, "1 worker"), (2, "2 workers"), (0, "0 workers")])
def test_plurals(n, text):
    assert plural(n, "worker") == text


def test_a_signal_between_the_jobs_of_a_sweep_starts_no_further_job(tmp_path, monkeypatch, capsys):
    """The sweep's side of the summary (hogwild.cli.sweep): a Ctrl-C after a job has finished
    and before Hydra hands over the next one is taken, not raised inside Hydra's loop; every
    later job is `not run`, its empty folder (Hydra made it) removed, and the table says so."""
    import signal

    from hogwild.cli.sweep import SweepRun
    from hogwild.process import signals

    monkeypatch.chdir(tmp_path)  # job folders are removed up to the working directory
    previous, sweep = signals.install(), SweepRun()
    try:
        (tmp_path / "0").mkdir()
        summary().write(str(tmp_path / "0" / "summary.json"))
        assert sweep.should_run(str(tmp_path / "0"), ["a=0"])
        sweep.ran(0, [])
        sweep.between_jobs()  # the job is over: Hydra's code runs until the next one
        signal.pthread_kill(signals.receiver().thread.ident, signal.SIGINT)
        assert wait_until(lambda: any(r.pending for r in signals.receiver().relays), 30)
        for job in ("1", "2"):
            (tmp_path / job).mkdir()
            assert not sweep.should_run(str(tmp_path / job), [f"a={job}"])
        sweep.print_report()
    finally:
        sweep.end()
        signals.restore(previous)
    assert sweep.exit_code() == 130
    assert (tmp_path / "0").exists() and not (tmp_path / "1").exists()
    assert not (tmp_path / "2").exists()
    out = capsys.readouterr().out
    assert "sweep: 3 jobs, 2 not run (stopped by SIGINT)" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("0", "a=0", "completed"),
        ("1", "a=1", "not"),
        ("2", "a=2", "not"),
    ]
    assert rows[1][-1] == "-" and rows[1][3] == "run"


def test_a_sweep_job_refused_when_it_started_is_listed_as_refused(tmp_path, capsys):
    from hogwild.cli.sweep import SweepRun

    sweep = SweepRun()
    (tmp_path / "0").mkdir()
    summary().write(str(tmp_path / "0" / "summary.json"))
    for job, code in (("0", 0), ("1", 2)):  # job 1: exit 2, its folder removed
        assert sweep.should_run(str(tmp_path / job), ["epochs=1", f"a={job}"])
        sweep.ran(code, [])
    sweep.print_report()
    out = capsys.readouterr().out
    assert "all jobs: epochs=1\n" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("0", "a=0", "completed"),
        ("1", "a=1", "refused"),
    ]
    assert sweep.exit_code() == 2


@pytest.mark.parametrize(
    "number, overrides, folder",
    [
        (0, ["trainer.num_workers=1", "trainer.epochs=1"], "0_trainer.num_workers=1"),
        (
            3,
            ["trainer.num_workers=2", "optimizer.lr=0.1"],
            "3_optimizer.lr=0.1,trainer.num_workers=2",
        ),
        (1, ["trainer.epochs=1"], "1"),  # nothing varies: the number alone
        (2, ["data.path=/srv/a"], "2_data.path=_srv_a"),  # one folder, not three
        (
            4,
            ["+model.x=1", "~model.y", "model@m=mlp", "trainer.seed=3"],
            "4_+model.x=1,model@m=mlp",
        ),
        (12, ["x=" + "9" * 300], "12_x=" + "9" * 98),  # cut: a folder name has 255 bytes at most
        (5, ["x=" + "数" * 60], "5_x=" + "数" * 32),  # cut by bytes, on a character
    ],
)
def test_a_sweep_job_folder_is_its_number_then_what_it_varies(number, overrides, folder):
    from hogwild.cli.sweep import job_folder
    from hogwild.run.folder import job_number

    # trainer.epochs: the same in every job; model.y, trainer.seed: the config's exclude_keys
    assert job_folder(number, overrides, ["model.y", "trainer.seed"], ("trainer.epochs",)) == folder
    assert job_number(folder) == number


def test_only_folders_that_start_with_a_job_number_are_jobs():
    from hogwild.run.folder import job_number

    assert [job_number(n) for n in ("7", "7_a=1", "a_7", "7a", ".hydra", "sweep.json")] == [
        7, 7, None, None, None, None
    ]  # fmt: skip


@pytest.mark.parametrize(
    "argv, fixed",
    [
        (["-m", "trainer.num_workers=1,2", "trainer.epochs=1", "+model.x=range(2)"], ("trainer.epochs",)),
        (["--config-dir", "/my/configs", "-m", "a=1,2", "b=3"], ("b",)),  # the option's value is no override
        (["-m", "a=1", "a=1,2"], ()),  # swept once: it varies
        (["-m", "a=1,2", "hydra.sweep.dir=s"], ("hydra.sweep.dir",)),
        (["-m", "a=[1,"], ()),  # Hydra cannot read it: it says so when it runs
    ],
)  # fmt: skip
def test_a_sweep_names_its_jobs_by_the_keys_it_sweeps(argv, fixed):
    from hogwild.cli.sweep import fixed_keys

    assert fixed_keys(argv) == fixed


def test_a_sweep_job_folder_is_what_hydra_resolves_for_the_subdir(tmp_path):
    """configs/train.yaml's subdir, resolved as Hydra's launcher does for job 1 of
    `-m trainer.num_workers=1,2 trainer.epochs=1`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from hogwild.cli.main import config_dir, register_defaults
    from hogwild.cli.sweep import fixed_keys, register_job_folder

    register_defaults()
    register_job_folder(fixed_keys(["-m", "trainer.num_workers=1,2", "trainer.epochs=1"]))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            job = ["trainer.num_workers=2", "trainer.epochs=1"]  # job 1's overrides
            cfg = compose("train", overrides=job, return_hydra_config=True)
        cfg.hydra.job.num = 1  # what Hydra's launcher sets per job
        assert OmegaConf.select(cfg, "hydra.sweep.subdir") == "1_trainer.num_workers=2"
    finally:
        GlobalHydra.instance().clear()
        register_job_folder()
