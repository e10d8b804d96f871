"""Evaluation of the shared model by the orchestrator, while the workers go on.

`SupervisedEvaluator` scores the test split after every epoch (the first moment every rank has
finished its shard of it), the last epoch once the workers have exited (the orchestrator then
has every core, and never evaluates the same weights twice), and an interrupted run's weights
at the end: test loss and accuracy for classification, test MSE and RMSE for regression. It decides for itself when
it is due; the run loop only asks (`due`), as torchtitan's validator does.

`PolicyEvaluator` plays the greedy policy of the shared model (hogwild.workloads.a3c) every M
environment steps and says when the task is solved (`goal`), which ends the run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hogwild.config.schema import usable_cores

log = logging.getLogger("hogwild")

# Whether the final evaluation may widen this process's intra-op pool: only in a process that
# forks nothing after its run (the CLI running one job sets it). A process whose pool ran wide
# hangs any child it forks that asks for more than one thread (OpenMP after fork): a Hydra
# sweep's next job, or a Python API caller's own fork after `fit()`.
last_run_in_process = False
# The most intra-op threads this process's pool has run with in `every_core` (0: never
# widened); hogwild.run.preflight's check_threads then refuses fork with several threads per worker.
widened = 0


@contextlib.contextmanager
def every_core(start_method: str) -> Iterator[None]:
    """The workers have exited: the final evaluation may use every core this process may
    run on, when nothing is forked from it afterwards (`last_run_in_process`) nor was during
    the run (fork workers). Otherwise it stays at one thread, as during training."""
    global widened
    cores = usable_cores()
    if not last_run_in_process or start_method == "fork" or cores == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    widened = max(widened, cores)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SupervisedEvaluator:
    idle_cores = True  # may run on the cores the workers leave idle (hogwild.run.idle_evaluation)

    def __init__(
        self,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        loss_fn: Callable[..., torch.Tensor],
        regression: bool,
        device: torch.device,
        layout: Callable[[torch.Tensor], torch.Tensor],
        batch_size: int,
        epochs: int,
    ):
        self.x, self.y, self.loss_fn, self.regression = test_x, test_y, loss_fn, regression
        self.device, self.layout, self.batch_size, self.epochs = device, layout, batch_size, epochs
        self.evaluated_epochs: int | None = (
            None  # set by the first `due` to the epochs done at the start
        )
        self.last: tuple[float, float] | None = (
            None  # (loss, accuracy or RMSE) of the latest evaluation
        )
        self.last_label: str | None = None
        self.epochs_complete = 0

    def due(self, epochs_complete: int, units: int) -> str | None:
        if self.evaluated_epochs is None:  # a resumed run does not evaluate the epochs it inherited
            self.evaluated_epochs = epochs_complete
        self.epochs_complete = epochs_complete
        if epochs_complete <= self.evaluated_epochs or epochs_complete >= self.epochs:
            return None  # the last epoch: at the end (`needs_final`)
        self.evaluated_epochs = epochs_complete
        return f"epoch {epochs_complete}/{self.epochs}"

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        if label == "final" and self.epochs_complete >= self.epochs:
            label = f"epoch {self.epochs}/{self.epochs}"  # what a completed run's last line says
        was_training = model.training
        model.eval()
        loss_sum, correct, n = 0.0, 0, self.x.shape[0]
        try:
            for i in range(0, n, self.batch_size):
                x = self.layout(self.x[i : i + self.batch_size].to(self.device))
                y = self.y[i : i + self.batch_size].to(self.device)
                out = model(x)
                loss_sum += float(self.loss_fn(out, y, reduction="sum"))
                if not self.regression:
                    correct += int((out.argmax(1) == y).sum())
        finally:
            model.train(was_training)
        loss = loss_sum / n
        self.last, self.last_label = (loss, loss**0.5 if self.regression else correct / n), label
        if self.regression:
            log.info("%s: test loss %.4f, test RMSE %.4f", label, *self.last)
            return {"eval/loss": loss, "eval/rmse": self.last[1]}
        log.info("%s: test loss %.4f, test accuracy %.2f%%", label, loss, 100 * self.last[1])
        return {"eval/loss": loss, "eval/accuracy": self.last[1]}

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        # the last epoch's evaluation waits for this call (see `due`); only a run whose
        # final weights were scored already skips it
        seen = completed and self.last is not None and self.evaluated_epochs == self.epochs
        return weights_changed or not seen

    def results(self) -> dict[str, Any]:
        loss, score = self.last or (None, None)
        return {
            "test_loss": loss,
            "task": "regression" if self.regression else "classification",
            "test_accuracy": None if self.regression else score,
            "test_rmse": score if self.regression else None,
        }

    def goal(self) -> str | None:
        return None  # supervised runs end when every epoch is done


class PolicyEvaluator:
    """The greedy policy of the shared model on `episodes` episodes of its own environment,
    every `every` environment steps (all workers together), while the workers go on. The first
    evaluation whose mean return reaches `stop_at` solves the task: `goal()` then tells the run
    loop to stop the workers. `None` for `stop_at`: the run ends at its budget only."""

    idle_cores = False  # its `goal` ends the run: evaluated in the run loop, on time

    def __init__(
        self,
        env_factory: Callable[[], Any],
        seed: int,
        every: int,
        episodes: int,
        stop_at: float | None,
        started_at: float,
    ):
        self.env_factory, self.seed, self.every, self.episodes = env_factory, seed, every, episodes
        self.stop_at, self.started_at = stop_at, started_at
        self.env = None  # made at the first evaluation, in this process
        self.next_at: int | None = None  # set by the first `due`: a resumed run counts from there
        self.last: float | None = None
        self.best: float | None = None
        self.evaluations = 0
        self.solved_after: float | None = None  # seconds from the start of the run
        self.units = 0  # env steps when the latest evaluation was due
        self.solved_at_units: int | None = None

    def due(self, epochs_complete: int, units: int) -> str | None:
        if self.next_at is None:
            self.next_at = units + self.every
        if units < self.next_at:
            return None
        self.next_at, self.units = units + self.every, units
        return f"{units:,} env steps"

    def evaluate(self, model: torch.nn.Module, label: str) -> dict[str, float]:
        from hogwild.workloads import envs

        self.env = self.env or self.env_factory()
        returns = envs.play_greedy(model, self.env, self.episodes, self.seed)
        mean = sum(returns) / len(returns)
        self.last, self.evaluations = mean, self.evaluations + 1
        self.best = mean if self.best is None else max(self.best, mean)
        if self.solved_after is None and self.stop_at is not None and mean >= self.stop_at:
            self.solved_after = time.time() - self.started_at
            self.solved_at_units = self.units
        solved = f" >= {self.stop_at:g}: solved" if self.solved_after is not None else ""
        log.info(
            "%s: greedy return %.1f (min %.1f) over %d episodes%s",
            label,
            mean,
            min(returns),
            len(returns),
            solved,
        )
        return {"eval/return": mean, "eval/return_min": min(returns)}

    def needs_final(self, completed: bool, weights_changed: bool) -> bool:
        return self.solved_after is None  # a solved run keeps the evaluation that solved it

    def results(self) -> dict[str, Any]:
        return {
            "eval_return": self.last,
            "best_eval_return": self.best,
            "evaluations": self.evaluations,
            "stop_at_return": self.stop_at,
            "solved": self.solved_after is not None,
            "seconds_to_solve": None if self.solved_after is None else round(self.solved_after, 2),
            "env_steps_to_solve": self.solved_at_units,
        }

    def goal(self) -> str | None:
        if self.solved_after is None:
            return None
        return f"solved: greedy return {self.last:.1f} >= {self.stop_at:g}"
