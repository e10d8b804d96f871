"""What crosses the process boundary: small messages of plain scalars, one shared control block,
exit codes described the same way everywhere."""

from __future__ import annotations

import pickle
import signal

import pytest
import torch

from hogwild import protocol
from hogwild.errors import WorkerFailure, describe_exit
from hogwild.protocol import Control

MESSAGES = [
    protocol.Hello(0, "file_descriptor", 1),
    protocol.Scalars(1, {"episode_return": 20.0}),
    protocol.EpochEnd(0, 3),
    protocol.Log(1, 20, "hello"),
    protocol.Done(1),
    protocol.Failure(1, "exception", "ZeroDivisionError: x", "Traceback ..."),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_are_plain_scalars_that_pickle_small(message):
    values = [v for f in message for v in (f.values() if isinstance(f, dict) else [f])]
    assert all(isinstance(v, (int, float, str)) for v in values)  # never a tensor
    data = pickle.dumps(message)
    assert pickle.loads(data) == message and len(data) < 200


def test_control_block_views_share_one_storage_and_pickle_it_once():
    control = Control(3)
    assert control.progress.shape == (3, 4) and control.staleness.shape[0] == 3
    assert (
        control.progress.untyped_storage().data_ptr() == control.table.untyped_storage().data_ptr()
    )
    control.progress[2, Control.SAMPLES] = 7
    assert int(control.table[2, Control.SAMPLES]) == 7
    control.reports[2, Control.LOSS] = 1.5  # float64 counters in the same int64 storage
    assert (
        control.reports.untyped_storage().data_ptr() == control.table.untyped_storage().data_ptr()
    )
    assert control.reports[2, Control.LOSS] == 1.5 and control.progress[2].tolist() == [0, 0, 7, 0]
    assert set(control.__getstate__()) == {"stop", "table"}
    assert len(control.tensors()) == Control.NUM_TENSORS
    again = Control.__new__(Control)
    again.__setstate__(control.__getstate__())
    again.progress[0, Control.STEPS] = 5
    again.reports[0, Control.T_LAST] = 2.5
    assert int(control.progress[0, Control.STEPS]) == 5  # the views of the copy see the same memory
    assert control.reports[0, Control.T_LAST] == 2.5


def test_control_block_lives_in_shared_memory():
    control = Control(2)
    assert control.stop.is_shared() and control.table.is_shared()
    assert control.table.dtype == torch.int64


@pytest.mark.parametrize(
    "code, text",
    [(None, "still running"), (0, "exit code 0"), (7, "exit code 7"), (-9, "killed by SIGKILL"),
     (-11, "killed by SIGSEGV"), (-200, "killed by signal 200")],
)  # fmt: skip
def test_exits_are_described_for_people(code, text):
    assert describe_exit(code) == text


def test_a_worker_failure_is_a_typed_value():
    killed = WorkerFailure(2, describe_exit(-signal.SIGKILL), -signal.SIGKILL)
    assert str(killed) == "worker 2 failed: killed by SIGKILL" and killed.signal_name == "SIGKILL"
    assert killed.restartable
    raised = WorkerFailure(0, "ValueError: x", 1, "Traceback ...", kind="exception")
    assert raised.signal_name is None and raised.traceback == "Traceback ..."
    assert not WorkerFailure(0, "nan", 1, kind="nonfinite").restartable
