"""Mapped data sets (hogwild.data.mapped): the same values as in memory, written atomically,
refused in one line when missing, damaged or written for other parameters; and the block order
that epochs over them follow (hogwild.workloads.supervised.BlockShard)."""

from __future__ import annotations

import json
import os
import pickle
import signal
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch

from hogwild.data import (
    DataError,
    DataSplits,
    load_libsvm,
    load_mapped,
    load_movielens,
    make_synthetic,
    make_synthetic_ratings,
    make_synthetic_sparse,
    write_mapped,
)
from hogwild.data.mapped import (
    MappedArray,
    MappedWriter,
    cached,
    mapped_array,
    take_rows,
    write_splits,
)
from hogwild.workloads.device import Layout
from hogwild.workloads.supervised import (
    BlockShard,
    SupervisedTask,
    SupervisedWorkload,
    epoch_permutation,
    shard,
)

from support import assert_refused_cleanly, cli_here

SPLITS = ("train_x", "train_y", "test_x", "test_y")


def assert_same(a, b) -> None:
    for name in SPLITS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.name, a.task, a.num_classes, a.model_kwargs) == (
        b.name,
        b.task,
        b.num_classes,
        b.model_kwargs,
    )


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert msg and "\n" not in msg and msg.strip() == msg
    return msg


# ---------------------------------------------------------------- the same data as in memory

RATINGS = dict(num_users=40, num_items=70, num_ratings=2_500_000, num_test_ratings=300, seed=3)


def test_synthetic_ratings_mapped_equal_in_memory_and_are_mapped(tmp_path):
    # 2.5M ratings: several generator chunks, written one at a time
    mapped = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    assert_same(make_synthetic_ratings(**RATINGS), mapped)
    for name in SPLITS:
        array = mapped_array(getattr(mapped, name))
        assert array is not None and Path(array.path).name == f"{name}.npy"
        assert np.array_equal(np.load(array.path), getattr(mapped, name).numpy())  # plain .npy
    assert mapped_array(make_synthetic_ratings(**RATINGS).train_x) is None


@pytest.mark.parametrize(
    "make, kwargs",
    [
        (make_synthetic, dict(num_samples=9000, num_test_samples=50, seed=2)),  # > 2 chunks
        (make_synthetic, dict(num_samples=300, num_test_samples=50, input_shape=[12])),
        (make_synthetic_sparse, dict(num_features=500, num_samples=400, num_test_samples=30)),
    ],
)
def test_generated_sets_mapped_equal_in_memory(tmp_path, make, kwargs):
    assert_same(make(**kwargs), make(**kwargs, cache_dir=tmp_path))


def test_movielens_and_libsvm_convert_to_the_same_values(tmp_path):
    rng = np.random.default_rng(0)
    rows = zip(rng.integers(1, 30, 400), rng.integers(1, 50, 400), rng.integers(1, 6, 400))
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text("".join(f"{u}\t{i}\t{r}\t0\n" for u, i, r in rows))
    kw = dict(download=False, test_fraction=0.2, seed=1)
    assert_same(
        load_movielens(tmp_path, **kw), load_movielens(tmp_path, **kw, cache_dir=tmp_path / "c")
    )
    lines = [f"{rng.choice(['-1', '+1'])} " + " ".join(f"{j}:{j / 7:.3f}" for j in sorted(
        rng.choice(range(1, 60), rng.integers(0, 9), replace=False))) for _ in range(9000)]  # fmt: skip
    (tmp_path / "train.svm").write_text("\n".join(lines[:8500]) + "\n")  # > 1 chunk of rows
    (tmp_path / "test.svm").write_text("# test\n" + "\n".join(lines[8500:]) + "\n")
    assert_same(
        load_libsvm(tmp_path, num_features=80),
        load_libsvm(tmp_path, num_features=80, cache_dir=tmp_path / "c"),
    )


def test_write_mapped_and_load_mapped_round_trip_any_set(tmp_path):
    s = make_synthetic(num_samples=200, num_test_samples=20, input_shape=[3, 5, 5])
    assert_same(s, write_mapped(s, tmp_path / "set"))
    assert_same(s, load_mapped(tmp_path / "set"))


# ---------------------------------------------------------------- written once, reused


