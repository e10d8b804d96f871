"""Resume is one command (hogwild.cli.resume): the continued run's own overrides come back,
those given now apply after them, and what differs is named."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from hogwild.cli import resume


def write_run(folder, overrides, config):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))


def test_auto_reads_the_run_folder_and_a_path_the_run_that_holds_the_checkpoint(tmp_path):
    run = tmp_path / "runs" / "a"
    write_run(run, ["+experiment=mnist", "trainer.epochs=2", "hydra.run.dir=elsewhere"], {})
    got = resume.with_own_overrides([f"hydra.run.dir={run}", "resume_from=auto"])
    assert got.folder == run and got.own == ["+experiment=mnist", "trainer.epochs=2"]
    assert got.overrides == [*got.own, f"hydra.run.dir={run}", "resume_from=auto"]
    by_path = resume.with_own_overrides([f"resume_from={run}/checkpoints/last.pt"])
    assert by_path.folder == run and by_path.own == got.own


def test_a_key_given_now_wins_and_one_added_again_replaces_the_runs_own(tmp_path):
    run = tmp_path / "a"
    own = ["+experiment=mnist", "trainer.epochs=2", "+model.step_seconds=0.2", "data.seed=3"]
    write_run(run, [*own, "resume_from=auto"], {})
    now = [f"hydra.run.dir={run}", "resume_from=auto", "trainer.epochs=4"]
    now += ["model.step_seconds=0", "+experiment=other"]
    got = resume.with_own_overrides(now)
    assert got.own == ["data.seed=3"]  # what still applies as the run had it
    # a later key=value replaces an earlier one; an added key (+) is never added twice
    assert got.overrides == [
        "trainer.epochs=2", "+model.step_seconds=0.2", "data.seed=3", *now
    ]  # fmt: skip


def test_another_choice_of_a_group_drops_the_runs_values_inside_it(tmp_path):
    run = tmp_path / "a"
    write_run(run, ["data=synthetic", "data.num_samples=2000", "trainer.epochs=1"], {})
    got = resume.with_own_overrides([f"resume_from={run}/checkpoints/last.pt", "data=digits"])
    assert got.own == ["trainer.epochs=1"]
    assert got.overrides[:2] == ["data=synthetic", "trainer.epochs=1"]  # data=digits wins


def test_the_runs_own_overrides_go_after_the_options_given_now(tmp_path):
    write_run(tmp_path / "a", ["model=small"], {})
    now = ["--config-dir", "my configs", f"hydra.run.dir={tmp_path / 'a'}", "resume_from=auto"]
    got = resume.with_own_overrides(now)
    assert got.overrides == ["--config-dir", "my configs", "model=small", *now[2:]]


def test_the_same_group_choice_keeps_the_runs_values_and_removals_stay_valid(tmp_path):
    run = tmp_path / "a"
    own = ["data=synthetic", "data.num_samples=2000", "+trainer.foo=1", "~trainer.max_restarts"]
    write_run(run, own, {})
    now = [f"resume_from={run}/checkpoints/last.pt", "data=synthetic", "~trainer.foo"]
    now.append("trainer.max_restarts=3")
    got = resume.with_own_overrides(now)
    # data.num_samples stays (same choice); +trainer.foo stays for ~trainer.foo to remove; a
    # value given now for a key the run removed drops that removal
    assert got.overrides == ["data=synthetic", "data.num_samples=2000", "+trainer.foo=1", *now]


def test_nothing_changes_without_a_run_to_read(tmp_path):
    assert resume.with_own_overrides(["trainer.epochs=2"]) is None
    assert resume.with_own_overrides(["resume_from=auto"]) is None  # no fixed folder
    assert resume.with_own_overrides([f"hydra.run.dir={tmp_path}", "resume_from=auto"]) is None
    assert resume.with_own_overrides(["resume_from=null"]) is None
    write_run(tmp_path / "a", ["trainer.epochs=2"], {})
    sweep = ["-m", f"hydra.run.dir={tmp_path / 'a'}", "resume_from=auto"]
    assert resume.with_own_overrides(sweep) is None
    (tmp_path / "a" / ".hydra" / "overrides.yaml").write_text("{not: a list}")
    assert resume.with_own_overrides(sweep[1:]) is None


def test_changes_name_every_value_that_differs_from_the_runs_config(tmp_path):
    was = {"trainer": {"epochs": 2, "seed": 0}, "resume_from": None, "model": {"hidden": [8]}}
    write_run(tmp_path, [], was)
    now = {"trainer": {"epochs": 4, "seed": 0}, "resume_from": "auto", "model": {"hidden": [8]}}
    now["optimizer"] = {"lr": 0.1}
    assert resume.changes(tmp_path, now) == ["optimizer.lr (none) -> 0.1", "trainer.epochs 2 -> 4"]


@pytest.mark.parametrize(
    "folder",
    [
        "runs/a",
        "runs/my run",
        "q/lr=0.1",
        "runs/a,b",
        "é's",
        "m/0_a=1,b=$x",
        'a"b\\c',
        "x\\'y",
        "z\\",
    ],
)
def test_the_command_is_quoted_for_hydra_and_the_shell(folder):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    words = shlex.split(resume.command(folder))
    assert words[:4] == ["python", "-m", "hogwild", "train"] and words[5] == "resume_from=auto"
    (parsed,) = OverridesParser.create().parse_overrides([words[4]])
    assert parsed.key_or_group == "hydra.run.dir" and parsed.value() == folder
    assert resume.continued_folder(words[4:6]) == Path(folder)  # read back as Hydra reads it


def test_a_sweep_jobs_command_reads_as_typed():
    assert resume.command("m/0_trainer.num_workers=1") == (
        "python -m hogwild train \"hydra.run.dir='m/0_trainer.num_workers=1'\" resume_from=auto"
    )


def test_the_command_gives_the_config_dir_again():
    sources = [
        {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
        {"path": "/work/my configs", "schema": "file", "provider": "command-line"},
        {"path": "/work/main/configs", "schema": "file", "provider": "main"},
    ]
    given = resume.config_dir_given(sources)
    assert resume.command("runs/a", given) == (
        "python -m hogwild train --config-dir '/work/my configs' hydra.run.dir=runs/a resume_from=auto"
    )
    assert resume.config_dir_given(sources[::2]) is None
