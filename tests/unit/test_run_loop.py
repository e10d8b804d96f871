"""The run loop (hogwild.run.loop.RunLoop) from watch() to the summary, without a worker process.

A real RunContext (a linear model on a few hundred synthetic samples, the supervised workload,
a shared control block, LocalNode, a run folder under tmp_path) around two fakes:

    Workers   the supervisor: each events() call replays the next batch of its script (a batch
              may be a function, called then); alive until the script is spent
    Relay     the signal relay: drain() hands over the signals `send` delivered since its last call

Workers report progress as real ones do: in their rows of the control block's shared table
(`train`), never in a message. What this file guards: how a run ends (completed, failed,
interrupted) is what summary.json says, with the exit code, checkpoint and final evaluation
each outcome promises; the stop flag is raised when the run stops early; and the evaluations
still waiting for an idle core at the end (one that raises fails the run late, a second signal
while they run skips the final evaluation).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from hogwild.config.schema import CheckpointConfig, ScheduleConfig, TrainerConfig, resolve_trainer
from hogwild.data import make_synthetic
from hogwild.distributed.node import LocalNode
from hogwild.protocol import Control, Done, EpochEnd, Failure, Hello
from hogwild.reporting.timeline import Timeline
from hogwild.run import checkpoint
from hogwild.run.context import RunContext, RunSetup
from hogwild.run.idle_evaluation import IdleEvaluations
from hogwild.run.loop import RunLoop
from hogwild.run.preflight import Plan
from hogwild.run.state import Exited
from hogwild.workloads.device import Layout
from hogwild.workloads.supervised import SupervisedWorkload

from support import tensorboard_scalars

RANKS = (0, 1)
NUM_TRAIN, BATCH = 256, 32
SHARD = NUM_TRAIN // len(RANKS)  # one rank's samples in one epoch


class Workers:
    """The supervisor, faked: events() replays the script one batch per call (the run loop asks
    once per turn); a callable batch is called then. Alive while the script is not spent."""

    def __init__(self, *script):
        self.script = collections.deque(script)
        self.started: list[int] = []  # restarts the loop asked for
        self.killed: list[int] = []

    @property
    def alive(self) -> bool:
        return bool(self.script)

    def events(self, timeout: float) -> list:
        batch = self.script.popleft()
        return list(batch() if callable(batch) else batch)

    def start(self, rank: int) -> None:
        self.started.append(rank)

    def kill(self, rank: int) -> None:
        self.killed.append(rank)

    def stack(self, rank: int, folder: str) -> str:
        return "(a fake worker has no stack)"

    def terminate(self) -> None: ...


class Relay:
    """The signal relay, faked: `send` delivers a signal as the OS would; drain() hands over
    those delivered since its last call and sets `taken`."""

    def __init__(self, *pending: int):
        self.pending = list(pending)
        self.taken = threading.Event()

    def send(self, signum: int) -> None:
        self.taken.clear()
        self.pending.append(signum)

    def drain(self) -> list[int]:
        out, self.pending = self.pending, []
        if out:
            self.taken.set()
        return out


# ---- the run and its script ----


def context(tmp_path: Path, epochs: int = 1, **trainer) -> RunContext:
    data = make_synthetic(
        num_samples=NUM_TRAIN, num_test_samples=64, input_shape=(8,), num_classes=2, seed=0
    )
    workload = SupervisedWorkload(data, batch_size=BATCH, epochs=epochs)
    trainer = dict(num_workers=len(RANKS), start_method="fork", threads_per_worker=1, **trainer)
    cfg = resolve_trainer(TrainerConfig(epochs=epochs, **trainer))
    plan = Plan(
        trainer=cfg,
        device=torch.device("cpu"),
        layout=Layout(),
        data_on_device=False,
        facts=workload.facts(),
        resume_from=None,
        progress=None,
        optimizer_state=None,
        num_shared=4,
    )
    return RunContext(
        cfg=cfg,
        model=torch.nn.Linear(8, 2),
        workload=workload,
        task=workload.task(torch.device("cpu"), Layout()),
        optimizer_factory=functools.partial(torch.optim.SGD, lr=0.1),
        plan=plan,
        control=Control(cfg.num_workers),
        optimizer_state=[],
        node=LocalNode(),
        output_dir=str(tmp_path / "run"),
        checkpointing=CheckpointConfig(),
        schedule=ScheduleConfig(),
        shared_optimizer=False,
        record={"seed": 0},
        started_at=time.time(),
        stack_dir=str(tmp_path),
        setup=RunSetup(Timeline(time.time())),
    )


def hello(ctx: RunContext) -> list[Hello]:
    return [Hello(rank, ctx.cfg.sharing_strategy, 1) for rank in RANKS]


def train(control: Control, rank: int, samples: int, loss: float = 0.5) -> None:
    """What a worker writes to its rows of the shared table as it takes steps."""
    steps, now = samples // BATCH, time.monotonic()
    progress, reports = control.progress[rank], control.reports[rank]
    progress[Control.SAMPLES] += samples
    progress[Control.STEPS] += steps
    reports[Control.LOSS] += loss * steps
    reports[Control.LOSS_STEPS] += steps
    if not reports[Control.T_FIRST]:
        reports[Control.T_FIRST] = now - 0.5  # the first step, half a second ago
    reports[Control.T_LAST] = now


def epoch(ctx: RunContext, number: int):
    """Every rank trains its shard of epoch `number` (0-based), then says so."""

    def batch() -> list[EpochEnd]:
        for rank in RANKS:
            train(ctx.control, rank, SHARD)
            ctx.control.progress[rank, Control.EPOCH] = number + 1
        return [EpochEnd(rank, number) for rank in RANKS]

    return batch


def some_steps(ctx: RunContext):
    """Every rank takes two steps, mid-epoch, and says nothing."""

    def batch() -> list:
        for rank in RANKS:
            train(ctx.control, rank, 2 * BATCH)
        return []

    return batch


def done(ranks=RANKS) -> list:
    """Workers that finish (their shard, or their step once the stop flag is up) and exit 0."""
    return [Done(rank) for rank in ranks] + [Exited(rank, 0) for rank in ranks]


def hold_evaluations_until_the_drain(loop: RunLoop, evaluate=None) -> None:
    """No core is ever idle (a fake /proc/loadavg: more threads runnable than cores) and none
    waits long enough: every evaluation due during training waits for the end of the run."""
    loop.evaluations.idle = IdleEvaluations(
        evaluate or loop.evaluator.evaluate, wait_seconds=3600, runnable=lambda: 3, cores=2
    )


def written_summary(ctx: RunContext) -> dict:
    return json.loads((Path(ctx.output_dir) / "summary.json").read_text())


def checkpoint_file(ctx: RunContext) -> Path:
    return Path(ctx.output_dir) / "checkpoints" / "last.pt"


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hogwild"]


@pytest.fixture(autouse=True)
def hogwild_logs(caplog):
    caplog.set_level(logging.INFO, logger="hogwild")


# ---- how a run ends ----


def test_a_run_whose_workers_finish_every_epoch_completes_with_its_evaluations_and_outputs(
    tmp_path, caplog
):
    ctx = context(tmp_path, epochs=2)
    workers = Workers(hello(ctx), epoch(ctx, 0), epoch(ctx, 1), done())
    loop = RunLoop(ctx, workers, Relay(), t_fit=time.monotonic())
    hold_evaluations_until_the_drain(loop)  # epoch 1's evaluation runs in the drain
    loop.watch()
    s = loop.finish()

    assert (s.status, s.exit_code, s.error) == ("completed", 0, None)
    assert int(ctx.control.stop[0]) == 0  # nothing stopped the workers
    written = written_summary(ctx)
    assert written["status"] == "completed" and written["exit_code"] == 0
    assert 0.0 <= written["test_accuracy"] <= 1.0 and written["test_loss"] > 0  # the final one
    assert written["total_samples"] == written["samples_seen"] == 2 * NUM_TRAIN
    assert written["epochs"] == 2
    assert written["worker_sharing_strategies"] == [ctx.cfg.sharing_strategy] * 2  # the Hellos
    assert written["final_train_loss"] == pytest.approx(0.5)
    assert written["train_seconds"] > 0 and "error" not in written
    evaluated = [m.split(":")[0] for m in messages(caplog) if ": test loss" in m]
    assert evaluated == ["epoch 1/2", "epoch 2/2"]  # the queued one, then the final one
    saved = checkpoint.load(str(checkpoint_file(ctx)))
    assert saved["run"]["samples_seen"] == 2 * NUM_TRAIN
    assert torch.equal(saved["progress"], ctx.control.progress)
    # each evaluation charted at the samples it was due at, the queued one too
    charted = tensorboard_scalars(Path(ctx.output_dir), "eval/accuracy")
    assert [step for step, _ in charted] == [NUM_TRAIN, 2 * NUM_TRAIN]


@pytest.mark.parametrize(
    "last_words, reason",
    [
        (
            [Failure(1, "exception", "ZeroDivisionError: boom", "Traceback ...")],
            "ZeroDivisionError: boom",
        ),
        ([], "exit code 1"),  # it died without a word
    ],
    ids=["said-why", "silent"],
)
def test_a_worker_that_fails_with_on_worker_failure_stop_fails_the_run_and_stops_the_others(
    tmp_path, caplog, last_words, reason
):
    ctx = context(tmp_path, on_worker_failure="stop")
    workers = Workers(hello(ctx), some_steps(ctx), [*last_words, Exited(1, 1)], done(ranks=[0]))
    loop = RunLoop(ctx, workers, Relay(), t_fit=time.monotonic())
    loop.watch()
    s = loop.finish()

    assert (s.status, s.exit_code) == ("failed", 1)
    assert int(ctx.control.stop[0]) == 1 and workers.started == []  # stopped, not restarted
    written = written_summary(ctx)
    assert written["status"] == "failed" and written["exit_code"] == 1
    assert written["error"] == {"rank": 1, "reason": reason}
    assert f"worker 1 failed: {reason}; stopping the other workers" in messages(caplog)
    assert not checkpoint_file(ctx).exists()  # a failed run keeps its last checkpoint, if any


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_interrupts_the_run_which_still_writes_its_checkpoint(
    tmp_path, caplog, signum, exit_code
):
    ctx = context(tmp_path, epochs=2)
    relay = Relay(signum)  # arrives while the workers say hello
    workers = Workers(hello(ctx), some_steps(ctx), done())
    loop = RunLoop(ctx, workers, relay, t_fit=time.monotonic())
    loop.watch()
    s = loop.finish()

    assert (s.status, s.exit_code) == ("interrupted", exit_code)
    assert int(ctx.control.stop[0]) == 1
    name = signal.Signals(signum).name
    assert f"{name} received: stopping the workers at their next step (again to force)" in (
        messages(caplog)
    )
    written = written_summary(ctx)
    assert written["status"] == "interrupted" and written["exit_code"] == exit_code
    assert written["test_accuracy"] is not None  # the interrupted run's weights, evaluated
    saved = checkpoint.load(str(checkpoint_file(ctx)))
    assert saved["run"]["samples_seen"] == 2 * 2 * BATCH == written["samples_seen"]


@pytest.mark.parametrize("group", [True, False])
def test_a_worker_killed_by_sigterm_is_the_groups_signal_when_the_orchestrator_got_one_too(
    tmp_path, monkeypatch, group
):
    """SIGTERM to the whole process group (a scheduler; torchrun's agent once a peer died)
    reaches a worker and the orchestrator a moment apart: the run is interrupted, not failed
    by that worker's death. A worker killed alone by SIGTERM still fails the run."""
    from hogwild.run import loop as run_loop

    monkeypatch.setattr(run_loop, "GROUP_SIGNAL_SECONDS", 0.05)  # (when none comes: group=False)
    ctx, relay = context(tmp_path), Relay()

    def killed():
        if group:  # the orchestrator's copy: taken by its receiver thread at the same moment
            relay.send(signal.SIGTERM)
        return [Exited(1, -signal.SIGTERM)]

    workers = Workers(hello(ctx), some_steps(ctx), killed, done(ranks=[0]))
    loop = RunLoop(ctx, workers, relay, t_fit=time.monotonic())
    loop.watch()
    s = loop.finish()
    if group:
        assert (s.status, s.exit_code) == ("interrupted", 143)
        assert "error" not in written_summary(ctx)
    else:
        assert (s.status, s.exit_code) == ("failed", 1)
        assert written_summary(ctx)["error"] == {"rank": 1, "reason": "killed by SIGTERM"}


def test_a_second_signal_while_the_workers_stop_ends_the_watch_at_once(tmp_path, caplog):
    ctx = context(tmp_path)
    relay = Relay(signal.SIGINT)
    never_sent = done()  # the workers ignore the stop flag: the caller escalates to SIGTERM
    workers = Workers(hello(ctx), lambda: relay.send(signal.SIGINT) or [], never_sent)
    loop = RunLoop(ctx, workers, relay, t_fit=time.monotonic())
    loop.watch()  # returns without waiting out trainer.grace_seconds

    assert list(workers.script) == [never_sent] and loop.state.force
    s = loop.finish()
    assert (s.status, s.exit_code) == ("interrupted", 130)
    assert "second signal: no final evaluation; writing the checkpoint and summary" in (
        messages(caplog)
    )
    assert written_summary(ctx)["test_accuracy"] is None and checkpoint_file(ctx).exists()


# ---- the evaluations still waiting for an idle core at the end ----


def test_an_evaluation_that_raises_in_the_final_drain_fails_the_run_late_without_blaming_a_signal(
    tmp_path, caplog
):
    ctx = context(tmp_path, epochs=2)
    workers = Workers(hello(ctx), epoch(ctx, 0), epoch(ctx, 1), done())
    loop = RunLoop(ctx, workers, Relay(), t_fit=time.monotonic())

    def broken(model, label):
        raise ValueError("no test split")

    hold_evaluations_until_the_drain(loop, broken)
    loop.watch()
    assert loop.state.status == "completed"  # every worker finished
    s = loop.finish()

    assert (s.status, s.exit_code) == ("failed", 1)
    reason = "evaluation failed: ValueError: no test split"
    assert written_summary(ctx)["error"] == {"rank": -1, "reason": reason}
    assert loop.state.signal is None and int(ctx.control.stop[0]) == 0
    assert not [m for m in messages(caplog) if "signal" in m]
    assert checkpoint_file(ctx).exists()  # the trained weights are kept all the same


def test_a_second_signal_while_the_queued_evaluations_run_skips_the_final_evaluation(
    tmp_path, caplog
):
    ctx = context(tmp_path, epochs=3)
    relay = Relay()
    workers = Workers(  # epochs 1 and 2 evaluations wait; then Ctrl-C
        hello(ctx),
        epoch(ctx, 0),
        epoch(ctx, 1),
        lambda: relay.send(signal.SIGINT) or [],
        done(),
    )
    loop = RunLoop(ctx, workers, relay, t_fit=time.monotonic())

    def after_the_second_signal(model, label):  # the drain asks the relay before this ends
        assert relay.taken.wait(timeout=30)
        return loop.evaluator.evaluate(model, label)

    hold_evaluations_until_the_drain(loop, after_the_second_signal)
    loop.watch()
    assert loop.state.status == "interrupted" and len(loop.evaluations.idle.waiting) == 2
    relay.send(signal.SIGINT)  # Ctrl-C again, once the workers are gone
    s = loop.finish()

    assert (s.status, s.exit_code) == ("interrupted", 130)
    logged = messages(caplog)
    assert "second signal: no final evaluation; writing the checkpoint and summary" in logged
    assert any(m.endswith("queued evaluation(s) of earlier epochs dropped") for m in logged)
    assert not [m for m in logged if m.startswith("final:")]  # no final evaluation
    assert written_summary(ctx)["status"] == "interrupted" and checkpoint_file(ctx).exists()
