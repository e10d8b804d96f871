"""hogwild: lock-free asynchronous SGD (Hogwild!) on torch.multiprocessing, driven by Hydra.

Python API (no Hydra needed)::

    from hogwild import Trainer, TrainerConfig
    Trainer(model, data, functools.partial(torch.optim.SGD, lr=0.05),
            TrainerConfig(num_workers=2), batch_size=64, output_dir="runs/mine").fit()
"""

from hogwild.config.schema import A3CConfig, CheckpointConfig, ScheduleConfig, TrainerConfig
from hogwild.errors import ConfigError, DataError, HogwildError, WorkerFailure

__all__ = [
    "Trainer",
    "TrainerConfig",
    "CheckpointConfig",
    "ScheduleConfig",
    "A3CConfig",
    "HogwildError",
    "ConfigError",
    "DataError",
    "WorkerFailure",
]


def __getattr__(name: str):
    # Imported on first use: `hogwild --help` should not pay for importing torch (~1.5 s).
    if name == "Trainer":
        from hogwild.run.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'hogwild' has no attribute {name!r}")
