"""The output folder's lock of ``attnflow figures``: one run writes into a folder at a
time. ``folder_lock(out)`` holds ``out/.attnflow-figures.lock`` (the pid and host of the
run) for a block; a second run is refused (``FolderBusy``) while a live run holds it, and
a lock whose process no longer runs on this host is taken over."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK", "FolderBusy", "folder_lock"]

LOCK = ".attnflow-figures.lock"


class FolderBusy(RuntimeError):
    """Another ``attnflow figures`` run is writing into the same output folder."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def folder_lock(out: Path) -> Iterator[None]:
    """Hold ``out/LOCK`` for the block: refuse (``FolderBusy``) while a live run holds
    it; take over a lock whose process no longer runs (on this host)."""
    from ..io.files import write_text

    lock = out / LOCK
    me = f"{os.getpid()} {socket.gethostname()}\n"
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                pid_s, _, host = lock.read_text().strip().partition(" ")
                pid = int(pid_s)
            except (OSError, ValueError):
                pid, host = -1, ""  # unreadable: written by a run killed mid-write
            if pid > 0 and (host != socket.gethostname() or _pid_alive(pid)):
                where = "" if host == socket.gethostname() else f" on {host}"
                raise FolderBusy(
                    f"another `attnflow figures` run (pid {pid}{where}) is writing into "
                    f"{str(out)!r}; wait for it to finish or use another --out (if no such "
                    f"run is alive, delete {str(lock)!r})."
                ) from None
            write_text(lock, me)  # stale: take it over (atomically), then check it is ours
            if lock.read_text() == me:
                break
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        break
    else:
        raise FolderBusy(f"could not take the lock {str(lock)!r}; another run is starting.")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if lock.read_text() == me:
                lock.unlink()
