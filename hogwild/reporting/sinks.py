"""Metric sinks, owned by the orchestrator: TensorBoard (hogwild.reporting.dashboards), one tqdm bar.

Call sites never branch on "is TensorBoard on?": they talk to a `Sinks` fan-out of `Sink`s, and
a sink that is off is simply not in it (`NullSink`: the do-nothing sink, and the base of the
others, which override what they write). The x axis everywhere is the global number of training
samples seen, which is what means something when N workers step at their own pace.
Tags are grouped with `/`: train/, eval/, perf/, and workers/<metric>/rank_NN (written by
hogwild.reporting.dashboards as one TensorBoard run per rank: one chart per metric, one line per worker).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from hogwild.protocol import Control

log = logging.getLogger("hogwild")


@runtime_checkable
class Sink(Protocol):
    """Where the orchestrator's metrics go (what `Sinks` fans out to)."""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Scalar values by tag (train/loss, workers/loss/rank_03, ...) at `step` samples seen."""

    def advance(self, samples: int, postfix: Mapping[str, Any]) -> None:
        """`samples` more done; `postfix`: the figures a progress bar shows beside it."""

    def hparams(self, hparams: Mapping[str, Any]) -> None:
        """The run's settings, as it starts (TensorBoard's HParams row)."""

    def results(self, status: str, metrics: Mapping[str, float | None], step: int) -> None:
        """The run's end: its status and summary metrics."""

    def close(self) -> None:
        """Flush and release (files, the terminal)."""


class NullSink:
    """Writes nothing: a node that does not write, and the base of the other sinks."""

    def scalars(self, values: Mapping[str, float], step: int) -> None: ...

    def advance(self, samples: int, postfix: Mapping[str, Any]) -> None: ...

    def hparams(self, hparams: Mapping[str, Any]) -> None: ...

    def results(self, status: str, metrics: Mapping[str, float | None], step: int) -> None: ...

    def close(self) -> None: ...


class Sinks(NullSink):
    """The fan-out. A sink that fails (a full disk under TensorBoard, a closed terminal) is
    dropped with one warning: dashboards are never worth a run."""

    def __init__(self, *sinks: Sink):
        self.sinks = list(sinks)

    def _each(self, method: str, *args) -> None:
        for s in list(self.sinks):
            try:
                getattr(s, method)(*args)
            except Exception as e:  # noqa: BLE001 - any sink error: drop the sink, go on
                self.sinks.remove(s)
                log.warning(
                    "%s stopped (%s: %s); training goes on", type(s).__name__, type(e).__name__, e
                )

    def scalars(self, values, step):
        self._each("scalars", values, step)

    def advance(self, samples, postfix):
        self._each("advance", samples, postfix)

    def hparams(self, hparams):
        self._each("hparams", hparams)

    def results(self, status, metrics, step):
        self._each("results", status, metrics, step)

    def close(self):
        self._each("close")


class ProgressBar(NullSink):
    """One bar: samples done, samples/s, loss, ETA. Disabled when stderr is not a terminal
    unless HOGWILD_PROGRESS=1 (logs of batch jobs stay readable).

    Its samples/s is the average since training began (not a moving window, and not counting
    the start-up), which is what the report at the end calls samples/s."""

    def __init__(self, total_samples: int, initial: int = 0, unit: str = "samples"):
        from tqdm import tqdm

        force = os.environ.get("HOGWILD_PROGRESS")
        self.bar = tqdm(
            total=total_samples,
            initial=initial,
            unit=" " + unit if " " in unit else unit,  # "env steps": "1.2k env steps/s"
            unit_scale=True,
            dynamic_ncols=True,
            disable=None if force is None else force == "0",
            desc="train",
            smoothing=0,  # the average rate, from the start time set below
        )
        self.training = False

    def advance(self, samples, postfix):
        self.bar.update(samples)
        if not self.training and not self.bar.disable:  # the first samples: training began now
            self.training = True
            self.bar.initial, self.bar.start_t = self.bar.n, self.bar._time()
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self):
        self.bar.close()


class ProgressWindow:
    """The workers' counters (hogwild.protocol.Control), sampled at most every `interval`
    seconds and written to the sinks as the change since the last sample.

    Workers may publish every step; the orchestrator reads the table only when a write is due,
    so its own cost stays flat however often the workers report.
    """

    def __init__(self, control, interval: float = 0.5, unit: str = "samples"):
        self.interval = interval
        self.rate_tag = f"perf/{unit.replace(' ', '_')}_per_second"  # what the workload counts
        self._progress = control.progress.numpy()
        self._reports = control.reports.numpy()
        self.last_loss: dict[int, float] = {}  # latest mean loss per rank (for final_train_loss)
        self._take()

    def _take(self, samples=None, loss=None) -> None:
        """The baseline of the next write: the counters as the last write read them (workers
        step meanwhile: a second read would lose what they did in between)."""
        self.t_start = time.monotonic()
        self._samples = self._progress[:, Control.SAMPLES].copy() if samples is None else samples
        self._loss = (
            self._reports[:, [Control.LOSS, Control.LOSS_STEPS]].copy() if loss is None else loss
        )

    @property
    def samples_seen(self) -> int:
        """All workers together, a resumed run's earlier samples included."""
        return int(self._progress[:, Control.SAMPLES].sum())

    @property
    def skipped(self) -> int:
        """Batches skipped for a non-finite loss or gradient, in all."""
        return int(self._reports[:, Control.SKIPPED].sum())

    def due(self) -> bool:
        return time.monotonic() - self.t_start >= self.interval

    def seconds_to_due(self) -> float:
        return max(0.0, self.t_start + self.interval - time.monotonic())

    def flush(self, sinks: Sink) -> None:
        elapsed = max(time.monotonic() - self.t_start, 1e-9)
        now_samples = self._progress[:, Control.SAMPLES].copy()  # one read of each counter
        now_loss = self._reports[:, [Control.LOSS, Control.LOSS_STEPS]].copy()
        samples, loss = now_samples - self._samples, now_loss - self._loss
        values: dict[str, float] = {}
        if samples.any():
            values[self.rate_tag] = float(samples.sum()) / elapsed
            for rank in samples.nonzero()[0]:
                values[f"workers/samples_per_second/rank_{rank:02d}"] = samples[rank] / elapsed
        ranks = loss[:, 1].nonzero()[0]  # the ranks that published a loss since the last write
        if ranks.size:
            total = loss[ranks].sum(axis=0)
            values["train/loss"] = float(total[0] / total[1])
            values["train/lr"] = float(self._reports[ranks, Control.LR].mean())
            for rank in ranks:
                self.last_loss[int(rank)] = float(loss[rank, 0] / loss[rank, 1])
                values[f"workers/loss/rank_{rank:02d}"] = self.last_loss[int(rank)]
        if values:
            if self.skipped:
                values["train/skipped_steps"] = self.skipped
            sinks.scalars(values, self.samples_seen)
            loss_text = {"loss": f"{values['train/loss']:.4f}"} if "train/loss" in values else {}
            sinks.advance(int(samples.sum()), loss_text)
        self._take(now_samples, now_loss)

    @property
    def final_train_loss(self) -> float | None:
        if not self.last_loss:
            return None
        return sum(self.last_loss.values()) / len(self.last_loss)
