"""What the benchmark runs: the models, their data and optimizers (the same for the plain loop and
the framework), the modes and the plan of runs."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

BATCH, LR, MOMENTUM, SEED = 64, 0.05, 0.5, 0
TEST_SAMPLES = 500  # the framework evaluates once after the epoch; keep that short
FD, FS = "file_descriptor", "file_system"
# The sparse models (opt-in: --models mf,sparse; in the full mode) train with Adagrad, the
# dense ones with SGD; MF is a regression (MSE) on batches of 256 ratings.
SPARSE = {"mf": dict(batch=256, lr=0.1), "sparse": dict(batch=64, lr=0.5)}
MODELS = ("mlp", "convnet", *SPARSE)


# Rows besides plain and framework, for the dense models (mlp, convnet), in the fork setting:
# the framework reporting its loss every step, and torch DDP (gloo) with one process per worker.
EXTRA_IMPLS = ("framework-step", "ddp")

MODES = {  # samples per run (1 epoch), which (start method, strategy) pairs, best single process?
    "tiny": dict(
        models=["mlp"],
        samples={"mlp": 1024, "mf": 4096, "sparse": 2048},
        plain=[("fork", FD)],
        framework=[("fork", FD)],
        single=False,
        max_workers=2,
    ),
    "quick": dict(
        models=["mlp", "convnet"],
        samples={"mlp": 30_000, "convnet": 6_000, "mf": 200_000, "sparse": 100_000},
        plain=[("fork", FD), ("forkserver", FD)],
        framework=[("fork", FD), ("forkserver", FD)],
        single=True,
        max_workers=None,
    ),
    "full": dict(
        models=list(MODELS),
        samples={"mlp": 60_000, "convnet": 15_000, "mf": 400_000, "sparse": 200_000},
        plain=[("fork", FD), ("forkserver", FD)],
        framework=[(m, s) for m in ("fork", "spawn", "forkserver") for s in (FD, FS)],
        single=True,
        max_workers=None,
    ),
}


def recipe(model_name: str) -> tuple[int, functools.partial, object]:
    """(batch size, optimizer factory, loss function) of a model, the same for plain and framework."""
    if model_name in SPARSE:
        s = SPARSE[model_name]
        return (
            s["batch"],
            functools.partial(torch.optim.Adagrad, lr=s["lr"]),
            (F.mse_loss if model_name == "mf" else F.cross_entropy),
        )
    return BATCH, functools.partial(torch.optim.SGD, lr=LR, momentum=MOMENTUM), F.cross_entropy


def build(model_name: str, num_samples: int):
    from hogwild.data import make_synthetic, make_synthetic_ratings, make_synthetic_sparse
    from hogwild.models import MLP, ConvNet, MatrixFactorization, SparseLinear

    torch.manual_seed(SEED)  # the same initial weights for plain and framework
    if model_name == "mf":
        data = make_synthetic_ratings(
            num_ratings=num_samples, num_test_ratings=TEST_SAMPLES, seed=SEED
        )
        return MatrixFactorization(**data.model_kwargs), data
    if model_name == "sparse":
        data = make_synthetic_sparse(
            num_samples=num_samples, num_test_samples=TEST_SAMPLES, seed=SEED
        )
        return SparseLinear(**data.model_kwargs), data
    model = MLP([1, 28, 28], 10, [256]) if model_name == "mlp" else ConvNet([1, 28, 28], 10)
    return model, make_synthetic(num_samples=num_samples, num_test_samples=TEST_SAMPLES, seed=SEED)


# ---- the sweep, the figures, the outputs ----


def plan(mode: dict, models: list[str], workers: list[int], cores: int) -> list[tuple]:
    """(model, impl, start_method, strategy, num_workers, threads); plain and framework of one
    setting run back to back, so that a change in machine load hits both alike."""
    runs = []
    for model in models:
        for n in workers:
            for start, strategy in dict.fromkeys(mode["plain"] + mode["framework"]):
                for impl in ("plain", "framework"):
                    if (start, strategy) in mode[impl]:
                        runs.append((model, impl, start, strategy, n, 1))
            if model not in SPARSE and n > 1:
                runs += [(model, impl, "fork", FD, n, 1) for impl in EXTRA_IMPLS]
        if mode["single"] and cores > 1:  # 1 process x all cores, in the plain loop's settings
            runs += [
                (model, impl, start, strategy, 1, cores)
                for start, strategy in mode["plain"]
                for impl in ("plain", "framework")
            ]
    return runs
