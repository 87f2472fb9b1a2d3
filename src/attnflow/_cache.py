"""JAX's persistent compilation cache: compiled programs kept on disk across processes.

``enable_compilation_cache(path=None)`` (re-exported as ``attnflow.enable_compilation_cache``)
points JAX at a cache directory, so that a later process running the same program (same
shapes, dtypes, options, JAX version and devices) reads the compiled program from disk
instead of compiling it again. Tracing and lowering still happen in every process; only
the XLA compilation is saved.

The directory, first match wins:

1. the ``path`` argument;
2. the environment variable ``ATTNFLOW_CACHE_DIR``;
3. ``$XDG_CACHE_HOME/attnflow/jax``, else ``~/.cache/attnflow/jax``
   (``%LOCALAPPDATA%\\attnflow\\jax`` on Windows).

``ATTNFLOW_COMPILATION_CACHE=0`` (or ``false``, ``no``, ``off``) turns the cache off:
``enable_compilation_cache`` then changes nothing and returns None. The command line
turns the cache on for every command that computes (``attnflow --no-cache ...`` does
not); a library user opts in with one call. Every program is cached, however short its
compilation (``jax_persistent_cache_min_compile_time_secs = 0``): the command line's
programs compile in tenths of a second each, and together they are most of its wait.

JAX refuses to write a program that holds host callbacks (``jax.debug.callback``,
``jax.pure_callback``, progress bars); such a program is compiled again in every process.
Equinox's runtime checks are such callbacks unless ``EQX_ON_ERROR`` says otherwise:
``enable_compilation_cache`` sets it to ``nan`` when equinox is not imported yet and the
variable is unset (see its docstring).

Below every layer: this module imports no module of attnflow, and JAX only inside the
functions that need it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "enable_compilation_cache",
    "cache_dir",
    "cache_enabled_by_env",
    "cache_info",
    "clear_cache",
    "memory_regions",
    "release_compiled_programs",
]

_OFF = ("0", "false", "no", "off")
# The jax options set, and the environment variables that carry them to child processes
# (JAX reads JAX_<OPTION> when it is imported).
_MIN_COMPILE_SECS = 0.0
_MIN_ENTRY_BYTES = 0
# XLA's C++ log threshold while the cache is on, unless the user set one: fatal only
_QUIET_XLA = "3"
# the user's own setting, read before JAX can set it: importing JAX sets
# TF_CPP_MIN_LOG_LEVEL=1 when it is unset, which child processes would inherit
_USER_XLA_LOG = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
if "jax" in sys.modules and _USER_XLA_LOG == "1":  # JAX's default, not the user's
    _USER_XLA_LOG = None


def cache_enabled_by_env() -> bool:
    """False when ``ATTNFLOW_COMPILATION_CACHE`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get("ATTNFLOW_COMPILATION_CACHE", "").strip().lower() not in _OFF


def cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: ``path``, else ``$ATTNFLOW_CACHE_DIR``, else the user's cache
    directory (see the module docstring). Nothing is created.

    Args:
        path: an explicit directory, or None.

    Returns:
        The directory, with ``~`` expanded.
    """
    if path is not None and str(path):
        return Path(path).expanduser()
    env = os.environ.get("ATTNFLOW_CACHE_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attnflow" / "jax"


def enable_compilation_cache(
    path: str | os.PathLike[str] | None = None, *, children: bool = False
) -> Path | None:
    """Keep JAX's compiled programs in a directory on disk, for this and later processes.

    Sets JAX's ``jax_compilation_cache_dir``, with ``jax_persistent_cache_min_compile_time_secs``
    and ``jax_persistent_cache_min_entry_size_bytes`` at 0 (every program is kept). Call it
    before the first computation: JAX opens its cache once per process, on the first
    compilation, and a later call changes the directory only for programs compiled after
    it (the cache is reopened). Safe to call more than once.

    The adaptive solve holds two runtime checks of diffrax (the saved times increase and
    lie in ``[0, t1]``), host callbacks under equinox's default ``EQX_ON_ERROR=raise``,
    and JAX writes no program with a host callback. ``simulate`` checks the same two
    things on the host before every solve, so when equinox is not imported yet and
    ``EQX_ON_ERROR`` is unset this call sets it to ``nan`` (equinox's runtime checks then
    return NaN instead of calling the host), and the solve is cached too. Set
    ``EQX_ON_ERROR`` yourself to choose otherwise.

    XLA:CPU writes an error line for every feature of every program it reads from the
    cache when the CPU features recorded at compile time include LLVM tuning
    preferences (``+prefer-no-gather``, ``+prefer-no-scatter``) that its host feature
    list lacks; the programs load and run (the same machine compiled them). So unless
    ``TF_CPP_MIN_LOG_LEVEL`` was set before attnflow was imported, this call sets it to
    ``3`` (XLA's C++ log shows fatal messages only; errors still reach Python as
    exceptions), overriding the ``1`` that importing JAX sets. XLA reads the variable
    when JAX is first imported, so in this process this takes effect only when the call
    comes before ``import jax`` (as on the command line); child processes started
    afterwards (``children``) inherit it. Set it yourself otherwise, or to ``0`` to see
    XLA's log.

    Args:
        path: the directory (created if missing). None: ``$ATTNFLOW_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/attnflow/jax`` or ``~/.cache/attnflow/jax``.
        children: also export the settings as ``JAX_*`` environment variables, so that
            child processes started afterwards (figure workers, sweep pools) use the same
            cache.

    Returns:
        The cache directory, or None when ``ATTNFLOW_COMPILATION_CACHE=0`` turns the cache
        off (then nothing is changed).

    Raises:
        OSError: the directory cannot be created.

    Example:
        >>> import attnflow as af
        >>> af.enable_compilation_cache("/tmp/attnflow-cache")  # doctest: +SKIP
        PosixPath('/tmp/attnflow-cache')
    """
    if not cache_enabled_by_env():
        return None
    directory = cache_dir(path)
    directory.mkdir(parents=True, exist_ok=True)
    if "equinox" not in sys.modules:
        os.environ.setdefault("EQX_ON_ERROR", "nan")
    # XLA:CPU logs an error line per feature for every program it loads from the cache
    # when the compile-time CPU features name LLVM tuning preferences the host list lacks
    # (``+prefer-no-gather``, ``+prefer-no-scatter`` on some x86 CPUs); the program loads
    # and runs, but a cached command would print dozens of such lines.
    quiet_xla_log()
    import jax

    settings: dict[str, Any] = {
        "jax_compilation_cache_dir": str(directory),
        "jax_persistent_cache_min_compile_time_secs": _MIN_COMPILE_SECS,
        "jax_persistent_cache_min_entry_size_bytes": _MIN_ENTRY_BYTES,
    }
    changed = jax.config.values["jax_compilation_cache_dir"] != str(directory)
    for name, value in settings.items():
        jax.config.update(name, value)
    if changed:
        # JAX opens its cache once, on the first compilation: reopen it at the new place.
        from jax.experimental.compilation_cache import compilation_cache as _cc

        _cc.reset_cache()
    if children:
        for name, value in settings.items():
            os.environ[name.upper()] = str(value)
    return directory


# XLA:CPU maps each compiled program's code into about 20 memory regions, and Linux lets
# a process hold vm.max_map_count of them (65,530 by default): a process that keeps
# ~3,000 programs alive fails inside LLVM ("Cannot allocate memory") and then aborts.
# Long-lived processes that compile many distinct programs (the figure runner's
# workers, the test suite's) drop JAX's in-memory caches past this many regions.
MAX_MEMORY_REGIONS = 30_000


def memory_regions() -> int | None:
    """The memory regions this process maps (``/proc/self/maps``), None where the OS
    does not say (not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def release_compiled_programs(limit: int = MAX_MEMORY_REGIONS) -> bool:
    """Drop JAX's in-memory caches of traced and compiled programs once this process
    maps more than ``limit`` memory regions; True when it did.

    A later call of a dropped program traces it again and reads it back from the
    persistent cache (or compiles it). Nothing is done where the region count is unknown
    or JAX is not imported.

    Args:
        limit: the region count past which the caches are dropped.
    """
    if "jax" not in sys.modules:
        return False
    count = memory_regions()
    if count is None or count <= limit:
        return False
    import jax

    jax.clear_caches()
    return True


def quiet_xla_log() -> None:
    """Set ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set it before attnflow was imported
    (JAX's own default ``1`` is overridden, for child processes too). XLA reads it when
    JAX is first imported, so callers that want it in this process call this first."""
    if _USER_XLA_LOG is None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = _QUIET_XLA


def cache_info(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What the cache directory holds: its path, whether it exists, the number of
    compiled programs and their total size in bytes; also whether the environment turns
    the cache off. Imports no JAX.

    Args:
        path: the directory (None: as ``cache_dir``).

    Returns:
        ``{"dir", "exists", "enabled", "entries", "bytes"}``.
    """
    directory = cache_dir(path)
    files = [p for p in directory.rglob("*") if p.is_file()] if directory.is_dir() else []
    entries = [p for p in files if p.name.endswith("-cache")]  # JAX also writes "-atime"
    return {
        "dir": str(directory),
        "exists": directory.is_dir(),
        "enabled": cache_enabled_by_env(),
        "entries": len(entries),
        "bytes": sum(p.stat().st_size for p in files),
    }


def clear_cache(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Delete the cache directory and everything in it (a missing one is not an error).

    Args:
        path: the directory (None: as ``cache_dir``).

    Returns:
        ``cache_info`` of the directory as it was before deleting.

    Raises:
        OSError: a file that cannot be deleted.
    """
    info = cache_info(path)
    directory = Path(info["dir"])
    if directory.is_dir():
        shutil.rmtree(directory)
    return info
