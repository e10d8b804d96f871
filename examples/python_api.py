"""Train your own nn.Module on your own tensors with Hogwild workers — no Hydra, no YAML.

python examples/python_api.py
"""

import functools

import torch
from torch import nn

from hogwild import Trainer, TrainerConfig
from hogwild.data import DataSplits

if __name__ == "__main__":  # required: spawn/forkserver workers re-import this file
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12_000, 20, generator=g)
    y = (x[:, :10].sum(1) > x[:, 10:].sum(1)).long()  # a rule the model can learn
    data = DataSplits(
        x[:10_000], y[:10_000], x[10_000:], y[10_000:], num_classes=2, name="my-tensors"
    )
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    trainer = Trainer(
        model,
        data,
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        TrainerConfig(num_workers=2, epochs=5),
        batch_size=64,
        # No output_dir: a fresh outputs/python_api/<date>_<time>/ each time. A fixed folder
        # that holds a finished run is refused unless overwrite=True (or resume_from=...).
    )
    summary = trainer.fit()
    print(
        f"{summary['status']}: test accuracy {summary['test_accuracy']:.3f}, "
        f"{summary['samples_per_second']:,.0f} samples/s, in {trainer.output_dir}"
    )
