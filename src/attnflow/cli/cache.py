"""``attnflow cache``: the compilation cache of the command line (``info``, ``clear``).

The directory is the one every computing command uses (``attnflow._cache``):
``$ATTNFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnflow/jax`` or ``~/.cache/attnflow/jax``.
Neither subcommand imports JAX.
"""

from __future__ import annotations

import typer

from . import _common as common
from . import _options as opt

SHORT_HELP = "Show or clear the compilation cache (compiled programs kept across runs)."

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="The compilation cache: JAX's compiled programs, kept on disk so that a later "
    "run skips compiling them. Every computing command uses it unless given "
    "`attnflow --no-cache` or ATTNFLOW_COMPILATION_CACHE=0; ATTNFLOW_CACHE_DIR moves it.",
)


def _describe(info: dict) -> str:
    size = info["bytes"] / 2**20
    state = "on" if info["enabled"] else "off (ATTNFLOW_COMPILATION_CACHE)"
    return f"{info['dir']}: {info['entries']} compiled program(s), {size:.1f} MiB; cache {state}"


@app.command("info", short_help="Where the cache is, how many programs it holds, its size.")
def info(as_json: bool = opt.as_json()):
    """Print the cache directory, the number of compiled programs it holds, their size,
    and whether the environment turns the cache off."""
    from .._cache import cache_info

    res = cache_info()
    if as_json:
        common.emit_json(res)
    else:
        typer.echo(_describe(res))


@app.command("clear", short_help="Delete the compiled programs of the cache (nothing else).")
def clear(as_json: bool = opt.as_json()):
    """Delete the compiled programs in the cache directory, and the directory once nothing
    else is left in it (the next run of each program compiles it again). Only a directory
    that attnflow created as its cache (it carries a CACHEDIR.TAG naming attnflow), or one
    that holds nothing but compiled programs, is cleared; any other directory is refused
    (exit status 2) and nothing in it is deleted."""
    from .._cache import clear_cache

    res = clear_cache()
    if as_json:
        common.emit_json({**res, "cleared": True})
    else:
        kept = f" (kept {len(res['kept'])} file(s) that are not programs)" if res["kept"] else ""
        typer.echo(f"cleared {_describe(res)}{kept}")
