"""Learning-rate rules under asynchrony (config group `schedule`).

- The schedule runs on the **global** sample count (all workers together, read from the shared
  progress table), so every worker sits at the same point of the curve whatever its own speed,
  and a replacement or resumed worker picks the curve up where the run is.
- `scale_lr_with_workers`: `linear` multiplies the base learning rate by the worker count
  (N workers apply N batches' worth of updates in the time one worker applies one: like a batch N
  times bigger), `sqrt` by its square root (the milder rule), `none` keeps it.
- `momentum_correction`: asynchrony itself acts like momentum of about 1 - 1/N (Mitliagkas et
  al., "Asynchrony begets momentum", 2016); with it on, each worker's explicit momentum becomes
  max(0, momentum - (1 - 1/N)), so the total stays near what was tuned for one worker.
"""

from __future__ import annotations

import math

import torch

from hogwild.config.schema import ScheduleConfig


def factor(cfg: ScheduleConfig, fraction: float) -> float:
    """The lr multiplier at `fraction` (0..1) of the run's samples."""
    fraction = min(max(fraction, 0.0), 1.0)
    if cfg.warmup_fraction and fraction < cfg.warmup_fraction:
        return fraction / cfg.warmup_fraction
    if cfg.name == "constant":
        return 1.0
    span = 1.0 - cfg.warmup_fraction
    t = (fraction - cfg.warmup_fraction) / span if span > 0 else 1.0
    shape = 1.0 - t if cfg.name == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return cfg.min_lr_fraction + (1.0 - cfg.min_lr_fraction) * shape


def worker_scale(cfg: ScheduleConfig, num_workers: int) -> float:
    return {"none": 1.0, "linear": float(num_workers), "sqrt": math.sqrt(num_workers)}[
        cfg.scale_lr_with_workers
    ]


class Scheduler:
    """Set in each worker on its own optimizer; `update` costs a few float writes."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        cfg: ScheduleConfig,
        num_workers: int,
        total_samples: int,
    ):
        self.optimizer, self.cfg, self.total = optimizer, cfg, max(total_samples, 1)
        scale = worker_scale(cfg, num_workers)
        self.base = [group["lr"] * scale for group in optimizer.param_groups]
        if cfg.momentum_correction:
            implicit = 1.0 - 1.0 / num_workers
            for group in optimizer.param_groups:
                if "momentum" in group:
                    group["momentum"] = max(0.0, group["momentum"] - implicit)
                elif "betas" in group:
                    group["betas"] = (max(0.0, group["betas"][0] - implicit), group["betas"][1])
        self.active = cfg.name != "constant" or cfg.warmup_fraction > 0 or scale != 1.0

    def update(self, global_samples: int) -> None:
        f = factor(self.cfg, global_samples / self.total)
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * f
