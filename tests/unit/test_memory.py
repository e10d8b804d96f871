"""The memory arithmetic of pre-flight (hogwild.run.memory), the model's big tensors created in
shared memory (hogwild.process.sharing.born_shared) and the parallel initialisation of big tables
(hogwild.models.init)."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import sys

import pytest
import torch

from hogwild.errors import PreflightError, SharedMemoryError
from hogwild.models import MatrixFactorization, init
from hogwild.process import sharing
from hogwild.run import memory

MiB = 2**20


def table(rows: int, dim: int = 32, sparse: bool = True) -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Embedding(rows, dim, sparse=sparse))


@pytest.mark.parametrize(
    ("factory", "copies"),
    [
        (functools.partial(torch.optim.SGD, lr=0.1), 0),
        (functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), 1),
        (functools.partial(torch.optim.Adagrad, lr=0.1), 1),
        (functools.partial(torch.optim.Adam, lr=0.1), 2),
    ],
)
def test_optimizer_state_is_sized_on_meta_copies(factory, copies):
    model = table(1000)  # on meta: nothing is allocated, and neither is the state
    state = memory.optimizer_state_bytes(factory, model.parameters())
    assert copies * 1000 * 32 * 4 <= state <= copies * 1000 * 32 * 4 + 64


class MySGD(torch.optim.SGD):
    """A user's optimizer: not one of torch's own, so sized by a step on meta copies."""


def test_other_optimizers_are_sized_by_their_initial_state_or_a_step_on_meta_copies():
    from hogwild.optim import RowwiseAdagrad

    model = table(1000)
    rowwise = memory.optimizer_state_bytes(
        functools.partial(RowwiseAdagrad, lr=0.1), model.parameters()
    )
    assert rowwise == 1000 * 4 + 8  # one float per row, and the step counter
    mine = functools.partial(MySGD, lr=0.1, momentum=0.9)
    assert memory.state_copies(mine) is None
    assert memory.optimizer_state_bytes(mine, model.parameters()) == 1000 * 32 * 4


def test_sparse_tables_need_no_gradient_copy_but_dense_layers_do():
    terms = memory.needs(table(100_000), torch.optim.SGD, False, 2, 0)
    assert not any(t.words.startswith("gradients") for t in terms)
    terms = memory.needs(table(100_000, sparse=False), torch.optim.SGD, False, 2, 0)
    grads = next(t for t in terms if t.words.startswith("gradients"))
    assert grads.bytes == 2 * 100_000 * 32 * 4


def test_a_run_that_does_not_fit_is_refused_with_the_sum_and_the_way_out(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: (10 * memory.GiB, "available"))
    rows = 3 * memory.GiB // 128  # a 3 GiB table; per-worker Adagrad: 3 more per worker
    adagrad = functools.partial(torch.optim.Adagrad, lr=0.1)
    with pytest.raises(PreflightError) as e:
        memory.check(table(rows), adagrad, False, 3, 0)
    said = e.value.cli
    assert said.startswith("the run needs about 13.0 GiB of memory but 10.0 GiB is available")
    assert "model 3.0 GiB + optimizer state 3 x 3.0 GiB (Adagrad, one per worker)" in said
    assert said.endswith(
        "use optimizer=rowwise_adagrad (embedding tables) or optimizer.shared=true"
    )
    assert "RowwiseAdagrad" in str(e.value)  # the Python API's words
    memory.check(table(rows), adagrad, True, 3, 0)  # shared: one state, it fits


def test_what_is_already_resident_counts_as_available(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda: (1 * memory.GiB, "available"))
    model = table(2 * memory.GiB // 128)
    with pytest.raises(PreflightError, match="smaller model"):
        memory.check(model, torch.optim.SGD, False, 1, 0)
    memory.check(model, torch.optim.SGD, False, 1, 0, resident_bytes=2 * memory.GiB)


def test_born_shared_creates_big_tensors_in_shared_memory_and_small_ones_as_usual():
    sharing.set_sharing_strategy("file_descriptor")
    with sharing.born_shared(min_bytes=MiB):
        big = torch.nn.Linear(1024, 512)  # 2 MiB weight, 2 KiB bias
        zeros, ones = torch.zeros(512, 1024), torch.ones(512, 1024, dtype=torch.float64)
        full = torch.full((600, 600), 3.0)
    assert big.weight.is_shared() and not big.bias.is_shared()
    assert big.weight.requires_grad and isinstance(big.weight, torch.nn.Parameter)
    assert zeros.is_shared() and float(zeros.abs().sum()) == 0
    assert ones.dtype == torch.float64 and float(ones.sum()) == 512 * 1024
    assert full.is_shared() and float(full.sum()) == 3 * 600 * 600
    # the Linear's own kaiming init ran on the shared tensor, in place
    assert 0 < float(big.weight.detach().std()) < 0.1
    assert not torch.empty(512, 1024).is_shared()  # outside: as usual


def test_born_shared_refuses_more_than_dev_shm_holds(monkeypatch):
    usage = shutil.disk_usage("/")._replace(free=3 * MiB)
    monkeypatch.setattr(sharing.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(SharedMemoryError, match="has 3.0 MiB free but the model needs at least"):
        with sharing.born_shared(min_bytes=MiB):
            torch.empty(2, MiB // 4)
            torch.empty(2, MiB // 4)


def test_parallel_normal_init_is_seeded_and_normal(monkeypatch):
    monkeypatch.setattr(init, "PARALLEL_MIN_NUMEL", 1 << 16)
    monkeypatch.setattr(init, "CHUNK_NUMEL", 1 << 12)
    a, b = torch.empty(1 << 18), torch.empty(1 << 18)
    torch.manual_seed(3)
    init.normal_(a, 0.5, 0.1)
    torch.manual_seed(3)
    init.normal_(b, 0.5, 0.1)
    assert torch.equal(a, b)
    assert abs(float(a.mean()) - 0.5) < 0.002 and abs(float(a.std()) - 0.1) < 0.002
    chunks = a.view(-1, 1 << 12)  # every chunk has its own stream: no two are equal
    assert not torch.equal(chunks[0], chunks[1])


def test_small_tensors_keep_torchs_own_init():
    torch.manual_seed(5)
    a = init.normal_(torch.empty(1000), 0.0, 0.1)
    torch.manual_seed(5)
    assert torch.equal(a, torch.nn.init.normal_(torch.empty(1000), 0.0, 0.1))


def test_the_mf_tables_can_be_built_on_meta_for_sizing():
    with torch.device("meta"):
        model = MatrixFactorization(num_users=10**9, num_items=10**8)
    assert memory.model_bytes(model) == (10**9 + 10**8) * 33 * 4 + 4


def test_parallel_normal_init_follows_the_generator_it_is_given(monkeypatch):
    """The synthetic ratings' true factors: seeded by the data's own generator, not torch's
    default one (which the model's seed sets)."""
    monkeypatch.setattr(init, "PARALLEL_MIN_NUMEL", 1 << 16)
    monkeypatch.setattr(init, "CHUNK_NUMEL", 1 << 12)
    a, b, c = (torch.empty(1 << 17) for _ in range(3))
    init.normal_(a, 0.0, 1.0, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(1)  # the default generator does not matter
    init.normal_(b, 0.0, 1.0, generator=torch.Generator().manual_seed(7))
    init.normal_(c, 0.0, 1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    small = init.normal_(torch.empty(100), 0.0, 1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(small, torch.empty(100).normal_(generator=torch.Generator().manual_seed(7)))


def shmem_rss() -> int:
    """Shared-memory bytes this process has pages of, its share (/proc/self/smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss_Shmem:"))


def test_a_big_born_shared_tensor_gets_its_pages_at_once_and_stays_as_made(monkeypatch):
    monkeypatch.setattr(sharing, "POPULATE_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(sharing, "POPULATE_CHUNK", 1 << 20)  # several chunks, on every core
    probe = torch.UntypedStorage._new_shared(1 << 20)
    can = sharing.populate(probe.data_ptr(), 1 << 20)  # Linux 5.14+; False before
    before = shmem_rss()
    with sharing.born_shared():
        zeros, empty = torch.zeros(4 << 20), torch.empty(3, 1 << 20)
        no_fill = torch.full((4 << 20,), 0.0)
    made = shmem_rss() - before
    assert zeros.is_shared() and empty.is_shared() and no_fill.is_shared()
    if can:  # the empty one's 12 MiB of pages were made, unwritten; zeros need none (reserved)
        assert (3 << 20) * 4 <= made < (3 << 20) * 4 + (4 << 20) * 4, made
    assert not zeros.any() and not no_fill.any()
    with sharing.born_shared():
        ones, negative_zeros = torch.ones(3, 1 << 20), torch.full((4 << 20,), -0.0)
    assert bool((ones == 1).all()) and bool(torch.signbit(negative_zeros).all())
    # populating pages that hold data leaves the data as it is
    sharing.populate(ones.data_ptr() + 100, ones.numel() * 4 - 100)
    assert bool((ones == 1).all())


def test_populate_is_a_no_op_where_the_kernel_cannot():
    assert sharing.populate(0, 1 << 20) is False  # no mapping there: nothing happens


linux_shm = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.isdir(sharing.SHM_DIR),
    reason="segments of hogwild's own are made on Linux, in /dev/shm",
)


@linux_shm
def test_a_big_segment_is_this_processs_own_file_mapped_by_torch_and_leaves_no_name(monkeypatch):
    """Under file_descriptor a big segment is made here (no posix_fallocate on one core): torch
    maps it as any storage it receives, shares it by its fd, and no name stays in /dev/shm."""
    monkeypatch.setattr(sharing, "POPULATE_MIN_BYTES", 1 << 20)
    sharing.set_sharing_strategy("file_descriptor")
    made = []
    monkeypatch.setattr(sharing, "populate", lambda *a: made.append(a) or True)
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared", None)  # not torch's own segment
    with sharing.born_shared():
        table = torch.empty(1 << 20)  # written next (an init): a segment of hogwild's own
    storage = table.untyped_storage()
    assert made == [(storage.data_ptr(), 4 << 20)] and storage.is_shared()
    t = torch.empty(0, dtype=torch.uint8).set_(storage)
    assert not t.any()
    t[:5] = torch.arange(1, 6)
    fd, size = storage._share_fd_cpu_()  # what a worker receives: the same memory
    assert size == 4 << 20 and os.pread(fd, 5, 0) == bytes([1, 2, 3, 4, 5])
    assert not [n for n in os.listdir(sharing.SHM_DIR) if n.startswith(f"torch_{os.getpid()}_")]


@linux_shm
def test_a_segment_whose_pages_cannot_be_made_is_one_clear_error(monkeypatch):
    """populate fails (a kernel before 5.14, or /dev/shm filled by another program since the
    check): the pages are reserved as torch does, and a full /dev/shm says so in one line."""
    monkeypatch.setattr(sharing, "POPULATE_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(sharing, "populate", lambda *a: False)
    sharing.set_sharing_strategy("file_descriptor")
    assert sharing.new_segment(2 << 20).nbytes() == 2 << 20  # reserved instead

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sharing.os, "posix_fallocate", full)
    with pytest.raises(SharedMemoryError) as e:
        sharing.new_segment(2 << 20, what="the shared optimizer state")
    assert str(e.value) == (
        "cannot make 2.0 MiB of shared memory in /dev/shm for the shared optimizer state "
        "(No space left on device): free space in /dev/shm, enlarge it (e.g. docker "
        "--shm-size), or use a smaller model"
    )


@linux_shm
def test_a_segment_the_address_space_limit_refuses_is_one_line_and_leaves_no_fd(monkeypatch):
    """ulimit -v: torch's mmap of the segment fails ("<filename not specified>"), and its dup of
    the segment's fd would stay open."""
    import resource

    monkeypatch.setattr(sharing, "POPULATE_MIN_BYTES", 1 << 20)
    sharing.set_sharing_strategy("file_descriptor")
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), limits[1]))
    try:
        with pytest.raises(SharedMemoryError) as e:
            with sharing.born_shared(what="the shared optimizer state"):
                torch.empty(256 << 20, dtype=torch.uint8)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
    assert str(e.value).startswith(
        "cannot map 256.0 MiB of shared memory for the shared optimizer state (address-space limit"
    )
    assert len(os.listdir("/proc/self/fd")) == fds
