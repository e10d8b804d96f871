"""The typed run configuration: the one home of every default, its doc and its check.

Each field is declared once, with `option(default, doc, check)`. The Python API reads the
defaults from these dataclasses; the CLI registers the same values as the base of each Hydra
group (`hogwild.cli.main.register_defaults`), so `trainer/default.yaml` restates nothing and a CLI
run and an API run get the same value for an omitted key. docs/configuration.md is written from
these fields (`python -m hogwild.cli.config_docs`), and a unit test keeps it in step.

`resolve_trainer` checks a TrainerConfig (from YAML or from Python) and resolves its `auto`s;
hogwild.config.run_config validates a whole composed config. Every error names the key, the value and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from typing import Any

from hogwild.config.checks import Bool, Choice, Device, Int, Number, OrNull, check_fields, refuse
from hogwild.errors import ConfigError

START_METHODS = ("fork", "spawn", "forkserver")


def option(default: Any, doc: str, check: Any) -> Any:
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check})


def usable_cores() -> int:
    """CPU cores this process may run on (affinity and cgroup pinning included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def idle_cores(cores: int) -> int:
    """The usable cores that other work leaves free: `cores` less the 1-minute load average
    (rounded down, so the CLI's own start-up does not count). Threads beyond a core that is
    free were measured to collapse: 1 worker x 2 threads ran at 9-17k samples/s beside other
    work on 2 cores, 1 x 1 thread at 32-39k."""
    try:  # the machine's load, in the share of its cores this process may use
        busy = int(os.getloadavg()[0] * cores / (os.cpu_count() or cores))
    except OSError:  # no load average on this system
        busy = 0
    return max(1, cores - busy)


def _sharing_strategies() -> tuple[str, ...]:
    """torch.multiprocessing.get_all_sharing_strategies(), without importing torch (~2 s) just
    to refuse a typo: file_system everywhere, file_descriptor too where fds can be passed."""
    return ("file_descriptor", "file_system") if sys.platform != "darwin" else ("file_system",)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The `trainer` group: how the workers run."""

    num_workers: int | str = option(2, "worker processes", Int(1, auto="usable CPU cores"))
    start_method: str = option(
        "forkserver",
        "how workers start, through a context (never globally); CUDA needs spawn or forkserver",
        Choice(START_METHODS),
    )
    sharing_strategy: str = option(
        "file_descriptor",
        "how CPU tensors are shared; set in the orchestrator and in every worker",
        Choice(_sharing_strategies),
    )
    device: str = option(
        "cpu", "where the shared model lives (cuda = the current device)", Device()
    )
    threads_per_worker: int | str = option(
        1,
        "intra-op threads per worker (1: a second thread pays off only for big layers on idle "
        "cores, and collapses when other work shares them)",
        Int(1, auto="max(1, idle cores // num_workers)"),
    )
    epochs: int = option(10, "passes over the training set, in total across all workers", Int(1))
    seed: int = option(
        0,
        "worker `rank` seeds with seed + rank; epoch permutations with seed and the epoch",
        Int(0),
    )
    log_every_n_steps: int = option(
        10,
        "how often a worker publishes its loss sum (steps; on CUDA each is a device sync)",
        Int(1),
    )
    on_worker_failure: str = option(
        "stop",
        "stop: a dead worker ends the run; restart: it is replaced "
        "(same rank, the rest of its shard)",
        Choice(("stop", "restart")),
    )
    max_restarts: int = option(
        3, "replacements allowed per run with on_worker_failure=restart", Int(0)
    )
    skip_nonfinite: bool = option(
        False, "skip batches whose loss is NaN/inf instead of failing the run", Bool()
    )
    grace_seconds: float = option(
        5.0, "how long stopping workers may take to finish their step before SIGTERM", Number(0.0)
    )
    stall_seconds: float = option(
        120.0,
        "a worker that takes no step for this long is hung: its stack is logged, it is "
        "killed and on_worker_failure applies (0 = off)",
        Number(0.0),
    )
    eval_batch_size: int = option(
        1000, "batch size of the orchestrator's evaluation passes", Int(1)
    )
    eval_wait_seconds: float = option(
        30.0,
        "how long an evaluation due while the workers keep every core busy may wait for an "
        "idle core (or the end of training) before it runs beside them; it scores the weights "
        "of the moment it was due (0 = at once)",
        Number(0.0),
    )
    memory_format: str = option(
        "auto",
        "layout of 4-D weights and inputs (auto: channels_last for a model "
        "with Conv2d layers on the CPU, where oneDNN runs it ~1.4x faster)",
        Choice(("auto", "contiguous", "channels_last")),
    )
    data_on_device: str = option(
        "auto",
        "CUDA only: keep the training split on the GPU (auto: when it needs "
        "at most half of the free memory) or in host shared memory",
        Choice(("auto", "true", "false"), words=True),
    )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """The `checkpoint` group: when checkpoints/last.pt is written while training (it is always
    written at the end of a run, completed or interrupted)."""

    every_n_steps: int = option(
        0, "every N optimizer steps, all workers together (0 = off)", Int(0)
    )
    every_seconds: float = option(60.0, "every N seconds of wall time (0 = off)", Number(0.0))


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The `schedule` group: the learning rate over the run, on the global sample count."""

    name: str = option(
        "constant",
        "the lr curve over the run: linear and cosine decay to min_lr_fraction",
        Choice(("constant", "linear", "cosine")),
    )
    warmup_fraction: float = option(
        0.0,
        "share of the run's samples over which the lr rises from 0 (0 = none)",
        Number(0.0, below=1.0),
    )
    min_lr_fraction: float = option(
        0.0, "where linear and cosine end, as a fraction of the base lr", Number(0.0, maximum=1.0)
    )
    scale_lr_with_workers: str = option(
        "none",
        "multiply the base lr by N or sqrt(N) for N workers",
        Choice(("none", "linear", "sqrt")),
    )
    momentum_correction: bool = option(
        False,
        "lower each worker's momentum by the implicit momentum of asynchrony, 1 - 1/N",
        Bool(),
    )


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """The `distributed` group: Hogwild inside each node, model averaging between nodes."""

    mode: str = option(
        "none",
        "torchrun: one orchestrator per node, launched by torchrun",
        Choice(("none", "torchrun")),
    )
    backend: str = option(
        "auto", "auto = gloo on the CPU, nccl on CUDA", Choice(("auto", "gloo", "nccl"))
    )
    sync_every_n_steps: int = option(
        50, "average the nodes' models every N local optimizer steps (0 = off)", Int(0)
    )
    sync_every_seconds: float = option(0.0, "and/or every N seconds (0 = off)", Number(0.0))
    timeout_seconds: float = option(
        60.0,
        "a round with no answer from a node within this ends the run on every node",
        Number(1.0),
    )


@dataclasses.dataclass(frozen=True)
class A3CConfig:
    """The `a3c` group: advantage actor-critic on the `env` group's environment (docs/a3c.md).
    The defaults solve CartPole-v1."""

    rollout_steps: int = option(
        20, "n of the n-step returns: environment steps per update, per worker", Int(1)
    )
    gamma: float = option(0.99, "discount factor", Number(0.0, maximum=1.0))
    gae_lambda: float = option(
        1.0,
        "1.0: A3C's n-step returns; below 1: generalized advantage estimation, GAE(lambda)",
        Number(0.0, maximum=1.0),
    )
    entropy_coef: float = option(0.01, "weight of the policy's entropy bonus", Number(0.0))
    value_coef: float = option(0.5, "weight of the value loss", Number(0.0))
    max_grad_norm: float = option(
        40.0, "clip each update's gradient norm to this (0 = off)", Number(0.0)
    )
    max_env_steps: int = option(
        2_000_000,
        "the budget: environment steps of all workers together; the run ends there if unsolved",
        Int(1),
    )
    eval_every_env_steps: int = option(
        20_000,
        "evaluate the greedy policy of the shared model every N environment steps (all "
        "workers together), while the workers go on",
        Int(1),
    )
    eval_episodes: int = option(10, "episodes per evaluation (K)", Int(1))
    stop_at_return: float | None = option(
        None,
        "end the run as solved when an evaluation's mean return reaches this",
        OrNull(Number(-math.inf), "the environment's reward_threshold: 475 for CartPole-v1"),
    )


GROUPS = {
    "trainer": TrainerConfig,
    "checkpoint": CheckpointConfig,
    "schedule": ScheduleConfig,
    "distributed": DistributedConfig,
    "a3c": A3CConfig,
}


def validate_device(device: Any, start_method: Any) -> str:
    """CUDA rules, checked before anything else (the fork refusal holds on every machine)."""
    device = Device()("trainer.device", device)
    if device == "cpu":
        return device
    if start_method == "fork":
        raise ConfigError(
            f"trainer.start_method='fork' cannot be used with trainer.device={device!r}: "
            "CUDA tensors can only be shared with spawn or forkserver"
        )
    import torch

    if not torch.cuda.is_available():
        raise refuse("trainer.device", device, "CUDA is not available on this machine; use cpu")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise refuse(
            "trainer.device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return device


def resolve_trainer(values: TrainerConfig | Mapping[str, Any]) -> TrainerConfig:
    """Check every trainer value and resolve `auto`: the config a run really uses."""
    raw = dataclasses.asdict(values) if isinstance(values, TrainerConfig) else dict(values)
    defaults = TrainerConfig()
    # The CUDA/fork refusal comes before every other check, as the contract promises.
    validate_device(
        raw.get("device", defaults.device), raw.get("start_method", defaults.start_method)
    )
    v = check_fields("trainer", raw, TrainerConfig)
    cores = usable_cores()
    if v["num_workers"] == "auto":
        v["num_workers"] = cores
    if v["threads_per_worker"] == "auto":
        v["threads_per_worker"] = max(1, idle_cores(cores) // v["num_workers"])
    return TrainerConfig(**v)
