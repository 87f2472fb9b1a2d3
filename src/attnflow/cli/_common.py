"""What the subcommands share besides their options: errors and exit statuses, JSON on
stdout, JAX's float mode, and turning ``--V/--Q/--K`` and ``--x0`` into arrays.

Every function here that reads a user's input raises ``CLIError`` (exit status 2) with a
one-line message that names the option; ``report`` turns any exception into one line on
stderr and an exit status (see the module docstring of ``attnflow.cli``).
"""

from __future__ import annotations

import enum
import errno
import json
import os
import re
import sys
import traceback as _traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer

from .. import _checks
from ._options import FIXED as _FIXED

if TYPE_CHECKING:
    from jaxtyping import Float

__all__ = [
    "CLIError",
    "CLIFailure",
    "STATE",
    "setup_jax",
    "setup_cache",
    "restore_jax",
    "emit_json",
    "value",
    "load_weights",
    "simulate_head",
    "read_tokens",
    "initial_tokens",
    "save_times",
    "check_layers",
    "check_tolerances",
    "matrix",
    "default_dim",
    "array_status",
    "report_status",
    "report",
]


class CLIError(Exception):
    """A usage error to report on one line of stderr, with exit status 2."""


class CLIFailure(Exception):
    """A runtime failure to report on one line of stderr, with exit status 1."""


# Set by the root options for one run of ``main``: ``traceback`` (--traceback), ``cache``
# (False with --no-cache), and ``restore``: the JAX options a command changed, with their
# values before, which ``main`` puts back when the command returns (and ``restore_env``:
# the environment variables that hand the cache to worker processes).
STATE: dict[str, Any] = {
    "traceback": False,
    "cache": True,
    "restore": {},
    "restore_env": {},
    "options": frozenset(),  # the running subcommand's option names (advice names only these)
}
# What makes a run smaller, by option: the out-of-memory advice lists the command's own.
SIZE_OPTIONS = {
    "--n": "fewer tokens (--n)",
    "--saves": "fewer saved times (--saves)",
    "--beta": "a smaller --beta",
}

# The float32 cast warning of the library (model.py, simulate.py): with --no-x64 the
# cast is what was asked for, so the command line silences it.
_CAST_WARNING = r"float64 input cast to float32"


# --------------------------------------------------------------------- set-up
def setup_jax(x64: bool) -> None:
    """Set JAX's float64 mode to ``x64`` (the command line's --x64/--no-x64).

    Only the command line and scripts touch JAX flags; ``main`` restores the previous
    mode when the command returns. With ``--no-x64`` the library's warning about float64
    input cast to float32 is silenced: that cast is what was asked for.

    Args:
        x64: True for float64 arithmetic, False for float32.
    """
    setup_cache()  # first: it sets XLA's log level, which XLA reads when JAX is imported
    import jax

    _remember("jax_enable_x64", bool(jax.config.read("jax_enable_x64")))
    jax.config.update("jax_enable_x64", bool(x64))
    if not x64:
        warnings.filterwarnings("ignore", message=_CAST_WARNING, category=UserWarning)


def _remember(name: str, before: Any) -> None:
    """Keep the value a JAX option had before the command first changed it."""
    STATE["restore"].setdefault(name, before)


_CACHE_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


