"""Bad input through the CLI, in-process: one clear line, exit code 2, nothing started or
written. (tests/e2e/test_errors.py checks the same rule on a real `python -m hogwild` process.)"""

from __future__ import annotations

import os

import pytest
import torch

from hogwild.run import checkpoint

from support import SMALL, assert_refused_cleanly, cli_here, free_port


@pytest.mark.parametrize(
    "override, fragments",
    [
        ("trainer.num_workers=0", ["trainer.num_workers=0", "integer >= 1"]),
        (
            "trainer.start_method=threads",
            ["trainer.start_method='threads'", "fork, spawn, forkserver"],
        ),
        ("trainer.sharing_strategy=nope", ["trainer.sharing_strategy='nope'", "file_system"]),
        ("data.batch_size=0", ["data.batch_size=0", "integer >= 1"]),
        ("trainer.epochs=-1", ["trainer.epochs=-1", "integer >= 1"]),
        ("trainer.device=cuda:99", ["trainer.device='cuda:99'"]),  # refused with or without CUDA
        ("model=convnet", ["convnet needs 1x28x28"]),
        ("optimizer.lr=-1", ["optimizer SGD rejects its arguments", "learning rate"]),
        ("model=mf", ["model=mf needs a ratings data set"]),
        ("model=sparse_linear", ["model=sparse_linear needs sparse feature data"]),
    ],
)
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, override, fragments):
    run_dir = tmp_path / "run"
    assert_refused_cleanly(cli_here([override], run_dir), run_dir, *fragments)


def test_an_optimizer_that_cannot_step_the_models_sparse_gradients_is_one_line(tmp_path):
    """model=mf with the default optimizer group (SGD, momentum 0.5): its step would slow down
    step after step (hogwild.run.preflight.check_sparse_gradients)."""
    run_dir = tmp_path / "run"
    args = ["+experiment=matrix_factorization", "optimizer=sgd", "data.num_ratings=1000"]
    assert_refused_cleanly(
        cli_here(args, run_dir), run_dir, "optimizer.momentum=0.5: SGD keeps", "model.sparse=false"
    )


def test_mnist_offline_is_one_line_naming_the_files_and_folder(tmp_path):
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    mirror = f"data.mirrors=[http://127.0.0.1:{free_port()}/]"
    result = cli_here(["+experiment=mnist", f"data.root={root}", mirror], run_dir)
    assert_refused_cleanly(result, run_dir, str(root), "train-images-idx3-ubyte")


def test_mnist_without_download_is_one_line(tmp_path):
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    result = cli_here(["+experiment=mnist", f"data.root={root}", "data.download=false"], run_dir)
    assert_refused_cleanly(result, run_dir, str(root), "data.download=false")


def refused_resume(result, run_dir, *fragments):
    prefix = "hogwild: error: resume_from="
    return assert_refused_cleanly(result, run_dir, *fragments, prefix=prefix)


