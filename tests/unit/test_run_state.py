"""The run loop's rules, driven with hand-made events: no processes, no clocks."""

from __future__ import annotations

import signal

import pytest

from hogwild.protocol import Done, EpochEnd, Failure, Hello
from hogwild.run.state import (
    Exited,
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


def state(**kw) -> RunState:
    return RunState(num_workers=2, **kw)


def test_a_run_whose_workers_all_finish_completes_with_exit_code_0():
    st = state()
    for rank in (0, 1):
        assert st.apply(Done(rank)) == []
        assert st.apply(Exited(rank, 0)) == []
    assert st.running
    st.all_exited()
    assert (st.status, st.exit_code, st.error) == ("completed", 0, None)


def test_a_worker_that_dies_without_done_fails_the_run_with_its_exit_code():
    st = state()
    actions = st.apply(Exited(1, -9))
    assert [type(a) for a in actions] == [Failed, StopWorkers]
    failure = actions[0].failure
    assert (failure.rank, failure.reason, failure.exitcode, failure.signal_name) == (
        1,
        "killed by SIGKILL",
        -9,
        "SIGKILL",
    )
    assert st.status == "failed" and st.exit_code == 1
    assert st.error == {"rank": 1, "reason": "killed by SIGKILL"}


def test_a_worker_that_said_why_fails_the_run_with_its_message_and_traceback():
    st = state()
    st.apply(Failure(0, "exception", "ZeroDivisionError: boom", "Traceback ..."))
    (failed, _) = st.apply(Exited(0, 1))
    assert failed.failure.reason == "ZeroDivisionError: boom"
    assert failed.failure.traceback == "Traceback ..." and failed.failure.exitcode == 1


def test_a_clean_exit_without_done_is_a_failure_too():
    st = state()
    st.apply(Exited(0, 0))
    assert st.status == "failed" and st.error["reason"] == "exit code 0"


def test_restart_replaces_a_dead_worker_up_to_max_restarts():
    st = state(on_failure="restart", max_restarts=2)
    for count in (1, 2):
        (restart,) = st.apply(Exited(1, -9))
        assert isinstance(restart, Restart) and (restart.failure.rank, restart.count) == (1, count)
        assert st.running
    assert isinstance(st.apply(Exited(1, -9))[0], Failed)  # the third death ends the run
    assert st.status == "failed" and st.restarts == 2


def test_a_non_finite_loss_is_never_restarted():
    st = state(on_failure="restart", max_restarts=5)
    st.apply(Failure(1, "nonfinite", "worker 1: non-finite loss (nan)", ""))
    assert isinstance(st.apply(Exited(1, 1))[0], Failed)


def test_deaths_while_stopping_are_no_news():
    st = state()
    st.apply(Exited(0, -9))
    assert st.apply(Exited(1, -15)) == []  # ended by the shutdown
    assert st.error["rank"] == 0


@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_signal_interrupts_the_run_and_sets_its_exit_code(signum, code):
    st = state()
    (stop,) = st.apply(Signal(signum))
    assert isinstance(stop, StopWorkers) and stop.reason == signal.Signals(signum).name
    assert st.status == "interrupted" and st.exit_code == code and st.error is None


def test_the_grace_period_then_terminate():
    st = state(grace_seconds=5.0)
    assert st.apply(Tick(100.0)) == []  # running: nothing is due
    st.apply(Signal(signal.SIGINT))
    assert st.apply(Tick(100.0)) == []  # the grace period starts
    assert st.apply(Tick(104.9)) == []
    assert st.apply(Tick(105.0)) == [Terminate()]


def test_a_second_signal_terminates_at_the_next_tick():
    st = state(grace_seconds=60.0)
    st.apply(Signal(signal.SIGINT))
    st.apply(Tick(0.0))
    assert st.apply(Signal(signal.SIGINT)) == []
    assert st.apply(Tick(0.1)) == [Terminate()]
    assert st.status == "interrupted" and st.signal == signal.SIGINT  # the first one counts


def test_a_run_failed_by_the_orchestrator_names_rank_minus_one():
    st = state()
    (stop,) = st.apply(RunFailed("node 1: sync round 3 failed"))
    assert isinstance(stop, StopWorkers)
    assert st.error == {"rank": -1, "reason": "node 1: sync round 3 failed"}


def test_a_node_leaving_after_ctrl_c_does_not_turn_an_interrupt_into_a_failure():
    st = state()
    st.apply(Signal(signal.SIGINT))
    assert st.apply(RunFailed("node 1: the peer left")) == []
    assert st.status == "interrupted" and st.error is None


def test_a_goal_reached_completes_the_run_and_stops_the_workers():
    st = state()
    (stop,) = st.apply(Finished("solved"))
    assert isinstance(stop, StopWorkers) and st.status == "completed" and st.exit_code == 0
    assert st.finished_reason == "solved"


def test_epochs_complete_is_the_slowest_ranks():
    st = state(epochs_done=[1, 1])
    assert st.epochs_complete == 1
    st.apply(EpochEnd(0, 1))
    assert st.epochs_complete == 1
    st.apply(EpochEnd(1, 1))
    assert st.epochs_complete == 2
    st.apply(EpochEnd(1, 0))  # an old message never lowers the count
    assert st.epochs_done == [2, 2]


def test_hello_is_kept():
    st = state()
    st.apply(Hello(1, "file_system", 1))
    assert st.hello[1].sharing_strategy == "file_system"


def test_the_status_never_goes_back():
    st = state()
    st.apply(Signal(signal.SIGTERM))
    st.apply(Exited(0, -9))
    st.apply(Finished("solved"))
    st.all_exited()
    assert st.status == "interrupted" and st.exit_code == 143


# ---- hung workers (trainer.stall_seconds) ----


def test_a_worker_whose_steps_stop_moving_for_stall_seconds_is_judged_hung_once():
    st = state(stall_seconds=10)
    assert st.apply(Tick(0.0, (5, 5))) == []
    assert st.apply(Tick(9.0, (6, 5))) == []  # rank 0 moved; rank 1 still within 10 s
    assert st.apply(Tick(10.0, (7, 5))) == [Stalled(1, 10.0)]
    assert st.failures[1].message == "hung: no step for 10 s (trainer.stall_seconds=10)"
    assert st.apply(Tick(30.0, (7, 5))) == [Stalled(0, 20.0)]  # rank 1 is not judged twice


def test_a_finished_worker_or_stall_seconds_0_is_never_judged_hung():
    st = state(stall_seconds=10)
    st.apply(Done(1))
    st.apply(Tick(0.0, (0, 3)))
    assert st.apply(Tick(5.0, (1, 3))) == []
    assert st.apply(Tick(50.0, (2, 3))) == []
    never = state()
    never.apply(Tick(0.0, (0, 0)))
    assert never.apply(Tick(1e6, (0, 0))) == []


def test_a_replacement_worker_gets_a_fresh_clock():
    st = state(stall_seconds=10, on_failure="restart", max_restarts=1)
    st.apply(Tick(0.0, (4, 4)))
    assert isinstance(st.apply(Exited(1, -9))[0], Restart)
    assert st.apply(Tick(9.0, (5, 4))) == []  # rank 1's clock starts again at 9 s
    assert st.apply(Tick(18.0, (6, 4))) == []
    assert st.apply(Tick(19.0, (7, 4))) == [Stalled(1, 10.0)]


def test_a_death_past_the_restart_budget_says_that_no_restart_was_left():
    st = state(on_failure="restart", max_restarts=1)
    (restart,) = st.apply(Exited(1, -9))
    assert isinstance(restart, Restart) and restart.failure.reason == "killed by SIGKILL"
    failed, _ = st.apply(Exited(1, -9))
    reason = "killed by SIGKILL; no restart left (trainer.max_restarts=1 used)"
    assert isinstance(failed, Failed) and failed.failure.reason == reason
    assert failed.failure.exitcode == -9 and st.error == {"rank": 1, "reason": reason}
    assert str(failed.failure) == f"worker 1 failed: {reason}"


def test_no_restart_allowed_and_no_restart_policy_say_what_applies():
    st = state(on_failure="restart", max_restarts=0)
    st.apply(Exited(0, 3))
    assert st.error["reason"] == "exit code 3; no restart left (trainer.max_restarts=0)"
    st = state(on_failure="stop", max_restarts=3)  # the budget is no part of a stopping run
    st.apply(Exited(0, 3))
    assert st.error["reason"] == "exit code 3"
