"""The progress of ``attnflow figures`` counts seconds of expected work: finished scripts
in full, running ones by the time they have run (capped), first-in first-out on the
workers."""

from __future__ import annotations

import time

from attnflow.experiments._progress import WorkProgress


def test_work_progress_counts_running_and_finished_scripts():
    order = ["long", "mid", "short", "tiny"]
    expected = {"long": 100.0, "mid": 20.0, "short": 5.0, "tiny": 0.0}
    p = WorkProgress(order, expected, 2, total_figures=5, done=1, disable=True)
    assert p.bar.total == 126  # the unknown one counts a second
    assert set(p._running) == {"long", "mid"} and p._queue == ["short", "tiny"]
    t0 = time.perf_counter()
    assert p._work(t0 + 3.0) == p._work(t0 + 3.0)  # a pure function of the clock
    assert 5.9 < p._work(t0 + 3.0) < 6.1  # two scripts running for 3 s each
    assert p._work(t0 + 50.0) < 50.0 + 20.0 + 0.2  # mid is capped at its 20 s
    p.finished("mid")  # the freed worker takes "short" at once
    assert set(p._running) == {"long", "short"} and p._queue == ["tiny"]
    assert p._finished == 20.0 and p._figures == [2, 5]
    p.finished("tiny")  # finished before it was thought to start: counted, never run
    assert p._queue == [] and p._finished == 21.0
    p.finished("short")
    p.finished("long")
    assert p._work(time.perf_counter()) == 126.0 and p._figures == [5, 5]
    p.close()


def test_a_script_that_skips_itself_leaves_the_total():
    p = WorkProgress(["heads", "a"], {"heads": 600.0, "a": 10.0}, 2, total_figures=2, disable=True)
    assert p.bar.total == 610
    p.finished("heads", skipped=True)  # the optional model is not installed
    assert p.bar.total == 10 and p._finished == 0.0
    p.close()


def test_an_exclusive_script_runs_with_no_other_beside_it():
    """A script that parallelises over the cores itself (``EXCLUSIVE``) is started alone
    and the others wait for it; the runner submits them in the same order."""
    order = ["phase", "ginibre", "a", "b", "c"]
    expected = {"phase": 200.0, "ginibre": 50.0, "a": 30.0, "b": 20.0, "c": 10.0}
    p = WorkProgress(
        order, expected, 2, total_figures=5, disable=True, exclusive={"phase", "ginibre"}
    )
    assert list(p._running) == ["phase"] and p._queue == ["ginibre", "a", "b", "c"]
    # it holds both workers: its seconds count twice, so the bar moves at 2 s/s
    assert p.bar.total == 2 * 200 + 2 * 50 + 30 + 20 + 10
    t0 = time.perf_counter()
    assert 5.9 < p._work(t0 + 3.0) < 6.1
    p.finished("phase")
    assert p._finished == 400.0
    assert list(p._running) == ["ginibre"]
    p.finished("ginibre")
    assert set(p._running) == {"a", "b"} and p._queue == ["c"]
    p.finished("a")
    assert set(p._running) == {"b", "c"}
    p.close()