def test_resume_from_garbage_is_one_line_and_writes_nothing(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x04not really a pickle" * 50)
    run_dir = tmp_path / "run"
    result = cli_here([*SMALL, f"resume_from={garbage}"], run_dir)
    refused_resume(result, run_dir, str(garbage), "not a loadable hogwild checkpoint")


class _Payload:
    """Pickles as a call to os.system: unpickling it with weights_only=False runs the command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import shlex

        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_resume_from_a_hostile_checkpoint_never_runs_it(tmp_path):
    marker = tmp_path / "payload-ran"
    hostile = tmp_path / "hostile.pt"
    torch.save({"format": checkpoint.FORMAT, "model": _Payload(marker)}, hostile)
    run_dir = tmp_path / "run"
    result = cli_here([*SMALL, f"resume_from={hostile}"], run_dir)
    refused_resume(result, run_dir, str(hostile), "weights-only loader")
    assert not marker.exists()


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["trainer.num_wokers=3"], ["trainer.num_wokers is not a config key", "did you mean trainer.num_workers?"]),
        (["datta=mnist"], ["datta is not a config key", "did you mean data?"]),
        (["data=synthetic", "data.num_sample=10"], ["did you mean data.num_samples?"]),
        (["data=imagenet"], ["data=imagenet is not an option of data", "digits, libsvm, mapped, mnist"]),
        (["+experiment=mnsit"], ["experiment=mnsit is not an option", "did you mean mnist?"]),
        (["trainer.num_workers=[1"], ["cannot read the override 'trainer.num_workers=[1'"]),
    ],
)  # fmt: skip
def test_a_misspelt_key_or_option_is_one_line_naming_the_closest(tmp_path, overrides, fragments):
    run_dir = tmp_path / "run"
    assert_refused_cleanly(cli_here(overrides, run_dir), run_dir, *fragments)


def test_a_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path):
    configs = tmp_path / "extra" / "model"
    configs.mkdir(parents=True)
    (configs / "broken.yaml").write_text("_target_: hogwild.models.MLP\nhidden_sizes: [32, 16\n")
    run_dir = tmp_path / "run"
    result = cli_here([f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "model=broken"], run_dir)
    assert_refused_cleanly(result, run_dir, f"{configs / 'broken.yaml'}, line 2, column 15")


@pytest.mark.parametrize(
    "yaml_text, fragments",
    [  # a list item indented one space more: YAML reads the string '64 - 32'
        (
            "hidden_sizes:\n- 64\n - 32\n",
            ["model.hidden_sizes=['64 - 32']", "a list of integers", "one '- item' per line"],
        ),
        ("hiden_sizes: [64]\n", ["did you mean model.hidden_sizes?"]),  # a key of your own config
        ("hidden_sizes: 64\n", ["model.hidden_sizes=64", "expected a list of integers"]),
    ],
)
def test_a_value_of_your_own_config_is_checked_against_what_its_target_takes(
    tmp_path, yaml_text, fragments
):
    configs = tmp_path / "extra" / "model"
    configs.mkdir(parents=True)
    (configs / "mine.yaml").write_text("_target_: hogwild.models.MLP\n" + yaml_text)
    run_dir = tmp_path / "run"
    result = cli_here([f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "model=mine"], run_dir)
    assert_refused_cleanly(result, run_dir, *fragments)


@pytest.mark.parametrize(
    "override, hint",
    [
        ("hydra.run.dir=runs/é_only", "'hydra.run.dir=\"runs/é_only\"'"),
        ("data.root=données/mnist", "'data.root=\"données/mnist\"'"),
        ("+model.note=it's_é", "'+model.note=\"it'\"'\"'s_é\"'"),
    ],
)
def test_an_override_hydra_reads_only_quoted_says_how_to_quote_it(tmp_path, override, hint):
    """Hydra's grammar refuses some characters unquoted (`é`): the line gives the override to
    type, quoted for Hydra inside the shell's quotes, and Hydra reads the same value from it."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    run_dir = tmp_path / "run"
    line = assert_refused_cleanly(cli_here([override], run_dir), run_dir, f"{override!r}")
    assert f"quote the value, as in {hint} (Hydra's override syntax" in line, line
    (typed,) = shlex.split(hint)  # what the shell hands over
    parsed = OverridesParser.create().parse_override(typed)
    assert parsed.value() == override.split("=", 1)[1]


def test_a_sweep_value_hydra_cannot_read_gets_no_quoting_hint(tmp_path):
    """Quoting `1,é` whole would turn a sweep into one string: no hint there."""
    run_dir = tmp_path / "run"
    line = assert_refused_cleanly(cli_here(["+model.note=1,é"], run_dir), run_dir)
    assert "cannot read the override '+model.note=1,é'" in line and "quote" not in line


def test_a_config_dir_that_is_not_there_is_one_line(tmp_path):
    run_dir, missing = tmp_path / "run", tmp_path / "missing"
    result = cli_here(["--config-dir", str(missing)], run_dir)
    assert_refused_cleanly(result, run_dir, f"--config-dir {missing}: no such folder")


@pytest.mark.parametrize("resume", [[], ["resume_from=auto"]])
def test_a_refused_run_leaves_the_finished_runs_record_as_it_was(tmp_path, resume):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    record = {
        "summary.json": '{"status": "completed"}',
        ".hydra/config.yaml": "trainer:\n  epochs: 2\n",
        ".hydra/overrides.yaml": "- trainer.epochs=2\n",
    }
    for name, text in record.items():
        (run_dir / name).write_text(text)
    result = cli_here(["trainer.epochs=1", *resume], run_dir)
    assert result.returncode == 2 and "already holds a" in result.stderr, result.stderr
    assert {name: (run_dir / name).read_text() for name in record} == record


def test_no_command_is_the_usage_and_exit_2_and_help_lists_only_choices(capsys):
    from hogwild import bench
    from hogwild.cli import main as cli

    assert cli.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: hogwild <command>")
    assert cli.main(["--help"]) == 0
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "trainer: default\n" in out and "schedule: constant, cosine, linear\n" in out
    assert "_defaults" not in out
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: hogwild bench")


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.hidden_sizes=[-3]"],  # refused once the model is built, after the folder's claim
        ["+experiment=mnist", "data.root=data/mnist/here", f"data.mirrors=[http://127.0.0.1:{free_port()}/]"],
    ],
)  # fmt: skip
def test_a_refused_run_leaves_no_folder_it_made(tmp_path, monkeypatch, overrides):
    monkeypatch.chdir(tmp_path)
    result = cli_here(overrides, tmp_path / "outputs" / "mine" / "2026-12-07_10-00-00")
    assert result.returncode == 2, result.stderr
    assert list(tmp_path.iterdir()) == []  # not outputs/mine/, nor the data folder it tried


@pytest.mark.parametrize(
    "sweep, fragments",
    [
        (["trainer.num_workers=2,-1"], ["sweep job #1 (", "trainer.num_workers=-1 trainer.epochs=1)", "integer >= 1"]),
        (["data=digits,nope"], ["sweep job #1 (", "data=nope trainer.epochs=1)", "data=nope is not an option"]),
        # a key no job has: the first job's line (it was a traceback)
        (["trainer.num_workers=1,2", "data.num_train=3"], ["sweep job #0 (", "data.num_train is not a config key"]),
        (["trainer.start_method=bogus,fork"], ["sweep job #0 (", "trainer.start_method='bogus' is not valid"]),
    ],
)  # fmt: skip
def test_a_sweep_checks_every_job_before_the_first_starts(tmp_path, sweep, fragments):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep_dir}", *sweep, "trainer.epochs=1"]
    line = assert_refused_cleanly(cli_here(args, tmp_path / "run"), tmp_path / "run", *fragments)
    assert line.endswith("; no job was started") and not sweep_dir.exists()