def setup_cache(*, children: bool = False) -> None:
    """Turn on JAX's persistent compilation cache (``attnflow._cache``) for the command,
    unless ``attnflow --no-cache`` or ``ATTNFLOW_COMPILATION_CACHE=0`` says not to.

    Called by ``setup_jax`` (every computing command) and by the commands that run
    figure scripts. A cache directory that cannot be created leaves the cache off, with
    one note on stderr; the command still runs.

    The command line runs only attnflow's own programs, so when equinox is not imported
    yet and ``EQX_ON_ERROR`` is unset it sets ``EQX_ON_ERROR=nan`` for its process (and
    the workers it starts): diffrax's runtime checks of the saved times, host callbacks
    under equinox's ``raise``, would keep the adaptive solve out of the cache, and
    ``simulate`` checks the same on the host first. ``enable_compilation_cache`` (the
    library's) leaves equinox alone.

    Args:
        children: also hand the cache to the worker processes the command starts
            (through ``JAX_*`` environment variables).
    """
    from .. import _cache

    if not STATE["cache"] or not _cache.cache_enabled_by_env():
        return
    _cache.quiet_xla_log()  # before JAX is imported: XLA reads it then
    if "equinox" not in sys.modules and "EQX_ON_ERROR" not in os.environ:
        STATE["restore_env"].setdefault("EQX_ON_ERROR", None)
        os.environ["EQX_ON_ERROR"] = "nan"  # equinox reads it when imported
    import jax

    for name in _CACHE_OPTIONS:
        _remember(name, jax.config.values[name])
    if children:
        for name in _CACHE_OPTIONS:
            STATE["restore_env"].setdefault(name.upper(), os.environ.get(name.upper()))
    try:
        _cache.enable_compilation_cache(children=children)
    except OSError as exc:
        sys.stderr.write(f"attnflow: note: compilation cache off: {exc}\n")


def set_env(name: str, value: str) -> None:
    """Set an environment variable for the command (and the worker processes it starts);
    ``restore_jax`` puts the previous value back when the command returns."""
    STATE["restore_env"].setdefault(name, os.environ.get(name))
    os.environ[name] = value


def restore_jax() -> None:
    """Put back the JAX options, and the environment variables handing them to worker
    processes, that the command changed (``main`` calls it on return)."""
    env, STATE["restore_env"] = STATE["restore_env"], {}
    for name, before in env.items():
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    saved, STATE["restore"] = STATE["restore"], {}
    if not saved:
        return
    import jax

    for name, before in saved.items():
        jax.config.update(name, before)
    if "jax_compilation_cache_dir" in saved:
        from jax.experimental.compilation_cache import compilation_cache as _cc

        _cc.reset_cache()  # reopened at the restored place on the next compilation


def emit_json(obj: Any) -> None:
    """Print ``obj`` as one line of strict JSON on stdout (``to_jsonable`` first).

    Args:
        obj: a result: dicts, lists, numbers, strings, numpy/JAX arrays, paths.
    """
    from ..io.serialize import to_jsonable

    sys.stdout.write(json.dumps(to_jsonable(obj)) + "\n")


def value(choice: Any) -> str:
    """The plain string of a choice (typer passes enum members).

    Args:
        choice: an enum member or a string.

    Returns:
        The string.
    """
    return str(choice.value) if isinstance(choice, enum.Enum) else str(choice)


# ------------------------------------------------------------------ inputs
def load_weights(
    V: str, Q: str, K: str, d: int | None, seed: int
) -> tuple[Float[np.ndarray, "d d"], Float[np.ndarray, "d d"], Float[np.ndarray, "d d"]]:
    """Resolve ``--V/--Q/--K`` (names or files) into three float64 matrices.

    Args:
        V: the ``--V`` value (a name of ``attnflow.io.matrices.NAMES`` or a file).
        Q: the ``--Q`` value.
        K: the ``--K`` value.
        d: the dimension (None: from V's file or fixed size).
        seed: seed of random V; Q and K use ``seed + 1`` and ``seed + 2``, so that
            ``--V ginibre --Q ginibre`` are independent.

    Returns:
        ``(Q, K, V)``, each ``(d, d)``.

    Raises:
        CLIError: a matrix that cannot be made or read, named by its option.
    """
    Vm = matrix("--V", V, d, seed)
    dd = Vm.shape[0]
    Qm = matrix("--Q", Q, dd, seed + 1)
    Km = matrix("--K", K, dd, seed + 2)
    return Qm, Km, Vm


def matrix(option: str, spec: str, d: int | None, seed: int) -> np.ndarray:
    from ..io import matrices

    try:
        return matrices.load(spec, d, seed)
    except ValueError as exc:
        raise CLIError(f"{option}: {exc}") from None


