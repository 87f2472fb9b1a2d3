"""``attnflow animate``: a GIF movie of the tokens moving (matplotlib + Pillow)."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Write a GIF movie of the tokens moving."


def animate(
    case: opt.Case = typer.Option(opt.Case("polytope"), "--case", help="the example to film"),
    out: Path | None = opt.out_gif(),
    n: int = opt.n(),
    t1: float | None = opt.t1(
        None, help="final time (default: the case's, 12 or 30; a multiple of --dt)"
    ),
    dt: float = opt.dt(
        0.1,
        help="layer step of attnflow's discrete "
        "transformer (Euler layers with exact discrete rescaling; the "
        "authors' movies use forward Euler of the rescaled ODE, also "
        "first order)",
    ),
    seed: int = opt.seed(help="seed of the tokens, uniform in [-5, 5]^d"),
    frames: int = typer.Option(
        48,
        "--frames",
        callback=opt.checked(_checks.integer, lo=2),
        help="number of frames (denser early)",
    ),
    fps: int = typer.Option(
        12, "--fps", callback=opt.checked(_checks.integer, lo=1), help="frames per second"
    ),
    dpi: int = typer.Option(
        90, "--dpi", callback=opt.checked(_checks.integer, lo=10), help="resolution (4 x 4 inches)"
    ),
    x64: bool = opt.x64(),
    as_json: bool = opt.as_json(),
):
    """Write a GIF movie of the tokens moving (matplotlib + Pillow; no ffmpeg needed):
    the rescaled frame with the current convex hull (polytope) or the lines/planes
    {phi_1^*(z) in {min, 0, max}} (hyperplanes); the original frame for origin.

    \b
    Example:
      attnflow animate --case hyperplanes --out figures/movies/hyperplanes.gif
    """
    from ..studies.setups import MOVIE_CASES

    case_s = common.value(case)
    common.check_layers(float(MOVIE_CASES[case_s]["t1"]) if t1 is None else t1, dt)
    path = out if out is not None else Path("figures") / "movies" / f"{case_s}.gif"
    try:
        _checks.output_file("--out", path)
    except ValueError as exc:
        raise common.CLIError(str(exc)) from None
    common.setup_jax(x64)
    from ..plotting import movie

    info = movie(case_s, path, n=n, seed=seed, t1=t1, dt=dt, frames=frames, fps=fps, dpi=dpi)
    if as_json:
        common.emit_json(info)
        return
    typer.echo(
        f"{info['path']}: {info['frames']} frames at {info['fps']} fps, "
        f"{info['bytes'] / 1e3:.0f} kB ({info['seconds']} s to draw); "
        f"status {info['params']['status']}"
    )
