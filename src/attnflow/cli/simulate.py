"""``attnflow simulate``: integrate the particle system and report where the tokens went.

Every option is checked while parsing, and the options that only make sense together
(``--method euler`` with ``--dt``, ``--t1`` a whole number of layers, ``--rtol`` and
``--atol`` not both 0) and the files (``--V/--Q/--K``, ``--x0``, ``--out``) before the
solve. The output gives the status of the solve and of every array it shows: an array
holding NaN or inf is never reported as ``ok``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import typer

from . import _common as common
from . import _options as opt

SHORT_HELP = "Integrate the particle system; report where the tokens went."
# What the final z is, by the frame integrated (traj.frame): z = e^{-tV} x after a solve
# in the original or rescaled frame; the tokens themselves (z = x) on the sphere.
_FRAME_HEADINGS = {"sphere": "sphere frame: the tokens on the unit sphere, z = x"}


def simulate(
    V: str = opt.V(),
    Q: str = opt.Q(),
    K: str = opt.K(),
    n: int = opt.n(),
    d: int | None = opt.d(),
    t1: float = opt.t1(),
    seed: int = opt.seed(),
    beta: float = opt.beta(),
    kernel: str = opt.kernel(),
    mask: str = opt.mask(),
    layernorm: str | None = opt.layernorm(),
    frame: opt.Frame = opt.frame(),
    method: opt.Method = opt.method(),
    dt: float | None = opt.dt(),
    saves: int = opt.saves(),
    rtol: float = opt.rtol(),
    atol: float = opt.atol(),
    max_steps: int = opt.max_steps(),
    x0: str = opt.x0(),
    scale: float = opt.scale(),
    x64: bool = opt.x64(),
    progress: bool = opt.progress(),
    strict: bool = opt.strict(),
    out: Path | None = opt.out_npz(),
    as_json: bool = opt.as_json(),
):
    """Integrate the particle system and report where the tokens went.

    A solve that stops early (step limit, overflow) is reported in the status, with a
    note that says what to change; --strict makes it exit with status 1."""
    frame_s, method_s = common.value(frame), common.value(method)
    ts = common.save_times(t1, saves, method_s, dt)
    common.check_tolerances(method_s, rtol, atol)
    common.setup_jax(x64)

    traj = common.simulate_head(
        V,
        Q,
        K,
        common.default_dim(V, d, 2),
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
        kernel=kernel,
        mask=mask,
        **({} if layernorm is None else {"layernorm": layernorm}),
    )
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    saved = None
    if out is not None:
        saved = traj.save(out, seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    with warnings.catch_warnings():
        # A frame out of the float range warns; its status below says so instead.
        warnings.simplefilter("ignore", RuntimeWarning)
        z_final, x_final = np.asarray(traj.z)[-1], np.asarray(traj.x)[-1]
        z_status = common.array_status(traj, "z", z_final)
        x_status = common.array_status(traj, "x", x_final)
    t_stop = float(traj.t_stop[0])
    limit = _where_they_went(traj)
    result = {
        "status": traj.status,
        "ok": traj.ok,
        "ts": traj.ts,
        "t_stop": t_stop,
        "n": traj.n,
        "d": traj.d,
        "frame": traj.frame,
        "stats": traj.stats,
        "z_final": z_final,
        "z_final_status": z_status,
        "x_final": x_final,
        "x_final_status": x_status,
        "metadata": meta,
        "out": str(saved) if saved is not None else None,
        "limit": limit,
    }
    if as_json:
        common.emit_json(result)
        common.report_status(traj, strict, note=False)
        return
    # The headline never says "ok" above numbers that are not.
    headline = str(traj.status) if z_status == traj.status else f"{z_status} (solve: {traj.status})"
    typer.echo(f"status: {headline}   (t_stop = {t_stop:.6g} of t1 = {t1})")
    typer.echo(f"solver: {traj.solver}   steps: {int(np.asarray(traj.stats['num_steps']))}")
    typer.echo(f"n = {traj.n}, d = {traj.d}, frame = {traj.frame}, x64 = {x64}")
    typer.echo(f"where the tokens went: {limit['summary']}")
    with np.printoptions(precision=4, suppress=True, threshold=200):
        heading = _FRAME_HEADINGS.get(traj.frame, "rescaled frame")
        typer.echo(f"final z ({heading}; status: {z_status}):\n{z_final}")
    if saved is not None:
        typer.echo(f"saved: {saved}")
    common.report_status(traj, strict)


def _where_they_went(traj) -> dict:
    """The observed limit of the run beside the prediction from the model (one line,
    and the labels for --json); a run or model the analyses refuse says why."""
    from ..analysis.observe import observe_limit
    from ..analysis.regimes import predict_regime

    out: dict = {"observed": None, "predicted": None}
    try:
        out["predicted"] = str(predict_regime(traj.model).label)
    except ValueError as exc:
        out["predicted_why_not"] = str(exc)
    try:
        obs = observe_limit(traj)
        out["observed"] = str(obs.label)
    except ValueError as exc:
        out["observed_why_not"] = str(exc)
    seen = out["observed"] or f"not observed ({out.get('observed_why_not', '')[:80]})"
    said = out["predicted"] or "no prediction"
    if None in (out["observed"], out["predicted"]):
        agree = ""
    elif out["observed"] == "not-converged":
        agree = " (not settled by t1: a larger --t1 may tell)"
    else:
        agree = " (agrees)" if out["observed"] == out["predicted"] else " (differs)"
    out["summary"] = f"observed {seen}; predicted {said}{agree}"
    return out
