"""``attnflow figures``: regenerate the figures from the fig_*.py scripts."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Regenerate the figures from the fig_*.py scripts."


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
    force: bool = typer.Option(
        False,
        "--force",
        help="run every script, even those whose saved results match their inputs (the "
        "attnflow source, the script, --quick and the versions)",
    ),
    as_json: bool = opt.as_json(),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        callback=opt.checked(_checks.integer, lo=1),
        help="scripts run at once, each in "
        "a worker process (default: one per core; 1: "
        "all in this process)",
    ),
    rewrite: bool = typer.Option(
        False,
        "--rewrite",
        help="draw and write every figure computed, even one whose numbers equal those of "
        "its files already in --out (to rounding; those are kept by default, so that a "
        "run that changes no number leaves a checkout clean), e.g. after changing a "
        "script's draw()",
    ),
    redraw: bool = typer.Option(
        False,
        "--redraw",
        help="compute nothing: draw the figures again from the data saved in --out (by "
        "a run with the same --quick and attnflow version), e.g. after changing a "
        "script's draw(); seconds",
    ),
):
    """Regenerate the figures (PNG + PDF + JSON sidecars) from the fig_*.py scripts of
    attnflow.experiments (or of --experiments DIR).

    Figures are always computed in float64. A script that fails is reported and the
    others still run; the exit status is then 1. A script whose inputs are unchanged
    since the last run into the same folder is not run again (its files are kept;
    --force runs it). A figure whose numbers equal, to rounding, those of its files
    already in --out keeps those files (--rewrite draws and writes it). --redraw only
    draws, from the data a run saved in --out: a figure without such data fails, saying
    what to run."""
    from ..experiments.runner import FolderBusy, find_experiments, list_figures, run_figures

    if list_only:
        names = list_figures(find_experiments(experiments))
        if as_json:
            common.emit_json({"figures": names})
        else:
            typer.echo("\n".join(names))
        return
    try:
        _checks.output_dir("--out", out)
    except ValueError as exc:
        raise common.CLIError(str(exc)) from None
    if redraw and force:
        raise common.CLIError(
            "--redraw computes nothing and --force computes everything: pass one."
        )
    if not redraw:  # --redraw computes nothing: no JAX, no compilation cache
        common.setup_cache(children=True)  # this process and the worker processes
    if rewrite:  # read by every figure script, here and in the worker processes
        from ..experiments._figure import REWRITE

        common.set_env(REWRITE, "1")
    try:
        index = run_figures(
            out,
            only=only,
            quick=quick,
            experiments=experiments,
            progress=not as_json,
            jobs=jobs,
            reuse=not force,
            redraw=redraw,
        )
    except FolderBusy as exc:  # a second run into the same --out
        raise common.CLIFailure(str(exc)) from None
    if as_json:
        common.emit_json(index)
    else:
        for name, res in index["figures"].items():
            if res.get("reused"):
                typer.echo(f"{name}: {len(res['figures'])} files, inputs unchanged: reused")
            elif res.get("unchanged"):
                typer.echo(
                    f"{name}: numbers unchanged (to rounding), its {len(res['figures'])} "
                    f"files kept as they were ({res['seconds']} s)"
                )
            elif res.get("redrawn"):
                typer.echo(f"{name}: {len(res['figures'])} files redrawn in {res['seconds']} s")
            else:
                typer.echo(f"{name}: {len(res['figures'])} files in {res['seconds']} s")
        for name, why in index.get("skipped", {}).items():
            typer.echo(f"{name}: {why}")
        for name, why in index["failed"].items():
            typer.echo(f"{name}: FAILED: {why}", err=True)
        typer.echo(
            f"{len(index['figures'])} script(s) in {index['seconds']} s ({index['jobs']} job(s))"
        )
    if index["failed"]:
        raise common.CLIFailure(
            f"{len(index['failed'])} figure script(s) failed: {', '.join(index['failed'])}"
        )
