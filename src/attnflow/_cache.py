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
``jax.pure_callback``, progress bars, equinox's runtime checks under its default
``EQX_ON_ERROR=raise``); such a program is compiled again in every process. Equinox's
error mode is the user's: nothing here changes it (the command line, which runs only
attnflow's own programs, sets ``EQX_ON_ERROR=nan`` for its own process, see
``attnflow.cli._common.setup_cache``).

Ownership. A directory that ``enable_compilation_cache`` creates, or finds empty or
holding nothing but JAX's cache files, gets the marker file ``MARKER``
(a ``CACHEDIR.TAG`` naming attnflow). ``clear_cache`` deletes only JAX's cache files (``*-cache``,
``*-atime``, ``.lockfile``) and the marker, and the directory itself only once it is
empty; it refuses, naming the directory, one without the marker that holds anything
else (``ATTNFLOW_CACHE_DIR=~/mywork`` must never cost ``~/mywork``). A cache written by
an earlier attnflow, which wrote no marker, holds JAX's files alone and is cleared.

Quiet. A cache that cannot be written (a read-only folder, a full disk) or that holds
damaged entries costs compile time, not warnings: JAX's per-program warnings about
reading or writing cache entries are filtered out while the cache is on (a damaged
entry is compiled again; ``clear_cache`` removes it).

Below every layer: this module imports no module of attnflow, and JAX only inside the
functions that need it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "MARKER",
    "NotACache",
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

# The file that says a directory is attnflow's compilation cache (see the module
# docstring), and the files JAX's cache writes there (jax._src.lru_cache): an entry
# "<key>-cache", its access time "<key>-atime", and a lock file when eviction is on.
# A cache directory tag (https://bford.info/cachedir/: backup tools skip the folder)
# naming attnflow, so that another tool's tag is not taken for ours.
MARKER = "CACHEDIR.TAG"
_MARKER_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
_MARKER_TEXT = (
    f"{_MARKER_SIGNATURE}\n"
    "# This directory is attnflow's compilation cache (JAX's compiled programs).\n"
    "# `attnflow cache clear` deletes the programs in it, and nothing else.\n"
)
_JAX_SUFFIXES = ("-cache", "-atime")
_JAX_FILES = (".lockfile",)
# JAX's warnings about one cache entry it could not read or write (jax._src.compiler):
# a read-only, full or damaged cache would print one per program
_JAX_CACHE_WARNINGS = r"Error (reading|writing) persistent compilation cache entry"


class NotACache(ValueError):
    """A directory that ``clear_cache`` will not delete: it cannot prove it is attnflow's
    compilation cache (no marker, and files that JAX's cache does not write)."""


def _is_jax_file(p: Path) -> bool:
    """A file JAX's persistent cache writes (an entry, its access time, its lock)."""
    return (
        p.name != MARKER
        and p.is_file()
        and (p.name.endswith(_JAX_SUFFIXES) or p.name in _JAX_FILES)
    )


