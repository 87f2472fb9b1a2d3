"""``attnflow dispersion``: softmax dispersion against n, with the bounds, per kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import typer

from .. import _checks
from . import _common as common
from . import _options as opt
from ._options import KERNELS

if TYPE_CHECKING:
    from jaxtyping import Float

SHORT_HELP = "Softmax dispersion against n, with the bounds, per kernel."


def dispersion_tokens(
    kind: str, n: int, d: int, rng: np.random.Generator
) -> Float[np.ndarray, "n d"]:
    """``n`` tokens for ``attnflow dispersion``: on the unit sphere, in the cube, normal,
    or a .npy/.txt file (its first ``n`` rows).

    Args:
        kind: ``sphere``, ``uniform``, ``normal`` or a file (``--tokens``).
        n: number of tokens.
        d: dimension.
        rng: the random stream (after Q and K were drawn from it).

    Returns:
        ``(n, d)`` tokens.

    Raises:
        CLIError: a file that cannot be used, named with ``--tokens``.
    """
    if kind == "sphere":
        x = rng.normal(size=(n, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, size=(n, d))
    if kind == "normal":
        return rng.normal(size=(n, d))
    x = common.read_tokens("--tokens", kind)
    if x.shape[0] < n or x.shape[1] != d:
        raise common.CLIError(
            f"--tokens file {kind!r} holds shape {x.shape}; need at least ({n}, {d})."
        )
    return x[:n]


def dispersion(
    kernels: str = opt.kernels(
        ",".join(("softmax", "qknorm", "ssmax", "sigmoid", "adaptive")),
        help=f"comma list of attention kernels, of: {', '.join(KERNELS)}",
    ),
    n: str = opt.n_list(
        "16,64,256,...,16384",
        help="numbers of tokens: a comma list; '16,64,256,...,16384' continues a progression",
    ),
    d: int = opt.d(8, help="token dimension"),
    beta: float = opt.beta(2.5, help="inverse temperature"),
    qknorm_beta: float | None = typer.Option(
        None,
        "--qknorm-beta",
        callback=opt.checked(_checks.positive),
        help="beta for qknorm (default --beta)",
    ),
    s: float = typer.Option(
        1.0,
        "--s",
        callback=opt.checked(_checks.number),
        help="ssmax parameter: softmax(s log(n) L)",
    ),
    queries: int = typer.Option(
        16,
        "--queries",
        callback=opt.checked(_checks.integer, lo=1),
        help="query rows (the first tokens) against all n keys",
    ),
    sink: int = typer.Option(
        1,
        "--sink",
        callback=opt.checked(_checks.integer, lo=0),
        help="sink tokens (the first ones) for the sink mass",
    ),
    Q: str = opt.Q(
        "random",
        help="'random' (iid N(0, 1/d) from --seed) or a matrix name/file",
        extra=("random",),
    ),
    K: str = opt.K("random", help="'random' or a matrix name/file", extra=("random",)),
    tokens: str = opt.tokens(),
    seed: int = opt.seed(1, help="seed (Q, K, then tokens from one stream)"),
    x64: bool = opt.x64(),
    as_json: bool = opt.as_json(),
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
    from ._parse import parse_dims

    names = kernels.split(",")
    ns = parse_dims(n)
    if not sink <= min(ns):
        raise common.CLIError(f"--sink must be in [0, smallest n = {min(ns)}]; got {sink}.")
    common.setup_jax(x64)
    import attnflow as af

    rng = np.random.default_rng(seed)
    Qm = (
        rng.normal(size=(d, d)) / np.sqrt(d)
        if Q == "random"
        else common.matrix("--Q", Q, d, seed + 1)
    )
    Km = (
        rng.normal(size=(d, d)) / np.sqrt(d)
        if K == "random"
        else common.matrix("--K", K, d, seed + 2)
    )
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
        common.emit_json(result)
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
