"""Typed run configuration and the validation that turns a composed config into it.

The CLI hands `build_run_config` a plain, fully resolved dict (no OmegaConf objects, no
interpolations); everything below it — trainer, workers, tests — sees only these dataclasses.
Every error names the key, the bad value and what is allowed, in one line.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

START_METHODS = ("fork", "spawn", "forkserver")
SCHEDULES = ("constant", "linear", "cosine")
LR_SCALINGS = ("none", "linear", "sqrt")
ON_WORKER_FAILURE = ("stop", "restart")
MEMORY_FORMATS = ("auto", "contiguous", "channels_last")
DATA_ON_DEVICE = ("auto", "true", "false")


class HogwildError(Exception):
    """A problem the user can fix; the CLI prints its message as one line, without traceback."""


class ConfigError(HogwildError, ValueError):
    pass


def usable_cores() -> int:
    """CPU cores this process may run on (affinity and cgroup pinning included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    num_workers: int = 2
    """worker processes (`auto` in YAML = usable CPU cores)"""
    start_method: str = "forkserver"
    """fork | spawn | forkserver; applied through a context, never globally"""
    sharing_strategy: str = "file_descriptor"
    """one of torch.multiprocessing.get_all_sharing_strategies()"""
    device: str = "cpu"
    """cpu | cuda | cuda:N (CUDA needs spawn or forkserver)"""
    threads_per_worker: int = 1
    """intra-op threads per worker (`auto` = max(1, cores // num_workers))"""
    epochs: int = 1
    """passes over the training set, in total across all workers"""
    seed: int = 0
    """worker `rank` seeds with seed + rank"""
    log_every_n_steps: int = 10
    """how often a worker reports its loss and throughput"""
    on_worker_failure: str = "stop"
    """stop: a dead worker ends the run; restart: it is replaced with the same rank"""
    max_restarts: int = 3
    """replacements allowed in one run with on_worker_failure=restart"""
    skip_nonfinite: bool = False
    """skip batches whose loss is NaN/inf instead of failing the run"""
    grace_seconds: float = 5.0
    """how long stopping workers may take to finish their step before SIGTERM"""
    eval_batch_size: int = 1000
    """batch size of the orchestrator's evaluation passes"""
    memory_format: str = "auto"
    """auto | contiguous | channels_last: layout of 4-D weights and inputs (auto = channels_last
    for a model with Conv2d layers on the CPU, where oneDNN runs it ~1.5x faster)"""
    data_on_device: str = "auto"
    """CUDA only: auto | true | false: keep the training split on the GPU (auto: when it needs at
    most half of the free memory) or in host shared memory, staged through pinned buffers"""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every_n_steps: int = 0
    """write checkpoints/last.pt every N optimizer steps (all workers together); 0 = off"""
    every_seconds: float = 0.0
    """write checkpoints/last.pt every N seconds; 0 = off"""


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """The `schedule` group: learning-rate rules under asynchrony (hogwild.schedule)."""

    name: str = "constant"
    """constant | linear (decay to min_lr_fraction) | cosine (decay to min_lr_fraction)"""
    warmup_fraction: float = 0.0
    """share of the run's samples over which the lr rises linearly from 0 (0 = no warm-up)"""
    min_lr_fraction: float = 0.0
    """where linear and cosine end, as a fraction of the base lr"""
    scale_lr_with_workers: str = "none"
    """none | linear | sqrt: multiply the base lr by N or sqrt(N) for N workers"""
    momentum_correction: bool = False
    """lower each worker's momentum by the implicit momentum of asynchrony, 1 - 1/N"""


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """The `distributed` group: Hogwild inside each node, model averaging between nodes."""

    mode: str = "none"
    """none | torchrun (one orchestrator per node, launched by torchrun)"""
    backend: str = "auto"
    """auto (gloo on the CPU, nccl on CUDA) | gloo | nccl"""
    sync_every_n_steps: int = 50
    """average the nodes' models every N local optimizer steps (0 = off)"""
    sync_every_seconds: float = 0.0
    """and/or every N seconds (0 = off)"""
    timeout_seconds: float = 60.0
    """a sync round that gets no answer from a node within this ends the run on every node"""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    trainer: TrainerConfig
    checkpoint: CheckpointConfig
    batch_size: int
    data: dict[str, Any]  # `_target_` + kwargs of the data builder (batch_size removed)
    model: dict[str, Any]  # `_target_` + kwargs of the model class
    optimizer: dict[str, Any]  # `_target_` + `_partial_: true` + kwargs
    output_dir: str
    resume_from: str | None = None
    shared_optimizer: bool = False  # optimizer.shared: one optimizer state for all workers
    schedule: ScheduleConfig = ScheduleConfig()
    distributed: DistributedConfig = DistributedConfig()
    raw: dict[str, Any] = dataclasses.field(default_factory=dict)  # composed config, for records


def _fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not valid: {allowed}")


def _int(key: str, value: Any, minimum: int, auto: int | None = None) -> int:
    if value == "auto" and auto is not None:
        return auto
    allowed = f"expected an integer >= {minimum}" + (" or 'auto'" if auto is not None else "")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(key, value, allowed)
    return value


def _number(key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise _fail(key, value, f"expected a number >= {minimum}")
    return float(value)


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _fail(key, value, "allowed: " + ", ".join(allowed))
    return value


def _yaml_word(value: Any) -> Any:
    """YAML reads `true`/`false` as booleans; a key that also takes `auto` wants the words."""
    return {True: "true", False: "false"}[value] if isinstance(value, bool) else value


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, value, "expected true or false")
    return value


def _check_keys(section: str, values: Mapping[str, Any], cls: type) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{section}.{key}={value!r}: {key!r} is not a known key; allowed: {', '.join(known)}")


def validate_device(device: Any, start_method: str) -> str:
    """CUDA rules, checked before anything else (the fork refusal holds on every machine)."""
    import torch

    if not isinstance(device, str) or not (
        device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise _fail("trainer.device", device, "allowed: cpu, cuda, cuda:N")
    if device == "cpu":
        return device
    if start_method == "fork":
        raise ConfigError(
            f"trainer.start_method='fork' cannot be used with trainer.device={device!r}: "
            "CUDA tensors can only be shared with spawn or forkserver"
        )
    if not torch.cuda.is_available():
        raise _fail("trainer.device", device, "CUDA is not available on this machine; use cpu")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise _fail("trainer.device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def build_trainer_config(values: Mapping[str, Any]) -> TrainerConfig:
    import torch.multiprocessing as mp

    v = {**dataclasses.asdict(TrainerConfig()), **values}
    # The CUDA/fork refusal comes before every other check, as the contract promises.
    device = validate_device(v["device"], v["start_method"])
    _check_keys("trainer", values, TrainerConfig)
    start_method = _choice("trainer.start_method", v["start_method"], START_METHODS)
    strategies = tuple(sorted(mp.get_all_sharing_strategies()))
    cores = usable_cores()
    num_workers = _int("trainer.num_workers", v["num_workers"], 1, auto=cores)
    return TrainerConfig(
        num_workers=num_workers,
        start_method=start_method,
        sharing_strategy=_choice("trainer.sharing_strategy", v["sharing_strategy"], strategies),
        device=device,
        threads_per_worker=_int(
            "trainer.threads_per_worker", v["threads_per_worker"], 1, auto=max(1, cores // num_workers)
        ),
        epochs=_int("trainer.epochs", v["epochs"], 1),
        seed=_int("trainer.seed", v["seed"], 0),
        log_every_n_steps=_int("trainer.log_every_n_steps", v["log_every_n_steps"], 1),
        on_worker_failure=_choice("trainer.on_worker_failure", v["on_worker_failure"], ON_WORKER_FAILURE),
        max_restarts=_int("trainer.max_restarts", v["max_restarts"], 0),
        skip_nonfinite=_bool("trainer.skip_nonfinite", v["skip_nonfinite"]),
        grace_seconds=_number("trainer.grace_seconds", v["grace_seconds"], 0.0),
        eval_batch_size=_int("trainer.eval_batch_size", v["eval_batch_size"], 1),
        memory_format=_choice("trainer.memory_format", v["memory_format"], MEMORY_FORMATS),
        data_on_device=_choice("trainer.data_on_device", _yaml_word(v["data_on_device"]), DATA_ON_DEVICE),
    )


def build_checkpoint_config(values: Mapping[str, Any]) -> CheckpointConfig:
    _check_keys("checkpoint", values, CheckpointConfig)
    v = {**dataclasses.asdict(CheckpointConfig()), **values}
    return CheckpointConfig(
        every_n_steps=_int("checkpoint.every_n_steps", v["every_n_steps"], 0),
        every_seconds=_number("checkpoint.every_seconds", v["every_seconds"], 0.0),
    )


def build_schedule_config(values: Mapping[str, Any]) -> ScheduleConfig:
    _check_keys("schedule", values, ScheduleConfig)
    v = {**dataclasses.asdict(ScheduleConfig()), **values}
    warmup = _number("schedule.warmup_fraction", v["warmup_fraction"], 0.0)
    if warmup >= 1.0:
        raise _fail("schedule.warmup_fraction", v["warmup_fraction"], "expected a number >= 0.0 and < 1.0")
    floor = _number("schedule.min_lr_fraction", v["min_lr_fraction"], 0.0)
    if floor > 1.0:
        raise _fail("schedule.min_lr_fraction", v["min_lr_fraction"], "expected a number >= 0.0 and <= 1.0")
    return ScheduleConfig(
        name=_choice("schedule.name", v["name"], SCHEDULES),
        warmup_fraction=warmup,
        min_lr_fraction=floor,
        scale_lr_with_workers=_choice("schedule.scale_lr_with_workers", v["scale_lr_with_workers"], LR_SCALINGS),
        momentum_correction=_bool("schedule.momentum_correction", v["momentum_correction"]),
    )


def build_distributed_config(values: Mapping[str, Any]) -> DistributedConfig:
    _check_keys("distributed", values, DistributedConfig)
    v = {**dataclasses.asdict(DistributedConfig()), **values}
    cfg = DistributedConfig(
        mode=_choice("distributed.mode", v["mode"], ("none", "torchrun")),
        backend=_choice("distributed.backend", v["backend"], ("auto", "gloo", "nccl")),
        sync_every_n_steps=_int("distributed.sync_every_n_steps", v["sync_every_n_steps"], 0),
        sync_every_seconds=_number("distributed.sync_every_seconds", v["sync_every_seconds"], 0.0),
        timeout_seconds=_number("distributed.timeout_seconds", v["timeout_seconds"], 1.0),
    )
    if cfg.mode == "torchrun" and not (cfg.sync_every_n_steps or cfg.sync_every_seconds):
        raise ConfigError("distributed.sync_every_n_steps=0 and distributed.sync_every_seconds=0: "
                          "the nodes would never average their models; set one of them above 0")
    return cfg


def _target_section(name: str, values: Any) -> dict[str, Any]:
    if not isinstance(values, Mapping) or "_target_" not in values:
        raise ConfigError(f"{name} must be a config group with a _target_ (got {values!r})")
    return dict(values)


def build_run_config(raw: Mapping[str, Any], output_dir: str) -> RunConfig:
    """Validate a composed, resolved config (a plain dict) into a RunConfig."""
    for section in ("trainer", "data", "model", "optimizer"):
        if not isinstance(raw.get(section), Mapping):
            raise ConfigError(f"{section} is missing from the config; pick one with {section}=<name>")
    trainer = build_trainer_config(raw["trainer"])
    data = _target_section("data", raw["data"])
    batch_size = _int("data.batch_size", data.pop("batch_size", None), 1)
    optimizer = _target_section("optimizer", raw["optimizer"])
    shared_optimizer = _bool("optimizer.shared", optimizer.pop("shared", False))
    resume_from = raw.get("resume_from")
    if resume_from is not None and not isinstance(resume_from, str):
        raise _fail("resume_from", resume_from, "expected a path to a checkpoint, auto (this run folder's last checkpoint, if any) or null")
    known = {"trainer", "data", "model", "optimizer", "checkpoint", "schedule", "distributed", "resume_from"}
    for key, value in raw.items():
        if key not in known and not key.startswith("hydra"):
            raise ConfigError(f"{key}={value!r}: {key!r} is not a known config key; allowed: {', '.join(sorted(known))}")
    return RunConfig(
        trainer=trainer,
        checkpoint=build_checkpoint_config(raw.get("checkpoint") or {}),
        batch_size=batch_size,
        data=data,
        model=_target_section("model", raw["model"]),
        optimizer=optimizer,
        output_dir=output_dir,
        resume_from=resume_from,
        shared_optimizer=shared_optimizer,
        schedule=build_schedule_config(raw.get("schedule") or {}),
        distributed=build_distributed_config(raw.get("distributed") or {}),
        raw=dict(raw),
    )
