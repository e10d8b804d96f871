"""The run loop: watch the workers, carry out what the run state decides, ask each component
whether it is due, and finish.

    while a worker is alive:
        events (pipes + sentinels, signals, time) -> RunState.apply -> actions (restart, stop, ...)
        dashboards due?   checkpoint due?   a node-sync round due?   an evaluation due?
    the last rounds with the other nodes; the evaluations still waiting for an idle core;
    the final evaluation and checkpoint; the summary

Every component decides for itself when it is due (cadence, evaluator, node); the loop only asks.
On a node other than torchrun's rank 0 the outputs are do-nothing objects: it evaluates and
writes nothing, so its cores go to its workers.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from hogwild.errors import NodeSyncError
from hogwild.protocol import Control, Log, Scalars
from hogwild.reporting import staleness, timeline
from hogwild.reporting.dashboards import TensorBoardSink
from hogwild.reporting.sinks import NullSink, ProgressBar, ProgressWindow, Sinks
from hogwild.run import evaluation, idle_evaluation, summary
from hogwild.run import folder as run_folder
from hogwild.run.checkpoint import Checkpointer
from hogwild.run.state import (
    Failed,
    Finished,
    Restart,
    RunFailed,
    RunState,
    Signal,
    Stalled,
    StopWorkers,
    Terminate,
    Tick,
)

log = logging.getLogger("hogwild")

# How often the loop looks at the shared table when no worker says anything: for the cadences
# counted in steps, the stall watch and shutdown deadlines. Measured (MLP, 2 workers, 4 short
# epochs): 36-41 wake-ups in 2.5-3.2 s of training cost 0.04-0.05 s of CPU in all, half of it
# the per-epoch evaluations.
POLL_SECONDS = 0.1


class RunLoop:
    def __init__(
        self, trainer, plan, control: Control, optimizer_state, supervisor, signals, t_fit: float
    ):
        self.t, self.plan, self.control, self.node, self.t_fit = (
            trainer,
            plan,
            control,
            trainer.node,
            t_fit,
        )
        self.supervisor, self.signals, self.optimizer_state = supervisor, signals, optimizer_state
        cfg, workload, writer = trainer.cfg, trainer.workload, trainer.node.is_writer
        self.initial = int(control.progress[:, Control.SAMPLES].sum())
        self.state = RunState(
            cfg.num_workers,
            [int(e) for e in control.progress[:, Control.EPOCH]],
            cfg.on_worker_failure,
            cfg.max_restarts,
            cfg.grace_seconds,
            cfg.stall_seconds,
        )
        self.window = ProgressWindow(control, unit=workload.unit)
        self.evaluator = (
            workload.evaluator(plan.device, plan.layout, cfg.eval_batch_size)
            if writer
            else NoEvaluation()
        )
        self.evaluator.due(
            self.state.epochs_complete, self.initial
        )  # a resumed run: its epochs are done
        self.checkpointer = Checkpointer(
            os.path.join(trainer.output_dir, "checkpoints", "last.pt"),
            trainer.ckpt_cfg,
            trainer.model,
            control.progress,
            plan.facts,
            trainer.record,
            optimizer_state,
            enabled=writer,
        )
        self.sinks = dashboards(trainer, self.initial) if writer else NullSink()
        wait, idle = cfg.eval_wait_seconds, self.evaluator.idle_cores  # hogwild.run.idle_evaluation
        self.idle = idle_evaluation.IdleEvaluations(self.evaluator.evaluate, wait) if idle else None

    def watch(self) -> None:
        st = self.state
        while self.supervisor.alive:
            # asleep until a worker says something or exits, or the next write is due
            for event in self.supervisor.events(timeout=self._sleep()):
                if isinstance(event, Scalars):
                    self.sinks.scalars(workload_scalars(event), self.window.samples_seen)
                elif isinstance(event, Log):
                    log.log(event.level, "[worker %d] %s", event.rank, event.message)
                self.apply(event)
            for signum in self.signals.drain():
                self.apply(Signal(signum))
            if self.window.due():
                self.flush()
            steps = tuple(int(n) for n in self.control.progress[:, Control.STEPS])
            if self.apply(Tick(time.monotonic(), steps)):
                break  # the caller escalates to SIGTERM / SIGKILL
            if st.running and self.checkpointer.due(
                int(self.control.progress[:, Control.STEPS].sum())
            ):
                self.node.checkpoint(self.checkpointer.save)
            if self.checkpointer.error and st.running:
                self.apply(RunFailed(self.checkpointer.error))
            self._node(
                lambda: self.sinks.scalars(self.node.tick(st.running), self.window.samples_seen)
            )
            if st.running and self.node.goal_reached:  # torchrun: rank 0's evaluation solved
                self.apply(Finished("another node reached the run's goal"))
            label = self.evaluator.due(st.epochs_complete, self.window.samples_seen)
            if label and st.running:
                idle_evaluation.evaluate(self, label)
            idle_evaluation.report(self)
        self.flush()
        # keep joining rounds until every node is done (the last one leaves all alike); a run
        # that reached its goal too, so that its rounds carry the news to the other nodes
        if st.running or st.finished_reason:
            self._node(self.node.finish)
        st.all_exited()

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

    def apply(self, event) -> bool:
        """Feed one event to the run state and carry out its actions; True to terminate now."""
        terminate = False
        for action in self.state.apply(event):
            if isinstance(action, Restart):
                f, n = action.failure, self.t.cfg.max_restarts
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
                elif self.state.status == "interrupted":
                    log.warning(
                        "%s received: stopping the workers at their next step (again to force)",
                        action.reason,
                    )
            elif isinstance(action, Stalled):
                log.error(
                    "worker %d took no step for %.0f s (trainer.stall_seconds=%g); where it is:\n%s",
                    action.rank,
                    action.seconds,
                    self.t.cfg.stall_seconds,
                    self.supervisor.stack(action.rank, self.t.stack_dir),
                )
                self.supervisor.kill(action.rank)
            elif isinstance(action, Terminate):
                terminate = True
        return terminate

    def flush(self) -> None:
        """Progress since the last write, plus the staleness histograms as they stand."""
        self.window.flush(self.sinks)
        if values := staleness.scalars(self.control.staleness.numpy()):
            self.sinks.scalars(values, self.window.samples_seen)


def dashboards(trainer, initial: int) -> Sinks:
    """What the node that writes shows: TensorBoard and the progress bar (other nodes log to
    their console only)."""
    workload = trainer.workload
    os.makedirs(trainer.output_dir, exist_ok=True)
    sinks = Sinks(
        TensorBoardSink(os.path.join(trainer.output_dir, "tensorboard")),
        ProgressBar(workload.total_units, initial, unit=workload.unit),
    )
    sinks.hparams(summary.hparams(trainer))  # a row in the HParams tab from the start
    return sinks


class NoEvaluation:
    """Nodes other than rank 0 evaluate nothing: their cores go to their workers."""

    idle_cores = False

    def due(self, epochs_complete: int, units: int) -> None:
        return None

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        return False

    def results(self) -> dict[str, Any]:
        return {}

    def goal(self) -> None:
        return None


def workload_scalars(event: Scalars) -> dict[str, float]:
    """A worker's own figures: the run's chart (`train/<key>`, every worker's reports on one
    line) and the worker's (`workers/<key>/rank_NN`)."""
    out = {f"train/{k}": v for k, v in event.values.items()}
    out.update({f"workers/{k}/rank_{event.rank:02d}": v for k, v in event.values.items()})
    return out


