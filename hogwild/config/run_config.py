"""A composed config (a plain, resolved dict from Hydra) validated into a RunConfig, before any
data is loaded or any process starts. Every error names the key, the value and what is allowed,
in one line; a misspelt key names the closest one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from hogwild.config.checks import Bool, Int, check_fields, refuse, unknown_key
from hogwild.config.schema import (
    A3CConfig,
    CheckpointConfig,
    DistributedConfig,
    ScheduleConfig,
    TrainerConfig,
    resolve_trainer,
)
from hogwild.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RunConfig:
    trainer: TrainerConfig
    checkpoint: CheckpointConfig
    batch_size: int
    data: dict[str, Any]  # `_target_` + kwargs of the data builder (batch_size removed)
    model: dict[str, Any]  # `_target_` + kwargs of the model class
    optimizer: dict[str, Any]  # `_target_` + `_partial_: true` + kwargs (shared removed)
    output_dir: str
    resume_from: str | None = None
    shared_optimizer: bool = False  # optimizer.shared: one optimizer state for all workers
    schedule: ScheduleConfig = ScheduleConfig()
    distributed: DistributedConfig = DistributedConfig()
    env: dict[str, Any] | None = None  # `_target_` + kwargs of an environment factory: A3C
    a3c: A3CConfig = A3CConfig()
    raw: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # the composed config, for records


def build_section(cls: type, section: str, values: Any) -> Any:
    return cls(**check_fields(section, values or {}, cls))


def check_distributed(cfg: DistributedConfig) -> DistributedConfig:
    if cfg.mode == "torchrun" and not (cfg.sync_every_n_steps or cfg.sync_every_seconds):
        raise ConfigError(
            "distributed.sync_every_n_steps=0 and distributed.sync_every_seconds=0: "
            "the nodes would never average their models; set one of them above 0"
        )
    return cfg


def _target_section(name: str, values: Any) -> dict[str, Any]:
    if not isinstance(values, Mapping) or "_target_" not in values:
        raise ConfigError(f"{name} must be a config group with a _target_ (got {values!r})")
    return dict(values)


def _finite_numbers(section: str, values: Mapping[str, Any]) -> None:
    """A NaN or infinite learning rate (or any other number) would start the run and fail later."""
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise refuse(f"{section}.{key}", value, "expected a finite number")


def build_run_config(raw: Mapping[str, Any], output_dir: str) -> RunConfig:
    """Validate a composed, resolved config (a plain dict) into a RunConfig."""
    env = _env_section(raw)
    for section in ("trainer", "model", "optimizer") + (() if env else ("data",)):
        if not isinstance(raw.get(section), Mapping):
            raise ConfigError(
                f"{section} is missing from the config; pick one with {section}=<name>"
            )
    trainer = resolve_trainer(raw["trainer"])
    data = {} if env else _target_section("data", raw["data"])
    batch_size = Int(1)("data.batch_size", data.pop("batch_size", None)) if data else 1
    optimizer = _target_section("optimizer", raw["optimizer"])
    shared_optimizer = Bool()("optimizer.shared", optimizer.pop("shared", False))
    _finite_numbers("optimizer", optimizer)
    resume_from = raw.get("resume_from")
    if resume_from is not None and not isinstance(resume_from, str):
        raise refuse(
            "resume_from",
            resume_from,
            "expected a path to a checkpoint, auto (this run folder's last checkpoint, if any) or null",
        )
    known = [
        "trainer",
        "data",
        "model",
        "optimizer",
        "checkpoint",
        "schedule",
        "distributed",
        "resume_from",
        "env",
        "a3c",
    ]
    for key, value in raw.items():
        if key not in known and not key.startswith("hydra"):
            raise unknown_key("", key, value, known)
    return RunConfig(
        trainer=trainer,
        checkpoint=build_section(CheckpointConfig, "checkpoint", raw.get("checkpoint")),
        batch_size=batch_size,
        data=data,
        model=_target_section("model", raw["model"]),
        optimizer=optimizer,
        output_dir=output_dir,
        resume_from=resume_from,
        shared_optimizer=shared_optimizer,
        schedule=build_section(ScheduleConfig, "schedule", raw.get("schedule")),
        distributed=check_distributed(
            build_section(DistributedConfig, "distributed", raw.get("distributed"))
        ),
        env=env,
        a3c=build_section(A3CConfig, "a3c", raw.get("a3c")),
        raw=dict(raw),
    )


def _env_section(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """An `env` group makes the run reinforcement learning (A3C), which trains on no data set."""
    if raw.get("env") is None:
        return None
    if raw.get("data") is not None:
        raise ConfigError(
            "env and data are both set: an env run (A3C) trains on no data set; "
            "use +experiment=a3c_cartpole, or add data=null"
        )
    device = (raw.get("trainer") or {}).get("device", "cpu")
    if device != "cpu":
        raise refuse(
            "trainer.device",
            device,
            "an env run (A3C) runs on the CPU: its environments step there and its models are tiny",
        )
    return _target_section("env", raw["env"])
