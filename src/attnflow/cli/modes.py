"""``attnflow modes``: the linear modes of the mean-field equation about the uniform
measure, and the number of metastable clusters they predict (numpy and scipy only)."""

from __future__ import annotations

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Predict the number of metastable clusters from the mean-field modes."


def modes(
    beta: float = opt.beta(help="inverse temperature (> 0)"),
    d: int = typer.Option(
        2,
        "--d",
        callback=opt.checked(_checks.integer, lo=2),
        help="token dimension (the sphere S^{d-1}; d = 2 is the circle)",
    ),
    kernel: str = typer.Option(
        "softmax", "--kernel", help="softmax (SA) or usa (unnormalised self-attention)"
    ),
    top: int = typer.Option(
        8, "--top", callback=opt.checked(_checks.integer, lo=1), help="fastest modes listed"
    ),
    as_json: bool = opt.as_json(),
):
    """The growth rates of the modes of the uniform measure (Fourier modes on the circle,
    spherical harmonics on S^{d-1}) for tokens with Q = K = V = I, and the fastest one:
    on the circle, the predicted number of metastable clusters."""
    from ..analysis.modes import predict_metastable

    try:
        r = predict_metastable(beta, d=d, kernel=kernel)
    except ValueError as exc:
        raise common.CLIError(str(exc)) from None
    if as_json:
        common.emit_json(r.to_dict())
        return
    what = "metastable clusters" if d == 2 else "degree of the fastest harmonic"
    typer.echo(f"beta = {r.beta:g}, d = {r.d}, {r.kernel}: {what} k* = {r.clusters}")
    typer.echo(f"rate of k*: {r.rate:.6g} (e-folding time {r.growth_time:.4g})")
    order = sorted(range(len(r.k)), key=lambda i: -r.log_rates[i])[:top]
    for i in order:
        typer.echo(f"  k = {int(r.k[i]):3d}  rate {r.rates[i]:.6g}")
