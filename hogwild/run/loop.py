"""The run loop: watch the workers, carry out what the run state decides, ask each component
whether it is due, and finish.

    while a worker is alive:
        events (pipes + sentinels, signals, time) -> RunState.apply -> actions (restart, stop, ...)
        dashboards due?   checkpoint due?   a node-sync round due?   an evaluation due?
    the last rounds with the other nodes; the evaluations still waiting for an idle core;
    the final evaluation and checkpoint; the summary

Every component decides for itself when it is due (cadence, evaluator, node); the loop only asks.
Before each write it looks (one stat) that the run folder it claimed is still there: a folder
removed while the run runs fails the run with one line, and nothing is written there again
(hogwild.run.folder.Claim.check).
On a node other than torchrun's rank 0 the outputs are do-nothing objects: it evaluates and
writes nothing, so its cores go to its workers.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from hogwild.errors import NodeSyncError, RunFolderError
from hogwild.process.signals import SignalRelay
from hogwild.protocol import Control, Log, Scalars
from hogwild.reporting import staleness
from hogwild.reporting.dashboards import TensorBoardSink
from hogwild.reporting.sinks import NullSink, ProgressBar, ProgressWindow, Sinks
from hogwild.run import evaluation, summary
from hogwild.run import folder as run_folder
from hogwild.run.checkpoint import Checkpointer
from hogwild.run.context import RunContext
from hogwild.run.idle_evaluation import EvaluationScheduler, Scored
from hogwild.run.state import (
    Exited,
    Failed,
    Finished,
    Restart,
    RunFailed,
    RunState,
    RunStatus,
    Signal,
    Stalled,
    StopWorkers,
    Terminate,
    Tick,
)
from hogwild.run.summary import Summary
from hogwild.run.supervisor import Supervisor
from hogwild.workloads.base import Evaluator, NullEvaluator

log = logging.getLogger("hogwild")

# How often the loop looks at the shared table when no worker says anything: for the cadences
# counted in steps, the stall watch and shutdown deadlines (its cost: docs/performance.md).
POLL_SECONDS = 0.1
# A worker killed by a SIGTERM the orchestrator did not send: how long the orchestrator waits for
# its own copy of a SIGTERM sent to the whole process group (a scheduler, torchrun's agent)
GROUP_SIGNAL_SECONDS = 2.0


class RunLoop:
    def __init__(self, ctx: RunContext, supervisor: Supervisor, signals: SignalRelay, t_fit: float):
        self.ctx, self.supervisor, self.signals, self.t_fit = ctx, supervisor, signals, t_fit
        self.control, self.node, cfg, writer = ctx.control, ctx.node, ctx.cfg, ctx.node.is_writer
        self.initial = int(ctx.control.progress[:, Control.SAMPLES].sum())
        self.state = RunState(
            cfg.num_workers,
            [int(e) for e in ctx.control.progress[:, Control.EPOCH]],
            cfg.on_worker_failure,
            cfg.max_restarts,
            cfg.grace_seconds,
            cfg.stall_seconds,
        )
        self.window = ProgressWindow(ctx.control, unit=ctx.workload.unit)
        self.evaluator: Evaluator = (
            ctx.workload.evaluator(ctx.plan.device, ctx.plan.layout, cfg.eval_batch_size)
            if writer
            else NullEvaluator()
        )
        self.evaluator.due(self.state.epochs_complete, self.initial)  # a resumed run: done epochs
        self.evaluations = EvaluationScheduler(
            self.evaluator, ctx.model, ctx.setup.timeline, cfg.eval_wait_seconds
        )
        self.checkpointer = Checkpointer(
            os.path.join(ctx.output_dir, "checkpoints", "last.pt"),
            ctx.checkpointing,
            ctx.model,
            ctx.control.progress,
            ctx.plan.facts,
            ctx.record,
            ctx.optimizer_state,
            enabled=writer,
        )
        self.claim = ctx.setup.claim if writer else None
        self.lost: str | None = None  # why the run folder is gone, once it is
        self.sinks = dashboards(ctx, self.initial) if writer else NullSink()

    def watch(self) -> None:
        st = self.state
        while self.supervisor.alive:
            # asleep until a worker says something or exits, or the next write is due
            for event in self.supervisor.events(timeout=self._sleep()):
                if isinstance(event, Exited) and event.exitcode == -signal.SIGTERM:
                    self._group_signal()
                if isinstance(event, Scalars):
                    self.sinks.scalars(workload_scalars(event), self.window.samples_seen)
                elif isinstance(event, Log):
                    log.log(event.level, "[worker %d] %s", event.rank, event.message)
                self.apply(event)
            for signum in self.signals.drain():
                self.apply(Signal(signum))
            if self.window.due():
                self.folder_kept()  # once it is gone, the dashboards are a NullSink
                self.flush()
            steps = tuple(int(n) for n in self.control.progress[:, Control.STEPS])
            if self.apply(Tick(time.monotonic(), steps)):
                break  # the caller escalates to SIGTERM / SIGKILL
            if (
                st.running
                and self.checkpointer.due(int(self.control.progress[:, Control.STEPS].sum()))
                and self.folder_kept()
            ):
                self.node.checkpoint(self.checkpointer.save)
            if self.checkpointer.error and st.running and self.folder_kept():
                self.apply(RunFailed(self.checkpointer.error))
            self._node(
                lambda: self.sinks.scalars(self.node.tick(st.running), self.window.samples_seen)
            )
            if st.running and self.node.goal_reached:  # torchrun: rank 0's evaluation solved
                self.apply(Finished("another node reached the run's goal"))
            label = self.evaluator.due(st.epochs_complete, self.window.samples_seen)
            if label and st.running:
                self.flush()  # the train/ charts get a point at every epoch's end, however short
                self._scored(self.evaluations.start(label, self.window.samples_seen))
            self._scored(self.evaluations.completed())
        self.folder_kept()
        self.flush()
        # keep joining rounds until every node is done (the last one leaves all alike); a run
        # that reached its goal too, so that its rounds carry the news to the other nodes
        if st.running or st.finished_reason:
            self._node(self.node.finish)
        st.all_exited()

    def _group_signal(self) -> None:
        """A worker died of SIGTERM while the run was going (the orchestrator sends it only to
        workers that outlive the grace period of a stop): most likely a SIGTERM to the whole
        process group, which the orchestrator receives too, a moment apart. Its own copy is
        taken first, so that the run is interrupted, as the sender meant, and not failed by the
        worker's death (under torchrun's agent, that of the node it stops after a peer died)."""
        if not self.state.running:
            return
        deadline = time.monotonic() + GROUP_SIGNAL_SECONDS
        while not self.signals.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        for signum in self.signals.drain():
            self.apply(Signal(signum))

    def _sleep(self) -> float:
        """How long the loop may wait for a worker's message: until the next dashboard write,
        and at most POLL_SECONDS (step-counted cadences, stall watch, shutdown deadlines)."""
        return min(self.window.seconds_to_due(), POLL_SECONDS)

    def _node(self, call) -> None:
        try:
            call()
        except NodeSyncError as e:
            if self.state.running:  # Ctrl-C reaches every node: a peer that left first is no news
                log.error("%s; stopping the workers", e)
            self.apply(RunFailed(str(e)))

    def _scored(self, scored: list[Scored]) -> None:
        """Evaluations done: their results charted at the units they were due at; an
        evaluation that raised fails the run, as if it had run here."""
        for units, outcome in scored:
            if isinstance(outcome, BaseException):
                raise outcome
            self.sinks.scalars(outcome, units)
            if reason := self.evaluator.goal():  # e.g. a policy that solved its task
                self.node.reach_goal()  # torchrun: the next rounds stop every node
                self.apply(Finished(reason))

    def apply(self, event) -> bool:
        """Feed one event to the run state and carry out its actions; True to terminate now."""
        terminate = False
        cfg = self.ctx.cfg
        for action in self.state.apply(event):
            if isinstance(action, Restart):
                f, n = action.failure, cfg.max_restarts
                log.warning(
                    "worker %d died (%s); restarting it (%d/%d)", f.rank, f.reason, action.count, n
                )
                self.sinks.scalars({"workers/restarts": action.count}, self.window.samples_seen)
                self.supervisor.start(f.rank)
            elif isinstance(action, Failed):
                if action.failure.traceback:
                    log.error(
                        "worker %d raised:\n%s",
                        action.failure.rank,
                        action.failure.traceback.rstrip(),
                    )
                log.error(
                    "worker %d failed: %s; stopping the other workers",
                    action.failure.rank,
                    action.failure.reason,
                )
            elif isinstance(action, StopWorkers):
                self.control.stop[0] = 1
                if self.state.finished_reason:
                    log.info("%s; stopping the workers", action.reason)
                else:  # interrupted or failed: the other nodes hear it
                    self.node.stopping(self.state.status.value)
                    if self.state.status is RunStatus.INTERRUPTED:
                        log.warning(
                            "%s received: stopping the workers at their next step (again to "
                            "force)%s",
                            action.reason,
                            # torchrun's agent stops every node it runs once one of them failed
                            "; under torchrun, its own report says whether a node failed first"
                            if self.node.world > 1 and action.reason == "SIGTERM"
                            else "",
                        )
            elif isinstance(action, Stalled):
                log.error(
                    "worker %d took no step for %.0f s (trainer.stall_seconds=%g); where it is:\n%s",
                    action.rank,
                    action.seconds,
                    cfg.stall_seconds,
                    self.supervisor.stack(action.rank, self.ctx.stack_dir),
                )
                self.supervisor.kill(action.rank)
            elif isinstance(action, Terminate):
                terminate = True
        return terminate

    def folder_kept(self) -> bool:
        """False once the run folder this run claimed is gone (or replaced): the run fails with
        that one line (stopping its workers), its dashboards and checkpoints are dropped, and
        nothing is written there again, so that the folder is not half made again."""
        if self.lost is None and self.claim is not None:
            try:
                self.claim.check()
            except RunFolderError as e:
                self.lost = str(e)
                log.error("%s", e)
                self.checkpointer.enabled = False
                self.sinks.close()  # TensorBoard's files went with the folder; the bar ends too
                self.sinks = NullSink()
                if self.state.running:
                    self.apply(RunFailed(self.lost))
                else:  # stopping already (a signal, a failure): it fails, with this reason
                    self.state.fail_late(self.lost)
        return self.lost is None

    def flush(self) -> None:
        """Progress since the last write, plus the staleness histograms as they stand."""
        self.window.flush(self.sinks)
        if values := staleness.scalars(self.control.staleness.numpy()):
            self.sinks.scalars(values, self.window.samples_seen)

    def finish(self) -> Summary:
        """The run after its workers: the evaluations still waiting for an idle core, the final
        evaluation and checkpoint (unless it failed), then the summary (written by rank 0 alone)."""
        st, ctx, timeline = self.state, self.ctx, self.ctx.setup.timeline
        # the workers' weights are worth keeping; an evaluation that fails below (a bug in an
        # evaluator, not in the weights) fails the run but does not lose its checkpoint
        trained = st.status in (RunStatus.COMPLETED, RunStatus.INTERRUPTED)
        second_signal = self._drain_evaluations()
        if trained and self.folder_kept():
            if second_signal:  # the checkpoint and the summary, nothing that can wait
                log.warning(
                    "second signal: no final evaluation; writing the checkpoint and summary"
                )
            elif st.status is not RunStatus.FAILED and self.evaluator.needs_final(
                st.status is RunStatus.COMPLETED, self.node.weights_change_at_end
            ):
                with timeline.phase("final_evaluation"), self._every_core():
                    results = self.evaluator.evaluate(ctx.model, "final")
                self.sinks.scalars(results, self.window.samples_seen)
            self.checkpointer.error = None
            if self.folder_kept():  # the final evaluation may take a while
                with timeline.phase("final_checkpoint"):
                    self.node.final_checkpoint(self.checkpointer.save)
            if self.checkpointer.error and self.folder_kept():
                st.fail_late(self.checkpointer.error)
        s = summary.collect(
            ctx, st, self.window, self.evaluator.results(), self.initial, self.t_fit
        )
        s.distributed = self.node.figures(
            {
                "status": s.status,
                "total_samples": s.total_samples,
                "samples_per_second": s.samples_per_second,
                "train_seconds": s.train_seconds,
            }
        )
        if self.node.is_writer:
            self.sinks.results(s.status, summary.hparam_metrics(s), self.window.samples_seen)
            self.sinks.close()
            path = os.path.join(ctx.output_dir, "summary.json")
            try:
                if self.folder_kept():  # not into a folder made again, or someone else's
                    s.write(path)
            except OSError as e:  # the console report below still tells the user everything
                log.error("%s", run_folder.write_error(path, e))
        return s

    def _every_core(self):
        return evaluation.every_core(self.ctx.cfg.start_method, self.ctx.setup.last_run_in_process)

    def _drain_evaluations(self) -> bool:
        """After the workers exit: the evaluations still waiting for an idle core, run now on
        every core (a fixed cost). A signal meanwhile drops those not started; to an
        interrupted run it is a second signal. True when the final evaluation must be skipped
        (a second signal)."""
        st = self.state
        if not self.evaluations.holds_any:
            return st.force
        drained = self.evaluations.drain(
            lambda: bool(self.signals.drain()), skip=st.force, every_core=self._every_core()
        )
        try:
            self._scored(drained.scored)
        except Exception as e:  # noqa: BLE001 - an evaluation raised: the run fails, as in the loop
            st.fail_late(f"evaluation failed: {type(e).__name__}: {e}")
        if drained.dropped:
            log.warning(
                "signal received: %d queued evaluation(s) of earlier epochs dropped",
                drained.dropped,
            )
        return st.force or (bool(drained.dropped) and st.status is RunStatus.INTERRUPTED)


def dashboards(ctx: RunContext, initial: int) -> Sinks:
    """What the node that writes shows: TensorBoard and the progress bar (other nodes log to
    their console only)."""
    if ctx.setup.claim is not None:  # not made again if it was removed since it was claimed
        ctx.setup.claim.check()
    os.makedirs(ctx.output_dir, exist_ok=True)
    sinks = Sinks(
        # the Custom Scalars category: "classification", ... (a workload may not say)
        TensorBoardSink(
            os.path.join(ctx.output_dir, "tensorboard"), getattr(ctx.workload, "kind", "training")
        ),
        ProgressBar(ctx.workload.total_units, initial, unit=ctx.workload.unit),
    )
    sinks.hparams(summary.hparams(ctx))  # a row in the HParams tab from the start
    return sinks


def workload_scalars(event: Scalars) -> dict[str, float]:
    """A worker's own figures: the run's chart (`train/<key>`, every worker's reports on one
    line) and the worker's (`workers/<key>/rank_NN`)."""
    out = {f"train/{k}": v for k, v in event.values.items()}
    out.update({f"workers/{k}/rank_{event.rank:02d}": v for k, v in event.values.items()})
    return out
