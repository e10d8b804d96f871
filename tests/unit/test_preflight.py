"""Pre-flight checks: a run that would die deep inside torch ("Too many open files", "No space
left on device", a bare "Bus error") is refused up front with one line and a way out, and a run
that can be made to work (a soft open-file limit that can be raised) just works."""

from __future__ import annotations

import functools
import shutil
from collections import namedtuple

import pytest
import torch
from torch.optim.optimizer import required

from hogwild import HogwildError
from hogwild.errors import ConfigError
from hogwild.optim.rowwise_adagrad import RowwiseAdagrad
from hogwild.process import sharing
from hogwild.process.sharing import FD_HEADROOM, PreflightError
from hogwild.run import preflight

Budget = namedtuple("Budget", "before after error")


class Limits:
    """resource's open-file limits, faked: what ensure_fd_budget reads and sets, in this process."""

    def __init__(self, soft: int, hard: int):
        self.value = (soft, hard)

    def getrlimit(self, which):
        return self.value

    def setrlimit(self, which, value):
        assert value[1] == self.value[1], "the hard limit must never change"
        self.value = value


def budget(monkeypatch, num_tensors: int, strategy: str, soft: int, hard: int = 20000) -> Budget:
    limits = Limits(soft, hard)
    monkeypatch.setattr(sharing.resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(sharing.resource, "setrlimit", limits.setrlimit)
    before, error = limits.value, None
    try:
        sharing.ensure_fd_budget(num_tensors, strategy)
    except PreflightError as e:
        error = str(e)
    return Budget(before, limits.value, error)


# ---- open files under file_descriptor ----


def test_fd_budget_raises_the_soft_limit_when_the_hard_limit_allows(monkeypatch):
    needed = 300 + FD_HEADROOM
    b = budget(monkeypatch, 300, "file_descriptor", soft=64)
    assert b.error is None
    assert b.before[0] == 64
    assert b.after == (needed, b.before[1])  # raised to what is needed, the hard limit untouched


def test_fd_budget_leaves_a_sufficient_soft_limit_alone(monkeypatch):
    b = budget(monkeypatch, 300, "file_descriptor", soft=4096)
    assert b.error is None and b.after == b.before  # never lowered


def test_fd_budget_refuses_when_the_hard_limit_is_too_low(monkeypatch):
    b = budget(monkeypatch, 300, "file_descriptor", soft=64, hard=64)
    assert b.after == b.before == (64, 64)
    assert b.error is not None and "\n" not in b.error
    assert "trainer.sharing_strategy='file_descriptor'" in b.error
    assert "trainer.sharing_strategy=file_system" in b.error
    assert "300 shared tensors" in b.error and "64" in b.error


def test_fd_budget_refuses_one_short_of_the_headroom(monkeypatch):
    hard = 300 + FD_HEADROOM - 1
    b = budget(monkeypatch, 300, "file_descriptor", soft=64, hard=hard)
    assert b.error is not None and f"hard {hard}" in b.error


@pytest.mark.parametrize("num_tensors", [300, 1_000_000])
def test_fd_budget_never_refuses_file_system(monkeypatch, num_tensors):
    b = budget(monkeypatch, num_tensors, "file_system", soft=64, hard=64)
    assert b.error is None and b.after == b.before == (64, 64)


# ---- forkserver hands a worker at most 256 fds (multiprocessing.forkserver.MAXFDS_TO_SEND) ----


def test_fd_passing_limit_applies_to_forkserver_with_file_descriptor_only():
    most = sharing.multiprocessing.forkserver.MAXFDS_TO_SEND - sharing.FORKSERVER_EXTRA_FDS - 1
    sharing.check_fd_passing(most, "forkserver", "file_descriptor")
    with pytest.raises(PreflightError) as info:
        sharing.check_fd_passing(most + 1, "forkserver", "file_descriptor")
    message = str(info.value)
    assert (
        "\n" not in message
        and f"at most {most} shared tensors" in message
        and f"have {most + 1}" in message
    )
    assert (
        "trainer.start_method='forkserver'" in message
        and "trainer.sharing_strategy=file_system" in message
    )
    for start_method, strategy in [
        ("forkserver", "file_system"),
        ("fork", "file_descriptor"),
        ("spawn", "file_descriptor"),
    ]:
        sharing.check_fd_passing(10_000, start_method, strategy)


# ---- /dev/shm space ----


def test_storage_bytes_counts_whole_cpu_storages():
    big = torch.zeros(1000, dtype=torch.float32)
    view = big[:10]  # shares (and pins) the whole storage
    small = torch.zeros(3, dtype=torch.int64)
    assert sharing.storage_bytes([view, small]) == 4000 + 24
    assert sharing.storage_bytes([]) == 0


def test_shm_space_refuses_more_than_is_free(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(PreflightError) as info:
        sharing.check_shm_space(2 * free + 2**30, shm_dir=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path} has ") and "MiB free" in message
    assert f"{(2 * free + 2**30) / 2**20:.1f} MiB of shared memory" in message
    sharing.check_shm_space(4096, shm_dir=str(tmp_path))  # what fits passes


def test_shm_space_keeps_headroom(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(
        sharing.shutil, "disk_usage", lambda path: usage(100 * 2**20, 0, 100 * 2**20)
    )
    sharing.check_shm_space(90 * 2**20, shm_dir=str(tmp_path))
    with pytest.raises(PreflightError, match="100.0 MiB free .* need 99.0 MiB"):
        sharing.check_shm_space(99 * 2**20, shm_dir=str(tmp_path))


def test_shm_space_without_the_folder_is_not_an_error(tmp_path):
    sharing.check_shm_space(2**60, shm_dir=str(tmp_path / "no-such-dir"))


def test_api_refuses_fork_with_threads_when_the_parent_runs_a_thread_pool(tmp_path):
    """OpenMP after fork: such workers hang forever, so the run is refused before anything starts."""
    from hogwild import Trainer, TrainerConfig
    from hogwild.data import make_synthetic

    data = make_synthetic(num_samples=256, num_test_samples=64, input_shape=[8], num_classes=2)
    trainer = Trainer(
        torch.nn.Linear(8, 2),
        data,
        torch.optim.SGD,
        TrainerConfig(start_method="fork", threads_per_worker=2),
        batch_size=32,
        output_dir=str(tmp_path / "run"),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(HogwildError, match="threads_per_worker=2.*forkserver"):
            trainer.fit()
    finally:
        torch.set_num_threads(threads)
    assert not (tmp_path / "run").exists()


def test_api_refuses_a_run_that_cannot_fit_in_memory_with_the_sum(tmp_path, monkeypatch):
    """The model is built (the Python API's), but a per-worker Adam state would not fit."""
    import functools

    from hogwild import Trainer, TrainerConfig
    from hogwild.data import make_synthetic
    from hogwild.run import memory

    monkeypatch.setattr(memory, "available", lambda: (10 * 2**20, "available"))
    data = make_synthetic(num_samples=256, num_test_samples=64, input_shape=[8], num_classes=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 2**16), torch.nn.Linear(2**16, 2))  # 2.5 MiB
    trainer = Trainer(
        model,
        data,
        functools.partial(torch.optim.Adam, lr=0.01),
        TrainerConfig(num_workers=2),
        batch_size=32,
        output_dir=str(tmp_path / "run"),
    )
    with pytest.raises(HogwildError) as e:
        trainer.fit()
    said = str(e.value)
    assert said.startswith("the run needs about") and "is available: model 3 MiB + " in said
    assert "optimizer state 2 x 6 MiB (Adam, one per worker) + gradients 2 x 3 MiB + 3 proc" in said
    assert not (tmp_path / "run" / "summary.json").exists()


class Picky(torch.optim.SGD):
    """A user's optimizer that refuses an empty parameter list in its own words."""

    def __init__(self, params, lr=0.1):
        params = list(params)
        if not params:
            raise ValueError("Picky needs parameters")
        super().__init__(params, lr=lr)


class FirstParam(torch.optim.SGD):
    """A user's optimizer that reads its first parameter before anything else."""

    def __init__(self, params, lr=0.1):
        params = list(params)
        self.first_shape = params[0].shape
        super().__init__(params, lr=lr)


class NeedsLr(torch.optim.Optimizer):
    """A user's optimizer with a required learning rate (checked when a group is added)."""

    def __init__(self, params, lr=required):
        super().__init__(params, {"lr": lr})


@pytest.mark.parametrize(
    "factory, fragment",
    [
        (functools.partial(torch.optim.SGD, lr=-1.0), "Invalid learning rate"),
        (functools.partial(torch.optim.Adam, betas=(2.0, 0.9)), "Invalid beta parameter"),
        (functools.partial(torch.optim.SGD, lr=0.1, momentun=0.9), "momentun"),
        (functools.partial(Picky, lr=-1.0), "Invalid learning rate"),
        # checked after Optimizer.__init__: the shortcut must not skip them
        (functools.partial(torch.optim.Adam, fused=True, foreach=True), "cannot be `True`"),
        (functools.partial(torch.optim.SGD, fused=True, differentiable=True), "differentiable"),
        (NeedsLr, "required optimization parameter lr"),
    ],
)
def test_optimizer_check_refuses_bad_arguments_in_one_line(factory, fragment):
    with pytest.raises(HogwildError, match=fragment):
        preflight.check_optimizer(factory)


@pytest.mark.parametrize(
    "factory",
    [
        functools.partial(torch.optim.SGD, lr=0.1, momentum=0.5),
        functools.partial(torch.optim.Adam, lr=1e-3),
        functools.partial(Picky, lr=0.1),  # refuses [] in its own words: the full check runs
        functools.partial(FirstParam, lr=0.1),  # cannot take []: the full check runs
    ],
)
def test_optimizer_check_accepts_good_arguments(factory):
    preflight.check_optimizer(factory)


@pytest.mark.parametrize("name", ["sgd", "adam", "adagrad", "rmsprop", "rowwise_adagrad"])
def test_every_shipped_optimizer_is_checked_without_a_parameter_group(name):
    # the shortcut that spares the orchestrator torch._dynamo's import (hogwild.process.forkserver): it
    # holds as long as torch checks the arguments, then refuses the empty list, in these words
    from hogwild.cli.builders import build_optimizer_factory

    from support import compose

    values = compose([f"optimizer={name}"])["optimizer"]
    values.pop("shared", None)
    factory = build_optimizer_factory(values)
    assert preflight.checks_arguments_first(factory, factory.keywords)
    with pytest.raises(ValueError, match=preflight.EMPTY_PARAMETERS):
        factory([])


def sparse_model() -> torch.nn.Module:
    """nn.Embedding(sparse=True) beside a dense bias: matrix factorization's kind of model."""
    model = torch.nn.Module()
    model.table, model.bias = torch.nn.Embedding(10, 2, sparse=True), torch.nn.Linear(2, 1)
    return model


@pytest.mark.parametrize("name", preflight.DENSE_ONLY)
def test_what_is_known_of_torchs_optimizers_and_sparse_gradients_is_what_torch_does(name):
    """DENSE_ONLY is what these torch optimizers' first step does with a sparse gradient; SGD,
    Adagrad and SparseAdam take one. A torch that changes either fails here."""
    cls = getattr(torch.optim, name, None)
    if cls is None:
        pytest.skip(f"torch.optim.{name} is not in this torch")
    p = torch.nn.Parameter(torch.zeros(4, 2))
    p.grad = torch.sparse_coo_tensor([[1]], torch.ones(1, 2), (4, 2))
    with pytest.raises(RuntimeError, match="sparse gradients"):
        cls([p], lr=0.1).step()
    for taker in (torch.optim.SGD, torch.optim.Adagrad, torch.optim.SparseAdam):
        taker([p], lr=0.1).step()
    for fused in (torch.optim.SGD, torch.optim.Adagrad):  # but not fused
        with pytest.raises(RuntimeError, match="sparse grad"):
            fused([p], lr=0.1, fused=True).step()


@pytest.mark.parametrize(
    ("factory", "cli", "api"),
    [
        (
            functools.partial(torch.optim.Adam),
            "optimizer._target_=torch.optim.Adam: cannot step sparse gradients, which the "
            "model's nn.Embedding(sparse=True) tables make: use optimizer=rowwise_adagrad, "
            "optimizer=adagrad or model.sparse=false",
            "torch.optim.Adam: cannot step sparse gradients, which the model's "
            "nn.Embedding(sparse=True) tables make: use hogwild.optim.RowwiseAdagrad, "
            "torch.optim.Adagrad or dense embeddings",
        ),
        (
            functools.partial(torch.optim.SGD, lr=0.1, momentum=0.5),
            "optimizer.momentum=0.5: SGD keeps",
            "SGD(momentum=0.5): SGD keeps",
        ),
        (
            functools.partial(torch.optim.Adagrad, weight_decay=0.1),
            "use optimizer.weight_decay=0, optimizer=rowwise_adagrad or model.sparse=false",
            "use weight_decay=0, hogwild.optim.RowwiseAdagrad or dense embeddings",
        ),
        (
            functools.partial(torch.optim.SGD, lr=0.1, fused=True),
            "optimizer.fused=True: fused SGD cannot step sparse gradients",
            "use fused=False, ",
        ),
        (  # dense embeddings are no way out for it
            functools.partial(torch.optim.SparseAdam),
            "optimizer._target_=torch.optim.SparseAdam: steps sparse gradients only, and the "
            "model has dense parameters too: use optimizer=rowwise_adagrad or optimizer=adagrad",
            "torch.optim.SparseAdam: steps",
        ),
    ],
)
def test_an_optimizer_that_cannot_step_sparse_gradients_is_refused_naming_the_key(
    factory, cli, api
):
    with pytest.raises(ConfigError) as e:
        preflight.check_sparse_gradients(sparse_model(), factory)
    assert cli in e.value.cli
    assert api in str(e.value) and "optimizer." not in str(e.value)  # the Python API's words


def frozen(model: torch.nn.Module, name: str) -> torch.nn.Module:
    getattr(model, name).requires_grad_(False)
    return model


@pytest.mark.parametrize(
    ("model", "factory", "shared"),
    [
        (sparse_model(), functools.partial(torch.optim.SGD, lr=0.1, momentum=0.0), False),
        (sparse_model(), functools.partial(torch.optim.Adagrad, lr=0.1), False),
        (sparse_model(), functools.partial(RowwiseAdagrad, lr=0.1, weight_decay=0.1), False),
        # one momentum buffer for all workers is built dense: it does not grow
        (sparse_model(), functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), True),
        (frozen(sparse_model(), "table"), functools.partial(torch.optim.Adam), False),
        (frozen(sparse_model(), "bias"), functools.partial(torch.optim.SparseAdam), False),
    ],
)
def test_optimizers_that_step_the_models_sparse_gradients_pass(model, factory, shared):
    preflight.check_sparse_gradients(model, factory, shared)


def test_a_dense_model_is_not_asked_about_sparse_gradients():
    dense = torch.nn.Linear(2, 1)
    preflight.check_sparse_gradients(
        dense, functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    )
    preflight.check_sparse_gradients(dense, functools.partial(torch.optim.Adam))