def test_the_cache_writes_once_per_parameters_and_maps_after(tmp_path):
    first = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    folder = Path(mapped_array(first.train_x).path).parent
    stamp = (folder / "meta.json").stat().st_mtime_ns
    again = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    assert (folder / "meta.json").stat().st_mtime_ns == stamp  # mapped, not written again
    assert Path(mapped_array(again.train_x).path).parent == folder
    other = make_synthetic_ratings(**{**RATINGS, "noise": 0.5}, cache_dir=tmp_path)
    assert Path(mapped_array(other.train_x).path).parent != folder
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [folder.name, Path(mapped_array(other.train_x).path).parent.name]
    )  # nothing else: no temp folder left


def test_a_replaced_source_file_is_converted_again(tmp_path):
    (tmp_path / "train.svm").write_text("+1 1:1\n-1 2:1\n")
    (tmp_path / "test.svm").write_text("+1 2:1\n")
    before = load_libsvm(tmp_path, cache_dir=tmp_path / "c")
    (tmp_path / "train.svm").write_text("+1 1:1\n-1 2:1\n+1 3:1\n")
    after = load_libsvm(tmp_path, cache_dir=tmp_path / "c")
    assert before.num_train == 2 and after.num_train == 3


# ---------------------------------------------------------------- refused in one line


def test_a_missing_folder_or_none_is_one_line(tmp_path):
    with pytest.raises(DataError) as err:
        load_mapped(tmp_path / "nothing")
    assert f"data.path={tmp_path / 'nothing'}: no such folder" in one_line(err)
    with pytest.raises(DataError, match=r"data.path=None: must be the folder"):
        load_mapped(None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no meta.json: not a mapped data set"):
        load_mapped(tmp_path / "empty")


def written(tmp_path) -> Path:
    s = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=100, num_test_ratings=10)
    write_mapped(s, tmp_path / "set", params={"num_ratings": 100})
    return tmp_path / "set"


def rewrite_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "train_x.npy").write_bytes((f / "train_x.npy").read_bytes()[:-8]),
         r"train_x.npy has 1,720 bytes, 1,728 expected \(cut short\?\)"),
        (lambda f: (f / "test_y.npy").unlink(), r"test_y.npy is missing"),
        (lambda f: (f / "train_y.npy").write_bytes(b"garbage"), r"train_y.npy is damaged"),
        (lambda f: (f / "meta.json").write_text("{"), r"meta.json is damaged"),
        (lambda f: (f / "meta.json").unlink(), r"no meta.json"),
        (lambda f: rewrite_meta(f, format="other"), r"not a hogwild-mapped description"),
        (lambda f: rewrite_meta(f, version=99), r"format version 99: this hogwild reads version 1"),
        (lambda f: np.save(f / "test_x.npy", np.zeros((10, 3), np.int64)),
         r"test_x.npy holds int64 \(10, 3\) but meta.json says int64 \(10, 2\)"),
    ],
)  # fmt: skip
def test_a_damaged_folder_is_one_line_that_says_to_write_it_again(tmp_path, damage, message):
    folder = written(tmp_path)
    damage(folder)
    with pytest.raises(DataError, match=message) as err:
        load_mapped(folder)
    assert one_line(err).startswith(f"data.path={folder}: ")


def test_a_folder_written_for_other_parameters_is_refused(tmp_path):
    s = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=100, num_test_ratings=10)

    def write(w):
        write_splits(w, s)

    cached(tmp_path, "toy", {"num_ratings": 100}, write)
    (folder,) = tmp_path.iterdir()
    rewrite_meta(folder, params={**json.loads((folder / "meta.json").read_text())["params"],
                                 "num_ratings": 7})  # fmt: skip
    with pytest.raises(DataError) as err:
        cached(tmp_path, "toy", {"num_ratings": 100}, write)
    assert "written for other parameters (num_ratings=7 there, 100 here): delete it" in one_line(
        err
    )
    assert one_line(err).startswith(f"data.cache_dir={tmp_path}: {folder}: ")


def test_the_cli_refuses_a_missing_mapped_folder_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    result = cli_here(["data=mapped", f"data.path={tmp_path / 'nope'}"], run_dir)
    assert_refused_cleanly(result, run_dir, f"data.path={tmp_path / 'nope'}: no such folder")


# ---------------------------------------------------------------- interrupted writes


