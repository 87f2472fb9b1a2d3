"""``attnflow classify``: predict the limit geometry from V's spectrum (and Q, K); with
``--simulate``, run it, observe the limit and compare."""

from __future__ import annotations

import numpy as np
import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Predict the limit geometry from V's spectrum (and Q, K)."


def classify(
    V: str = opt.V(),
    Q: str = opt.Q(),
    K: str = opt.K(),
    d: int | None = opt.d(),
    seed: int = opt.seed(),
    rtol: float = opt.decision_rtol(),
    do_simulate: bool = typer.Option(
        False, "--simulate", help="also simulate, observe the limit and compare with the prediction"
    ),
    n: int = opt.n(help="tokens (with --simulate)"),
    t1: float = opt.t1(12.0, help="final time (with --simulate)"),
    saves: int = opt.saves(61, help="saved times (with --simulate)"),
    method: opt.Method = opt.method(
        help="solver (with --simulate): adaptive, euler (needs --dt), or a named adaptive solver",
    ),
    dt: float | None = opt.dt(help="layer step for --method euler"),
    scale: float = opt.scale(help="tokens uniform in [-scale, scale]^d"),
    max_steps: int = opt.max_steps(help="step limit of the adaptive solver (with --simulate)"),
    tol: float | None = typer.Option(
        None,
        "--tol",
        callback=opt.checked(_checks.positive),
        help="clustering tolerance (relative)",
    ),
    x64: bool = opt.x64(),
    strict: bool = opt.strict(
        help="with --simulate: exit with status 1 when the solve stopped before t1, after printing",
    ),
    as_json: bool = opt.as_json(),
):
    """Predict the limit geometry from V's spectrum (and Q, K); with --simulate, run it,
    observe where the tokens went and say whether observation agrees with prediction."""
    method_s = common.value(method)
    ts = common.save_times(t1, saves, method_s, dt) if do_simulate else None
    if ts is not None:  # the prediction alone is numpy arithmetic, in float64
        common.setup_jax(x64)
    from ..analysis.regimes import Label, predict_regime

    Qm, Km, Vm = common.load_weights(V, Q, K, common.default_dim(V, d, 2), seed)
    reg = predict_regime(Qm, Km, Vm, rtol=rtol)
    result = {
        "prediction": reg.to_dict(),
        **{
            k: v
            for k, v in reg.to_dict().items()
            if k in ("label", "theorem", "eigenvalues", "reason")
        },
    }
    traj = obs = None
    agree = False
    if ts is not None:
        import attnflow as af

        from ..analysis.observe import observe_limit

        tokens = common.initial_tokens("uniform", n, Vm.shape[0], seed, scale)
        frame = "original" if reg.label == Label.ORIGIN else "rescaled"
        traj = af.simulate(
            af.Attention(Qm, Km, Vm),
            tokens,
            t1,
            ts=ts,
            frame=frame,
            method=method_s,
            dt=dt,
            max_steps=max_steps,
        )
        obs = observe_limit(traj, tol=tol)
        agree = obs.label == reg.label
        result["observation"] = obs.to_dict()
        result["agree"] = agree
        result["metadata"] = traj.metadata(seed=seed, scale=scale, command="attnflow classify")
    if as_json:
        common.emit_json(result)
        if traj is not None:
            common.report_status(traj, strict, note=False)
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
        if traj is not None and obs is not None:
            typer.echo(f"observed:  {obs.label} ({obs.reason})  status: {traj.status}")
            typer.echo(f"agree:     {'yes' if agree else 'no'}")
    if traj is not None:
        common.report_status(traj, strict, note=False)
