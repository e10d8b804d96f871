"""hogwild: lock-free asynchronous SGD (Hogwild!) on torch.multiprocessing, driven by Hydra.

Python API (no Hydra needed)::

    from hogwild import Trainer, TrainerConfig
    Trainer(model, data, functools.partial(torch.optim.SGD, lr=0.05),
            TrainerConfig(num_workers=2), batch_size=64, output_dir="runs/mine").fit()
"""

from hogwild.config import CheckpointConfig, ConfigError, HogwildError, TrainerConfig
from hogwild.trainer import Trainer

__all__ = ["Trainer", "TrainerConfig", "CheckpointConfig", "HogwildError", "ConfigError"]
