"""The run's summary: one dataclass, from which both summary.json and the console report are made.

summary.json is strict JSON: a figure that is missing or not finite is `null`, never a bare NaN.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import time
from typing import Any

from hogwild.optim import shared_state
from hogwild.protocol import Control
from hogwild.reporting import staleness
from hogwild.reporting.sinks import ProgressWindow
from hogwild.reporting.text import plural, shown_path
from hogwild.run import folder
from hogwild.run.context import RunContext
from hogwild.run.state import RunState


@dataclasses.dataclass
class Summary:
    status: str  # a RunStatus's value: completed | interrupted | failed
    exit_code: int
    num_workers: int
    start_method: str
    sharing_strategy: str
    worker_sharing_strategies: list[str]  # what each worker reports it really runs with
    device: str
    threads_per_worker: int
    memory_format: str
    data_on_device: bool
    total_samples: int  # trained by this run (a resumed run: since it resumed)
    samples_seen: int  # in all, resumed runs included
    resumed_from: str | None
    wall_seconds: float  # the whole process
    train_seconds: float | None  # first worker's first step to last worker's last step
    startup_seconds: float | None  # fit() called -> first optimizer step of any worker
    samples_per_second: float | None  # total_samples / train_seconds
    final_train_loss: float | None
    skipped_steps: int  # batches skipped for a non-finite loss or gradient (skip_nonfinite=true)
    worker_restarts: int
    staleness: dict | None
    optimizer_shared: bool
    schedule: dict
    optimizer_state_steps: int | None  # the shared state's step counter: all workers' updates
    workload: dict[str, Any]  # the workload's facts and results (epochs, test_accuracy, ...)
    error: dict | None = None  # rank and reason of a failed run
    distributed: dict | None = None  # torchrun: rounds, sync cost, every node's figures
    fixed_costs: dict | None = None  # the wall clock outside training, phase by phase (timeline)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "workload"}
        out.update(self.workload)
        for key in ("error", "distributed", "fixed_costs"):
            if out[key] is None:
                del out[key]
        return _finite(out)

    def write(self, path: str) -> None:
        tmp = path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.to_dict(), f, indent=2, allow_nan=False)
            os.replace(tmp, path)
        except OSError:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def console_lines(self, output_dir: str) -> tuple[str | None, list[str]]:
        """(the failure line for stderr or None, the lines for stdout): results and where
        everything is."""
        s = self.to_dict()
        failure = None
        if self.status == "failed":
            error = self.error or {}
            who = (
                "" if error.get("rank", -1) < 0 else f"worker {error['rank']}: "
            )  # -1: the orchestrator
            failure = f"hogwild: run failed: {who}{error.get('reason')}"
        rel = shown_path(output_dir)
        checkpoint = os.path.join(output_dir, "checkpoints", "last.pt")
        rows = [
            *result_rows(s),
            (
                "samples/s",
                f"{'node 0: ' if self.distributed else ''}{fmt(self.samples_per_second, ',.0f')} "
                f"({plural(self.num_workers, 'worker')}, {self.start_method}, {self.sharing_strategy})",
            ),
            (
                "samples",
                f"{self.total_samples:,} in {fmt(self.train_seconds, '.2f')} s of training, "
                f"{self.wall_seconds:.1f} s in all",
            ),
            *_node_rows(self.distributed),
            *(
                [
                    (
                        "skipped",
                        f"{plural(self.skipped_steps, 'batch', 'batches')} with a non-finite loss or gradient",
                    )
                ]
                if self.skipped_steps
                else []
            ),
            ("run folder", rel),
            (
                "checkpoint",
                os.path.join(rel, "checkpoints", "last.pt")
                + (" (the last one before the failure)" if self.status == "failed" else "")
                if os.path.exists(checkpoint)
                else "none written",
            ),
            # the run folder, not its tensorboard/: TensorBoard would name the run "."; quoted
            # for the shell, so that the command can be pasted as it is (spaces, quotes, ...)
            ("dashboards", f"tensorboard --logdir {shlex.quote(rel)}"),
        ]
        return failure, [f"run {self.status}"] + [f"  {key:<14} {value}" for key, value in rows]


def result_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run achieved: the test scores, or for A3C the greedy return and whether (and
    when) it solved its task."""
    if "solved" in s:
        at = s.get("stop_at_return")
        solved = (
            f"yes, {s['seconds_to_solve']:.1f} s after the start (return >= {at:g})"
            if s["solved"]
            else "no" + ("" if at is None else f" (return {at:g} not reached)")
        )
        return [
            ("eval return", f"{fmt(s.get('eval_return'), '.1f')} (greedy, last evaluation)"),
            ("solved", solved),
            ("env steps", f"{s['env_steps']:,} ({fmt(s['env_steps_per_second'], ',.0f')}/s)"),
        ]
    if s.get("task") == "regression":
        score = ("test RMSE", fmt(s.get("test_rmse"), ".4f"))
    else:
        accuracy = s.get("test_accuracy") and 100 * s["test_accuracy"]
        score = ("test accuracy", fmt(accuracy, ".2f", "%"))
    return [score, ("test loss", fmt(s.get("test_loss"), ".4f"))]