def test_an_interrupted_write_leaves_nothing_usable(tmp_path):
    def half(w):
        w.array("train_x", (10, 2), np.int64).write(np.zeros((5, 2), np.int64))
        raise KeyboardInterrupt  # Ctrl-C halfway

    with pytest.raises(KeyboardInterrupt):
        cached(tmp_path, "toy", {"n": 10}, half)
    assert list(tmp_path.iterdir()) == []  # no folder, no hidden temp folder
    s = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=10, num_test_ratings=2)
    assert_same(s, cached(tmp_path, "toy", {"n": 10}, lambda w: write_splits(w, s)))


def test_a_killed_write_leaves_a_hidden_folder_no_reader_uses_and_the_next_write_removes(
    tmp_path,
):
    s = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=10, num_test_ratings=2)

    def killed(w):
        w.array("train_x", (10, 2), np.int64).write(s.train_x[:5])
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up runs

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            cached(tmp_path, "toy", {"n": 10}, killed)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".toy-") and ".tmp-" in left.name
    target = tmp_path / left.name[1:].split(".tmp-")[0]
    with pytest.raises(DataError, match="no such folder"):
        load_mapped(target)  # the half-written set is never read
    assert_same(s, cached(tmp_path, "toy", {"n": 10}, lambda w: write_splits(w, s)))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the leftover is gone


def test_two_writers_of_one_set_both_finish_and_the_first_wins(tmp_path):
    a = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=10, num_test_ratings=2)
    b = make_synthetic_ratings(num_users=5, num_items=6, num_ratings=10, num_test_ratings=2, seed=1)
    with MappedWriter(tmp_path / "set") as first, MappedWriter(tmp_path / "set") as second:
        write_splits(first, a)  # the second writer's folder is live: not taken for abandoned
        write_splits(second, b)
    assert [p.name for p in tmp_path.iterdir()] == ["set"]
    assert_same(a, load_mapped(tmp_path / "set"))


# ---------------------------------------------------------------- the mapping itself


def test_a_mapped_set_travels_as_its_files_not_its_bytes(tmp_path):
    s = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    workload = SupervisedWorkload(s, batch_size=64, epochs=1)
    assert workload.host_tensors() == [] and workload.mapped is not None
    task = workload.task(torch.device("cpu"), Layout())
    assert isinstance(task.train_x, MappedArray) and isinstance(task.train_y, MappedArray)
    # what forkserver / spawn send: a few hundred bytes, nothing put in shared memory
    assert len(ForkingPickler.dumps(task)) < 2000 < s.train_x.nbytes
    assert workload.facts()["shuffle"].startswith("blocks")
    memory = SupervisedWorkload(make_synthetic_ratings(**RATINGS), batch_size=64, epochs=1)
    assert len(memory.host_tensors()) == 2 and "shuffle" not in memory.facts()


def test_row_slices_stay_mapped(tmp_path):
    s = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    part = take_rows(s.train_x, 1000, 3000)
    array = mapped_array(part)
    assert array.shape == (2000, 2) and torch.equal(array.open().tensor, s.train_x[1000:3000])
    assert pickle.loads(pickle.dumps(array)) == array


