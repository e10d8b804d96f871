"""The typed seams: a workload is told from a data set by what it has (`Workload`), and every
implementation of the node and sink seams has every member its Protocol declares, with the
same parameters."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

import pytest
import torch

from hogwild.data import make_synthetic
from hogwild.distributed.node import LocalNode, Node
from hogwild.distributed.torchrun import NodeSync
from hogwild.reporting.dashboards import TensorBoardSink
from hogwild.reporting.sinks import NullSink, ProgressBar, Sink, Sinks
from hogwild.workloads import envs
from hogwild.workloads.a3c import A3CWorkload
from hogwild.workloads.base import Evaluator, NullEvaluator, Task, Workload
from hogwild.workloads.device import Layout
from hogwild.workloads.supervised import SupervisedWorkload

CPU = torch.device("cpu")


def members(protocol: type) -> set[str]:
    """What a Protocol declares: its public methods, properties and annotated attributes."""
    return {n for n in vars(protocol) if not n.startswith("_")} | set(
        inspect.get_annotations(protocol)
    )


def set_in_init(cls: type) -> set[str]:
    """The attributes `cls.__init__` assigns (`self.a = ...`, `self.a, self.b = ...`)."""
    if not inspect.isfunction(cls.__init__):  # object's own
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    targets = [t for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets]
    names = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return {
        e.attr
        for e in names
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self"
    }


def parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def assert_implements(cls: type, protocol: type) -> None:
    """Every member of `protocol` on `cls` (on the class, or set by its __init__); the methods
    with the protocol's parameter names."""
    have = set(dir(cls)) | set_in_init(cls)
    assert members(protocol) - have == set(), f"{cls.__name__} lacks them"
    for name in members(protocol):
        declared = vars(protocol).get(name)
        if inspect.isfunction(declared):
            assert parameters(getattr(cls, name)) == parameters(declared), f"{cls.__name__}.{name}"


def supervised() -> SupervisedWorkload:
    data = make_synthetic(num_samples=40, num_test_samples=10, input_shape=(1, 4, 4))
    return SupervisedWorkload(data, batch_size=8, epochs=1)


def a3c() -> A3CWorkload:
    return A3CWorkload(functools.partial(envs.gym_env, "CartPole-v1"))


def test_a_workload_is_told_from_a_data_set_by_what_it_has():
    assert isinstance(supervised(), Workload) and isinstance(a3c(), Workload)
    data = make_synthetic(num_samples=40, num_test_samples=10, input_shape=(1, 4, 4))
    assert not isinstance(data, Workload)


def test_the_workloads_evaluators_and_tasks_are_on_the_seam():
    for workload in (supervised(), a3c()):
        assert isinstance(workload.evaluator(CPU, Layout(), 8), Evaluator)
    assert isinstance(a3c().task(CPU, Layout()), Task)  # shares nothing: safe to make here
    assert isinstance(NullEvaluator(), Evaluator)
    assert_implements(NullEvaluator, Evaluator)


def test_the_null_evaluator_evaluates_nothing():
    ev = NullEvaluator()
    assert not ev.idle_cores and ev.due(1, 100) is None and ev.goal() is None
    assert not ev.needs_final(completed=True, weights_changed=True)
    assert ev.results() == {} and ev.evaluate(torch.nn.Linear(2, 2), "final") == {}


@pytest.mark.parametrize("cls", [LocalNode, NodeSync])
def test_both_nodes_have_every_member_of_the_node_seam(cls):
    assert {"rank", "is_writer", "goal_reached", "weights_change_at_end"} <= members(Node)
    assert_implements(cls, Node)  # NodeSync is not made: it joins a torch.distributed group


def test_the_local_node_is_a_node():
    assert isinstance(LocalNode(), Node)


def test_every_sink_is_a_sink(tmp_path):
    bar = ProgressBar(10)
    board = TensorBoardSink(str(tmp_path / "tensorboard"))
    try:
        for sink in (NullSink(), bar, board, Sinks(NullSink(), bar)):
            assert isinstance(sink, Sink)
            assert_implements(type(sink), Sink)
    finally:
        bar.close()
        board.close()
