"""Claims: which run is computing which shard, across processes and hosts.

Contract: a run claims a shard by creating ``<shard>.claim`` with ``O_CREAT | O_EXCL``
(holding its pid, host and a fresh token) and a heartbeat thread refreshes the claim's
modification time every ``CLAIM_STALE_SECONDS / 10`` (at most 30 s) while it is held. A
claim is stale, and may be taken over, when its process is dead (same host), when it has
this process's pid but a token no live run of this process holds (an earlier process
with the same pid), when it is empty or unreadable for ``UNREADABLE_GRACE_SECONDS`` (a
run that died between creating and writing it), or when it has not been refreshed for
``CLAIM_STALE_SECONDS`` (another host that crashed). A take-over that finds a fresh
claim of another run gives it back. A run removes only claims that are still its own.
Claims only divide the work:
correctness never depends on them, since shard files appear atomically and two
computations of a shard are bit-identical.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from pathlib import Path

from .store import HOST, pid_alive

__all__ = ["CLAIM_STALE_SECONDS", "CLAIM_SUFFIX", "POLL_SECONDS", "Claims"]

CLAIM_SUFFIX = ".claim"
# A claim whose file has not been refreshed for this long is abandoned (its run's host
# crashed); a run refreshes its claims every CLAIM_STALE_SECONDS / 10 (at most 30 s).
CLAIM_STALE_SECONDS = 600.0
# A claim file that is empty or unreadable for this long was left by a run that died
# between creating and writing it: stale.
UNREADABLE_GRACE_SECONDS = 5.0
# How often a run looks at shards that another run is computing.
POLL_SECONDS = 0.2
# Tokens of the claims held by runs in this process (a claim with this process's pid
# whose token is not here was left by an earlier process that had the same pid).
_LIVE_TOKENS: set[str] = set()


def _read_claim(path: Path) -> dict | None:
    """A claim's content, or None (gone, or still being written)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


class Claims:
    """The shard claims of one run: created exclusively, refreshed by a heartbeat
    thread while held, released when done."""

    def __init__(self, stale_after: float):
        self.stale_after = float(stale_after)
        self.held: dict[Path, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, path: Path) -> bool:
        """Claim ``path``; False if another live run holds it."""
        for _ in range(4):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = _read_claim(path)
                if not self._stale(path, info) or not self._take_over(path, info):
                    return False
                continue
            token = uuid.uuid4().hex
            _LIVE_TOKENS.add(token)
            with os.fdopen(fd, "w") as f:
                json.dump(
                    {"pid": os.getpid(), "host": HOST, "token": token, "time": time.time()}, f
                )
            with self._lock:
                self.held[path] = token
            self._start_heartbeat()
            return True
        return False

    def remove_stale(self, path: Path) -> None:
        """Remove the claim at ``path`` if it is stale."""
        info = _read_claim(path)
        if self._stale(path, info):
            self._take_over(path, info)

    def _stale(self, path: Path, info: dict | None) -> bool:
        if info is not None and info.get("host") == HOST and isinstance(info.get("pid"), int):
            if info["pid"] == os.getpid():
                return info.get("token") not in _LIVE_TOKENS
            if not pid_alive(info["pid"]):
                return True
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return True
        if info is None:
            # empty or unreadable: its run died between creating the file and writing it
            # (a write takes microseconds), so after a short grace it is abandoned
            return age > min(UNREADABLE_GRACE_SECONDS, self.stale_after)
        return age > self.stale_after

    @staticmethod
    def _take_over(path: Path, info: dict | None) -> bool:
        """Remove the stale claim ``info`` at ``path``; False if another run replaced it
        meanwhile (then it is put back)."""
        aside = path.with_name(f"{path.name}.{uuid.uuid4().hex}.stale")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True
        moved = _read_claim(aside)
        if info is not None and moved is not None and moved.get("token") != info.get("token"):
            with contextlib.suppress(OSError):
                os.link(aside, path)  # a fresh claim of another run: give it back
            with contextlib.suppress(OSError):
                os.unlink(aside)
            return False
        with contextlib.suppress(OSError):
            os.unlink(aside)
        return True

    def release(self, path: Path) -> None:
        """Remove our claim at ``path`` (if it is still ours)."""
        with self._lock:
            token = self.held.pop(path, None)
        if token is None:
            return
        _LIVE_TOKENS.discard(token)
        info = _read_claim(path)
        if info is not None and info.get("token") == token:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def close(self) -> None:
        """Release every claim and stop the heartbeat."""
        self._stop.set()
        for path in list(self.held):
            with contextlib.suppress(OSError):
                self.release(path)

    def _start_heartbeat(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._beat, name="attnflow-sweep-claims", daemon=True
            )
            self._thread.start()

    def _beat(self) -> None:
        period = min(30.0, self.stale_after / 10)
        while not self._stop.wait(period):
            with self._lock:
                paths = list(self.held)
            for p in paths:
                with contextlib.suppress(OSError):
                    os.utime(p)