def read_tokens(option: str, path: str, *, d: int | None = None) -> Float[np.ndarray, "n d"]:
    """The tokens stored in a ``.npy``/``.txt`` file given as ``option``.

    Args:
        option: the option's name, for messages (``--x0``, ``--tokens``).
        path: the file.
        d: the dimension the tokens must have (None: any).

    Returns:
        A finite real ``(n, d)`` array in float64.

    Raises:
        CLIError: a file that cannot be read or does not hold one finite real
            ``(n, d)`` array; the message names the option and the file.
    """
    from ..io import matrices

    try:
        arr = matrices.read_array(path)
        arr = _checks.real_array(f"file {path!r}", arr, ndim=2, shape_hint="(n, d)")
    except ValueError as exc:
        raise CLIError(f"{option}: {exc}") from None
    if d is not None and arr.shape[1] != d:
        raise CLIError(
            f"{option}: file {path!r} holds shape {arr.shape}; the tokens must have d = {d} "
            f"columns, the size of the weights."
        )
    return np.asarray(arr, dtype=np.float64)


def simulate_head(
    V: str,
    Q: str,
    K: str,
    d: int | None,
    seed: int,
    x0: str,
    n: int,
    scale: float,
    beta: float,
    t1: float,
    *,
    kernel: str = "softmax",
    mask: str = "none",
    **solve: Any,
) -> Any:
    """Build one head from ``--V/--Q/--K`` (with ``--kernel`` and ``--mask``) and its
    starting tokens from ``--x0``, then ``attnflow.simulate`` it with the solver options
    ``solve``; returns the Trajectory. Call after ``setup_jax`` (the weights are cast to
    the working precision here)."""
    import attnflow as af

    Qm, Km, Vm = load_weights(V, Q, K, d, seed)
    tokens = initial_tokens(x0, n, Vm.shape[0], seed, scale)
    try:
        head = af.Attention(Qm, Km, Vm, beta=beta, kernel=kernel, mask=mask_object(mask))
    except ValueError as exc:
        raise CLIError(f"--kernel {kernel} --mask {mask}: {exc}") from None
    from .. import _exported

    with _exported.allowed():  # programs of the command line's own making
        return af.simulate(head, tokens, t1, **solve)


def mask_object(value: str) -> Any:
    """The mask object of a ``--mask`` spelling (``_options.parse_mask``)."""
    from attnflow.masks import check_mask

    from ._options import parse_mask

    return check_mask(parse_mask(value))


def initial_tokens(kind: str, n: int, d: int, seed: int, scale: float) -> Float[np.ndarray, "n d"]:
    """``n`` starting tokens in ``R^d``: uniform in ``[-scale, scale]^d``, normal with
    standard deviation ``scale``, or the tokens of a ``.npy``/``.txt`` file.

    Args:
        kind: ``"uniform"``, ``"normal"`` or a file (``--x0``).
        n: number of tokens (a file decides its own).
        d: dimension.
        seed: seed of the random tokens.
        scale: half-width (uniform) or standard deviation (normal).

    Returns:
        ``(n, d)`` float64 tokens.

    Raises:
        CLIError: an unknown kind, or a file that cannot be used (named).
    """
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.uniform(-scale, scale, size=(n, d))
    if kind == "normal":
        return scale * rng.standard_normal((n, d))
    if Path(kind).suffix in (".npy", ".txt"):
        return read_tokens("--x0", kind, d=d)
    raise CLIError(f"--x0 must be 'uniform', 'normal' or a .npy/.txt file; got {kind!r}.")


