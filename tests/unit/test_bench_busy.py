"""The bench says when other work shared the cores (hogwild.bench.say_if_busy): a row with more
threads than idle cores measures the load as much as the code (issue 30)."""

from __future__ import annotations

from hogwild import bench


def rows(*shapes):
    return [{"num_workers": n, "threads": t} for n, t in shapes]


def test_a_busy_machine_is_said_with_the_rows_it_touched(capsys):
    assert bench.say_if_busy(1.3, 2, rows((1, 1), (2, 1), (1, 2)))
    err = capsys.readouterr().err
    assert "load average 1.3 on 2 cores" in err and "2 of 3 rows" in err and "1 idle core" in err


def test_a_quiet_machine_or_rows_that_fit_say_nothing(capsys):
    assert not bench.say_if_busy(0.2, 2, rows((2, 1), (1, 2)))
    assert not bench.say_if_busy(1.1, 4, rows((1, 1), (2, 1)))  # 3 idle cores: they fit
    assert capsys.readouterr().err == ""