def finish(loop: RunLoop) -> summary.Summary:
    """The run after its workers: final evaluation and checkpoint (unless it failed), then the
    summary (written by rank 0 alone)."""
    st, t = loop.state, loop.t
    second_signal = idle_evaluation.drain_queue(loop)
    if st.status in ("completed", "interrupted"):
        if second_signal:  # the checkpoint and the summary, nothing that can wait
            log.warning("second signal: no final evaluation; writing the checkpoint and summary")
        elif loop.evaluator.needs_final(st.status == "completed", loop.node.weights_change_at_end):
            with timeline.phase("final_evaluation"), evaluation.every_core(t.cfg.start_method):
                results = loop.evaluator.evaluate(t.model, "final")
            loop.sinks.scalars(results, loop.window.samples_seen)
        loop.checkpointer.error = None
        with timeline.phase("final_checkpoint"):
            loop.node.final_checkpoint(loop.checkpointer.save)
        if loop.checkpointer.error:
            st.fail_late(loop.checkpointer.error)
    s = summary.collect(loop)
    s.distributed = loop.node.figures(
        {
            "status": s.status,
            "total_samples": s.total_samples,
            "samples_per_second": s.samples_per_second,
            "train_seconds": s.train_seconds,
        }
    )
    if loop.node.is_writer:
        loop.sinks.results(s.status, summary.hparam_metrics(s), loop.window.samples_seen)
        loop.sinks.close()
        path = os.path.join(t.output_dir, "summary.json")
        try:
            s.write(path)
        except OSError as e:  # the console report below still tells the user everything
            log.error("%s", run_folder.write_error(path, e))
    return s