def save_times(t1: float, saves: int, method: str, dt: float | None) -> np.ndarray:
    """``saves`` times in ``[0, t1]``, moved onto the layer grid for ``--method euler``.

    Also checks what the options say together (before any work): a fixed-step method
    needs ``--dt``, and ``--t1`` must then be a whole number of layers.

    Args:
        t1: final time (``--t1``, checked > 0).
        saves: number of saved times (``--saves``, checked >= 2).
        method: the ``--method`` string.
        dt: the layer step (``--dt``), or None.

    Returns:
        The sorted saved times.

    Raises:
        CLIError: ``--saves`` below 2, ``--dt`` missing or not dividing ``--t1``.
    """
    if saves < 2:
        raise CLIError("--saves must be at least 2.")
    ts = np.linspace(0.0, t1, saves)
    if method in _FIXED:
        if dt is None:
            raise CLIError(f"--dt is required with --method {method}.")
        check_layers(t1, dt)
        ts = np.unique(np.clip(np.rint(ts / dt) * dt, 0, t1))
    return ts


def check_layers(t1: float, dt: float) -> None:
    """``--t1`` must be a whole number of layers of ``--dt`` (the library's rule, checked
    here before any work).

    Args:
        t1: final time.
        dt: layer step.

    Raises:
        CLIError: when it is not.
    """
    layers = round(t1 / dt)
    if layers < 1 or abs(layers * dt - t1) > 1e-9 * max(1.0, t1):
        raise CLIError(
            f"--t1 {t1:g} is not a whole number of layers of --dt {dt:g}; choose --t1 = k * dt."
        )


def default_dim(V: str, d: int | None, default: int) -> int | None:
    """``--d``, or ``default`` when V is a sized name (a file or paper matrix fixes d).

    Args:
        V: the ``--V`` value.
        d: the ``--d`` value, or None.
        default: the dimension of sized names when ``--d`` is not given.

    Returns:
        The dimension to ask for, or None when V decides it.
    """
    from ..io import matrices

    if d is None and not matrices.is_file_spec(V) and V not in matrices.PAPER:
        return default
    return d


def check_tolerances(method: str, rtol: float, atol: float) -> None:
    """``--rtol`` and ``--atol`` both 0 accept no step of an adaptive solver.

    Args:
        method: the ``--method`` string.
        rtol: ``--rtol`` (checked in [0, 1) while parsing).
        atol: ``--atol`` (checked >= 0 while parsing).

    Raises:
        CLIError: both are 0 with an adaptive method.
    """
    if method not in _FIXED and rtol == 0 and atol == 0:
        raise CLIError(
            "--rtol and --atol are both 0: no step would ever be accepted; give "
            "--rtol > 0 (e.g. 1e-6) or --atol > 0."
        )


# ----------------------------------------------------------------- results
def array_status(traj: Any, name: str, array: Any) -> str:
    """The status of one array the command shows: the trajectory's own word for the
    frame (``traj.status_of``, where it exists), and ``"nonfinite"`` whenever the
    numbers shown hold NaN or inf although that word is ``"ok"``.

    Args:
        traj: the ``Trajectory``.
        name: the frame, ``"z"`` or ``"x"``.
        array: the numbers shown (for instance ``traj.z[-1]``).

    Returns:
        ``"ok"`` only when every number shown is finite.
    """
    status_of = getattr(traj, "status_of", None)
    status = str(status_of(name) if callable(status_of) else traj.status)
    if status == "ok" and not np.all(np.isfinite(np.asarray(array))):
        return "nonfinite"
    return status


def report_status(traj: Any, strict: bool, *, note: bool = True) -> None:
    """After the output: with ``--strict``, a solve that stopped early is a failure
    (exit status 1); otherwise its status was reported, and ``note`` prints a line that
    says what to change.

    Args:
        traj: the ``Trajectory``.
        strict: the ``--strict`` flag.
        note: print the advice line (text output only).

    Raises:
        CLIFailure: with ``strict``, when the solve did not reach t1.
    """
    if traj.ok:
        return
    from ..dynamics.trajectory import SimulationError

    try:
        traj.raise_for_status()
    except SimulationError as exc:
        if strict:
            raise CLIFailure(f"the solve failed ({traj.status}): {exc}") from None
        if note:
            typer.echo(f"note: {exc}")


