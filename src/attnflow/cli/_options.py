"""The options of the ``attnflow`` subcommands, each declared once.

An option that several subcommands take (``--V``, ``--n``, ``--t1``, ``--seed``,
``--method``, ``--x64``, ``--json``, ...) is one function here returning its
``typer.Option``: the name, the check and the help text live in one place, and a command
passes only what differs (the default, or help that says what the value means there).

Every value is checked while the command line is parsed, before any work: choices are
enums built from the tables below, numbers go through ``attnflow._checks`` (finite, in
range, whole), files must exist, output paths must be writable. A bad value is a click
usage error: one line naming the option, exit status 2.

This module imports neither JAX nor any layer of attnflow that does (``--help``, every
subcommand's ``--help`` and every usage error answer without the numerical stack), so
the tables of choices are copies of the library's own: ``FRAMES``, ``SOLVERS`` and
``_FIXED`` of ``attnflow.dynamics``, ``KERNELS`` of ``attnflow.dynamics.kernels``,
``NORMS`` of ``attnflow.analysis.rank``, ``LAYERNORMS`` of ``attnflow.dynamics.frames``,
``INTERVALS`` and ``BACKENDS`` of
``attnflow.studies.ginibre``, the names of ``attnflow.studies.setups.MOVIE_CASES``.
``tests/test_startup.py`` checks that each copy equals the library's table: a new
solver, frame, norm, interval, backend or movie case is added here too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .. import _checks

# ------------------------------------------------------------------------ tables
# Copies of the library's tables (see the module docstring; tests/test_startup.py
# compares them).
FRAMES = ("rescaled", "original", "sphere")
SOLVERS = ("adaptive", "tsit5", "dopri5", "dopri8", "bosh3", "heun")
FIXED = ("euler", "euler-ode")  # the fixed-step methods (``--dt`` required)
MAX_STEPS_LIMIT = 2**31 - 1
KERNELS = (
    "softmax",
    "qknorm",
    "ssmax",
    "sigmoid",
    "adaptive",
    "usa",
    "linear",
    "linearnorm",
    "stickbreaking",
    "selective",
    "differential",
    "offbyone",
    "prenorm",
    "sink",
    "qknorm_sink",
    "sinkhorn",
    "sparsemax",
    "entmax",
    "softpick",
    "hardmax",
)
NORMS = ("inf", "l1")
INTERVALS = ("wilson", "clopper-pearson")
BACKENDS = ("numpy", "jax")
MOVIE_CASES = ("polytope", "polytope-3d", "hyperplanes", "hyperplanes-3d", "origin")


# ----------------------------------------------------------------------- choices
class Choice(enum.StrEnum):
    """A fixed set of strings for an option: typer lists them in ``--help`` and rejects
    any other value while parsing, before the command runs."""

    def __str__(self) -> str:
        return str(self.value)


def _choices(name: str, values: Iterable[str]) -> type[Choice]:
    return Choice(name, [(v, v) for v in dict.fromkeys(values)])  # type: ignore[return-value]


if TYPE_CHECKING:  # the members are only known at run time, from the library's tables
    Frame = Method = Norm = Interval = Backend = Case = Choice
else:
    Frame = _choices("Frame", FRAMES)
    Method = _choices("Method", ("adaptive", *FIXED, *SOLVERS))
    Norm = _choices("Norm", NORMS)
    Interval = _choices("Interval", INTERVALS)
    Backend = _choices("Backend", BACKENDS)
    Case = _choices("Case", MOVIE_CASES)

X0_KINDS = ("uniform", "normal")
TOKEN_KINDS = ("sphere", "uniform", "normal")


# --------------------------------------------------------------------- callbacks
def _strip_name(message: str, name: str) -> str:
    """A check's message without its leading option name (click adds its own)."""
    for prefix in (name + " ", name + ": ", name + ":"):
        if message.startswith(prefix):
            return message[len(prefix) :].lstrip()
    return message