def _marked(directory: Path) -> bool:
    """Whether ``directory`` carries attnflow's marker (a cache directory tag naming
    attnflow)."""
    try:
        with open(directory / MARKER, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(_MARKER_SIGNATURE) and "attnflow" in head


def _foreign(directory: Path) -> list[Path]:
    """What ``directory`` holds besides JAX's cache files and attnflow's marker (another
    tool's ``CACHEDIR.TAG`` is foreign)."""
    ours = _marked(directory)
    return sorted(
        p
        for p in directory.iterdir()
        if not _is_jax_file(p) and not (p.name == MARKER and ours and p.is_file())
    )


def _claim(directory: Path) -> None:
    """Write the marker into ``directory`` when it holds nothing but JAX's cache files
    (just created, empty, or a cache of an attnflow that wrote no marker); a directory
    that holds anything else is left unmarked (``clear_cache`` will refuse it). A
    directory that cannot be written stays unmarked too."""
    marker = directory / MARKER
    if marker.exists() or _foreign(directory):
        return
    with contextlib.suppress(OSError):  # FileExistsError: another process marked it
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(_MARKER_TEXT)


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

    Equinox's error mode (``EQX_ON_ERROR``) is left as it is: the programs that hold
    equinox's runtime checks as host callbacks (under its default ``raise``) are
    compiled again in each process, and the user's own ``eqx.error_if`` checks keep
    raising.

    The directory gets the marker ``MARKER`` when it is new, empty or holds nothing but
    JAX's cache files; ``clear_cache`` deletes only marked caches (see the module
    docstring). JAX's warnings about cache entries it cannot read or write (a read-only
    folder, a full disk, a damaged entry) are filtered out: such a program is compiled
    instead, without a word per program.

    XLA:CPU writes an error line for every feature of every program it reads from the
    cache when the CPU features recorded at compile time include LLVM tuning
    preferences (``+prefer-no-gather``, ``+prefer-no-scatter``) that its host feature
    list lacks; the programs load and run (the same machine compiled them). So unless
    ``TF_CPP_MIN_LOG_LEVEL`` was set before attnflow was imported, this call sets it to
    ``3`` (XLA's C++ log shows fatal messages only; errors still reach Python as
    exceptions), overriding the ``1`` that importing JAX sets; child processes started
    afterwards (``children``) inherit it. XLA reads the variable when JAX is first
    imported: when JAX was imported before this call (as in the README's ten lines),
    the same threshold is set in the loaded XLA directly (Linux; elsewhere set the
    variable before ``import jax``). Set it yourself, or to ``0`` to see XLA's log.

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
    if not directory.is_dir():
        raise NotADirectoryError(
            f"the compilation cache {str(directory)!r} is not a directory; point "
            "ATTNFLOW_CACHE_DIR (or the path argument) at a folder."
        )
    _claim(directory)
    warnings.filterwarnings("ignore", message=_JAX_CACHE_WARNINGS, category=UserWarning)
    jax_first = "jax" in sys.modules
    # XLA logs an error line per feature for every program it loads from the cache
    # when the compile-time CPU features name LLVM tuning preferences the host list lacks
    # (``+prefer-no-gather``, ``+prefer-no-scatter`` on some x86 CPUs); the program loads
    # and runs, but a cached command would print dozens of such lines.
    quiet_xla_log()
    if jax_first and _USER_XLA_LOG is None:
        _quiet_loaded_xla()
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
    compiled programs and their total size in bytes, whether it carries attnflow's
    marker; also whether the environment turns the cache off. Imports no JAX.

    Args:
        path: the directory (None: as ``cache_dir``).

    Returns:
        ``{"dir", "exists", "enabled", "marked", "entries", "bytes"}``; ``entries`` and
        ``bytes`` count JAX's cache files only.
    """
    directory = cache_dir(path)
    files = [p for p in directory.iterdir() if _is_jax_file(p)] if directory.is_dir() else []
    entries = [p for p in files if p.name.endswith("-cache")]  # JAX also writes "-atime"
    return {
        "dir": str(directory),
        "exists": directory.is_dir(),
        "enabled": cache_enabled_by_env(),
        "marked": _marked(directory),
        "entries": len(entries),
        "bytes": sum(p.stat().st_size for p in files),
    }


def clear_cache(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Delete the compiled programs of attnflow's compilation cache, and the directory
    once nothing else is left in it (a missing directory is not an error).

    Only JAX's cache files (``*-cache``, ``*-atime``, ``.lockfile``) and the marker are
    deleted; anything else in the directory stays, and so does the directory then. A
    directory without the marker is cleared only when it holds nothing but JAX's cache
    files (a cache of an attnflow that wrote no marker); otherwise nothing is deleted.

    Args:
        path: the directory (None: as ``cache_dir``).

    Returns:
        ``cache_info`` of the directory as it was before deleting, with ``"kept"``: the
        names of the files and folders left in a marked directory.

    Raises:
        NotACache: the directory has no marker and holds other files, or is not a
            directory (the message names it and says what to do).
        OSError: a file that cannot be deleted.
    """
    directory = cache_dir(path)
    if not directory.exists() and not directory.is_symlink():
        return {**cache_info(path), "kept": []}
    if not directory.is_dir():
        raise NotACache(
            f"refusing to clear {str(directory)!r}: it is not a directory, so not a "
            "compilation cache; set ATTNFLOW_CACHE_DIR to the cache folder (or unset it for "
            "the default one)."
        )
    info = cache_info(path)
    foreign = _foreign(directory)
    if not info["marked"] and foreign:
        shown = ", ".join(repr(p.name) for p in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise NotACache(
            f"refusing to clear {str(directory)!r}: it does not carry attnflow's cache marker "
            f"({MARKER}) and holds files that are not compiled programs ({shown}); nothing "
            "was deleted. If it is a cache, delete its *-cache and *-atime files yourself; "
            "else set ATTNFLOW_CACHE_DIR to attnflow's own cache folder (or unset it)."
        )
    for p in directory.iterdir():
        if _is_jax_file(p):
            p.unlink(missing_ok=True)
    if foreign:  # marked, but the user keeps files there: the marker stays too
        return {**info, "kept": [p.name for p in foreign]}
    if info["marked"]:
        (directory / MARKER).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # a file that appeared meanwhile: leave the folder
        directory.rmdir()
    return {**info, "kept": []}


# ------------------------------------------------------------- XLA's log, JAX first
# absl's SetMinLogLevel in the XLA library that jaxlib loads: a local symbol (not
# exported), found in the library's ELF symbol table. Its one argument is absl's
# LogSeverityAtLeast (an int): 3 is kFatal.
_XLA_LIBRARY = "libjax_common.so"
_SET_MIN_LOG_LEVEL = rb"_ZN4absl12lts_\d+14SetMinLogLevelENS0_18LogSeverityAtLeastE\x00"
_FATAL = 3
_SYM = [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2")]
_SYM += [("value", "<u8"), ("size", "<u8")]


def _elf_function(path: str, pattern: bytes) -> tuple[int, int] | None:
    """``(address relative to the first loadable segment, first segment's p_vaddr)`` of
    the one function whose name matches ``pattern`` in the symbol table of the 64-bit
    little-endian ELF file ``path``; None when there is no single such function."""
    import numpy as np

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
            return None
        phoff, shoff = struct.unpack_from("<QQ", m, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", m, 0x36)
        vaddr = None
        for i in range(phnum):
            p_type, _, _, p_vaddr = struct.unpack_from("<IIQQ", m, phoff + i * phentsize)
            if p_type == 1:  # PT_LOAD
                vaddr = p_vaddr
                break
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", m, shoff + i * shentsize) for i in range(shnum)
        ]
        symtab = next((sec for sec in sections if sec[1] == 2), None)  # SHT_SYMTAB
        if vaddr is None or symtab is None or symtab[6] >= len(sections):
            return None
        strtab = sections[symtab[6]]
        found = re.compile(pattern).search(m, strtab[4], strtab[4] + strtab[5])  # type: ignore[arg-type]
        if found is None:
            return None
        name = found.start() - strtab[4]
        del found  # it holds the map
        syms = np.frombuffer(m, np.dtype(_SYM), symtab[5] // 24, symtab[4]).copy()
    hits = np.nonzero(syms["name"] == name)[0]
    if len(hits) != 1 or syms["info"][hits[0]] & 0xF != 2 or not syms["size"][hits[0]]:
        return None  # not exactly one function (STT_FUNC) of that name
    return int(syms["value"][hits[0]]), int(vaddr)


def _quiet_loaded_xla() -> bool:
    """Set the loaded XLA library's C++ log threshold to fatal, as
    ``TF_CPP_MIN_LOG_LEVEL=3`` does when set before JAX is imported; True when done.

    Linux only, and only when the function is found unambiguously and its address lies
    in an executable mapping of the library; otherwise nothing is done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/maps") as f:
            maps = [ln.split() for ln in f]
        lib = next((m[5] for m in maps if len(m) == 6 and m[5].endswith("/" + _XLA_LIBRARY)), None)
        if lib is None:
            return False
        base = next(
            int(m[0].split("-")[0], 16)
            for m in maps
            if len(m) == 6 and m[5] == lib and int(m[2], 16) == 0
        )
        found = _elf_function(lib, _SET_MIN_LOG_LEVEL)
        if found is None:
            return False
        address = base + found[0] - found[1]
        executable = any(
            len(m) == 6
            and m[5] == lib
            and "x" in m[1]
            and int(m[0].split("-")[0], 16) <= address < int(m[0].split("-")[1], 16)
            for m in maps
        )
        if not executable:
            return False
        import ctypes

        ctypes.CFUNCTYPE(None, ctypes.c_int)(address)(_FATAL)
        return True
    except (OSError, ValueError, StopIteration, struct.error, ImportError):
        return False
