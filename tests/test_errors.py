"""Bad input from the command line: one clear line, a non-zero exit, nothing started or written."""

from __future__ import annotations

import socket

import pytest

from conftest import SMALL, run_cli


def assert_refused_cleanly(result, run_dir, *fragments):
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hogwild: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    for output in ("summary.json", "tensorboard", "checkpoints"):
        assert not (run_dir / output).exists(), output


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("trainer.num_workers=0", ["trainer.num_workers=0", "integer >= 1"]),
        ("trainer.start_method=threads", ["trainer.start_method='threads'", "fork, spawn, forkserver"]),
        ("trainer.sharing_strategy=nope", ["trainer.sharing_strategy='nope'", "file_system"]),
        ("data.batch_size=0", ["data.batch_size=0", "integer >= 1"]),
        ("trainer.epochs=-1", ["trainer.epochs=-1", "integer >= 1"]),
        ("trainer.device=cuda:99", ["trainer.device='cuda:99'"]),  # refused with or without CUDA
        ("model=convnet", ["convnet needs 1x28x28"]),
        ("optimizer.lr=-1", ["optimizer SGD rejects its arguments", "learning rate"]),
    ],
)
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, override, fragments):
    run_dir = tmp_path / "run"
    result = run_cli([override], run_dir)
    assert_refused_cleanly(result, run_dir, *fragments)


def test_fork_with_cuda_is_refused_first(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["trainer.device=cuda", "trainer.start_method=fork", "data.batch_size=0"], run_dir)
    assert_refused_cleanly(result, run_dir, "trainer.start_method='fork'", "cuda")


def test_hydra_composition_errors_keep_hydras_format(tmp_path):
    result = run_cli(["data=imagenet"], tmp_path / "run")
    assert result.returncode != 0
    assert "Could not find 'data/imagenet'" in result.stderr and "HYDRA_FULL_ERROR" in result.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_mnist_offline_is_one_line_naming_the_files_and_folder(tmp_path):
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    result = run_cli(["+experiment=mnist", f"data.root={root}", f"data.mirrors=[http://127.0.0.1:{closed_port()}/]"],
                     run_dir)
    assert_refused_cleanly(result, run_dir, str(root), "train-images-idx3-ubyte")


def test_mnist_without_download_is_one_line(tmp_path):
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    result = run_cli(["+experiment=mnist", f"data.root={root}", "data.download=false"], run_dir)
    assert_refused_cleanly(result, run_dir, str(root), "data.download=false")


def test_finished_run_folder_is_never_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    first = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert first.returncode == 0, first.stderr
    before = (run_dir / "summary.json").read_text()
    second = run_cli([*SMALL, "trainer.start_method=fork"], run_dir)
    assert second.returncode == 2 and "already holds a finished run" in second.stderr
    assert (run_dir / "summary.json").read_text() == before
