"""The common currency of the data layer.

Every loader returns a DataSplits: four CPU tensors plus a little metadata. They are plain
in-memory tensors, which the trainer moves to shared memory once and hands to its workers, or
tensors mapped from .npy files (hogwild.data.mapped, a loader's `cache_dir`), which every
worker maps itself. Loaders know nothing of processes or the trainer.

    splits = load_digits()
    splits.train_x.shape   # (1437, 1, 8, 8), float32
    splits.input_shape     # (1, 8, 8)
    splits.num_classes     # 10

DataError is raised for every user-facing problem (missing or corrupt files, bad argument
values). Its message is a single line naming what is wrong and what to do about it, so the
CLI can print it as-is instead of a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hogwild.errors import DataError

TASKS = ("classification", "regression")
__all__ = ["DataError", "DataSplits", "TASKS", "make_folder"]


@dataclass
class DataSplits:
    """A data set as four tensors: in memory (the trainer moves them to shared memory once) or
    mapped from files (hogwild.data.mapped: never copied)."""

    train_x: (
        torch.Tensor
    )  # float32, shape (N, *input_shape) (regression: any dtype, e.g. int64 ids)
    train_y: torch.Tensor  # int64 class labels, shape (N,) (regression: float32 targets)
    test_x: torch.Tensor  # like train_x, shape (M, *input_shape)
    test_y: torch.Tensor  # like train_y, shape (M,)
    num_classes: int  # 0 for regression
    name: str
    task: str = "classification"  # or "regression": MSE loss, RMSE on the test split
    model_kwargs: dict[str, Any] = field(
        default_factory=dict
    )  # e.g. num_users / num_items for model=mf

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DataError(f"{self.name}: task={self.task!r}: must be one of {', '.join(TASKS)}")
        regression = self.task == "regression"
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if not regression and x.dtype != torch.float32:
                raise DataError(
                    f"{self.name}: {split}_x has dtype {x.dtype}: must be torch.float32"
                )
            want = torch.float32 if regression else torch.int64
            if y.dtype != want:
                raise DataError(f"{self.name}: {split}_y has dtype {y.dtype}: must be {want}")
            if x.dim() < 2 or y.dim() != 1:
                raise DataError(
                    f"{self.name}: {split}_x/{split}_y have shapes {tuple(x.shape)}/{tuple(y.shape)}: "
                    "must be (N, *input_shape) and (N,)"
                )
            if len(x) != len(y):
                raise DataError(
                    f"{self.name}: {split}_x has {len(x)} rows but {split}_y has {len(y)}: must match"
                )
            if not regression and len(y) and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise DataError(
                    f"{self.name}: {split}_y has labels in [{int(y.min())}, {int(y.max())}]: "
                    f"must lie in [0, {self.num_classes - 1}]"
                )
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise DataError(
                f"{self.name}: train inputs have shape {tuple(self.train_x.shape[1:])} but test inputs "
                f"{tuple(self.test_x.shape[1:])}: must match"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.train_y)

    @property
    def num_test(self) -> int:
        return len(self.test_y)


def make_folder(path: Path, way_out: str, what: str = "") -> None:
    """`mkdir -p`, or one DataError naming the folder (`what`: "MNIST folder "), the OS reason
    and `way_out`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create {what}{path} ({e.strerror or e}): {way_out}") from None