def checked(check: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """A typer callback that runs ``check(option_name, value, **kwargs)`` from
    ``attnflow._checks`` while parsing; None (an unset optional value) passes.

    Args:
        check: a function of ``attnflow._checks`` (``number``, ``positive``,
            ``integer``, ``output_file``, ...).
        **kwargs: its keyword arguments (``lo``, ``hi``, ...).

    Returns:
        The callback; it returns the value unchanged, or raises ``typer.BadParameter``
        with the check's message.
    """

    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        name = param.opts[0] if param.opts else str(param.name)
        try:
            check(name, value, **kwargs)
        except ValueError as exc:
            raise typer.BadParameter(_strip_name(str(exc), name)) from None
        return value

    return callback


def _token_source(kinds: tuple[str, ...]) -> Callable[[str], str]:
    """A parse-time check of ``--x0``/``--tokens``: a kind name or an existing .npy/.txt
    (its contents are read, and checked, before any work)."""

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


def _matrix_spec(*extra: str) -> Callable[[str], str]:
    """A parse-time check of ``--V/--Q/--K``: a matrix name or an existing file (its
    contents are read, and checked, before any work)."""

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
    from ._parse import parse_dims

    try:
        parse_dims(value)
    except ValueError as exc:
        msg = str(exc)
        raise typer.BadParameter(msg[4:].lstrip(": ") if msg.startswith("--d") else msg) from None
    return value


def _npz_file(name: str, value: Any) -> Path:
    """``simulate --out``: a file that can be written, ``.npz`` appended as
    ``Trajectory.save`` does (missing parent folders are created when it writes)."""
    if Path(value).is_dir():  # "." included
        raise ValueError(
            f"{name} {str(value)!r} is a directory; give a file name such as "
            f"{str(Path(value) / 'run.npz')!r}."
        )
    path = _checks.output_file(name, value, suffix=".npz")
    return _checks.output_file(name, path)


def _gif_file(name: str, value: Any) -> Path:
    """``animate --out``: a ``.gif`` file that can be written."""
    if Path(value).suffix.lower() != ".gif":
        raise ValueError(f"{name} must be a .gif file; got {str(value)!r}.")
    return _checks.output_file(name, value)


# ------------------------------------------------------------------- the options
_HELP_X64 = (
    "float64 arithmetic (default: on); --no-x64 computes in "
    "float32: faster, but logits overflow sooner and close tokens "
    "merge to the last bit sooner"
)


def V() -> Any:
    """``--V``: the value matrix, a name or a file."""
    return typer.Option(
        "identity",
        "--V",
        callback=_matrix_spec(),
        help="value matrix: a name (identity, ginibre, paper-2d, ...) or a .npy/.npz/.txt file",
    )


def Q(
    default: str = "identity",
    help: str = "query matrix: a name or a .npy/.npz/.txt file",
    *,
    extra: tuple[str, ...] = (),
) -> Any:
    """``--Q``: the query matrix; ``extra`` names accepted besides the matrix names."""
    return typer.Option(default, "--Q", callback=_matrix_spec(*extra), help=help)


def K(
    default: str = "identity",
    help: str = "key matrix: a name or a .npy/.npz/.txt file",
    *,
    extra: tuple[str, ...] = (),
) -> Any:
    """``--K``: the key matrix; ``extra`` names accepted besides the matrix names."""
    return typer.Option(default, "--K", callback=_matrix_spec(*extra), help=help)


# Sizes past any machine (an n x n attention matrix of 10^12 entries, tokens of 10^6
# coordinates) are refused while parsing, by name, before numpy is asked for them.
MAX_TOKENS = 10**6
MAX_DIM = 10**6


def n(default: int = 20, help: str = "number of tokens") -> Any:
    """``--n``: a number of tokens, in ``[1, MAX_TOKENS]``."""
    return typer.Option(
        default, "--n", callback=checked(_checks.integer, lo=1, hi=MAX_TOKENS), help=help
    )


def n_list(default: str, help: str) -> Any:
    """``--n`` as a comma list of numbers of tokens (``'16,64,...,16384'``)."""
    return typer.Option(default, "--n", callback=_dims_list, help=help)


def d(default: int | None = None, help: str = "dimension (default: from V, or 2)") -> Any:
    """``--d``: the dimension, in ``[1, MAX_DIM]`` (None: from V)."""
    return typer.Option(
        default, "--d", callback=checked(_checks.integer, lo=1, hi=MAX_DIM), help=help
    )


def d_list(default: str, help: str) -> Any:
    """``--d`` as a comma list of dimensions (``'2,4,8,...,256'``)."""
    return typer.Option(default, "--d", callback=_dims_list, help=help)


def t1(default: float | None = 5.0, help: str = "final time") -> Any:
    """``--t1``: the final time, finite and > 0."""
    return typer.Option(default, "--t1", callback=checked(_checks.positive), help=help)


def seed(default: int = 0, help: str = "seed for random matrices and tokens") -> Any:
    """``--seed``: an integer >= 0."""
    return typer.Option(default, "--seed", callback=checked(_checks.integer, lo=0), help=help)


def beta(default: float = 1.0, help: str = "inverse temperature: multiplies every logit") -> Any:
    """``--beta``: the inverse temperature, finite and > 0."""
    return typer.Option(default, "--beta", callback=checked(_checks.positive), help=help)


def frame() -> Any:
    """``--frame``: the frame integrated, a choice of ``FRAMES``."""
    return typer.Option(
        Frame("rescaled"),
        "--frame",
        help="the frame integrated: rescaled (z = e^{-tV} x) or original (x)",
    )


def method(
    help: str = "adaptive (Tsit5 with step "
    "control), euler (the discrete transformer, one layer per --dt), "
    "or a named adaptive solver",
) -> Any:
    """``--method``: ``adaptive``, a fixed-step scheme or a named adaptive solver."""
    return typer.Option(Method("adaptive"), "--method", help=help)


def dt(default: float | None = None, help: str = "layer step, required with --method euler") -> Any:
    """``--dt``: the layer step, finite and > 0."""
    return typer.Option(default, "--dt", callback=checked(_checks.positive), help=help)


def saves(default: int = 11, help: str = "number of saved times in [0, t1]") -> Any:
    """``--saves``: a number of saved times, >= 2 (0 and t1 at least)."""
    return typer.Option(default, "--saves", callback=checked(_checks.integer, lo=2), help=help)


def rtol() -> Any:
    """``--rtol`` of the adaptive solver: in [0, 1)."""
    return typer.Option(
        1e-6,
        "--rtol",
        callback=checked(_checks.number, lo=0.0, hi=1.0, hi_open=True),
        help="relative tolerance of the adaptive solver",
    )


def atol() -> Any:
    """``--atol`` of the adaptive solver: finite, >= 0."""
    return typer.Option(
        1e-9,
        "--atol",
        callback=checked(_checks.number, lo=0.0),
        help="absolute tolerance of the adaptive solver",
    )


def max_steps(
    help: str = "step limit of the adaptive solver (status 'max_steps' when reached)",
) -> Any:
    """``--max-steps``: a whole number of steps, >= 1."""
    return typer.Option(
        100_000,
        "--max-steps",
        callback=checked(_checks.integer, lo=1, hi=MAX_STEPS_LIMIT),
        help=help,
    )


def decision_rtol() -> Any:
    """``--rtol`` of the spectral decisions (``classify``, ``heads``): in (0, 1)."""
    return typer.Option(
        1e-8,
        "--rtol",
        callback=checked(_checks.number, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        help="relative tolerance of the decisions",
    )


def x0() -> Any:
    """``--x0``: initial tokens, ``uniform``, ``normal`` or a .npy/.txt file."""
    return typer.Option(
        "uniform",
        "--x0",
        callback=_token_source(X0_KINDS),
        help="initial tokens: uniform | normal | a .npy/.txt file of shape (n, d)",
    )


def tokens() -> Any:
    """``--tokens`` (dispersion): ``sphere``, ``uniform``, ``normal`` or a file."""
    return typer.Option(
        "sphere",
        "--tokens",
        callback=_token_source(TOKEN_KINDS),
        help="sphere | uniform | normal | a .npy/.txt file",
    )


def scale(
    default: float = 5.0,
    help: str = "half-width (uniform) or standard deviation (normal) of x0",
) -> Any:
    """``--scale`` of the random initial tokens: finite and > 0."""
    return typer.Option(default, "--scale", callback=checked(_checks.positive), help=help)


LAYERNORMS = ("post", "pre", "peri", "ngpt", "mix", "scaled")
_MASK_FORMS = "none, causal, window:W, alibi:SLOPE, sinkwindow:SINKS,W or rope:BASE[,causal]"


def _check_kernel(value: str) -> str:
    if value not in KERNELS:
        raise typer.BadParameter(f"must be one of {', '.join(KERNELS)}; got {value!r}.")
    return value


def parse_mask(value: str) -> list | None:
    """The ``--mask`` spelling as the mask's saved form (``None`` for none), checked at
    parse time; ``attnflow.masks.check_mask`` turns it into the object when the command
    runs (it imports JAX)."""
    v = value.strip().lower()
    if v in ("", "none"):
        return None
    if v == "causal":
        return ["causal"]
    kind, _, rest = v.partition(":")
    parts = [p.strip() for p in rest.split(",")] if rest else []
    try:
        if kind == "window" and len(parts) == 1:
            return ["window", int(parts[0])]
        if kind == "alibi" and len(parts) == 1:
            return ["alibi", float(parts[0])]
        if kind == "sinkwindow" and len(parts) == 2:
            return ["sinkwindow", int(parts[0]), int(parts[1])]
        if kind == "rope" and len(parts) in (1, 2) and parts[1:] in ([], ["causal"]):
            return ["rope", float(parts[0]), ["causal"] if len(parts) == 2 else None]
    except ValueError:
        pass
    raise typer.BadParameter(f"must be one of {_MASK_FORMS}; got {value!r}.")


def _check_mask(value: str) -> str:
    parse_mask(value)
    return value


def kernel() -> Any:
    """``--kernel``: the attention kernel of ``KERNELS`` (default parameters)."""
    return typer.Option(
        "softmax",
        "--kernel",
        callback=_check_kernel,
        help=f"the attention kernel, one of: {', '.join(KERNELS)}",
    )


def mask() -> Any:
    """``--mask``: which logits a row keeps (and positions): ``parse_mask``."""
    return typer.Option(
        "none", "--mask", callback=_check_mask, help=f"the attention mask: {_MASK_FORMS}"
    )


def layernorm() -> Any:
    """``--layernorm``: where the layer norm sits (``--frame sphere --method euler``)."""
    return typer.Option(
        None,
        "--layernorm",
        callback=lambda v: v if v is None or v in LAYERNORMS else _bad_layernorm(v),
        help=f"the layer norm's place on the sphere's layers: {', '.join(LAYERNORMS)} "
        "(with --frame sphere --method euler; default post)",
    )


def _bad_layernorm(v: str) -> str:
    raise typer.BadParameter(f"must be one of {', '.join(LAYERNORMS)}; got {v!r}.")


def kernels(default: str, help: str) -> Any:
    """``--kernels``: a comma list of attention kernels of ``KERNELS``."""
    return typer.Option(default, "--kernels", callback=_check_kernels, help=help)


def x64() -> Any:
    """``--x64/--no-x64``: float64 (default) or float32 arithmetic."""
    return typer.Option(True, "--x64/--no-x64", show_default=False, help=_HELP_X64)


def as_json() -> Any:
    """``--json``: one JSON object on stdout."""
    return typer.Option(False, "--json", help="print one JSON object on stdout (nothing else)")


def progress() -> Any:
    """``--progress``: a progress bar on stderr."""
    return typer.Option(False, "--progress", help="show a progress bar on stderr")


def strict(
    help: str = "exit with status 1 when the solve "
    "stopped before t1 (status not 'ok'), after printing the results",
) -> Any:
    """``--strict``: a solve that stopped early exits with status 1."""
    return typer.Option(False, "--strict", help=help)


def out_npz() -> Any:
    """``simulate --out``: the .npz file to write (checked writable before the solve)."""
    return typer.Option(
        None,
        "--out",
        callback=checked(_npz_file),
        help="write ts, z, x and metadata to this .npz file",
    )


def out_gif() -> Any:
    """``animate --out``: the .gif file to write (checked writable before drawing)."""
    return typer.Option(
        None,
        "--out",
        callback=checked(_gif_file),
        help="the .gif to write (default figures/movies/CASE.gif)",
    )


def out_dir(default: Path | None, help: str) -> Any:
    """``--out`` naming a folder (checked to be a folder or creatable)."""
    return typer.Option(default, "--out", callback=checked(_checks.output_dir), help=help)
