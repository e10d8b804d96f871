"""What TensorBoard shows: run folders named after what ran, one TensorBoard run per worker,
and an HParams row whose columns are the same in every run."""

from __future__ import annotations

import json

import pytest

from hogwild.reporting.dashboards import COLUMNS, METRICS, TensorBoardSink, hparams_summaries


def run_dirs(overrides=()) -> tuple[str, str]:
    from hydra import compose, initialize_config_dir

    from hogwild.cli.main import config_dir, register_defaults

    register_defaults()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    return cfg.hydra.run.dir, cfg.hydra.sweep.dir


@pytest.mark.parametrize(
    "overrides, name",
    [
        ([], "digits-mlp"),
        (["data=synthetic", "model=convnet"], "synthetic-convnet"),
        (["+experiment=mnist"], "mnist"),
    ],
)
def test_a_run_folder_names_the_experiment_or_data_and_model_then_the_time(overrides, name):
    run_dir, sweep_dir = run_dirs(overrides)
    folder, when = run_dir.split("/")[1:]
    assert run_dir.startswith("outputs/") and folder == name
    assert len(when) == len("2026-12-04_03-40-38") and when[10] == "_"
    # a sweep's folder is the same for all its jobs, whatever they vary: the time only
    assert sweep_dir == f"outputs/multirun/{when}"


def events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return acc


def test_each_worker_gets_its_own_run_with_the_same_tags(tmp_path):
    sink = TensorBoardSink(str(tmp_path))
    values = {"train/loss": 1.0, "workers/loss/rank_00": 2.0, "workers/loss/rank_01": 3.0}
    sink.scalars(values, 64)
    sink.scalars({"workers/staleness/rank_01": 0.5, "workers/restarts": 1}, 128)
    sink.close()
    assert events(tmp_path).Tags()["scalars"] == ["train/loss", "workers/restarts"]
    rank_1 = events(tmp_path / "w1")
    assert sorted(rank_1.Tags()["scalars"]) == ["workers/loss", "workers/staleness"]
    assert [(e.step, e.value) for e in rank_1.Scalars("workers/loss")] == [(64, 3.0)]
    assert events(tmp_path / "w0").Tags()["scalars"] == ["workers/loss"]


def plugin_data(summaries):
    """{tag: HParamsPluginData} of the experiment and session start summaries."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    return {
        pb.value[0].tag: plugin_data_pb2.HParamsPluginData.FromString(
            pb.value[0].metadata.plugin_data.content
        )
        for pb in summaries
    }


def test_every_run_describes_the_same_columns_and_writes_integers_as_text():
    from tensorboard.plugins.hparams import metadata

    mlp = {"experiment": "none", "data": "digits", "num_workers": 4, "lr": 0.05, "epochs": 2}
    mf = {"experiment": "matrix_factorization", "num_workers": 2, "lr": "n/a", "trial_id": "t"}
    a, b = plugin_data(hparams_summaries(mlp)), plugin_data(hparams_summaries(mf))
    # TensorBoard takes the first experiment it finds for the whole log folder
    assert a[metadata.EXPERIMENT_TAG] == b[metadata.EXPERIMENT_TAG]
    experiment = a[metadata.EXPERIMENT_TAG].experiment
    titles = [h.display_name for h in experiment.hparam_infos]
    assert (
        titles[:5]
        == ["data", "model", "optimizer", "workers", "lr"]
        == [title for _, title, _ in COLUMNS[:5]]
    )
    names = [h.name for h in experiment.hparam_infos]
    assert names == sorted(names)  # TensorBoard orders the columns by name
    assert [m.name.tag for m in experiment.metric_infos] == [tag for _, tag, _, _ in METRICS]
    start = {
        name.split("_", 1)[1]: value
        for name, value in a[metadata.SESSION_START_INFO_TAG].session_start_info.hparams.items()
    }
    assert start["num_workers"].string_value == "4" and start["epochs"].string_value == "2"
    assert start["lr"].number_value == 0.05 and start["data"].string_value == "digits"
    mf_start = b[metadata.SESSION_START_INFO_TAG].session_start_info
    assert mf_start.group_name == "t"  # the Trial ID
    assert (
        "06_lr" not in mf_start.hparams
    )  # no number: no value, rather than text in a number column


def test_the_hparams_metrics_are_one_point_each_under_summary(tmp_path):
    sink = TensorBoardSink(str(tmp_path))
    sink.results(
        "completed", {"test_accuracy": 0.9, "test_rmse": None, "samples_per_second": 269190.0}, 1000
    )
    sink.close()
    acc = events(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["summary/ksamples_per_second", "summary/test_accuracy"]
    ((point,),) = [acc.Scalars("summary/ksamples_per_second")]
    assert point.step == 1000 and point.value == pytest.approx(269.19)


def test_an_interrupted_run_stays_open_until_its_resumed_run_completes_it(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import api_pb2, metadata

    for trial, status in (("first", "interrupted"), ("resumed", "completed")):
        sink = TensorBoardSink(str(tmp_path))  # the same folder: resume_from continues it
        sink.hparams({"trial_id": trial, "num_workers": 2})
        sink.results(status, {"test_accuracy": 0.9}, 100)
        sink.close()
    board = EventMultiplexer()
    board.AddRunsFromDirectory(str(tmp_path))
    board.Reload()
    tags = board.PluginRunToTagToContent("hparams")["."]
    # TensorBoard keeps a tag's first metadata: the first run's row, the first status written
    start = metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
    end = metadata.parse_session_end_info_plugin_data(tags[metadata.SESSION_END_INFO_TAG])
    assert start.group_name == "first" and end.status == api_pb2.STATUS_SUCCESS


def test_custom_scalars_lay_out_each_kind_of_task_apart_with_only_its_own_charts(tmp_path):
    """Two runs of different tasks in one log folder, merged as TensorBoard's Custom Scalars
    tab merges them: a category per task, no chart of a metric the task does not have."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin

    runs = {
        "digits": ("classification", {"train/loss": 1.0, "eval/accuracy": 0.9}),
        "ratings": ("regression", {"train/loss": 1.0, "eval/rmse": 0.5}),
    }
    for name, (kind, values) in runs.items():
        sink = TensorBoardSink(str(tmp_path / name / "tensorboard"), kind)
        sink.scalars({**values, "workers/loss/rank_00": 2.0}, 64)
        sink.scalars({"perf/samples_per_second": 10.0}, 128)  # a new tag: laid out again
        sink.close()
    board = EventMultiplexer()
    board.AddRunsFromDirectory(str(tmp_path))
    board.Reload()
    provider = data_provider.MultiplexerDataProvider(board, str(tmp_path))
    plugin = CustomScalarsPlugin(
        base_plugin.TBContext(data_provider=provider, multiplexer=board, logdir=str(tmp_path))
    )
    merged = json.loads(plugin.layout_impl(context.RequestContext(), ""))
    charts = {c["title"]: [chart["title"] for chart in c["chart"]] for c in merged["category"]}
    assert charts == {
        "classification": [
            "eval/accuracy",
            "perf/samples_per_second",
            "train/loss",
            "workers/loss",
        ],
        "regression": ["eval/rmse", "perf/samples_per_second", "train/loss", "workers/loss"],
    }
    (chart,) = [c for c in merged["category"][0]["chart"] if c["title"] == "workers/loss"]
    assert chart["multiline"]["tag"] == ["^workers/loss$"]  # drawn from the workers' runs
