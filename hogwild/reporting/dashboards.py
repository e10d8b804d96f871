"""TensorBoard, as the orchestrator writes it (docs/dashboards.md lists every tag).

    <run folder>/tensorboard/     train/ eval/ perf/ staleness/ summary/ + HParams row
    <run folder>/tensorboard/w0/  workers/loss, workers/samples_per_second, ... of worker 0
    <run folder>/tensorboard/w1/  the same tags: one chart per metric, one line per worker

Callers write flat tags; a per-rank tag (`workers/loss/rank_03`) goes to that rank's own
TensorBoard run under the tag without its rank (`workers/loss`), so that TensorBoard overlays the
workers of a run in one chart with one y axis instead of one card per rank.

The HParams row, written as the run starts: every run writes the same experiment description
(the columns and metrics below), since TensorBoard takes the first one it finds for the whole log
folder. The metrics, written at the end, are one-point scalars under `summary/`, a group that
sorts after eval/ and perf/ in the Scalars view.
TensorBoard prints every number in that table with 5 significant digits (2 -> "2.0000", 269190 ->
"2.6919e+5"): integers are written as text and throughput in thousands.

The Custom Scalars tab, one category per kind of task: each run lays out the tags it has written
under its workload's kind ("classification", "regression", "reinforcement learning"), one chart
per tag, the workers' tags drawn from their runs. TensorBoard merges the runs' layouts by
category title, so a log folder that mixes tasks shows each task's charts apart, and no chart
of a metric that task does not have (the Scalars tab shows every tag of every run). A chart
draws its tag from every ticked run, of any task, that has it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from hogwild.reporting.sinks import NullSink

_RANK_TAG = re.compile(r"^(?P<tag>.+)/rank_(?P<rank>\d+)$")

# (key in hogwild.run.summary.hparams(), column title, kind): the table shows the first five
# (TensorBoard sorts columns by name: the names carry the order, the titles are what one reads);
# the experiment is in the run's path (outputs/mnist/...), the learning rate is not
COLUMNS = [
    ("data", "data", str),
    ("model", "model", str),
    ("optimizer", "optimizer", str),
    ("num_workers", "workers", int),
    ("lr", "lr", float),
    ("experiment", "experiment", str),
    ("batch_size", "batch size", int),
    ("epochs", "epochs", int),
    ("start_method", "start method", str),
    ("sharing_strategy", "sharing strategy", str),
    ("device", "device", str),
    ("threads_per_worker", "threads per worker", int),
    ("num_train", "training samples", int),
]
# (key in hogwild.run.summary.hparam_metrics(), tag, column title, scale)
METRICS = [
    ("test_accuracy", "summary/test_accuracy", "test accuracy", 1.0),
    ("test_rmse", "summary/test_rmse", "test RMSE", 1.0),
    ("test_loss", "summary/test_loss", "test loss", 1.0),
    ("samples_per_second", "summary/ksamples_per_second", "k samples/s", 1e-3),
]
# the HParams tab's Status filter offers Success, Failure, Unknown and Running (not Aborted,
# whose rows it would hide): an interrupted run stays Unknown
_STATUS = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}


def column_name(i: int, key: str) -> str:
    return f"{i + 1:02d}_{key}"


class TensorBoardSink(NullSink):
    def __init__(self, log_dir: str, kind: str = "training"):
        from torch.utils.tensorboard import SummaryWriter  # imported only where it is used

        _quiet_writer_threads()
        self.log_dir, self._writer_class, self.kind = log_dir, SummaryWriter, kind
        self.writer = SummaryWriter(log_dir=log_dir)
        self.ranks: dict[int, Any] = {}  # rank -> its writer, opened at its first value
        self.tags: dict[str, None] = {}  # every tag written (the workers' without their rank)
        self._laid_out = 0  # how many of them the last Custom Scalars layout had

    def _rank_writer(self, rank: int):
        if rank not in self.ranks:
            path = os.path.join(self.log_dir, f"w{rank}")  # listed beneath the run: w0, w1
            self.ranks[rank] = self._writer_class(log_dir=path)
        return self.ranks[rank]

    def scalars(self, values, step):
        for tag, value in values.items():
            m = _RANK_TAG.match(tag)
            if m:
                self._rank_writer(int(m["rank"])).add_scalar(m["tag"], value, step)
            else:
                self.writer.add_scalar(tag, value, step)
            self.tags[m["tag"] if m else tag] = None
        if len(self.tags) > self._laid_out:  # a new tag: TensorBoard reads the last layout
            self._laid_out = len(self.tags)
            self.writer.file_writer.add_summary(layout(self.kind, self.tags), step)

    def hparams(self, hparams):
        """The run's HParams row, as it starts (its Status: Unknown until it ends): `hparams`
        from hogwild.run.summary.hparams, the COLUMNS plus `trial_id` and `started_at`."""
        for pb in hparams_summaries(hparams):
            self.writer.file_writer.add_summary(pb)

    def results(self, status, metrics, step):
        """The row's metrics (`metrics` from hogwild.run.summary.hparam_metrics), and its status. An
        interrupted run leaves it open: TensorBoard keeps the first status a run writes, and a
        resumed run ends it."""
        for key, tag, _, scale in METRICS:
            if metrics.get(key) is not None:
                self.writer.add_scalar(tag, float(metrics[key]) * scale, step)
        if status in _STATUS:
            self.writer.file_writer.add_summary(session_end(status))

    def close(self):
        for w in [self.writer, *self.ranks.values()]:
            w.flush()
            w.close()


def layout(kind: str, tags) -> Any:
    """The Custom Scalars layout of a run: one category, titled by its kind of task, with one
    chart per tag (a regex matching that tag alone, in the run and its workers' runs)."""
    from torch.utils.tensorboard.summary import custom_scalars

    charts = {tag: ["Multiline", [f"^{re.escape(tag)}$"]] for tag in sorted(tags)}
    return custom_scalars({kind: charts})


def hparams_summaries(hparams: Mapping[str, Any]) -> list:
    """The experiment (columns, metrics) and the session start (this run's values), as
    TensorBoard summary protos."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    experiment = api_pb2.Experiment(
        hparam_infos=[
            api_pb2.HParamInfo(
                name=column_name(i, key),
                display_name=title,
                type=api_pb2.DATA_TYPE_FLOAT64 if kind is float else api_pb2.DATA_TYPE_STRING,
            )
            for i, (key, title, kind) in enumerate(COLUMNS)
        ],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=title)
            for _, tag, title, _ in METRICS
        ],
    )
    start = plugin_data_pb2.SessionStartInfo(
        group_name=str(hparams.get("trial_id", "")),
        start_time_secs=float(hparams.get("started_at") or time.time()),
    )
    for i, (key, _, kind) in enumerate(COLUMNS):
        value = hparams.get(key)
        if value is None:
            continue
        if kind is not float:
            start.hparams[column_name(i, key)].string_value = str(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            start.hparams[column_name(i, key)].number_value = float(value)
    return [
        _summary(metadata.EXPERIMENT_TAG, experiment=experiment),
        _summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
    ]


def session_end(status: str):
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    end = plugin_data_pb2.SessionEndInfo(status=_STATUS[status], end_time_secs=time.time())
    return _summary(metadata.SESSION_END_INFO_TAG, session_end_info=end)


def _summary(tag: str, **data):
    """A summary proto holding HParamsPluginData(**data) under `tag`."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    pb = Summary()
    pb.value.add(
        tag=tag,
        metadata=metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(**data)),
        tensor=metadata.NULL_TENSOR,
    )
    return pb


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread keeps a write error (a full disk) for the next add_* or
    close, where Sinks reports it in one line, and then re-raises it in the thread, where
    Python would print a traceback: that second copy is dropped."""
    previous = threading.excepthook
    if getattr(previous, "hogwild", False):
        return

    def hook(args) -> None:
        writer_thread = type(args.thread).__name__ == "_AsyncWriterThread"
        if not (writer_thread and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.hogwild = True
    threading.excepthook = hook
