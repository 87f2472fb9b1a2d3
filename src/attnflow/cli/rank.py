"""``attnflow rank``: simulate, then follow the attention matrix P(t) to its Boolean limit.

The analysis settings (``--tol``, ``--fit-max``, ``--fit-min``, ``--leader-threshold``)
are checked with the simulation's options, before the (possibly long) solve.
"""

from __future__ import annotations

import numpy as np
import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Follow the attention matrix P(t) to its Boolean limit."


def rank(
    V: str = opt.V(),
    Q: str = opt.Q(),
    K: str = opt.K(),
    n: int = opt.n(),
    d: int | None = opt.d(help="dimension (default: from V, or 1)"),
    t1: float = opt.t1(10.0, help="final time (logits grow like e^{2 lambda t}: keep it moderate)"),
    seed: int = opt.seed(),
    beta: float = opt.beta(),
    frame: opt.Frame = opt.frame(),
    method: opt.Method = opt.method(),
    dt: float | None = opt.dt(),
    saves: int = opt.saves(241, help="number of saved times in [0, t1] (the fit needs many)"),
    rtol: float = opt.rtol(),
    atol: float = opt.atol(),
    max_steps: int = opt.max_steps(),
    x0: str = opt.x0(),
    scale: float = opt.scale(1.0),
    x64: bool = opt.x64(),
    tol: float = typer.Option(
        1e-6,
        "--tol",
        callback=opt.checked(_checks.number, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        help="numerical rank: singular values above tol * sigma_max count",
    ),
    norm: opt.Norm = typer.Option(
        opt.Norm("inf"),
        "--norm",
        help="Boolean distance per row: inf (1 - max_j P_ij) or l1 (twice that)",
    ),
    leader_threshold: float = typer.Option(
        0.5,
        "--leader-threshold",
        callback=opt.checked(_checks.positive),
        help="leaders: column mass of the last P above this",
    ),
    fit_max: float = typer.Option(
        1e-10,
        "--fit-max",
        callback=opt.checked(_checks.number, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        help="fit only where D <= fit-max",
    ),
    fit_min: float | None = typer.Option(
        None,
        "--fit-min",
        callback=opt.checked(_checks.number, lo=0.0),
        help="fit only where D >= "
        "fit-min (default 1e3 * smallest normal float; "
        "0: logit-based values to the end)",
    ),
    progress: bool = opt.progress(),
    strict: bool = opt.strict(),
    as_json: bool = opt.as_json(),
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
    frame_s, method_s, norm_s = common.value(frame), common.value(method), common.value(norm)
    # Options that depend on one another, before the (possibly long) simulation.
    if fit_min is not None and not fit_min < fit_max:
        raise common.CLIError(f"--fit-min must be in [0, fit-max); got {fit_min}.")
    ts = common.save_times(t1, saves, method_s, dt)
    common.check_tolerances(method_s, rtol, atol)
    common.setup_jax(x64)

    from ..analysis.rank import track_rank

    traj = common.simulate_head(
        V,
        Q,
        K,
        common.default_dim(V, d, 1),
        seed,
        x0,
        n,
        scale,
        beta,
        t1,
        ts=ts,
        frame=frame_s,
        method=method_s,
        dt=dt,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        progress=progress,
    )
    rt = track_rank(
        traj,
        tol=tol,
        norm=norm_s,
        leader_threshold=leader_threshold,
        fit_max=fit_max,
        fit_min=fit_min,
    )
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow rank")
    if as_json:
        result = rt.to_dict()
        result.update(status=traj.status, ok=traj.ok, metadata=meta)
        common.emit_json(result)
        common.report_status(traj, strict, note=False)
        return
    typer.echo(f"status: {traj.status}   (t_stop = {float(traj.t_stop[0]):.6g} of t1 = {t1})")
    typer.echo(f"n = {traj.n}, d = {traj.d}, x64 = {x64}, tol = {tol:g}, norm = {norm_s}")
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
    common.report_status(traj, strict)
