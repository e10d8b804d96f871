"""The sparse models end to end: matrix factorization and sparse logistic regression learn,
and a model given the wrong kind of data says which data to use."""

from __future__ import annotations

from hogwild.data import make_synthetic_ratings

from support import SMALL_MF, read_summary, run_cli, tensorboard_tags


def test_matrix_factorization_experiment_learns_and_reports_rmse(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli([*SMALL_MF, "trainer.epochs=3"], run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert (
        s["task"] == "regression" and s["test_accuracy"] is None and s["total_samples"] == 3 * 20000
    )
    # predicting the mean rating gives the spread of the ratings (~0.8); the factors do far better
    test_y = make_synthetic_ratings(
        num_users=200, num_items=300, num_ratings=20000, num_test_ratings=2000
    ).test_y
    assert s["test_rmse"] < 0.75 * float(test_y.std())
    assert "eval/rmse" in tensorboard_tags(run_dir) and "test RMSE" in result.stdout
    assert "Sparse invariant checks" not in result.stderr


SMALL_SPARSE = [
    "+experiment=sparse_logreg",
    "data.num_features=2000",
    "data.num_samples=8000",
    "data.num_test_samples=1000",
    "data.density=0.01",
    "trainer.start_method=fork",
]


def test_sparse_logreg_experiment_learns(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(SMALL_SPARSE, run_dir)
    assert result.returncode == 0, result.stderr
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["total_samples"] == 3 * 8000
    assert s["test_accuracy"] > 0.65  # chance is ~0.5
