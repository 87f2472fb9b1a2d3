"""The mean-field equation on the circle: its modes, its clusters, and particles converging
to it.

``attnflow.solve_density`` integrates the continuity equation of the token density of
isotropic attention on the circle (``Q = K = V = I``, the limit ``n -> infinity`` of the
particle system; a spectral method for ``sqrt(rho)``). Four panels:

1. Growth rates: the uniform density perturbed by ``1e-7 cos(k theta + phi_k)`` in every
   mode ``k = 1 .. 12`` at once (the modes decouple to first order), beta = 5 and 20, SA;
   each mode's measured rate ``log(|c_k(t1)| / |c_k(0)|) / t1`` beside the closed form
   ``k^2 I_k(beta) / (beta I_0(beta))`` (``analysis.mode_rates``); the error is judged on
   the modes growing at least 1/100 as fast as the fastest.
2. Clusters from a near-uniform density: ``rho0 = 1 + 1e-4 sum_k a_k cos(k theta + phi_k)``
   (``a_k`` standard normal, ``phi_k`` uniform, ``k <= 24``; eight random starts per beta,
   start ``s`` drawn from ``numpy.random.default_rng(s)``, ``s`` in ``CLUSTER_SEEDS``,
   the same starts at every beta, solved as one batch), several beta, 256 modes; the
   number of peaks (``density_clusters``: peaks above twice the uniform density) at the
   last resolved save, against ``k* = argmax k^2 I_k(beta)``: how many starts end with
   ``k*`` peaks, with an exact (Clopper-Pearson) 95% interval of that fraction. The peaks
   rise above the level one after another, then narrow until the spectrum is no longer
   resolved (here ``tail > 1e-4``: peaks are counted, not measured).
3. Particles converge: beta = 5 from ``rho0 = 1 + 0.4 cos theta + 0.3 cos(3 theta + 0.5)``
   to t = 3 (three clusters formed, the density resolved); ``W1`` on the circle between
   the density and n particles, placed at its quantiles or drawn i.i.d. from it (seeds
   averaged), against n; the fitted exponents (expected -1 and -1/2).
4. Energy: ``interaction_energy`` of the density and of the particles over time.

Run:  python -m attnflow.experiments.fig_meanfield [--quick] [--out figures] [--redraw]

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

NAME = "fig_meanfield"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 40, "full": 103}
SEED, RTOL, ATOL = 0, 1e-9, 1e-12
# the random starts of the cluster panel: start s from numpy.random.default_rng(s)
CLUSTER_SEEDS = tuple(range(10, 18))
RATE_MODES = 12
# Peaks are counted while the spectral tail is below this: an error of relative size
# 1e-4 cannot make or hide a peak of prominence 1/(2 pi); the default 1e-6 is for values.
PEAK_TAIL = 1e-4


def _bumpy(th):
    return 1 + 0.4 * np.cos(th) + 0.3 * np.cos(3 * th + 0.5)


def _rates(af, beta: float, rng) -> dict:
    from attnflow.analysis import mode_rates

    k = np.arange(1, RATE_MODES + 1)
    lam = mode_rates(beta, k)[0]
    phase = rng.uniform(0, 2 * math.pi, k.size)
    t1 = 2.0 / float(lam.max())

    def rho0(th):
        return 1 + 1e-7 * np.cos(np.multiply.outer(th, k) + phase).sum(-1)

    solver = af.AdaptiveSolver(rtol=1e-12, atol=1e-14, method="dopri8")
    sol = af.solve_density(af.CircleMeanField(beta, modes=32), rho0, t1, solver=solver)
    c = np.abs(sol.coefficients(RATE_MODES))[:, 1:]
    got = np.log(c[-1] / c[0]) / t1
    return dict(
        beta=beta,
        k=k,
        predicted=lam,
        measured=got,
        # modes slower than lambda_max / 100 barely grow by t1: their measured rate is
        # swamped by the second-order coupling of the others (listed, not judged)
        max_relative_error=float(np.max(np.abs(got / lam - 1)[lam >= lam.max() / 100])),
        status=sol.status,
    )


def _solve_batch(af, model, rho0s, t1: float, ts: np.ndarray) -> list:
    """``solve_density`` of every initial density of ``rho0s`` (values on the grid), as
    one vmapped solve (the same solver, tolerances and resolution test); the runs."""
    import equinox as eqx
    import jax.numpy as jnp

    from attnflow.dynamics import meanfield as MF

    q0 = jnp.asarray(np.stack([MF._initial_q(model, r) for r in rho0s]))
    solve = eqx.filter_vmap(MF._solve, in_axes=(None, 0, None, None, None, None, None, None))
    sol = solve(model, q0, jnp.asarray(ts), t1, RTOL, ATOL, "tsit5", 100_000)
    out = []
    for i in range(len(rho0s)):
        run = MF.DensityTrajectory(
            model=model,
            ts=ts,
            q=np.asarray(sol.ys[i]),
            status=str(MF.BY_CODE[int(sol.status[i])]),
            t_stop=float(sol.t_stop[i]),
            num_steps=int(sol.num_steps[i]),
            tail_tol=PEAK_TAIL,
        )
        out.append(run)
    return out


def _clusters(af, beta: float, seeds, modes: int) -> dict:
    import dataclasses

    from attnflow._stats import binomial_interval
    from attnflow.analysis import density_clusters

    pred = af.predict_metastable(beta)
    ks = np.arange(1, 25)
    m = af.CircleMeanField(beta, modes=modes)
    rho0s = []
    for s in seeds:
        rng = np.random.default_rng(s)
        a, phase = rng.normal(size=ks.size), rng.uniform(0, 2 * math.pi, ks.size)
        rho0s.append(1 + 1e-4 * (a * np.cos(np.multiply.outer(m.grid(), ks) + phase)).sum(-1))
    t1 = pred.linear_time(1e-4) * 1.3
    ts = np.linspace(0.0, t1, 66)
    counted, last_times, statuses, resolved = [], [], [], []
    for sol in _solve_batch(af, m, rho0s, t1, ts):
        ok = sol.resolved
        last = int(np.flatnonzero(ok)[-1])  # the last resolved save (t = 0 always is)
        # the peaks of that save alone (density_clusters of every save costs seconds each)
        at_last = dataclasses.replace(sol, ts=sol.ts[last : last + 1], q=sol.q[last : last + 1])
        counted.append(int(density_clusters(at_last)[0]))
        last_times.append(float(ts[last]))
        statuses.append(sol.status)
        resolved.append(ok)
    k = pred.clusters
    wins = sum(c == k for c in counted)
    values, freq = np.unique(counted, return_counts=True)
    return dict(
        beta=beta,
        predicted_clusters=k,
        linear_time=pred.linear_time(1e-4),
        ts=ts,
        seeds=list(seeds),
        resolved=np.asarray(resolved),
        last_resolved_time=last_times,
        counted=counted,
        distribution={str(int(v)): int(f) for v, f in zip(values, freq)},
        wins=int(wins),
        fraction_wins=wins / len(counted),
        fraction_wins_interval_95=list(
            binomial_interval(int(wins), len(counted), method="clopper-pearson")
        ),
        status=statuses,
        modes=modes,
    )


def _convergence(af, ns, seeds: int) -> tuple[dict, dict]:
    from attnflow._stats import loglog_slope
    from attnflow.analysis import circle_wasserstein, interaction_energy

    beta, t1 = 5.0, 3.0
    ts = np.linspace(0.0, t1, 13)
    sol = af.solve_density(af.CircleMeanField(beta, modes=128), _bumpy, t1, ts=ts)
    sol.raise_for_status()
    grid = np.linspace(0.0, 2 * math.pi, 40001)
    cdf = sol.cdf(grid, 0)
    rng = np.random.default_rng(SEED + 1)
    model = af.IsotropicAttention(2, beta=beta)
    w_q, w_iid, energy = [], [], {}
    for n in ns:
        u = np.concatenate([((np.arange(n) + 0.5) / n)[None], rng.uniform(size=(seeds, n))])
        th0 = np.interp(u, cdf, grid)
        x0 = np.stack([np.cos(th0), np.sin(th0)], axis=-1)
        traj = af.simulate(model, x0, t1, ts=ts, frame="sphere", rtol=RTOL, atol=ATOL)
        traj.raise_for_status()
        xs = np.asarray(traj.x)  # (seeds + 1, m, n, 2)
        angles = np.arctan2(xs[..., 1], xs[..., 0])
        w_q.append(circle_wasserstein(angles[0], sol))
        w_iid.append(float(np.mean([circle_wasserstein(p, sol) for p in angles[1:]])))
        energy[int(n)] = np.asarray(interaction_energy(xs[0], beta))
    fq = loglog_slope(ns, w_q)
    fi = loglog_slope(ns, w_iid)
    out = dict(
        beta=beta,
        t1=t1,
        n=np.asarray(ns),
        seeds=seeds,
        w1_quantile=w_q,
        w1_iid=w_iid,
        slope_quantile=fq[0],
        slope_quantile_stderr=fq[1],
        slope_iid=fi[0],
        slope_iid_stderr=fi[1],
        final_clusters=int(np.asarray(af.count_clusters(sol))[-1]),
    )
    en = dict(ts=ts, density=np.asarray(interaction_energy(sol, beta)), particles=energy)
    return out, en


def compute(quick: bool) -> F.Data:
    """The four studies (see the module docstring).

    Args:
        quick: the small version (rates and clusters at beta = 5, four starts; particles
            n = 32 .. 128, two i.i.d. seeds; full: rates at 5 and 20, clusters at beta =
            2, 5, 10, 20, 32, eight starts each, n = 32 .. 512, four seeds).

    Returns:
        the sidecar and, for ``draw``, the arrays of each panel.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af

    rng = np.random.default_rng(SEED)
    if quick:
        rate_betas, cluster_betas, ns, seeds = (5.0,), (5.0,), [32, 64, 128], 2
    else:
        rate_betas, cluster_betas = (5.0, 20.0), (2.0, 5.0, 10.0, 20.0, 32.0)
        ns, seeds = [32, 64, 128, 256, 512], 4
    rates = [_rates(af, b, rng) for b in rate_betas]
    starts = CLUSTER_SEEDS[:4] if quick else CLUSTER_SEEDS
    clusters = [_clusters(af, b, starts, 256) for b in cluster_betas]
    conv, energy = _convergence(af, ns, seeds)
    arrays: dict[str, np.ndarray] = {"energy_ts": energy["ts"], "energy_rho": energy["density"]}
    for n, e in energy["particles"].items():
        arrays[f"energy_n{n}"] = e
    side = H.sidecar(
        script="attnflow.experiments.fig_meanfield",
        quick=quick,
        runs=[],
        seeds=[SEED, SEED + 1, *CLUSTER_SEEDS],
        seeds_note=(
            f"numpy default_rng({SEED}): the rates' phases; default_rng({SEED + 1}): the "
            "particles' i.i.d. draws (their seeds' count is convergence.seeds); "
            "default_rng(s), s in clusters[].seeds: the near-uniform starts, the same at "
            "every beta"
        ),
        seed=SEED,
        d=2,
        Q="identity",
        K="identity",
        V="identity",
        kernel="softmax",
        solver="tsit5 (dopri8 for the rates)",
        tolerances={"rtol": RTOL, "atol": ATOL},
        rates=rates,
        clusters=clusters,
        convergence=conv,
    )
    result = {
        "rate_error": max(r["max_relative_error"] for r in rates),
        "k_star_wins": {f"beta={c['beta']:g}": [c["wins"], len(c["counted"])] for c in clusters},
        "w1_slopes": [conv["slope_quantile"], conv["slope_iid"]],
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
    fig, grid = plt.subplots(2, 2, figsize=(7.0, 5.4))
    axes = grid.ravel()
    ax = axes[0]
    for i, r in enumerate(s["rates"]):
        k = np.asarray(r["k"])
        ax.plot(k, r["predicted"], "-", color=f"C{i}", lw=1, label=rf"$\beta$ = {r['beta']:g}")
        ax.plot(k, r["measured"], "o", color=f"C{i}", ms=3, mfc="none")
    ax.set_xlabel("Mode $k$")
    ax.set_ylabel(r"growth rate $\lambda_k$")
    ax.set_title("rates: closed form (line), solver (o)", fontsize=7)
    ax.legend(fontsize=6)
    ax = axes[1]
    cl = s["clusters"]
    b = [c["beta"] for c in cl]
    ax.plot(b, [c["predicted_clusters"] for c in cl], "s-", color="0.4", ms=4, label="k*")
    for j, c in enumerate(cl):
        dist = {int(k): v for k, v in c["distribution"].items()}
        ax.scatter(
            [c["beta"]] * len(dist),
            list(dist),
            s=[12 * v for v in dist.values()],
            color="C3",
            alpha=0.7,
            label="density peaks (area: starts)" if j == 0 else None,
        )
        ax.annotate(
            f"{c['wins']}/{len(c['counted'])}",
            (c["beta"], max(dist) + 0.6),
            ha="center",
            fontsize=5.5,
        )
    ax.set_xscale("log")
    ax.set_xticks(b, [f"{x:g}" for x in b])
    ax.minorticks_off()
    ax.set_xlabel(r"$\beta$")
    ax.set_ylabel("clusters")
    ax.set_title("peaks from near uniform (k* wins / starts)", fontsize=7)
    ax.legend(fontsize=6, loc="upper left")
    ax = axes[2]
    c = s["convergence"]
    n = np.asarray(c["n"], float)
    ax.loglog(n, c["w1_quantile"], "o-", ms=3, label=f"quantiles, slope {c['slope_quantile']:.2f}")
    ax.loglog(n, c["w1_iid"], "s-", ms=3, label=f"i.i.d., slope {c['slope_iid']:.2f}")
    ax.set_xticks(n, [f"{int(v)}" for v in n])
    ax.minorticks_off()
    ax.set_xlabel("Particles $n$")
    ax.set_ylabel(rf"$W_1$(particles, density) at t = {c['t1']:g}")
    ax.legend(fontsize=6)
    ax = axes[3]
    ts = np.asarray(a["energy_ts"])
    ax.plot(ts, a["energy_rho"], "k-", lw=1.5, label="density")
    for key in sorted((k for k in a if k.startswith("energy_n")), key=lambda k: int(k[8:])):
        ax.plot(ts, a[key], "--", lw=0.8, label=f"n = {key[8:]}")
    ax.set_xlabel("t")
    ax.set_ylabel(r"energy $E_\beta$")
    ax.legend(fontsize=5, ncol=2)
    fig.suptitle("the mean-field equation on the circle (SA, Q = K = V = I)", fontsize=9)
    rows = [
        "| beta | k* | peaks per start (last resolved save) | k* wins | 95% interval (exact) "
        "| at t | linear time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in cl:
        lo, hi = r["fraction_wins_interval_95"]
        at = r["last_resolved_time"]
        rows.append(
            f"| {r['beta']:g} | {r['predicted_clusters']} | "
            f"{', '.join(str(c) for c in r['counted'])} | {r['wins']}/{len(r['counted'])} | "
            f"[{100 * lo:.0f}, {100 * hi:.0f}]% | {min(at):.3g} to {max(at):.3g} | "
            f"{r['linear_time']:.3g} |"
        )
    rows += [
        "",
        "| mode-rate error (max relative) | W1 slope, quantiles | W1 slope, i.i.d. |",
        "|---|---|---|",
        f"| {max(r['max_relative_error'] for r in s['rates']):.2e} | "
        f"{c['slope_quantile']:.3f} ± {c['slope_quantile_stderr']:.3f} | "
        f"{c['slope_iid']:.3f} ± {c['slope_iid_stderr']:.3f} |",
    ]
    H.panel_letters(axes)
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
