"""The benchmark and the sweep table run end to end and write sane outputs.

No timing assertions: these machines are shared and noisy. The benchmark is the performance
check (run `python scripts/bench.py --quick` and read it); these tests only keep it working.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import REPO, cli_env

ROW_FIGURES = (
    "samples",
    "samples_per_second",
    "train_seconds",
    "startup_seconds",
    "wall_seconds",
    "pss_mb",
    "speedup",
)


def setting(row: dict) -> tuple:
    return (
        row["model"],
        row["start_method"],
        row["sharing_strategy"],
        row["num_workers"],
        row["threads"],
    )


def run_script(args, cwd, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=cli_env(),
    )


def test_tiny_benchmark_writes_a_row_per_run_with_positive_figures_and_a_plot(tmp_path, no_leaks):
    out = tmp_path / "results" / "bench.json"
    result = run_script(
        [str(REPO / "scripts" / "bench.py"), "--tiny", "--out", str(out)], cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    rows = report["rows"]
    assert rows
    for row in rows:
        assert "error" not in row, row
        for key in ROW_FIGURES:
            assert row[key] is not None and row[key] > 0, (key, row)
    plain = {setting(r) for r in rows if r["impl"] == "plain"}
    framework = [r for r in rows if r["impl"] == "framework"]
    assert any(setting(r) in plain for r in framework), (
        "no framework row has a plain row for the same setting"
    )
    for row in framework:
        assert row["vs_plain"] > 0
    # the every-step reporting row and the DDP row, with the framework's ratio over DDP
    impls = {r["impl"]: r for r in rows if r["num_workers"] == 2}
    assert {"framework", "framework-step", "ddp"} <= set(impls)
    assert impls["framework-step"]["vs_plain"] > 0 and impls["framework"]["vs_ddp"] > 0
    assert impls["ddp"]["samples"] == 1024  # both ranks' whole batches: 2 x 8 x 64
    # the fixed costs: every framework row's, and one whole CLI run's, adding up to its wall clock
    costs = report["cli_run"]["fixed_costs"]
    for phase in ("python_and_imports", "config", "torch_import", "data_and_model", "checks",
                  "start_to_first_step", "training", "final_evaluation", "final_checkpoint"):  # fmt: skip
        assert costs[phase] >= 0, phase
    parts = sum(v for k, v in costs.items() if k not in ("fixed_total", "during_training"))
    assert parts == pytest.approx(report["cli_run"]["wall_seconds"], abs=0.05)
    assert all(r["fixed_costs"]["fixed_total"] > 0 for r in framework)
    assert "fixed costs" in result.stdout and "torch_import" in result.stdout
    assert (out.parent / "bench.png").stat().st_size > 0
    assert "samples/s" in result.stdout  # the table header


def test_the_cli_ends_a_sweep_with_one_row_per_job(two_run_sweep):
    out = (two_run_sweep.parent / "cli.stdout").read_text()
    table = out[out.index("sweep: 2 jobs") :].splitlines()
    assert table[2].split()[:3] == ["job", "overrides", "status"] and "run folder" in table[2]
    for job, row in enumerate(table[4:6]):
        cells = row.split()
        assert cells[:3] == [str(job), f"trainer.num_workers={job + 1}", "completed"], row
        assert cells[-1].endswith(f"sweep/{job}_trainer.num_workers={job + 1}"), row
        assert cells[-3].endswith("%")


def test_sweep_table_summarises_a_real_two_run_sweep(two_run_sweep, tmp_path):
    sweep = two_run_sweep
    result = run_script([str(REPO / "scripts" / "sweep_table.py"), str(sweep)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads((sweep / "sweep.json").read_text())
    assert [r["num_workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["status"] == "completed"
        assert (
            row["samples_per_second"] > 0
            and row["wall_seconds"] > 0
            and 0 <= row["test_accuracy"] <= 1
        )
        assert "trainer.start_method=fork" in row["overrides"]
    assert "trainer.num_workers=2" in result.stdout
    assert (sweep / "sweep.png").stat().st_size > 0


def test_sweep_table_lists_a_job_without_summary_as_missing(tmp_path):
    for job, overrides in (  # a folder named by its job number only, as sweeps wrote them
        ("0", "- trainer.num_workers=1\n"),
        ("1_trainer.num_workers=oops", "- trainer.num_workers=oops\n"),
    ):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(overrides)
    (tmp_path / "0" / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "num_workers": 1,
                "samples_per_second": 1000.0,
                "test_accuracy": 0.9,
                "wall_seconds": 2.0,
            }
        )
    )
    result = run_script(
        [str(REPO / "scripts" / "sweep_table.py"), str(tmp_path), "--no-plot"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["status"] for r in rows] == ["completed", "missing"]
    assert [r["job"] for r in rows] == ["0", "1"]  # the job numbers, in order
    assert rows[1]["samples_per_second"] is None
    assert not (tmp_path / "sweep.png").exists()


def test_sweep_table_refuses_a_folder_without_jobs(tmp_path):
    result = run_script([str(REPO / "scripts" / "sweep_table.py"), str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 2
    assert "no job folders" in result.stderr


def test_plot_without_matplotlib_says_how_to_get_it_instead_of_crashing(
    tmp_path, monkeypatch, capsys
):
    from hogwild import bench

    monkeypatch.setitem(
        sys.modules, "matplotlib", None
    )  # makes `import matplotlib` raise ImportError
    png = tmp_path / "bench.png"
    bench.plot([{"model": "mlp", "samples_per_second": 1.0}], str(png))
    assert not png.exists()
    assert "pip install 'hogwild[bench]'" in capsys.readouterr().err


@pytest.mark.slow
def test_classic_compare_times_both_sides_of_the_same_work(tmp_path):
    out = tmp_path / "classic.json"
    result = run_script(
        [
            str(REPO / "scripts" / "classic_compare.py"),
            "--samples",
            "1000",
            "--start-method",
            "fork",
            "--stall-seconds",
            "5",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["samples"] == 2000
    assert report["framework_wall_seconds"] > 0 and report["classic_omp1_wall_seconds"] > 0
    # the published, uncapped variant either finishes or is reported as hung (None), never 0
    assert report["classic_wall_seconds"] is None or report["classic_wall_seconds"] > 0
    assert "classic, 1 thread" in result.stdout


def test_tiny_benchmark_covers_the_sparse_models(tmp_path):
    out = tmp_path / "bench.json"
    result = run_script(
        [
            str(REPO / "scripts" / "bench.py"),
            "--tiny",
            "--models",
            "mf,sparse",
            "--no-plot",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {(r["model"], r["impl"]) for r in rows} == {
        (m, i) for m in ("mf", "sparse") for i in ("plain", "framework")
    }
    for row in rows:
        assert "error" not in row and row["samples_per_second"] > 0, row
