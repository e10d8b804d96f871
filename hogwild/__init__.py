"""hogwild: lock-free asynchronous SGD (Hogwild!) on torch.multiprocessing, driven by Hydra.

Python API (no Hydra needed)::

    from hogwild import Trainer, TrainerConfig
    Trainer(model, data, functools.partial(torch.optim.SGD, lr=0.05),
            TrainerConfig(num_workers=2), batch_size=64, output_dir="runs/mine").fit()
"""

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


EXPORTS = {  # name -> the module that defines it
    "Trainer": "hogwild.run.trainer",
    "TrainerConfig": "hogwild.config.schema",
    "CheckpointConfig": "hogwild.config.schema",
    "ScheduleConfig": "hogwild.config.schema",
    "A3CConfig": "hogwild.config.schema",
    "HogwildError": "hogwild.errors",
    "ConfigError": "hogwild.errors",
    "DataError": "hogwild.errors",
    "WorkerFailure": "hogwild.errors",
}


def __getattr__(name: str):
    # Imported on first use: `hogwild --help` should not pay for importing torch (~1.5 s), and
    # the CLI takes Ctrl-C before anything else is imported (hogwild.cli.main.run).
    import importlib

    if name in EXPORTS:
        return getattr(importlib.import_module(EXPORTS[name]), name)
    try:  # a subpackage (hogwild.errors, hogwild.config, ...), as eager imports once gave
        return importlib.import_module(f"hogwild.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'hogwild' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
