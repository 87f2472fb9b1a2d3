"""The ``attnflow`` command line.

One module per subcommand (``simulate``, ``rank``, ``ginibre``, ``classify``, ``modes``,
``animate``, ``heads``, ``dispersion``, ``retrieval``, ``figures``, and ``cache`` for the
compilation cache); the options they share are declared once in ``_options``; errors, JSON
output and reading weights and tokens are in ``_common``. This module holds the app, its
root options (``--version``, ``--traceback``, ``--no-cache``) and ``main``.

``--help``, ``--version``, every subcommand's ``--help`` and every usage error answer
without importing JAX or the numerical stack: the subcommand modules and the option
declarations import only typer, numpy and attnflow's light modules at the top, and each
command imports what it computes with when it runs.

Compiled programs are kept across runs: every command that computes turns on JAX's
persistent compilation cache (``attnflow._cache``: ``$ATTNFLOW_CACHE_DIR``, else
``$XDG_CACHE_HOME/attnflow/jax`` or ``~/.cache/attnflow/jax``), also for the worker
processes of ``figures``. ``attnflow --no-cache ...`` or ``ATTNFLOW_COMPILATION_CACHE=0``
turns it off; ``attnflow cache info`` shows it and ``attnflow cache clear`` deletes it.

Every computing subcommand accepts ``--json`` and then prints exactly one JSON object on
stdout. Options with a fixed set of values (``--frame``, ``--method``, ``--norm``,
``--interval``, ``--backend``, ``--case``) are choices listed in ``--help``; these, the
numbers (finite, in range, whole where they count something), the comma lists
(``--kernels``, ``--n``, ``--d``), the token sources (``--x0``, ``--tokens``), the
matrices named on the command line and the output paths are checked before any work;
the files given (``--V/--Q/--K``, ``--x0``, ``--tokens``) are read and checked before
any solve.

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
  or cannot be read, an output path that cannot be written, or a ``ValueError`` from
  the library's checks of its arguments.
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence

import typer

from . import _common
from . import animate as _animate
from . import cache as _cache_cmd
from . import classify as _classify
from . import dispersion as _dispersion
from . import figures as _figures
from . import ginibre as _ginibre
from . import heads as _heads
from . import longcontext as _longcontext
from . import modes as _modes
from . import rank as _rank
from . import retrieval as _retrieval
from . import simulate as _simulate
from ._common import CLIError, CLIFailure
from ._options import Backend, Case, Choice, Frame, Interval, Method, Norm

__all__ = [
    "app",
    "main",
    "CLIError",
    "CLIFailure",
    "Choice",
    "Frame",
    "Method",
    "Norm",
    "Interval",
    "Backend",
    "Case",
    "EXIT_CODES",
]

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


def _print_version(value: bool) -> None:
    if value:
        from .._meta import attnflow_version

        typer.echo(f"attnflow {attnflow_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
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
    no_cache: bool = typer.Option(
        False,
        "--no-cache",
        help="do not read or write the compilation cache "
        "(compiled programs kept across runs; also: ATTNFLOW_COMPILATION_CACHE=0; "
        "see `attnflow cache info`)",
    ),
) -> None:
    """attnflow: self-attention as an interacting particle system (tokens are particles,
    layers are time).

    Arithmetic is float64 by default (--x64; --no-x64 for float32). Every computing
    subcommand prints one JSON object on stdout with --json."""
    if traceback:
        _common.STATE["traceback"] = True
    sub, get = ctx.invoked_subcommand, getattr(ctx.command, "get_command", None)
    command = get(ctx, sub) if sub and callable(get) else None
    _common.STATE["options"] = frozenset(
        o for p in getattr(command, "params", ()) for o in getattr(p, "opts", ())
    )
    if no_cache:
        _common.STATE["cache"] = False


# The subcommands, in the order `attnflow --help` lists them.
for _module, _name in (
    (_simulate, "simulate"),
    (_rank, "rank"),
    (_ginibre, "ginibre"),
    (_classify, "classify"),
    (_modes, "modes"),
    (_animate, "animate"),
    (_heads, "heads"),
    (_dispersion, "dispersion"),
    (_retrieval, "retrieval"),
    (_longcontext, "longcontext"),
    (_figures, "figures"),
):
    app.command(name=_name, short_help=_module.SHORT_HELP)(getattr(_module, _name))
app.add_typer(_cache_cmd.app, name="cache", short_help=_cache_cmd.SHORT_HELP)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line.

    Errors become one line on stderr; in-process callers (tests, notebooks) get their
    JAX float64 mode and compilation cache settings back when the command returns. JAX
    is imported only by the commands that compute.

    Args:
        argv: the arguments after ``attnflow`` (default: ``sys.argv[1:]``; none prints
            the help).

    Raises:
        SystemExit: always, with the exit status: 0 on success, 1 for a runtime failure
            or an internal error, 2 for a usage error, 130 when interrupted.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    _common.STATE.update(
        traceback=False, cache=True, restore={}, restore_env={}, options=frozenset()
    )
    if "jax" in sys.modules:  # a command may set x64 without setup_jax (figures)
        import jax

        _common.STATE["restore"]["jax_enable_x64"] = bool(jax.config.read("jax_enable_x64"))
    try:
        with warnings.catch_warnings():  # setup_jax's filter ends with the command
            rc = app(args=args, standalone_mode=False, prog_name="attnflow")
    except SystemExit:
        raise
    except BaseException as exc:
        rc = _common.report(exc)
    finally:
        _common.restore_jax()
    raise SystemExit(rc if isinstance(rc, int) else 0)
