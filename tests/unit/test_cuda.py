"""CUDA: the placement rules run everywhere; training on a GPU needs one and skips without it.

The refusals (fork with CUDA, CUDA without a GPU, a GPU index that does not exist) are tested in
test_config.py and test_errors.py. On a CUDA machine `python scripts/gpu_check.py` is the wider
check (1, 2 and 4 workers, IPC, leaks, throughput against the CPU).
"""

from __future__ import annotations

import pytest
import torch

from hogwild.errors import ConfigError
from hogwild.workloads import device as device_rules

from support import run_config

MiB = 2**20


def test_data_stays_home_on_the_cpu_and_when_told_to():
    cuda = torch.device("cuda", 0)
    assert not device_rules.data_goes_to_device(1, torch.device("cpu"), "true", free_bytes=10**12)
    assert not device_rules.data_goes_to_device(1, cuda, "false", free_bytes=10**12)


@pytest.mark.parametrize("nbytes, goes", [(400 * MiB, True), (500 * MiB, True), (501 * MiB, False)])
def test_auto_puts_the_data_on_the_gpu_when_it_needs_at_most_half_the_free_memory(nbytes, goes):
    assert (
        device_rules.data_goes_to_device(
            nbytes, torch.device("cuda", 0), "auto", free_bytes=1000 * MiB
        )
        is goes
    )


def test_data_on_device_true_refuses_data_bigger_than_the_free_memory():
    cuda = torch.device("cuda", 0)
    assert device_rules.data_goes_to_device(900 * MiB, cuda, "true", free_bytes=1000 * MiB)
    with pytest.raises(
        ConfigError, match=r"data_on_device=true.*1,200 MiB.*1,000 MiB free.*auto or false"
    ):
        device_rules.data_goes_to_device(1200 * MiB, cuda, "true", free_bytes=1000 * MiB)


@pytest.mark.parametrize(
    "value, expected", [("auto", "auto"), ("true", "true"), ("false", "false")]
)
def test_data_on_device_accepts_yaml_booleans_and_auto(value, expected):
    assert run_config([f"trainer.data_on_device={value}"]).trainer.data_on_device == expected


def test_data_on_device_refuses_other_values():
    with pytest.raises(ConfigError, match=r"trainer.data_on_device='gpu'.*auto, true, false"):
        run_config(["trainer.data_on_device=gpu"])


def test_cpu_device_resolves_to_itself():
    assert device_rules.resolve("cpu") == torch.device("cpu")
