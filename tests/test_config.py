"""Every config option composes and validates; every bad value is refused with one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hogwild import builders
from hogwild.cli import config_dir
from hogwild.config import ConfigError, build_run_config, usable_cores

CONFIGS = Path(config_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def composed(overrides=()) -> dict:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def run_config(overrides=()):
    return build_run_config(composed(overrides), output_dir="unused")


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
