"""The progress of ``attnflow figures`` counts seconds of expected work: finished scripts
in full, running ones by the time they have run (capped), first-in first-out on the
workers."""

from __future__ import annotations

import io
import time

from attnflow.experiments._progress import WorkProgress, clock


def test_work_progress_counts_running_and_finished_scripts():
    order = ["long", "mid", "short", "tiny"]
    expected = {"long": 100.0, "mid": 20.0, "short": 5.0, "tiny": 0.0}
    p = WorkProgress(order, expected, 2, total_figures=5, done=1, disable=True)
    assert p.bar.total == 126  # the unknown one counts a second
    assert set(p._running) == {"long", "mid"} and p._queue == ["short", "tiny"]
    t0 = time.perf_counter()
    assert p._work(t0 + 3.0) == p._work(t0 + 3.0)  # a pure function of the clock
    assert 5.9 < p._work(t0 + 3.0) < 6.1  # two scripts running for 3 s each
    # past their expected seconds the scripts still count: the bar never freezes
    assert 99.9 < p._work(t0 + 50.0) < 100.1
    assert 155.9 < p._total_now(t0 + 50.0) < 156.1  # the total grows by mid's 30 s over
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


def test_a_script_past_its_expected_seconds_shows_it_is_alive_and_by_how_much():
    """No frozen bar: an overrunning script keeps moving the bar (its extra time is added
    to the total as it accrues), its label says how far over it is, and when it
    finishes the bar does not step back."""
    p = WorkProgress(["slow", "b"], {"slow": 100.0, "b": 50.0}, 1, total_figures=2, disable=True)
    p._running["slow"] -= 160.0  # as if it had started 160 s ago: 60 s over its 100
    now = time.perf_counter()
    work, total = p._work(now), p._total_now(now)
    assert 159.9 < work < 160.2 and 209.9 < total < 210.2
    assert 49.9 < total - work < 50.1  # what remains: the other script's expected work
    assert p._label("slow", now) == "slow 2:40, 1:00 over 1:40"
    later = now + 10.0
    assert p._work(later) > work + 9.9 and p._total_now(later) > total + 9.9
    p._refresh()
    assert "slow 2:40, 1:00 over 1:40" in p.bar.desc
    before = p._work(now) / p._total_now(now)
    p.finished("slow")
    after = p._work(time.perf_counter()) / p._total_now(time.perf_counter())
    assert after >= before - 1e-3  # its overrun stays counted: no step back
    assert 159.9 < p._finished < 160.3 and 209.9 < p._total < 210.3
    p.close()


def test_clock():
    assert [clock(s) for s in (0, 59.4, 61, 3599, 3600, 7325)] == [
        "0:00",
        "0:59",
        "1:01",
        "59:59",
        "1:00:00",
        "2:02:05",
    ]


def test_one_line_per_finished_script_when_the_stream_is_not_a_terminal():
    """On a file or pipe: a first line (what runs, its expected work, what was skipped),
    a line when a script passes its expected time, one per finished script."""
    out = io.StringIO()  # not a terminal
    p = WorkProgress(
        ["a", "b", "c"],
        {"a": 120.0, "b": 30.0, "c": 10.0},
        1,
        total_figures=3,
        skipped={"fig_needs_model": "not installed: some_model"},
        file=out,
    )
    assert p._lines and p.bar.disable
    p._running["a"] -= 150.0  # 30 s past its 2:00
    p._refresh()
    p.finished("a")
    p.finished("b", skipped=True)
    p.finished("c", failed=True)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "attnflow figures: 3 script(s) to run, about 2:40 of work on 1 worker(s); "
        "1 skipped (fig_needs_model)"
    )
    assert lines[1] == "attnflow figures: a still running, past its expected 2:00"
    assert lines[2].startswith("attnflow figures: 1/3 a done in 2:30, 0:30 over its expected 2:00;")
    assert lines[2].endswith("about 0:40 left")
    assert lines[3].startswith("attnflow figures: 2/3 b skipped in 0:00;")
    assert lines[3].endswith("about 0:10 left")
    assert lines[4].startswith("attnflow figures: 3/3 c failed in 0:00;")
    assert lines[5].startswith("attnflow figures: 3/3 in ") and len(lines) == 6
    assert "\r" not in out.getvalue()  # no bar redrawn in place


def test_a_terminal_gets_the_bar_not_lines():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = WorkProgress(["a"], {"a": 5.0}, 1, total_figures=1, file=out)
    assert not p._lines and not p.bar.disable
    p.finished("a")
    p.close()
    assert "done in" not in out.getvalue() and "attnflow figures 1/1" in out.getvalue()


def test_a_script_that_needs_a_missing_module_is_skipped_before_the_start(tmp_path, capfd):
    """REQUIRES names optional modules: when one is not installed the runner skips the
    script before the start (it never runs), says why in the index, and leaves it out of
    the progress's expected work; the other scripts run, one line each on a non-terminal."""
    from attnflow.experiments.runner import run_figures

    ext = tmp_path / "mine"
    ext.mkdir()
    ran = tmp_path / "ran.txt"
    for name, extra in (
        ("plain", ""),
        ("needs", "REQUIRES = ('no_such_module_attnflow',)\n"),
        ("has", "REQUIRES = ('json',)\n"),
    ):
        (ext / f"fig_{name}.py").write_text(
            f"from pathlib import Path\nSECONDS = {{'quick': 7, 'full': 300}}\n{extra}\n"
            "def make(out_dir, quick=False):\n"
            f"    with open({str(ran)!r}, 'a') as f:\n"
            f"        f.write('{name} ')\n"
            f"    p = Path(out_dir) / '{name}.txt'\n"
            "    p.write_text('x')\n"
            "    return {'figures': [p]}\n"
        )
    capfd.readouterr()
    index = run_figures(tmp_path / "out", quick=True, experiments=ext, jobs=1, progress=True)
    err = capfd.readouterr().err
    assert sorted(ran.read_text().split()) == ["has", "plain"]
    assert sorted(index["figures"]) == ["fig_has", "fig_plain"]
    assert index["skipped"] == {"fig_needs": "not installed: no_such_module_attnflow"}
    lines = [ln for ln in err.splitlines() if ln.startswith("attnflow figures")]
    # 14 s of expected work: the skipped script's 7 s are not counted
    assert lines[0] == (
        "attnflow figures: 2 script(s) to run, about 0:14 of work on 1 worker(s); "
        "1 skipped (fig_needs)"
    )
    assert [ln.split()[3] for ln in lines[1:3]] == ["fig_has", "fig_plain"]
    assert all(" done in " in ln for ln in lines[1:3]) and len(lines) == 4
