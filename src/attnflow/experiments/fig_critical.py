"""Critical attention scaling at long context: where one layer keeps its tokens apart.

Chen, Lin, Polyanskiy and Rigollet (2026). One softmax layer (``Q = K = V = I``, no
residual) on ``n`` simplex tokens with pairwise inner products ``rho``, at inverse
temperature ``beta = gamma log n``: as ``n`` grows the outputs' cosine tends to 1 below
``gamma_c = 1 / (1 - rho)`` (the tokens collapse), to ``4 rho / (1 + 3 rho)`` at it (the
self-weight tends to 1/2) and to ``rho`` above it. For keys uniform on ``S^{d-1}`` the
critical ``beta`` grows like ``n^{2/(d-1)}`` instead (arXiv 2605.08505), so no fixed
scale of ``log n`` (``ssmax``) stays critical.

Four panels:

1. The outputs' cosine against ``n`` for ``rho = 1/2`` at ``gamma = 1, 2 (= gamma_c), 3``:
   attnflow's own layer (``Attention(I, I, I, beta=gamma log n).pure_layer`` on
   ``simplex_tokens(n, rho)``, measured up to ``n = 1024``) beside the closed form
   (``analysis.critical_layer``, drawn to ``n = 1e12``) and the three limits.
2. The cosine against ``gamma / gamma_c`` for ``n = 1e2 .. 1e16`` (closed form) and
   attnflow's layer at ``n = 256``: the step 1, ``4 rho / (1 + 3 rho)``, ``rho`` forms.
   (At ``gamma_c`` the self-weight is ``1 / (1 + (n - 1) / n)``, the same for every
   ``rho``.)
3. Keys uniform on the sphere: the critical ``beta_c`` (the expected largest weight of one
   query reaches 1/2; ``analysis.critical_beta_sphere``, exact order statistics) against
   ``n`` for ``d = 2, 3, 4``, with the fitted exponents against ``2/(d-1)``.
4. ``ssmax``'s critical scale ``s_c(n) = beta_c / log n`` on sphere keys against the
   simplex's ``1 / (1 - rho)``, which does not depend on ``n``.

Run:  python -m attnflow.experiments.fig_critical [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_critical"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 6, "full": 14}
SEED, RHO, GAMMAS, LEVEL = 0, 0.5, (1.0, 2.0, 3.0), 0.5
SHARPEN_NS = (10**2, 10**4, 10**8, 10**16)
PROBE_N, PROBE_RATIOS = 256, (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def _measured_cosine(af, gamma: float, rho: float, n: int) -> tuple[float, float]:
    """The outputs' mean pairwise cosine and mean self-weight of attnflow's own layer."""
    from attnflow.analysis import simplex_tokens

    y = simplex_tokens(n, rho)
    I = np.eye(y.shape[1])
    model = af.Attention(I, I, I, beta=gamma * math.log(n))
    z = np.asarray(model.pure_layer(y), np.float64)
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    G = u @ u.T
    off = ~np.eye(n, dtype=bool)
    P = np.asarray(model.attention(y), np.float64)
    return float(G[off].mean()), float(np.diag(P).mean())


def compute(quick: bool) -> F.Data:
    """The simplex layer (measured and closed form) and the sphere's critical beta.

    Args:
        quick: the small version (measured n up to 256, sphere n up to 1e4 with 4 seeds of
            16 sets; full: n up to 1024, sphere n = 1e2 .. 1e6 with 8 seeds of 64 sets).

    Returns:
        the sidecar (per gamma the measured and closed-form cosines and the limits; per d
        the fitted exponent and interval, the log log n term, beta_c and s_c per n) and,
        for ``draw``, the curves.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.analysis import critical_exponent_sphere, critical_gamma, critical_layer

    measured_ns = [16, 64, 256] if quick else [16, 64, 256, 1024]
    sphere_ns = [10**2, 10**3, 10**4] if quick else [10**2, 10**3, 10**4, 10**5, 10**6]
    seeds, samples = (4, 16) if quick else (8, 64)
    curve_ns = np.unique(np.round(np.logspace(math.log10(4), 12, 60)).astype(np.int64))
    arrays: dict[str, np.ndarray] = {"curve_n": curve_ns.astype(np.float64)}
    simplex = []
    for i, gamma in enumerate(GAMMAS):
        closed = [critical_layer(gamma, RHO, int(n)) for n in curve_ns]
        arrays[f"g{i}_cosine"] = np.array([c.cosine for c in closed])
        got = [_measured_cosine(af, gamma, RHO, n) for n in measured_ns]
        exact = [critical_layer(gamma, RHO, n) for n in measured_ns]
        err = max(abs(g[0] - e.cosine) for g, e in zip(got, exact, strict=True))
        simplex.append(
            dict(
                gamma=gamma,
                rho=RHO,
                phase=closed[0].phase,
                n=measured_ns,
                measured_cosine=[g[0] for g in got],
                measured_self_weight=[g[1] for g in got],
                closed_cosine=[e.cosine for e in exact],
                max_abs_error=err,
                limit_cosine=closed[0].limit_cosine,
                limit_self_weight=closed[0].limit_self_weight,
            )
        )
    # the transition against gamma / gamma_c sharpens into a step as n grows
    gc = critical_gamma(RHO)
    ratio = np.linspace(0.02, 2.5, 125)
    arrays["ratio"] = ratio
    for j, nn in enumerate(SHARPEN_NS):
        arrays[f"s{j}_cosine"] = np.array([critical_layer(r * gc, RHO, nn).cosine for r in ratio])
    probe = [_measured_cosine(af, r * gc, RHO, PROBE_N)[0] for r in PROBE_RATIOS]
    sharpen = dict(
        rho=RHO,
        gamma_c=gc,
        n=list(SHARPEN_NS),
        probe_n=PROBE_N,
        probe_ratios=list(PROBE_RATIOS),
        probe_cosine=probe,
        probe_closed=[critical_layer(r * gc, RHO, PROBE_N).cosine for r in PROBE_RATIOS],
    )
    sphere = []
    for d in (2, 3, 4):
        fit = critical_exponent_sphere(
            sphere_ns, d, level=LEVEL, seeds=seeds, samples=samples, seed=SEED
        )
        sphere.append(
            dict(
                d=d,
                n=sphere_ns,
                predicted=fit.predicted,
                exponent=fit.exponent,
                interval=list(fit.interval),
                log_term=fit.log_term,
                log_interval=list(fit.log_interval),
                beta_c=[p.beta_c for p in fit.points],
                beta_c_interval=[list(p.interval) for p in fit.points],
                ssmax_scale=[p.ssmax_scale for p in fit.points],
                agrees=bool(fit.interval[0] <= fit.predicted <= fit.interval[1]),
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_critical",
        quick=quick,
        runs=[],
        seed=SEED,
        Q="identity",
        K="identity",
        V="identity",
        kernel="softmax",
        level=LEVEL,
        seeds=seeds,
        samples=samples,
        simplex=simplex,
        transition=sharpen,
        sphere=sphere,
        theorem=(
            "[CLPR26]: cosine -> 1, 4 rho / (1 + 3 rho), rho below, at and above "
            "gamma_c = 1 / (1 - rho); on the sphere beta_c ~ n^{2/(d-1)} (arXiv 2605.08505)."
        ),
    )
    result = {
        "max_abs_error": max(s["max_abs_error"] for s in simplex),
        "exponents": {f"d={s['d']}": [s["predicted"], s["exponent"]] for s in sphere},
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Four panels and a Markdown table (matplotlib only, from ``compute``'s data).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    n = a["curve_n"]
    fig, grid = plt.subplots(2, 2, figsize=(7.2, 6.4), layout="constrained")
    ax = grid[0, 0]
    for i, r in enumerate(s["simplex"]):
        c = f"C{i}"
        ax.semilogx(
            n,
            a[f"g{i}_cosine"],
            "-",
            color=c,
            lw=1,
            label=rf"$\gamma$ = {r['gamma']:g} ({r['phase']})",
        )
        ax.semilogx(r["n"], r["measured_cosine"], "o", color=c, ms=4, mfc="none")
        ax.axhline(r["limit_cosine"], color=c, lw=0.6, ls=":")
    ax.set_xlabel("n")
    ax.set_ylabel("outputs' cosine")
    ax.set_title(
        rf"simplex tokens, $\rho$ = {s['simplex'][0]['rho']:g}: circles measured", fontsize=8
    )
    ax.legend(fontsize=6)
    ax = grid[0, 1]
    t = s["transition"]
    for j, nn in enumerate(t["n"]):
        ax.plot(
            a["ratio"],
            a[f"s{j}_cosine"],
            "-",
            lw=1,
            color=f"C{j}",
            label=f"n = 1e{round(math.log10(nn))}",
        )
    ax.plot(
        t["probe_ratios"],
        t["probe_cosine"],
        "ko",
        ms=3,
        mfc="none",
        label=f"attnflow, n = {t['probe_n']}",
    )
    rho = t["rho"]
    ax.plot([0, 1], [1, 1], "k:", lw=0.8)
    ax.plot([1, 2.5], [rho, rho], "k:", lw=0.8)
    ax.plot([1], [4 * rho / (1 + 3 * rho)], "k*", ms=6, label=r"$4\rho/(1+3\rho)$")
    ax.set_xlabel(r"$\gamma / \gamma_c$")
    ax.set_ylabel("outputs' cosine")
    ax.set_title(rf"$\rho$ = {rho:g}: the limit is a step at $\gamma_c$", fontsize=8)
    ax.legend(fontsize=6)
    ax = grid[1, 0]
    for k, r in enumerate(s["sphere"]):
        ns = np.asarray(r["n"], float)
        lo, hi = np.asarray(r["beta_c_interval"]).T
        ax.errorbar(
            ns,
            r["beta_c"],
            yerr=[np.asarray(r["beta_c"]) - lo, hi - np.asarray(r["beta_c"])],
            fmt="o",
            color=f"C{k}",
            ms=3,
            label=f"d = {r['d']}: slope {r['exponent']:.3f} (2/(d-1) = {r['predicted']:.3f})",
        )
        ref = r["beta_c"][0] * (ns / ns[0]) ** r["predicted"]
        ax.loglog(ns, ref, "-", color=f"C{k}", lw=0.8)
    ax.set_xlabel("n keys")
    ax.set_ylabel(r"critical $\beta_c$ (largest weight 1/2)")
    ax.set_title("keys uniform on the sphere", fontsize=8)
    ax.legend(fontsize=6)
    ax = grid[1, 1]
    for k, r in enumerate(s["sphere"]):
        ax.loglog(
            r["n"], r["ssmax_scale"], "o-", color=f"C{k}", ms=3, lw=1, label=f"sphere, d = {r['d']}"
        )
    for rho in (0.25, 0.5, 0.75):
        ax.axhline(1.0 / (1.0 - rho), color="0.6", lw=0.6, ls=":")
    ax.set_xlabel("n")
    ax.set_ylabel(r"critical ssmax scale $s_c = \beta_c / \log n$")
    ax.set_title(r"dotted: simplex tokens, $1/(1-\rho)$ for $\rho$ = 1/4, 1/2, 3/4", fontsize=8)
    ax.legend(fontsize=6)
    H.panel_letters(grid.ravel())
    fig.suptitle("Critical attention scaling: one layer, $Q = K = V = I$", fontsize=9)
    rows = [
        "| gamma | phase | n | cosine (attnflow) | cosine (closed form) | limit |",
        "|---|---|---|---|---|---|",
    ]
    for r in s["simplex"]:
        for nn, m, c in zip(r["n"], r["measured_cosine"], r["closed_cosine"], strict=True):
            lim = r["limit_cosine"]
            rows.append(f"| {r['gamma']:g} | {r['phase']} | {nn} | {m:.6f} | {c:.6f} | {lim:.4f} |")
    rows += [
        "",
        "| d | exponent | 95% interval | 2/(d-1) | log log n term |",
        "|---|---|---|---|---|",
    ]
    for r in s["sphere"]:
        lo, hi = r["interval"]
        llo, lhi = r["log_interval"]
        rows.append(
            f"| {r['d']} | {r['exponent']:.4f} | [{lo:.4f}, {hi:.4f}] | {r['predicted']:.4f} | "
            f"{r['log_term']:+.3f} [{llo:+.3f}, {lhi:+.3f}] |"
        )
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