# ------------------------------------------------------------------ errors
def traceback_wanted() -> bool:
    """Whether ``--traceback`` or ``ATTNFLOW_TRACEBACK`` asks for tracebacks."""
    env = os.environ.get("ATTNFLOW_TRACEBACK", "").strip().lower()
    return STATE["traceback"] or env not in ("", "0", "false", "no", "off")


def report(exc: BaseException) -> int:
    """Print one line for ``exc`` on stderr (and its traceback when asked).

    Args:
        exc: what the command raised.

    Returns:
        The exit status: 2 for usage errors (click's, ``CLIError``, ``ValueError`` and
        ``OSError``), 1 for runtime failures and internal errors, 130 for Ctrl-C.
    """
    # A SimulationError can only come from the dynamics once they are imported; a usage
    # error is reported without importing them (and JAX).
    trajectory = sys.modules.get(f"{__name__.partition('.')[0]}.dynamics.trajectory")
    SimulationError = getattr(trajectory, "SimulationError", ())

    format_message = getattr(exc, "format_message", None)
    exit_code = getattr(exc, "exit_code", None)
    if callable(format_message) and isinstance(exit_code, int):
        # click's usage errors (bad option, bad value or choice, missing file): status 2.
        # (typer words its choice errors as validation errors: "Value error, 'x' is ...")
        msg = str(format_message()).replace(": Value error, ", ": ")
        ctx = getattr(exc, "ctx", None)
        if exit_code == 2 and ctx is not None:
            msg = f"{msg} (see '{ctx.command_path} --help')"
        return fail(msg, exit_code)
    if isinstance(exc, CLIError):
        return fail(str(exc), 2)
    if type(exc).__name__ == "Abort" or isinstance(exc, KeyboardInterrupt):
        # Ctrl-C inside a command exits 130 through typer; click turns an EOFError
        # into Abort ("interrupted"), the cause kept: report the cause instead.
        cause = exc.__cause__
        if isinstance(cause, EOFError):
            return report(cause)
        ctrl_c = isinstance(exc, KeyboardInterrupt) or isinstance(cause, KeyboardInterrupt)
        return fail("interrupted", 130 if ctrl_c else 1)
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        return 1  # stdout closed early (`attnflow ... | head`): nothing to say
    tb = traceback_wanted()
    if tb:
        _traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, CLIFailure):
        return fail(str(exc), 1)
    if isinstance(exc, (ValueError, OSError)):
        # The library's argument checks and the user's files.
        return fail(str(exc) or type(exc).__name__, 2)
    if isinstance(exc, (SimulationError, ImportError)):
        return fail(str(exc) or type(exc).__name__, 1)
    if isinstance(exc, MemoryError) or "RESOURCE_EXHAUSTED" in str(exc):
        # numpy's MemoryError, XLA's RESOURCE_EXHAUSTED: a size, not a bug
        asked = re.search(r"allocating (\d+) bytes", str(exc))
        size = f" ({int(asked.group(1)) / 2**30:.1f} GiB asked)" if asked else ""
        have = [why for opt, why in SIZE_OPTIONS.items() if opt in STATE.get("options", ())]
        advice = f"; use {' or '.join(have)}" if have else ""
        return fail(
            f"out of memory{size}: the run does not fit in this machine's memory{advice}.", 1
        )
    hint = (
        ""
        if tb
        else " (re-run with `attnflow --traceback ...` or ATTNFLOW_TRACEBACK=1 for the traceback)"
    )
    return fail(f"{type(exc).__name__}: {exc}{hint}", 1, label="internal error")


def fail(message: str, code: int, *, label: str = "error") -> int:
    """Write ``attnflow: <label>: <message>`` as one line on stderr.

    Args:
        message: the message (its lines are joined; at most 2000 characters).
        code: the exit status to return.
        label: ``error`` or ``internal error``.

    Returns:
        ``code``.
    """
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    sys.stderr.write(f"attnflow: {label}: {' '.join(lines)[:2000]}\n")
    return code