def resident_kib(path: str) -> int:
    """The process's resident KiB of its mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc")
def test_released_rows_leave_the_process(tmp_path):
    s = make_synthetic_ratings(**RATINGS, cache_dir=tmp_path)
    mapping = mapped_array(s.train_x).open()
    path = mapping.array.path
    assert float(mapping.tensor[:, 0].float().sum()) > 0  # reads every page: 40 MB
    assert resident_kib(path) > 30_000
    mapping.release(0, 1_000_000)
    assert 10_000 < resident_kib(path) < 30_000  # the other 1.5M rows are still there
    mapping.release(1_000_000, len(mapping.tensor))
    assert resident_kib(path) < 100


# ---------------------------------------------------------------- epochs in blocks


def block_epoch(n, workers, epoch=0, block=64, seed=1) -> list[torch.Tensor]:
    return [BlockShard(n, seed, epoch, r, workers, block=block)[:] for r in range(workers)]


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("num_samples, block", [(1000, 64), (997, 100), (50, 64), (640, 64)])
def test_block_epochs_use_every_sample_once_in_disjoint_shards(num_samples, block, num_workers):
    for epoch in range(3):
        shards = block_epoch(num_samples, num_workers, epoch, block)
        assert sorted(torch.cat(shards).tolist()) == list(range(num_samples))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert not torch.equal(
        torch.cat(block_epoch(997, 1, 0, 100)), torch.cat(block_epoch(997, 1, 1, 100))
    )
    assert not torch.equal(
        torch.cat(block_epoch(997, 1, 0, 100, seed=2)), torch.cat(block_epoch(997, 1, 0, 100))
    )


def test_block_epochs_shuffle_within_and_between_blocks():
    (order,) = block_epoch(64 * 20, 1, block=64)
    blocks = (order // 64).tolist()
    visits = [b for i, b in enumerate(blocks) if i == 0 or b != blocks[i - 1]]
    assert sorted(visits) == list(range(20)) and visits != list(range(20))  # each block once
    assert not torch.equal(order[:64], order[:64].sort().values)


def test_batches_read_in_any_steps_give_the_same_order():
    whole = BlockShard(10_000, 5, 2, 1, 3, block=128)[:]
    for size in (1, 7, 64, 500):
        again = BlockShard(10_000, 5, 2, 1, 3, block=128)
        batches = [again[b * size : (b + 1) * size] for b in range(-(-len(again) // size))]
        assert torch.equal(torch.cat(batches), whole)
        resumed = BlockShard(10_000, 5, 2, 1, 3, block=128)  # a fresh process at batch 3
        assert torch.equal(resumed[3 * size :], whole[3 * size :])


class Recorder:
    def __init__(self):
        self.calls = []

    def release(self, lo, hi):
        self.calls.append(("release", lo, hi))

    def prefetch(self, lo, hi):
        self.calls.append(("prefetch", lo, hi))


def test_each_block_is_prefetched_as_it_is_reached_and_released_when_done():
    pages = Recorder()
    shard = BlockShard(1000, 0, 0, 0, 1, block=100, pages=[pages])
    for b in range(0, 1000, 30):
        rows = shard[b : b + 30]
        for kind, lo, hi in pages.calls:
            if kind == "release":
                assert not ((rows >= lo) & (rows < hi)).any()  # nothing still to read
    shard.close()
    released = sorted((lo, hi) for kind, lo, hi in pages.calls if kind == "release")
    assert released == [(lo, lo + 100) for lo in range(0, 1000, 100)]  # each block once


# ---------------------------------------------------------------- the worker's loop


class Context:
    """What SupervisedTask.run needs of a worker's context: records the samples it trains on."""

    def __init__(self, rank, num_workers, position=(0, 0), stop_after=None):
        self.rank, self.num_workers, self.position, self.seed = rank, num_workers, position, 4
        self.device, self.seen, self.stop_after = torch.device("cpu"), [], stop_after
        self.model = lambda x: x[:, 0].float()

    def stopping(self):
        return self.stop_after is not None and len(self.seen) >= self.stop_after

    def begin(self):
        pass

    def step(self, loss, units, batch):
        self.seen.append(batch)

    def end_epoch(self, epoch):
        self.position = (epoch + 1, 0)


def rows_seen(task, ctx) -> list[int]:
    ids = []
    model = ctx.model

    def spy(x):
        ids.extend(x[:, 0].tolist())  # train_x column 0 is the row number
        return model(x)

    ctx.model = spy
    task.run(ctx)
    return ids


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_workers_on_mapped_data_train_on_every_sample_once_per_epoch(tmp_path, num_workers):
    n = 70_000  # two blocks
    x = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.int64)], 1)
    y = torch.zeros(n)
    s = write_mapped(DataSplits(x, y, x[:5], y[:5], 0, "rows", "regression"), tmp_path / "rows")
    task = SupervisedWorkload(s, batch_size=500, epochs=2).task(torch.device("cpu"), Layout())
    task = pickle.loads(pickle.dumps(task))  # as a worker receives it
    seen = [rows_seen(task, Context(r, num_workers)) for r in range(num_workers)]
    per_epoch = [sum((ids[e * len(ids) // 2 : (e + 1) * len(ids) // 2] for ids in seen), [])
                 for e in range(2)]  # fmt: skip
    for ids in per_epoch:
        assert sorted(ids) == list(range(n))
    # resumed at epoch 1, batch 10: exactly the rest of the uninterrupted run
    rest = rows_seen(task, Context(0, num_workers, position=(1, 10)))
    assert rest == seen[0][len(seen[0]) // 2 + 10 * 500 :]


def test_the_in_memory_order_is_unchanged():
    n = 1000
    x = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.int64)], 1)
    task = SupervisedTask(x, torch.zeros(n), 1, 100, lambda out, y: out.sum(), Layout())
    ids = rows_seen(task, Context(1, 2))
    assert ids == shard(epoch_permutation(n, 4, 0), 1, 2).tolist()
