"""A worker's step loop, run in this process: the context and the supervised task without a
worker process. What the context does for every workload: the non-finite check before the
update, the counters, the reports, the epoch ends, the stop flag."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from hogwild.config.schema import ScheduleConfig
from hogwild.data import make_synthetic
from hogwild.protocol import Control, EpochEnd, WorkerSpec
from hogwild.worker.main import NonFinite, WorkerContext, grads_finite
from hogwild.workloads.device import Layout
from hogwild.workloads.supervised import SupervisedWorkload


class Pipe:
    """What a worker would send to the orchestrator, kept in a list."""

    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)

    def of(self, kind):
        return [m for m in self.sent if isinstance(m, kind)]


def context(
    model, num_workers=1, rank=0, log_every=5, skip_nonfinite=False, control=None, total=1000
):
    spec = WorkerSpec(
        num_workers=num_workers, seed=0, threads=1, sharing_strategy="file_system", device="cpu",
        log_every_n_steps=log_every, optimizer_factory=functools.partial(torch.optim.SGD, lr=0.1),
        skip_nonfinite=skip_nonfinite, schedule=ScheduleConfig(), total_units=total, orchestrator_pid=0,
        task=None,
    )  # fmt: skip
    conn = Pipe()
    control = control or Control(num_workers)
    return WorkerContext(rank, spec, model, control, [], conn), control, conn


def task(num_samples=100, batch_size=10, epochs=2):
    data = make_synthetic(
        num_samples=num_samples, num_test_samples=10, input_shape=[4], num_classes=2
    )
    return SupervisedWorkload(data, batch_size, epochs).task(torch.device("cpu"), Layout())


def test_a_task_runs_its_shard_of_every_epoch_and_counts_it():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ctx, control, conn = context(model, num_workers=2, rank=1)
    task(num_samples=100, batch_size=10, epochs=2).run(ctx)
    ctx.report.flush()
    epoch, batch, samples, steps = control.progress[1].tolist()
    assert (epoch, batch, samples, steps) == (2, 0, 100, 10)  # 50 samples a epoch, in 5 batches
    assert control.progress[0].tolist() == [0, 0, 0, 0]  # a rank writes its own row only
    assert [m.epoch for m in conn.of(EpochEnd)] == [0, 1]
    # the report columns: every step's loss in the sum (published every 5 steps and at each
    # epoch's end), the lr, the first and the last step's times; nothing sent for them
    loss, loss_steps, skipped, lr, t_first, t_last = control.reports[1].tolist()
    assert loss_steps == 10 and math.isfinite(loss) and loss > 0 and skipped == 0
    assert lr == pytest.approx(0.1) and 0 < t_first < t_last
    assert control.reports[0].tolist() == [0.0] * 6
    assert control.train_span() == (t_first, t_last)
    assert {type(m) for m in conn.sent} == {EpochEnd}


def test_a_worker_publishes_its_loss_every_log_every_steps():
    model = torch.nn.Linear(4, 2)
    ctx, control, _ = context(model, log_every=3)
    x, y = torch.randn(10, 4), torch.randint(0, 2, (10,))
    steps = []
    for b in range(7):
        ctx.begin()
        ctx.step(torch.nn.functional.cross_entropy(model(x), y), 10, b + 1)
        steps.append(int(control.reports[0, Control.LOSS_STEPS]))
    assert steps == [0, 0, 3, 3, 3, 6, 6]
    assert control.progress[0, Control.SAMPLES] == 70  # the counts: every step
    ctx.report.flush()
    assert control.reports[0, Control.LOSS_STEPS] == 7


def test_a_replacement_worker_continues_at_the_first_batch_not_yet_applied():
    model = torch.nn.Linear(4, 2)
    control = Control(1)
    control.progress[0] = torch.tensor([1, 3, 130, 13])  # epoch 1, 3 batches of it done
    ctx, control, conn = context(model, control=control)
    task(num_samples=100, batch_size=10, epochs=2).run(ctx)
    assert control.progress[0].tolist() == [2, 0, 130 + 70, 13 + 7]
    assert [m.epoch for m in conn.of(EpochEnd)] == [1]


def test_the_stop_flag_ends_the_loop_before_the_next_step():
    model = torch.nn.Linear(4, 2)
    ctx, control, conn = context(model)
    control.stop[0] = 1
    task().run(ctx)
    assert control.progress[0].tolist() == [0, 0, 0, 0]


class NaNAfter(torch.nn.Module):
    def __init__(self, calls: int):
        super().__init__()
        self.linear, self.calls, self.left = torch.nn.Linear(4, 2), 0, calls

    def forward(self, x):
        self.calls += 1
        out = self.linear(x)
        return out * float("nan") if self.calls > self.left else out


def test_a_non_finite_loss_fails_before_the_update_touches_the_weights():
    model = NaNAfter(calls=3)
    ctx, control, _ = context(model)
    with pytest.raises(NonFinite, match=r"^non-finite loss \(nan\) at epoch 0, batch 3$"):
        task().run(ctx)
    before = [p.detach().clone() for p in model.parameters()]
    assert all(torch.isfinite(p).all() for p in before)
    assert control.progress[0].tolist()[2:] == [30, 3]  # 3 good steps were applied


def test_skip_nonfinite_skips_the_batch_and_goes_on():
    model = NaNAfter(calls=3)
    ctx, control, conn = context(model, skip_nonfinite=True)
    task(num_samples=100, batch_size=10, epochs=1).run(ctx)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert control.progress[0].tolist()[2:] == [30, 3]
    assert control.reports[0, Control.SKIPPED] == 7  # counted, for the summary


class NaNGradientAfter(NaNAfter):
    """A finite loss whose gradients are NaN (as sqrt at 0 makes them)."""

    def forward(self, x):
        self.calls += 1
        out = self.linear(x)
        if self.calls > self.left:
            out.register_hook(lambda g: g * float("nan"))
        return out


def test_a_nan_gradient_with_a_finite_loss_never_reaches_the_weights():
    model = NaNGradientAfter(calls=3)
    ctx, control, _ = context(model)
    with pytest.raises(NonFinite, match=r"^non-finite gradient at epoch 0, batch 3$"):
        task().run(ctx)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert control.progress[0].tolist()[2:] == [30, 3]

    model = NaNGradientAfter(calls=3)
    ctx, control, conn = context(model, skip_nonfinite=True)
    task(num_samples=100, batch_size=10, epochs=1).run(ctx)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert control.reports[0, Control.SKIPPED] == 7


def test_the_gradient_check_reads_dense_and_sparse_gradients():
    dense = torch.nn.Linear(3, 2)
    emb = torch.nn.Embedding(5, 2, sparse=True)
    (dense(torch.ones(1, 3)).sum() + emb(torch.tensor([1, 2])).sum()).backward()
    params = [*dense.parameters(), *emb.parameters()]
    assert grads_finite(params)
    emb.weight.grad = torch.sparse_coo_tensor([[1]], [[float("inf"), 0.0]], (5, 2))
    assert not grads_finite(params)
    assert grads_finite([torch.nn.Parameter(torch.ones(1))])  # no gradient yet: nothing wrong


def test_staleness_counts_the_other_workers_updates_between_read_and_write():
    from hogwild.reporting import staleness

    model = torch.nn.Linear(4, 2)
    ctx, control, _ = context(model, num_workers=2, rank=0)
    x, y = torch.zeros(3, 4), torch.tensor([0, 1, 0])
    ctx.begin()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    control.progress[1, Control.STEPS] += 4  # rank 1 applied 4 updates meanwhile
    assert ctx.step(loss, 3, batch=1)
    assert staleness.stats(control.staleness.numpy()[0])["max"] == 4.0
