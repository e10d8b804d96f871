"""The orchestrator: it owns every side effect of a run.

    checks     output folder, /dev/shm space, open-file budget, resume checkpoint
    share      model.share_memory() (grads None), training tensors to shared memory, once
    start      N workers through a context of `trainer.start_method`
    watch      worker pipes + process sentinels -> tqdm bar, TensorBoard, eval, checkpoints
    stop       stop flag -> grace -> SIGTERM -> SIGKILL -> join; summary.json

Usable without Hydra: build a model, a `DataSplits` and an optimizer factory, then
`Trainer(...).fit()`. The CLI does exactly that from the composed config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from hogwild import checkpoint, optim_state, sharing, staleness
from hogwild import device as device_rules
from hogwild.config import CheckpointConfig, ConfigError, HogwildError, ScheduleConfig, TrainerConfig
from hogwild.distributed import NodeSyncError
from hogwild.metrics import NullSink, ProgressBar, ProgressWindow, Sinks, TensorBoardSink
from hogwild.protocol import (
    Control, Done, EpochEnd, Failure, Hello, Log, Progress, TrainData, WorkerSpec, describe_exit,
)
from hogwild.supervisor import Exited, Supervisor, prestart
from hogwild.worker import run_worker

log = logging.getLogger("hogwild")
EXIT_CODES = {"completed": 0, "failed": 1, signal.SIGINT: 130, signal.SIGTERM: 143}


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        data,  # hogwild.data.DataSplits
        optimizer_factory: Callable[..., torch.optim.Optimizer],
        trainer: TrainerConfig,
        batch_size: int,
        output_dir: str,
        checkpointing: CheckpointConfig = CheckpointConfig(),
        resume_from: str | None = None,  # a checkpoint, or "auto": this run's own last one if there is one
        record: Mapping[str, Any] | None = None,  # the composed config, stored in checkpoints
        loss_fn: Callable[..., torch.Tensor] | None = None,  # default: cross_entropy, or mse_loss for regression
        started_at: float | None = None,  # time.time() the process started (for wall_seconds)
        shared_optimizer: bool = False,  # one optimizer state for all workers (hogwild.optim_state)
        schedule: ScheduleConfig = ScheduleConfig(),  # learning-rate rules (hogwild.schedule)
        node=None,  # hogwild.distributed.NodeSync under torchrun: model averaging between nodes
    ):
        self.model, self.data, self.cfg = model, data, trainer
        self.regression = getattr(data, "task", "classification") == "regression"
        self.optimizer_factory = optimizer_factory
        self.loss_fn = loss_fn or (F.mse_loss if self.regression else F.cross_entropy)
        self.batch_size, self.ckpt_cfg, self.resume_from = batch_size, checkpointing, resume_from
        self.output_dir = os.path.abspath(output_dir)
        self.record = dict(record or {})
        self.started_at = started_at or time.time()
        self.shared_optimizer, self.schedule = shared_optimizer, schedule
        self.node = node
        self.writer = node is None or node.is_writer  # only global rank 0 writes files
        self.ckpt_wanted = False  # under torchrun: rank 0 asks for the next round's progress table
        self.final_table: torch.Tensor | None = None  # every node's progress, from the last round
        self.optimizer_state: optim_state.State = []
        self.saved_optimizer_state: optim_state.State | None = None  # from the resumed checkpoint
        self.device = device_rules.resolve(trainer.device)
        self.ckpt_path = os.path.join(self.output_dir, "checkpoints", "last.pt")
        self.summary_path = os.path.join(self.output_dir, "summary.json")
        self.channels_last = trainer.memory_format == "channels_last" or (
            trainer.memory_format == "auto" and self.device.type == "cpu"
            and any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
        )

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs in the layout the model's weights use (channels_last: oneDNN's fast path)."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    # ---- set-up: everything that can refuse the run happens before anything is written ----

    def _run_facts(self) -> dict[str, Any]:
        """What a resumed run (and, under torchrun, every node) must agree on."""
        return {
            "num_workers": self.cfg.num_workers,
            "batch_size": self.batch_size,
            "num_train": (self.node and self.node.num_train_total) or self.data.num_train,  # the unsharded size
            "seed": self.cfg.seed,
            "epochs": self.cfg.epochs,
            "world_size": self.node.world if self.node else 1,
        }

    def _resume_path(self) -> str | None:
        """`resume_from` as given; "auto" is this run folder's last checkpoint, if there is one
        (how a run restarted by torchrun or a batch scheduler picks up where it stopped)."""
        if self.resume_from != "auto":
            return self.resume_from
        return self.ckpt_path if os.path.isfile(self.ckpt_path) else None

    def _preflight(self) -> torch.Tensor | None:
        """Refuse a doomed run with one clear line; return the progress table to resume from
        (under torchrun: every node's, as only rank 0 reads the checkpoint)."""
        if self.writer and os.path.exists(self.summary_path):
            if not self.resume_from:
                raise HogwildError(
                    f"{self.output_dir} already holds a finished run (summary.json); "
                    "choose another folder (hydra.run.dir=...) or continue it with resume_from=<checkpoint>"
                )
            if self.resume_from == "auto" and _summary_status(self.summary_path) == "completed":
                raise HogwildError(f"resume_from=auto: {self.output_dir} already holds a completed run "
                                   "(summary.json); auto continues only a run that did not complete")
        if self.cfg.start_method == "fork" and self.cfg.threads_per_worker > 1 and torch.get_num_threads() > 1:
            # OpenMP after fork: a child of a process whose thread pool has run (share_memory()
            # alone starts it) hangs forever in its first multi-threaded op. The CLI caps this
            # process at 1 thread before any torch work; an API caller must do the same.
            raise ConfigError(
                f"trainer.start_method='fork' with trainer.threads_per_worker={self.cfg.threads_per_worker} "
                f"hangs the workers when this process runs {torch.get_num_threads()} intra-op threads: "
                "use start_method=forkserver or spawn, threads_per_worker=1, or call torch.set_num_threads(1) "
                "before any torch work"
            )
        train_bytes = sharing.storage_bytes([self.data.train_x, self.data.train_y])
        self.data_on_device = device_rules.data_goes_to_device(train_bytes, self.device, self.cfg.data_on_device)
        progress = None
        self.resume_from = self._resume_path() if self.writer else None  # other nodes hear rank 0's
        if self.resume_from:
            state = checkpoint.load(self.resume_from)
            checkpoint.check_compatible(self.resume_from, state, self._run_facts(), self.model)
            self.model.load_state_dict(state["model"])
            progress = state["progress"]
            self.saved_optimizer_state = state.get("optimizer_state")
        tensors = [*self.model.parameters(), *self.model.buffers(), self.data.train_x, self.data.train_y]
        in_shm = tensors if self.device.type == "cpu" else [] if self.data_on_device else tensors[-2:]
        if in_shm:
            sharing.check_shm_space(sharing.storage_bytes(in_shm))
        self.num_shared = len(tensors) + Control.NUM_TENSORS  # what each worker receives
        self._check_fds(self.num_shared)
        return progress

    def _agree(self, progress: torch.Tensor | None) -> torch.Tensor | None:
        """Under torchrun: one start-up collective (see NodeSync.agree); every node takes its
        rows of rank 0's resume table. Rank 0's weights reach the others with the broadcast."""
        facts = {**self._run_facts(), "model": type(self.model).__name__,
                 "parameters": sum(p.numel() for p in self.model.parameters())}
        plan = {"resume_from": self.resume_from, "progress": None if progress is None else progress.tolist()}
        plan = self.node.agree(facts, plan=plan)
        self.resume_from = plan["resume_from"]
        return None if plan["progress"] is None else self.node.rows(torch.tensor(plan["progress"], dtype=torch.int64))

    def _check_fds(self, num_tensors: int) -> None:
        """Every shared tensor a worker receives may cost an fd (file_descriptor strategy)."""
        sharing.ensure_fd_budget(num_tensors, self.cfg.sharing_strategy)
        sharing.check_fd_passing(num_tensors, self.cfg.start_method, self.cfg.sharing_strategy)

    def _check_optimizer(self) -> None:
        """Fail here, not in every worker. Also imports what optimizers import lazily (~1.2 s
        of torch._dynamo) once, before fork, instead of in every forked worker."""
        try:
            self.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
        except (TypeError, ValueError) as e:
            name = getattr(self.optimizer_factory, "func", self.optimizer_factory)
            raise ConfigError(f"optimizer {getattr(name, '__name__', name)} rejects its arguments: {e}") from None

    def _share(self, progress: torch.Tensor | None) -> tuple[TrainData, Control]:
        sharing.set_sharing_strategy(self.cfg.sharing_strategy)
        self.model.to(self.device)
        if self.channels_last:  # 4-D weights only; the shared data is laid out to match, once
            self.model.to(memory_format=torch.channels_last)
        self.model.zero_grad(set_to_none=True)  # each worker allocates its own grads
        self.model.share_memory()  # CUDA tensors need no move: they are shared through CUDA IPC
        home = self.device if self.data_on_device else torch.device("cpu")
        data = TrainData(self._layout(self.data.train_x.to(home)), self.data.train_y.to(home))
        sharing.share_tensors(data)
        if self.shared_optimizer:  # built on the device, in the layout, the workers' parameters have
            self.optimizer_state = optim_state.build(self.optimizer_factory, list(self.model.parameters()))
            self._restore_optimizer_state()
            optim_state.share(self.optimizer_state)
            self._check_fds(self.num_shared + len(optim_state.tensors(self.optimizer_state)))
        control = Control(self.cfg.num_workers)
        if progress is not None:
            control.progress.copy_(progress)
        return data, control

    def _restore_optimizer_state(self) -> None:
        """A resumed run continues the shared moments it saved; when it cannot, it says so."""
        if not self.resume_from or not self.writer:  # other nodes receive rank 0's with the weights
            return
        if self.saved_optimizer_state is None:
            log.warning("%s holds no shared optimizer state (written with optimizer.shared=false): "
                        "the shared state starts fresh", self.resume_from)
            return
        reason = optim_state.restore(self.optimizer_state, self.saved_optimizer_state)
        if reason:
            log.warning("the optimizer state in %s does not fit this optimizer (%s): it starts fresh",
                        self.resume_from, reason)
        else:
            log.info("resumed the shared optimizer state (step %s)", optim_state.steps(self.optimizer_state))

    def _spec(self) -> WorkerSpec:
        c = self.cfg
        return WorkerSpec(
            num_workers=c.num_workers, epochs=c.epochs, batch_size=self.batch_size, seed=c.seed,
            threads=c.threads_per_worker, sharing_strategy=c.sharing_strategy, device=str(self.device),
            log_every_n_steps=c.log_every_n_steps, optimizer_factory=self.optimizer_factory,
            loss_fn=self.loss_fn, skip_nonfinite=c.skip_nonfinite, orchestrator_pid=os.getpid(),
            channels_last=self.channels_last, schedule=self.schedule,
        )

    # ---- the run ----

    def fit(self) -> dict[str, Any]:
        """Train to the end (or to a failure or interrupt); returns the summary it wrote."""
        self.t_fit = time.monotonic()
        try:
            progress = self._preflight()
        except HogwildError as e:
            if self.node:  # tell the other nodes why, so they stop now instead of at a timeout
                self.node.agree(self._run_facts(), error=str(e))
            raise
        if self.node:
            progress = self._agree(progress)
        prestart(self.cfg.start_method)  # the fork server boots while we finish setting up
        self._check_optimizer()
        data, control = self._share(progress)
        if self.node:
            self.node.broadcast([*self.model.parameters(), *self.model.buffers(),
                                 *optim_state.tensors(self.optimizer_state)])
        initial_samples = int(control.progress[:, Control.SAMPLES].sum())
        total = self.cfg.epochs * self.data.num_train
        if self.writer:
            os.makedirs(self.output_dir, exist_ok=True)
            self.sinks = Sinks(TensorBoardSink(os.path.join(self.output_dir, "tensorboard")), ProgressBar(total, initial_samples))
        else:  # other nodes log to their console only
            self.sinks = NullSink()
        self.window = ProgressWindow()
        self.window.samples_seen = initial_samples
        self.control = control
        spec = self._spec()
        # The model and `data` are referenced here until the supervisor has joined every worker
        # (the finally below): a CUDA producer must outlive the consumers of its tensors.
        self.supervisor = Supervisor(self.cfg.start_method, run_worker, lambda rank: (spec, self.model, data, control, self.optimizer_state))
        self.state = _RunState(self.cfg.num_workers, control)
        self.evals: list[tuple[float, float]] = []
        handlers = self._install_signal_handlers()
        try:
            log.info(
                "training %s on %s: %d samples x %d epochs, %d workers (%s, %s, %d thread(s) each)",
                type(self.model).__name__, self.data.name, self.data.num_train, self.cfg.epochs,
                self.cfg.num_workers, self.cfg.start_method, self.cfg.sharing_strategy, self.cfg.threads_per_worker,
            )
            for rank in range(self.cfg.num_workers):
                self.supervisor.start(rank)
            self._watch()
            if self.node and self.state.status == "completed":
                # keep joining rounds until every node is done; the last one leaves all alike
                while self.state.status == "completed" and not self._sync(finished=True):
                    pass
        except BaseException as e:
            if self.state.status == "running":
                self.state.fail(-1, f"orchestrator error: {type(e).__name__}: {e}")
            raise
        finally:
            self.supervisor.terminate()
            self._restore_signal_handlers(handlers)
            summary = self._finish(initial_samples)
        return summary

    def _watch(self) -> None:
        st, ckpt_at = self.state, time.monotonic()
        steps_at_ckpt = int(self.control.progress[:, Control.STEPS].sum())
        while self.supervisor.alive:
            for event in self.supervisor.events(timeout=0.1):
                self._handle(event)
            if self.window.due():
                self._flush()
            if st.status != "running" and not st.stop_deadline:
                self.control.stop[0] = 1
                st.stop_deadline = time.monotonic() + self.cfg.grace_seconds
            if st.stop_deadline and (time.monotonic() > st.stop_deadline or st.force):
                break  # the finally clause escalates to SIGTERM / SIGKILL
            steps = int(self.control.progress[:, Control.STEPS].sum())
            every_n, every_s = self.ckpt_cfg.every_n_steps, self.ckpt_cfg.every_seconds
            if st.status == "running" and (
                (every_n and steps - steps_at_ckpt >= every_n) or (every_s and time.monotonic() - ckpt_at >= every_s)
            ):
                if self.node:  # taken at the next round, where the nodes' models are one
                    self.ckpt_wanted = self.writer
                else:
                    self._save_checkpoint()
                ckpt_at, steps_at_ckpt = time.monotonic(), steps
            if self.node and st.status == "running" and self.node.due(steps):
                self._sync(finished=False)
        self._flush()
        if st.status == "running":
            st.status = "completed"

    def _sync(self, finished: bool) -> bool:
        """One model-averaging round with the other nodes; True when every node has finished."""
        steps = int(self.control.progress[:, Control.STEPS].sum())
        before = (self.node.seconds, self.node.bytes)
        try:
            done, table = self.node.round(list(self.model.parameters()), finished, steps,
                                          self.control.progress, checkpoint=self.ckpt_wanted)
        except NodeSyncError as e:
            if self.state.status != "interrupted":  # Ctrl-C reaches every node: the peer just left first
                self.state.fail(-1, str(e))
                log.error("%s; stopping the workers", e)
            return True
        self.sinks.scalars({"distributed/sync_seconds": self.node.seconds - before[0],
                            "distributed/sync_bytes": self.node.bytes - before[1]}, self.window.samples_seen)
        if table is not None:
            self.ckpt_wanted = False
            if done:
                self.final_table = table  # saved by _finish, after the final evaluation
            else:
                self._save_checkpoint(table)
        return done

    def _node_figures(self, summary: dict[str, Any]) -> dict[str, Any]:
        n = self.node
        mine = {"rank": n.rank, "status": summary["status"], "total_samples": summary["total_samples"],
                "samples_per_second": summary["samples_per_second"], "train_seconds": summary["train_seconds"],
                "param_checksum": float(sum(p.detach().double().sum() for p in self.model.parameters()))}
        # a collective: only when every node got through its final rounds (else it would wait)
        per_node = n.gather(mine) if summary["status"] == "completed" else [mine]
        rates = [p["samples_per_second"] for p in per_node]
        return {"world_size": n.world, "rank": n.rank, "sync_rounds": n.rounds, "sync_seconds": round(n.seconds, 4),
                "sync_bytes": n.bytes, "sync_every_n_steps": n.cfg.sync_every_n_steps,
                # the whole run's figures: every node's samples/s added up, and every node's samples
                "samples_per_second_all_nodes": round(sum(rates), 1) if len(rates) == n.world and all(rates) else None,
                "samples_seen_all_nodes": None if self.final_table is None
                else int(self.final_table[:, Control.SAMPLES].sum()),
                "per_node": per_node}

    def _flush(self) -> None:
        """Progress since the last write, plus the staleness histograms as they stand."""
        self.window.flush(self.sinks)
        if values := staleness.scalars(self.control.staleness.numpy()):
            self.sinks.scalars(values, self.window.samples_seen)

    def _handle(self, event) -> None:
        st = self.state
        if isinstance(event, Progress):
            self.window.add(event.rank, event.steps, event.samples, event.loss_sum, event.lr)
            st.t_first = min(st.t_first, event.t_first)
            st.t_last = max(st.t_last, event.t_last)
        elif isinstance(event, EpochEnd):
            st.epochs_done[event.rank] = max(st.epochs_done[event.rank], event.epoch + 1)
            if min(st.epochs_done) > st.epochs_evaluated and st.status == "running":
                st.epochs_evaluated = min(st.epochs_done)
                self._flush()
                if self.writer:  # other nodes record nothing: their cores go to their workers
                    self._evaluate(epoch=st.epochs_evaluated)
        elif isinstance(event, Hello):
            st.hello[event.rank] = event
        elif isinstance(event, Log):
            log.log(event.level, "[worker %d] %s", event.rank, event.message)
        elif isinstance(event, Done):
            st.done.add(event.rank)
        elif isinstance(event, Failure):
            st.failures[event.rank] = event
        elif isinstance(event, Exited):
            self._on_exit(event)

    def _on_exit(self, event: Exited) -> None:
        st = self.state
        if event.rank in st.done and event.exitcode == 0:
            return
        failure = st.failures.pop(event.rank, None)
        reason = failure.message if failure else describe_exit(event.exitcode)
        if st.status != "running":  # already stopping: a worker ended by the shutdown is no news
            return
        restartable = failure is None or failure.kind != "nonfinite"
        if self.cfg.on_worker_failure == "restart" and restartable and st.restarts < self.cfg.max_restarts:
            st.restarts += 1
            log.warning("worker %d died (%s); restarting it (%d/%d)", event.rank, reason, st.restarts, self.cfg.max_restarts)
            self.sinks.scalars({"workers/restarts": st.restarts}, self.window.samples_seen)
            self.supervisor.start(event.rank)
            return
        if failure and failure.traceback:
            log.error("worker %d raised:\n%s", event.rank, failure.traceback.rstrip())
        st.fail(event.rank, reason)
        log.error("worker %d failed: %s; stopping the other workers", event.rank, reason)

    # ---- evaluation, checkpoints, signals, summary ----

    @torch.no_grad()
    def _evaluate(self, epoch: int | None = None) -> tuple[float, float]:
        """(test loss, test accuracy), or (test MSE, test RMSE) for regression data."""
        was_training = self.model.training
        self.model.eval()
        loss_sum, correct = 0.0, 0
        x_all, y_all = self.data.test_x, self.data.test_y
        for i in range(0, x_all.shape[0], self.cfg.eval_batch_size):
            x = self._layout(x_all[i : i + self.cfg.eval_batch_size].to(self.device))
            y = y_all[i : i + self.cfg.eval_batch_size].to(self.device)
            out = self.model(x)
            loss_sum += float(self.loss_fn(out, y, reduction="sum"))
            if not self.regression:
                correct += int((out.argmax(1) == y).sum())
        self.model.train(was_training)
        loss = loss_sum / x_all.shape[0]
        result = (loss, loss**0.5 if self.regression else correct / x_all.shape[0])
        self.evals.append(result)
        score = "eval/rmse" if self.regression else "eval/accuracy"
        self.sinks.scalars({"eval/loss": result[0], score: result[1]}, self.window.samples_seen)
        label = f"epoch {epoch}/{self.cfg.epochs}" if epoch else "final"
        if self.regression:
            log.info("%s: test loss %.4f, test RMSE %.4f", label, result[0], result[1])
        else:
            log.info("%s: test loss %.4f, test accuracy %.2f%%", label, result[0], 100 * result[1])
        return result

    def _save_checkpoint(self, progress: torch.Tensor | None = None) -> None:
        """`progress`: every node's table, taken at a round (torchrun); else this node's own."""
        if not self.writer:
            return
        # one snapshot of the live table (the workers keep counting), so the count matches the rows
        progress = self.control.progress.clone() if progress is None else progress
        run = {**self._run_facts(), "samples_seen": int(progress[:, Control.SAMPLES].sum())}
        checkpoint.save(self.ckpt_path, self.model, progress, run, self.record, self.optimizer_state)

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals can only be handled on the main thread; the caller owns them there

        def handler(signum, frame):
            st = self.state
            if st.status == "running":
                st.status, st.signal = "interrupted", signum
                log.warning("%s received: stopping the workers at their next step (again to force)",
                            signal.Signals(signum).name)
            else:
                st.force = True

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signal_handlers(handlers: dict) -> None:
        for sig, old in handlers.items():
            signal.signal(sig, old)

    def _finish(self, initial_samples: int) -> dict[str, Any]:
        st = self.state
        total_samples = int(self.control.progress[:, Control.SAMPLES].sum()) - initial_samples
        test_loss = test_score = None
        if st.status in ("completed", "interrupted") and self.writer:
            # the eval after the last epoch already saw the final weights: no need to run it twice
            final_seen = (st.status == "completed" and self.evals and st.epochs_evaluated == self.cfg.epochs
                          and not self.node)  # averaging changed the weights after the last epoch
            test_loss, test_score = self.evals[-1] if final_seen else self._evaluate()
            if self.node is None or self.final_table is not None:  # torchrun: else the last round's stands
                self._save_checkpoint(self.final_table)
        train_seconds = max(st.t_last - st.t_first, 0.0) if st.t_first < st.t_last else None
        summary = {
            "status": st.status,
            "num_workers": self.cfg.num_workers,
            "start_method": self.cfg.start_method,
            "sharing_strategy": self.cfg.sharing_strategy,
            "worker_sharing_strategies": [st.hello[r].sharing_strategy for r in sorted(st.hello)],
            "device": self.cfg.device,
            "threads_per_worker": self.cfg.threads_per_worker,
            "memory_format": "channels_last" if self.channels_last else "contiguous",
            "data_on_device": self.data_on_device,
            "epochs": self.cfg.epochs,
            "batch_size": self.batch_size,
            "num_train": self.data.num_train,
            "total_samples": total_samples,
            "samples_seen": initial_samples + total_samples,
            "resumed_from": self.resume_from,
            "wall_seconds": round(time.time() - self.started_at, 3),
            "train_seconds": round(train_seconds, 4) if train_seconds else None,
            # fit() called -> first optimizer step of any worker: checks, sharing, process start
            "startup_seconds": round(st.t_first - self.t_fit, 3) if st.t_first < float("inf") else None,
            "samples_per_second": round(total_samples / train_seconds, 1) if train_seconds else None,
            "final_train_loss": self.window.final_train_loss,
            "test_loss": test_loss,
            "task": "regression" if self.regression else "classification",
            "test_accuracy": None if self.regression else test_score,
            "test_rmse": test_score if self.regression else None,
            "worker_restarts": st.restarts,
            "staleness": staleness.summarize(self.control.staleness.numpy()),
            "optimizer_shared": self.shared_optimizer,
            "schedule": dataclasses.asdict(self.schedule),
            # the shared state's step counter: all workers' updates (None for per-worker state)
            "optimizer_state_steps": optim_state.steps(self.optimizer_state),
            "exit_code": EXIT_CODES.get(st.signal or st.status, 1),
        }
        if st.error:
            summary["error"] = st.error
        if self.node:
            summary["distributed"] = self._node_figures(summary)
        if not self.writer:
            return summary
        hparams = {k: summary[k] for k in ("num_workers", "start_method", "sharing_strategy", "device",
                                           "threads_per_worker", "batch_size", "epochs")}
        hparams["lr"] = getattr(self.optimizer_factory, "keywords", {}).get("lr", "n/a")
        self.sinks.hparams(hparams, {k: summary[k] for k in ("test_accuracy", "test_rmse", "test_loss",
                                                             "samples_per_second")})
        self.sinks.close()
        tmp = self.summary_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(tmp, self.summary_path)
        return summary


def _summary_status(path: str) -> str | None:
    try:
        with open(path) as f:
            return json.load(f).get("status")
    except (OSError, ValueError, AttributeError):
        return None


class _RunState:
    """What the orchestrator knows about the run so far; changed only from its loop."""

    def __init__(self, num_workers: int, control: Control):
        self.status = "running"  # -> completed | interrupted | failed
        self.signal: int | None = None
        self.force = False
        self.stop_deadline = 0.0
        self.error: dict[str, Any] | None = None
        self.epochs_done = [int(e) for e in control.progress[:, Control.EPOCH]]
        self.epochs_evaluated = min(self.epochs_done)
        self.done: set[int] = set()
        self.failures: dict[int, Failure] = {}
        self.hello: dict[int, Hello] = {}
        self.restarts = 0
        self.t_first, self.t_last = float("inf"), 0.0

    def fail(self, rank: int, reason: str) -> None:
        self.status = "failed"
        self.error = {"rank": rank, "reason": reason}
