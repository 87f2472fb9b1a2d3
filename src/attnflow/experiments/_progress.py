"""The progress of ``attnflow figures``: a bar in seconds of expected work, not in figures.

Contract. Each script has an expected duration (its ``SECONDS``, else the earlier run's).
The bar's total is their sum; a finished script counts its expected seconds, and a
running one the time it has run so far, so the bar moves while a long script runs and
the estimate of what remains is in seconds of work. The scripts run first-in first-out
on ``jobs`` workers, in the order they were submitted, except that a script of
``exclusive`` (one that parallelises over the cores itself) runs with no other script
beside it: this is how the running ones and their start times are known without asking
the workers. An exclusive script holds every worker, so its seconds count ``jobs``
times (in its expected work and while it runs): the bar then moves at about ``jobs``
seconds of work per second throughout, and tqdm's estimate of what remains holds
before, during and after it.

A script that runs past its expected seconds is not capped there: its extra time is
added to the bar's total as it accrues (the bar keeps moving, and what remains stays the
other scripts' expected work), and the description says by how much it overran
(``fig_x 5:39, 1:45 over 3:54``); when it finishes, its extra time stays counted. A
script skipped before the start (an optional model not installed: the runner knows it
from the script's ``REQUIRES``) is never counted; one that skips itself while running
leaves the total. A ticker thread refreshes the bar twice a second; ``close`` stops it.

When the stream (stderr) is not a terminal, there is no bar: one line when the run
starts (the scripts, their expected work, what was skipped), one when a script passes
its expected seconds (it is alive, and how far past), and one per finished script (its
time, how far past its expected seconds, the work left).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any


def clock(seconds: float) -> str:
    """``seconds`` as ``m:ss`` (``h:mm:ss`` from an hour on), rounded to the second."""
    s = max(round(seconds), 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class WorkProgress:
    """A tqdm bar over the expected seconds of ``order`` run on ``jobs`` workers (or, on
    a stream that is not a terminal, one line per finished script)."""

    def __init__(
        self,
        order: list[str],
        expected: dict[str, float],
        jobs: int,
        *,
        done: int = 0,
        total_figures: int,
        desc: str = "attnflow figures",
        disable: bool = False,
        exclusive: set[str] | frozenset[str] = frozenset(),
        skipped: Mapping[str, str] | None = None,
        file: IO[str] | None = None,
        lines: bool | None = None,
    ):
        """
        Args:
            order: the scripts to run, in the order they are submitted.
            expected: each script's expected seconds (a script without one counts 1 s).
            jobs: the workers.
            done: scripts already done (reused), counted in the figures ``k/total``.
            total_figures: the scripts of the run, reused ones included.
            desc: the bar's label.
            disable: show nothing.
            exclusive: the scripts that run alone and hold every worker.
            skipped: scripts skipped before the start, with why (named in the first
                line of the line mode; never counted).
            file: the stream (default ``sys.stderr``).
            lines: one line per finished script instead of a bar; default: when
                ``file`` is not a terminal.
        """
        from tqdm.auto import tqdm

        self._file = sys.stderr if file is None else file
        if lines is None:
            isatty = getattr(self._file, "isatty", None)
            lines = not (callable(isatty) and isatty())
        self._lines = bool(lines) and not disable
        self._queue = list(order)
        self._jobs = max(1, int(jobs))
        self._exclusive = frozenset(exclusive)
        self._weight = {n: self._jobs if n in self._exclusive else 1 for n in order}
        # a script without an expected duration counts one second
        self._expected = {n: max(float(expected.get(n, 0.0)), 1.0) for n in order}
        self._running: dict[str, float] = {}
        self._finished = 0.0
        self._total = float(sum(self._weight[n] * t for n, t in self._expected.items()))
        self._figures = [done, total_figures]
        self._told_over: set[str] = set()
        self._lock = threading.Lock()
        self._last = ""
        self._desc = desc
        self._t0 = time.perf_counter()
        self.bar = tqdm(
            total=round(self._total),
            desc=desc,
            unit="s",
            disable=disable or self._lines,
            file=self._file,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]",
        )
        self._start_next(self._t0)
        self._stop = threading.Event()
        self._thread = None
        if self._lines:
            what = f"{len(order)} script(s) to run, about {clock(self._total / self._jobs)}"
            what += f" of work on {self._jobs} worker(s)"
            if done:
                what += f"; {done} reused"
            if skipped:
                what += f"; {len(skipped)} skipped ({', '.join(sorted(skipped))})"
            self._say(what)
        if not disable and order:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        self._refresh()

    def _say(self, text: str) -> None:
        print(f"{self._desc}: {text}", file=self._file, flush=True)

    def _start_next(self, now: float) -> None:
        while self._queue and len(self._running) < self._jobs:
            alone = self._queue[0] in self._exclusive or not self._exclusive.isdisjoint(
                self._running
            )
            if alone and self._running:
                break
            self._running[self._queue.pop(0)] = now

    def _over(self, name: str, now: float) -> float:
        """The seconds script ``name`` has run past its expected seconds (0 if not)."""
        return max(now - self._running[name] - self._expected[name], 0.0)

    def _work(self, now: float) -> float:
        """Worker-seconds done: the finished scripts, and the time the running ones have
        run (past their expected seconds too)."""
        run = sum(self._weight[n] * (now - t) for n, t in self._running.items())
        return self._finished + run

    def _total_now(self, now: float) -> float:
        """The expected work, grown by the time the running scripts overran."""
        return self._total + sum(self._weight[n] * self._over(n, now) for n in self._running)

    def _remaining(self, now: float) -> float:
        """Seconds of wall time left at the expected pace: the work left over the workers."""
        return max(self._total_now(now) - self._work(now), 0.0) / self._jobs

    def _label(self, name: str, now: float) -> str:
        ran = now - self._running[name]
        over = self._over(name, now)
        if over <= 0:
            return f"{name} {clock(ran)}"
        return f"{name} {clock(ran)}, {clock(over)} over {clock(self._expected[name])}"

    def _refresh(self) -> None:
        with self._lock:
            now = time.perf_counter()
            total = max(round(self._total_now(now)), 1)
            self.bar.total = total
            self.bar.n = min(round(self._work(now)), total)
            k, n_all = self._figures
            running = ", ".join(self._label(n, now) for n in self._running) or self._last
            self.bar.set_description_str(f"{self._desc} {k}/{n_all} ({running})", refresh=False)
            news = []
            if self._lines:
                for name in self._running:
                    if name not in self._told_over and self._over(name, now) > 0:
                        self._told_over.add(name)
                        news.append(
                            f"{name} still running, past its expected {clock(self._expected[name])}"
                        )
        for text in news:
            self._say(text)
        self.bar.refresh()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._refresh()

    def finished(self, name: str, *, skipped: bool = False, failed: bool = False) -> None:
        """Script ``name`` is done (or ``failed``): its expected seconds count in full,
        and the time it ran past them too. A script that skipped itself (an optional
        model not installed) did none of its work: its expected seconds leave the total
        instead."""
        line = ""
        with self._lock:
            now = time.perf_counter()
            started = self._running.pop(name, None)
            if name in self._queue:  # finished before it was thought to start
                self._queue.remove(name)
            ran = None if started is None else now - started
            over = 0.0 if ran is None else max(ran - self._expected.get(name, 1.0), 0.0)
            weight = self._weight.get(name, 1)
            if skipped:
                self._total = max(self._total - self._work_of(name), 1.0)
            else:
                self._finished += self._work_of(name) + weight * over
                self._total += weight * over
            self._figures[0] += 1
            self._last = name
            self._start_next(now)
            if self._lines:
                k, n_all = self._figures
                what = "skipped" if skipped else "failed" if failed else "done"
                if ran is not None:
                    what += f" in {clock(ran)}"
                    if over > 0:
                        what += f", {clock(over)} over its expected {clock(ran - over)}"
                left = self._remaining(now)
                line = f"{k}/{n_all} {name} {what}; about {clock(left)} left"
        if line:
            self._say(line)
        self._refresh()

    def _work_of(self, name: str) -> float:
        return self._weight.get(name, 1) * self._expected.get(name, 1.0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._refresh()
        self.bar.close()
        if self._lines:
            self._say(f"{self._figures[0]}/{self._figures[1]} in {clock(self._elapsed())}")

    def _elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
