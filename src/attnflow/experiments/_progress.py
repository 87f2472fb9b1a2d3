"""The progress of ``attnflow figures``: a bar in seconds of expected work, not in figures.

Contract. Each script has an expected duration (its ``SECONDS``, else the earlier run's).
The bar's total is their sum; a finished script counts its expected seconds, and a
running one the time it has run so far, capped at its expected seconds, so the bar moves
while a long script runs and the estimate of what remains is in seconds of work. The
scripts run first-in first-out on ``jobs`` workers, in the order they were submitted,
except that a script of ``exclusive`` (one that parallelises over the cores itself) runs
with no other script beside it: this is how the running ones and their start times are
known without asking the workers. An exclusive script holds every worker, so its
seconds count ``jobs`` times (in its expected work and while it runs): the bar then
moves at about ``jobs`` seconds of work per second throughout, and tqdm's estimate of
what remains holds before, during and after it. A ticker thread refreshes the bar twice
a second; ``close`` stops it.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class WorkProgress:
    """A tqdm bar over the expected seconds of ``order`` run on ``jobs`` workers."""

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
    ):
        from tqdm.auto import tqdm

        # a script without an expected duration counts one second
        self._queue = list(order)
        self._jobs = max(1, int(jobs))
        self._exclusive = frozenset(exclusive)
        self._weight = {n: self._jobs if n in self._exclusive else 1 for n in order}
        self._expected = {n: max(float(expected.get(n, 0.0)), 1.0) for n in order}
        self._running: dict[str, float] = {}
        self._finished = 0.0
        self._figures = [done, total_figures]
        self._lock = threading.Lock()
        self._last = ""
        self._desc = desc
        self.bar = tqdm(
            total=round(sum(self._weight[n] * t for n, t in self._expected.items())),
            desc=desc,
            unit="s",
            disable=disable,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]",
        )
        self._start_next(time.perf_counter())
        self._stop = threading.Event()
        self._thread = None
        if not disable and order:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        self._refresh()

    def _start_next(self, now: float) -> None:
        while self._queue and len(self._running) < self._jobs:
            alone = self._queue[0] in self._exclusive or not self._exclusive.isdisjoint(
                self._running
            )
            if alone and self._running:
                break
            self._running[self._queue.pop(0)] = now

    def _work(self, now: float) -> float:
        run = sum(
            self._weight[n] * min(now - t, self._expected[n]) for n, t in self._running.items()
        )
        return self._finished + run

    def _refresh(self) -> None:
        with self._lock:
            now = time.perf_counter()
            self.bar.n = min(round(self._work(now)), self.bar.total)
            k, total = self._figures
            running = ", ".join(self._running) or self._last
            self.bar.set_description_str(f"{self._desc} {k}/{total} ({running})", refresh=False)
        self.bar.refresh()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._refresh()

    def finished(self, name: str, *, skipped: bool = False) -> None:
        """Script ``name`` is done (or failed): its expected seconds count in full. A
        script that skipped itself (an optional model not installed) did none of its
        work: its expected seconds leave the total instead."""
        with self._lock:
            now = time.perf_counter()
            self._running.pop(name, None)
            if name in self._queue:  # finished before it was thought to start
                self._queue.remove(name)
            if skipped:
                self.bar.total = max(self.bar.total - round(self._work_of(name)), 1)
            else:
                self._finished += self._work_of(name)
            self._figures[0] += 1
            self._last = name
            self._start_next(now)
        self._refresh()

    def _work_of(self, name: str) -> float:
        return self._weight.get(name, 1) * self._expected.get(name, 1.0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._refresh()
        self.bar.close()

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