def collect(
    ctx: RunContext,
    state: RunState,
    window: ProgressWindow,
    evaluation: dict[str, Any],
    initial: int,
    t_fit: float,
) -> Summary:
    """The summary of a run that has ended: what it was given (`ctx`), how it ended (`state`),
    what its workers reported (`window`), its evaluator's results, the samples it resumed at
    and when `fit` started (time.monotonic())."""
    cfg, plan, control = ctx.cfg, ctx.plan, ctx.control
    total_samples = int(control.progress[:, Control.SAMPLES].sum()) - initial
    t_first, t_last = control.train_span() or (None, None)
    train_seconds = t_last - t_first if t_first is not None and t_first < t_last else None
    wall_seconds = time.time() - ctx.started_at
    to_wall = time.time() - time.monotonic()  # the workers' step times are monotonic
    return Summary(
        status=state.status.value,
        exit_code=state.exit_code,
        num_workers=cfg.num_workers,
        start_method=cfg.start_method,
        sharing_strategy=cfg.sharing_strategy,
        worker_sharing_strategies=[state.hello[r].sharing_strategy for r in sorted(state.hello)],
        device=cfg.device,
        threads_per_worker=cfg.threads_per_worker,
        memory_format="channels_last" if plan.layout.channels_last else "contiguous",
        data_on_device=plan.data_on_device,
        total_samples=total_samples,
        samples_seen=initial + total_samples,
        resumed_from=plan.resume_from,
        wall_seconds=round(wall_seconds, 3),
        train_seconds=round(train_seconds, 4) if train_seconds else None,
        startup_seconds=round(t_first - t_fit, 3) if t_first is not None else None,
        samples_per_second=round(total_samples / train_seconds, 1) if train_seconds else None,
        final_train_loss=window.final_train_loss,
        skipped_steps=window.skipped,
        worker_restarts=state.restarts,
        staleness=staleness.summarize(control.staleness.numpy()),
        optimizer_shared=ctx.shared_optimizer,
        schedule=dataclasses.asdict(ctx.schedule),
        optimizer_state_steps=shared_state.steps(ctx.optimizer_state),
        workload={
            **ctx.workload.facts(),
            **evaluation,
            **_units(ctx.workload.unit, initial + total_samples, train_seconds, total_samples),
        },
        error=state.error,
        fixed_costs=ctx.setup.timeline.breakdown(
            wall_seconds,
            t_first and t_first + to_wall,
            t_last and t_last + to_wall,
        ),
    )


def _units(unit: str, seen: int, seconds: float | None, trained: int) -> dict[str, Any]:
    """A workload that counts something else than samples (A3C: env steps) gets its own
    names for the counts: `env_steps` (in all, resumed runs included) and its rate."""
    if unit == "samples":
        return {}
    key = unit.replace(" ", "_")
    return {key: seen, f"{key}_per_second": round(trained / seconds, 1) if seconds else None}


def hparams(ctx: RunContext) -> dict[str, Any]:
    """The HParams tab's columns (hogwild.reporting.dashboards.COLUMNS) and the run's trial id."""
    cfg, record = ctx.cfg, ctx.record
    choices = record.get("choices") or {}  # the config groups the CLI composed (hogwild.cli.main)
    factory = ctx.optimizer_factory
    names = {
        "experiment": choices.get("experiment") or "none",
        "data": choices.get("data") or ctx.workload.name,
        # a config's name (mlp, sgd) through the CLI, the class's through the Python API: both
        # in lower case, as config names are (sequential, sgd; not Sequential, SGD)
        "model": choices.get("model") or type(ctx.model).__name__.lower(),
        "optimizer": choices.get("optimizer")
        or getattr(getattr(factory, "func", factory), "__name__", "n/a").lower(),
    }
    job = folder.job_number(os.path.basename(ctx.output_dir))  # a sweep's job, or None
    return {
        **names,
        "num_workers": cfg.num_workers,
        "start_method": cfg.start_method,
        "sharing_strategy": cfg.sharing_strategy,
        "device": cfg.device,
        "threads_per_worker": cfg.threads_per_worker,
        **ctx.workload.facts(),
        "lr": getattr(factory, "keywords", {}).get("lr", "n/a"),
        # the table's Trial ID, unique (runs with the same one would share a row) and short
        # enough to be read: which job of a sweep, when; the columns say what ran
        "trial_id": ("" if job is None else f"#{job} ")
        + time.strftime("%m-%d %H:%M:%S", time.localtime(ctx.started_at)),
        "started_at": ctx.started_at,
    }


def hparam_metrics(s: Summary) -> dict[str, Any]:
    d = s.to_dict()
    keys = ("test_accuracy", "test_rmse", "test_loss", "samples_per_second", "eval_return")
    return {k: d.get(k) for k in keys}


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _node_rows(d: dict | None) -> list[tuple[str, str]]:
    """Under torchrun, the rows above are rank 0's own; these are the whole run's."""
    if not d:
        return []
    return [
        (
            "all nodes",
            f"{d['world_size']} nodes, {fmt(d['samples_per_second_all_nodes'], ',.0f')} samples/s "
            f"together, {fmt(d['samples_seen_all_nodes'], ',')} samples seen",
        ),
        (
            "sync",
            f"{d['sync_rounds']} rounds, {d['sync_seconds']:.2f} s (waited "
            f"{d.get('sync_wait_seconds') or 0:.2f} s, transfer {d.get('sync_transfer_seconds') or 0:.2f} s), "
            f"{d['sync_bytes'] / 2**20:,.1f} MiB",
        ),
    ]


def _finite(value: Any) -> Any:
    """NaN and infinities become None, at any depth: strict JSON, and the truth (no figure)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
