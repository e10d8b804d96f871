"""Every config option composes and validates; every bad value is refused with one clear line."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path

import pytest
import yaml
from hydra.utils import get_object

from hogwild.cli import builders
from hogwild.cli.main import config_dir
from hogwild.config.schema import GROUPS, usable_cores
from hogwild.errors import ConfigError

from support import REPO, compose, run_config

CONFIGS = Path(config_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def test_default_config_is_digits_mlp_sgd_with_two_forkserver_workers():
    run = run_config()
    assert run.data["_target_"].endswith("load_digits")
    assert run.model["_target_"].endswith("MLP")
    assert run.optimizer["_partial_"] is True
    assert run.trainer.num_workers == 2 and run.trainer.start_method == "forkserver"
    assert run.trainer.threads_per_worker == max(1, usable_cores() // 2)


@pytest.mark.parametrize("group", ["data", "model", "optimizer", "trainer", "checkpoint"])
def test_every_option_of_every_group_composes_and_validates(group):
    for option in options(group):
        run = run_config([f"{group}={option}"])
        assert run.batch_size >= 1


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes_and_validates(experiment):
    run = run_config([f"+experiment={experiment}"])
    assert run.trainer.epochs >= 1


def test_mnist_experiment_is_the_classic_convnet_on_mnist():
    run = run_config(["+experiment=mnist"])
    assert run.data["_target_"].endswith("load_mnist") and run.model["_target_"].endswith("ConvNet")
    assert run.optimizer["lr"] == 0.01 and run.optimizer["momentum"] == 0.5 and run.batch_size == 64


def test_optimizer_section_becomes_a_picklable_partial():
    import pickle

    import torch

    factory = builders.build_optimizer_factory(run_config().optimizer)
    opt = pickle.loads(pickle.dumps(factory))([torch.nn.Parameter(torch.zeros(3))])
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["lr"] == 0.05


def test_auto_workers_and_threads_follow_usable_cores():
    run = run_config(["trainer.num_workers=auto", "trainer.threads_per_worker=auto"])
    assert run.trainer.num_workers == usable_cores()
    assert run.trainer.threads_per_worker == 1
    assert run_config().trainer.threads_per_worker == 1  # the default: auto is opt-in


def test_auto_threads_count_only_the_cores_other_work_leaves_idle(monkeypatch):
    from hogwild.config import schema

    monkeypatch.setattr(schema, "usable_cores", lambda: 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # this process may use all of them
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.0, 0.0))  # a quiet machine
    assert run_config(["trainer.threads_per_worker=auto"]).trainer.threads_per_worker == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (4.7, 0.0, 0.0))  # 4 cores busy elsewhere
    assert run_config(["trainer.threads_per_worker=auto"]).trainer.threads_per_worker == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (30.0, 0.0, 0.0))
    assert run_config(["trainer.threads_per_worker=auto"]).trainer.threads_per_worker == 1


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("trainer.num_workers=0", "trainer.num_workers", "integer >= 1 or 'auto'"),
        ("trainer.num_workers=two", "trainer.num_workers", "integer >= 1"),
        ("trainer.start_method=thread", "trainer.start_method", "fork, spawn, forkserver"),
        ("trainer.sharing_strategy=magic", "trainer.sharing_strategy", "file_descriptor"),
        ("trainer.device=tpu", "trainer.device", "cpu, cuda, cuda:N"),
        ("trainer.threads_per_worker=0", "trainer.threads_per_worker", "integer >= 1"),
        ("trainer.epochs=0", "trainer.epochs", "integer >= 1"),
        ("trainer.epochs=1.5", "trainer.epochs", "integer >= 1"),
        ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps", "integer >= 1"),
        ("trainer.on_worker_failure=ignore", "trainer.on_worker_failure", "stop, restart"),
        ("trainer.max_restarts=-1", "trainer.max_restarts", "integer >= 0"),
        ("trainer.skip_nonfinite=maybe", "trainer.skip_nonfinite", "true or false"),
        ("trainer.memory_format=nhwc", "trainer.memory_format", "auto, contiguous, channels_last"),
        ("data.batch_size=0", "data.batch_size", "integer >= 1"),
        ("data.batch_size=-4", "data.batch_size", "integer >= 1"),
        ("checkpoint.every_n_steps=-1", "checkpoint.every_n_steps", "integer >= 0"),
        ("+trainer.workers=2", "trainer.workers", "allowed: num_workers"),
        ("+typo=1", "typo", "allowed:"),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        run_config([override])
    message = str(err.value)
    assert key in message and allowed in message and "\n" not in message
    value = override.split("=", 1)[1]
    assert value in message


def test_fork_with_cuda_is_refused_before_anything_else():
    # even together with another bad value, and even on a machine without CUDA
    with pytest.raises(ConfigError, match="fork.*cannot be used with trainer.device='cuda'"):
        run_config(["trainer.start_method=fork", "trainer.device=cuda", "trainer.num_workers=0"])


def test_cuda_without_cuda_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="trainer.device='cuda:1'.*CUDA is not available"):
        run_config(["trainer.device=cuda:1", "trainer.start_method=spawn"])


def test_convnet_on_8x8_digits_is_refused_with_a_hint():
    run = run_config(["model=convnet"])
    with pytest.raises(ConfigError, match="convnet needs 1x28x28 inputs but the data gives 1x8x8"):
        builders.build_model(run.model, (1, 8, 8), 10)


@pytest.mark.parametrize(
    "override, message",
    [
        ("distributed.mode=mpi", "distributed.mode='mpi'.*none, torchrun"),
        ("distributed.backend=mpi", "distributed.backend='mpi'.*auto, gloo, nccl"),
        ("distributed.timeout_seconds=0", "distributed.timeout_seconds=0.*>= 1.0"),
    ],
)
def test_bad_distributed_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        run_config(["distributed=torchrun", override])


def test_a_torchrun_run_that_never_syncs_is_refused():
    with pytest.raises(ConfigError, match="would never average"):
        run_config(["distributed=torchrun", "distributed.sync_every_n_steps=0"])


# ---- one home for every default ----


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_python_defaults_equal_the_composed_cli_config_key_by_key(group):
    """A Python API user and a CLI user get the same run for the same omitted key."""
    overlay = ["+experiment=a3c_cartpole"] if group == "a3c" else []  # only RL runs compose a3c
    assert compose(overlay)[group] == dataclasses.asdict(GROUPS[group]())


def test_the_api_classes_are_the_schema_classes():
    import hogwild

    assert (
        hogwild.TrainerConfig is GROUPS["trainer"]
        and hogwild.CheckpointConfig is GROUPS["checkpoint"]
    )


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_option_of_a_typed_group_only_lists_what_it_changes(group):
    """schedule=cosine inherits the defaults and says only what differs; nothing restates them."""
    defaults = dataclasses.asdict(GROUPS[group]())
    for option in options(group):
        text = yaml.safe_load((CONFIGS / group / f"{option}.yaml").read_text()) or {}
        assert "_defaults" in text.get("defaults", []), (group, option)
        restated = {k: v for k, v in text.items() if k != "defaults" and defaults.get(k) == v}
        assert not restated, f"{group}/{option}.yaml restates defaults: {restated}"


def _own_target_options():
    """Options whose _target_ is hogwild's: torch's optimizers have defaults too, but a YAML
    value there is a choice (sgd's lr), not a restated default."""
    for group in ("data", "model", "optimizer"):
        for option in options(group):
            target = yaml.safe_load((CONFIGS / group / f"{option}.yaml").read_text())["_target_"]
            if target.startswith("hogwild."):
                yield group, option


@pytest.mark.parametrize("group, option", list(_own_target_options()))
def test_a_yaml_value_agrees_with_its_targets_default_unless_it_says_it_differs(group, option):
    """hogwild's own loaders and models have defaults too: the YAML may only restate them
    exactly, or say on that line why it differs."""
    path = CONFIGS / group / f"{option}.yaml"
    values = yaml.safe_load(path.read_text())
    target = values["_target_"]
    parameters = inspect.signature(get_object(target)).parameters
    lines = path.read_text().splitlines()
    for key, value in values.items():
        default = getattr(parameters.get(key), "default", inspect.Parameter.empty)
        if (
            default is inspect.Parameter.empty
            or default == value
            or (isinstance(default, tuple) and list(default) == value)
        ):
            continue
        line = next(line for line in lines if line.startswith(f"{key}:"))
        assert "differs" in line, f"{path.name}: {key}={value!r} but {target} says {default!r}"


def test_the_configuration_reference_is_current():
    from hogwild.cli import config_docs

    path = REPO / "docs" / "configuration.md"
    assert path.read_text() == config_docs.render(), (
        "docs/configuration.md is out of date: python -m hogwild.cli.config_docs > docs/configuration.md"
    )


def test_every_shipped_section_passes_the_check_of_what_its_target_takes():
    from hogwild.config.checks import check_arguments

    supplied = ("input_shape", "num_classes", "num_users", "num_items", "num_features")
    checked = 0
    for group in ("data", "model", "optimizer", "env"):
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            values = compose(
                [f"+{group}={path.stem}"] if group == "env" else [f"{group}={path.stem}"]
            )[group]
            values = {k: v for k, v in values.items() if k not in ("batch_size", "shared")}
            check_arguments(group, values, get_object(values["_target_"]), supplied)
            checked += 1
    assert checked >= 15


def test_the_target_check_takes_what_python_would():
    from hogwild.config.checks import check_arguments

    def build(hidden: int = None, fused: bool = False, name: str = "x", sizes=(1,)):
        return hidden

    check_arguments("model", {"hidden": None, "fused": 1, "name": 123, "sizes": [2]}, build)
    with pytest.raises(ConfigError, match="model.hidden='8' is not valid: expected an integer"):
        check_arguments("model", {"hidden": "8"}, build)
