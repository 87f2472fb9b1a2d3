"""Noise in deep transformers: random value matrices keep antipodal pairs and clusters.

Fedorov, Sander, Elie, Marion and Lauriere (2026), "Clustering in deep stochastic
transformers" (arXiv 2601.21942). Post-layer-norm layers with value matrix ``V + sigma
dW_k / dt`` (``W`` a ``d x d`` Brownian motion of entries of variance ``t / d``, common to
all tokens) on the sphere, ``attnflow.dynamics.simulate_noisy(..., method="layers")``,
``Q = K = V = I``. Three panels:

1. Two tokens, beta = 1: the share of pairs started at ``rho_0 = <x_1, x_2> = -0.9`` (in a
   random plane) that end antipodal (``rho < -0.99``) at depth ``t1``, over a grid of
   ``sigma^2`` and ``d``, with the closed-form threshold ``sigma_c^2(d)`` where the
   antipodal exponent ``2 (1 - tanh beta) - (sigma^2 / d)((d - 1) tanh^2 beta - (d - 3))``
   changes sign (``attnflow.analysis.noise``); none above ``d = 1 + 2 cosh^2 beta``.
2. The same shares against ``sigma^2`` for each ``d``, beside the probability of the
   limit SDE from the scale function (``antipodal_probability``: no finite depth).
3. ``n = 16`` tokens in ``d = 3``, beta = 3, uniform starts: the mean ``<x_i, x_j>``
   over 16 runs against depth without noise (it rises towards one cluster) and with
   noise (it stops at a plateau: two antipodal clusters, ``|<x_i, x_j>| -> 1``).

Run:  python -m attnflow.experiments.fig_noise [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_noise"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 10, "full": 50}
SEED = 0
BETA_PAIR, RHO0, SETTLED = 1.0, -0.9, 0.99  # two tokens: start, and "ended antipodal"
PAIR_STEPS, PAIR_T1 = 500, 20.0  # layers per run; depth t1 = PAIR_T1 / max(1, sigma^2 / 2)
BETA_MANY, N_MANY, D_MANY, T_MANY, DT_MANY = 3.0, 16, 3, 100.0, 0.05
SAME = 0.999  # two tokens in one cluster: <x_i, x_j> above this


def _pair_starts(d: int, runs: int, rng) -> np.ndarray:
    """``runs`` pairs of unit tokens with inner product ``RHO0``, each in a random plane."""
    out = np.empty((runs, 2, d))
    for i in range(runs):
        e, _ = np.linalg.qr(rng.normal(size=(d, 2)))
        out[i, 0] = e[:, 0]
        out[i, 1] = RHO0 * e[:, 0] + math.sqrt(1 - RHO0 * RHO0) * e[:, 1]
    return out


def _depth(sigma2: float) -> float:
    """The depth of a two-token run: shorter where the noise is fast."""
    return PAIR_T1 / max(1.0, sigma2 / 2)


def _two_tokens(af: Any, ds: list[int], sigma2s: np.ndarray, runs: int) -> dict:
    from attnflow.analysis.noise import (
        antipodal_exponent,
        antipodal_probability,
        antipodal_threshold,
    )
    from attnflow.dynamics import Noise, simulate_noisy

    rng = np.random.default_rng(SEED)
    share = np.zeros((len(ds), sigma2s.size))
    collapsed = np.zeros_like(share)
    predicted = np.zeros_like(share)
    seeds = np.zeros(share.shape, np.int64)
    for i, d in enumerate(ds):
        model = af.Attention(np.eye(d), np.eye(d), np.eye(d), beta=BETA_PAIR)
        x0 = _pair_starts(d, runs, rng)
        for j, s2 in enumerate(sigma2s):
            t1 = _depth(float(s2))
            seeds[i, j] = SEED + 1 + i * sigma2s.size + j
            noise = Noise(math.sqrt(s2), int(seeds[i, j]))
            traj = simulate_noisy(
                model, x0, t1, noise=noise, dt=t1 / PAIR_STEPS, ts=np.array([0.0, t1])
            )
            traj.raise_for_status()
            x = np.asarray(traj.x[:, -1])
            rho = np.sum(x[:, 0] * x[:, 1], axis=-1)
            share[i, j] = np.mean(rho < -SETTLED)
            collapsed[i, j] = np.mean(rho > SETTLED)
            predicted[i, j] = antipodal_probability([RHO0], BETA_PAIR, math.sqrt(s2), d)[0]
    fine = np.geomspace(sigma2s[0], sigma2s[-1], 60)
    curves = np.array(
        [[antipodal_probability([RHO0], BETA_PAIR, math.sqrt(s), d)[0] for s in fine] for d in ds]
    )
    d_line = np.linspace(2.0, 8.0, 241)
    tau = math.tanh(BETA_PAIR)
    den = (d_line - 1) * tau * tau - (d_line - 3)
    line = np.where(den > 0, 2 * d_line * (1 - tau) / np.where(den > 0, den, 1.0), np.inf)
    return dict(
        beta=BETA_PAIR,
        rho0=RHO0,
        settled=SETTLED,
        d=ds,
        sigma2=sigma2s,
        runs=runs,
        steps=PAIR_STEPS,
        t1=[_depth(float(s)) for s in sigma2s],
        noise_seeds=seeds,
        threshold_sigma2=[antipodal_threshold(BETA_PAIR, d) for d in ds],
        no_threshold_above_d=1 + 2 * math.cosh(BETA_PAIR) ** 2,
        exponent=[[antipodal_exponent(BETA_PAIR, math.sqrt(s), d) for s in sigma2s] for d in ds],
        antipodal_fraction=share,
        collapsed_fraction=collapsed,
        predicted_probability=predicted,
        curve_sigma2=fine,
        curves=curves,
        line_d=d_line,
        line_sigma2=line,
    )


def _many_tokens(af: Any, sigma2s: list[float], runs: int, t1: float) -> tuple[dict, dict]:
    from attnflow.dynamics import Noise, simulate_noisy

    d, n = D_MANY, N_MANY
    model = af.Attention(np.eye(d), np.eye(d), np.eye(d), beta=BETA_MANY)
    x0 = np.random.default_rng(SEED + 1000).normal(size=(runs, n, d))
    ts = np.linspace(0.0, t1, 101)
    iu = np.triu_indices(n, 1)
    arrays: dict[str, np.ndarray] = {"many_ts": ts}
    final_cos, final_abs, not_collapsed, largest = {}, {}, {}, {}
    for k, s2 in enumerate(sigma2s):
        noise = Noise(math.sqrt(s2), SEED + 2000 + k)
        traj = simulate_noisy(model, x0, t1, noise=noise, dt=DT_MANY, ts=ts)
        traj.raise_for_status()
        x = np.asarray(traj.x)  # (runs, m, n, d)
        G = np.einsum("rmid,rmjd->rmij", x, x)
        c = G[..., iu[0], iu[1]]  # (runs, m, pairs)
        arrays[f"cos_{k}"] = c.mean(-1)  # (runs, m)
        arrays[f"abs_{k}"] = np.abs(c).mean(-1)
        share = (G[:, -1] > SAME).sum(-1).max(-1) / n  # largest cluster share per run
        key = f"{s2:g}"
        final_cos[key] = float(c[:, -1].mean())
        final_abs[key] = float(np.abs(c[:, -1]).mean())
        not_collapsed[key] = float(np.mean(share < 1))
        largest[key] = share.tolist()
    side = dict(
        beta=BETA_MANY,
        n=n,
        d=d,
        runs=runs,
        t1=t1,
        dt=DT_MANY,
        sigma2=sigma2s,
        noise_seeds=[SEED + 2000 + k for k in range(len(sigma2s))],
        x0_seed=SEED + 1000,
        same_cluster=SAME,
        final_mean_cosine=final_cos,
        final_mean_abs_cosine=final_abs,
        runs_not_collapsed=not_collapsed,
        largest_cluster_share=largest,
    )
    return side, arrays


def compute(quick: bool) -> F.Data:
    """The two-token grid and curves, and the many-token runs.

    Args:
        quick: the small version (d = 3; sigma^2 = 0.2, 5; 24 pairs a cell; 4
            many-token runs to depth 40; full: d = 2 .. 6, eight sigma^2 from 0.1 to 30,
            48 pairs a cell, 16 runs to depth 100).

    Returns:
        the sidecar (every parameter and seed, the shares, exponents and predictions)
        and, for ``draw``, the mean inner products over depth.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af

    if quick:
        ds, sigma2s, runs = [3], np.array([0.2, 5.0]), 24
        many_sigma2, many_runs, many_t1 = [0.0, 1.0], 4, 40.0
    else:
        ds, sigma2s, runs = [2, 3, 4, 5, 6], np.geomspace(0.1, 30.0, 8), 48
        many_sigma2, many_runs, many_t1 = [0.0, 0.25, 1.0], 16, T_MANY
    t0 = time.perf_counter()
    two = _two_tokens(af, ds, sigma2s, runs)
    t1 = time.perf_counter()
    many, arrays = _many_tokens(af, many_sigma2, many_runs, many_t1)
    two["seconds"] = t1 - t0  # wall times: to the run's timings, not the sidecar
    many["seconds"] = time.perf_counter() - t1
    side = H.sidecar(
        script="attnflow.experiments.fig_noise",
        quick=quick,
        runs=[],
        seed=SEED,
        seeds=[SEED, SEED + 1000, *np.unique(two["noise_seeds"]).tolist(), *many["noise_seeds"]],
        seeds_note=(
            f"pair starts from default_rng({SEED}); many-token starts from "
            f"default_rng({SEED + 1000}); a Noise seed per cell (two_tokens.noise_seeds) and "
            "per sigma^2 (many_tokens.noise_seeds), system i on fold_in(PRNGKey(seed), i)"
        ),
        Q="identity",
        K="identity",
        V="identity",
        kernel="softmax",
        solver="simulate_noisy, method='layers' (post layer norm), VirtualBrownianTree paths",
        noise="value matrix V + sigma dW / dt; W: entries of variance t / d, one for all tokens",
        two_tokens=two,
        many_tokens=many,
    )
    result = {
        "threshold_sigma2": dict(zip(map(str, ds), two["threshold_sigma2"], strict=True)),
        "many_not_collapsed": many["runs_not_collapsed"],
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Three panels and a Markdown table (matplotlib only, from ``compute``'s data).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    two, many = s["two_tokens"], s["many_tokens"]
    ds = np.asarray(two["d"])
    s2 = np.asarray(two["sigma2"], float)
    share = np.asarray(two["antipodal_fraction"], float)
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.5), layout="constrained")
    ax = axes[0]
    # cell edges: halfway between the d, geometric halfway between the sigma^2
    de = np.concatenate([[ds[0] - 0.5], (ds[1:] + ds[:-1]) / 2, [ds[-1] + 0.5]])
    ls = np.log(s2)
    step = (ls[1] - ls[0]) if s2.size > 1 else 1.0
    se = np.exp(np.concatenate([[ls[0] - step / 2], (ls[1:] + ls[:-1]) / 2, [ls[-1] + step / 2]]))
    mesh = ax.pcolormesh(de, se, share.T, cmap="viridis", vmin=0, vmax=1)
    line_d, line_s = np.asarray(two["line_d"]), np.asarray(two["line_sigma2"], float)
    ok = np.isfinite(line_s)
    ax.plot(line_d[ok], line_s[ok], "w-", lw=1.5)
    H.label_line(ax, line_d[ok], line_s[ok], r"$\lambda = 0$: $\sigma_c^2(d)$", at=0.3)
    ax.axvline(two["no_threshold_above_d"], color="w", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(se[0], se[-1])
    ax.set_xlim(de[0], de[-1])
    ax.set_xticks(ds)
    ax.set_xlabel("d")
    ax.set_ylabel(r"$\sigma^2$")
    ax.set_title(
        rf"two tokens, $\beta$ = {two['beta']:g}, $\rho_0$ = {two['rho0']:g}: share antipodal",
        fontsize=7,
    )
    fig.colorbar(mesh, ax=ax, shrink=0.9)
    ax = axes[1]
    runs = two["runs"]
    curves = np.asarray(two["curves"], float)
    for i, d in enumerate(ds):
        if not np.any(curves[i] > 0) and not np.any(share[i] > 0):
            continue
        c = f"C{i}"
        ax.semilogx(two["curve_sigma2"], curves[i], "-", color=c, lw=1, label=f"d = {d}")
        err = np.sqrt(np.maximum(share[i] * (1 - share[i]), 0.25 / runs) / runs)
        ax.errorbar(s2, share[i], yerr=err, fmt="o", color=c, ms=3, mfc="none", lw=0.8)
    zero = [str(d) for i, d in enumerate(ds) if not np.any(curves[i] > 0)]
    ax.set_xlabel(r"$\sigma^2$")
    ax.set_ylabel("share ending antipodal")
    title = "limit SDE (lines), layers at finite depth (o)"
    if zero:
        title += f"; d = {', '.join(zero)}: limit 0"
    ax.set_title(title, fontsize=7)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax = axes[2]
    ts = np.asarray(a["many_ts"])
    for k, v in enumerate(many["sigma2"]):
        cos = np.asarray(a[f"cos_{k}"])
        c = f"C{k}"
        ax.plot(ts, cos.mean(0), "-", color=c, lw=1.2, label=rf"$\sigma^2$ = {v:g}")
        lo, hi = np.quantile(cos, [0.25, 0.75], axis=0)
        ax.fill_between(ts, lo, hi, color=c, alpha=0.15, lw=0)
        ax.plot(ts, np.asarray(a[f"abs_{k}"]).mean(0), "--", color=c, lw=0.8)
    ax.set_xlabel("Depth $t$")
    ax.set_ylabel(r"mean $\langle x_i, x_j\rangle$ (dashed: $|\cdot|$)")
    ax.set_title(
        rf"n = {many['n']}, d = {many['d']}, $\beta$ = {many['beta']:g}, "
        f"{many['runs']} runs (band: quartiles)",
        fontsize=7,
    )
    ax.set_ylim(-0.1, 1.02)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    H.panel_letters(axes)
    fig.suptitle(
        r"Stochastic transformer: value matrices $V + \sigma\, dW/dt$ ($Q = K = V = I$)",
        fontsize=9,
    )
    rows = ["| d | threshold sigma_c^2 | " + " | ".join(f"{v:.3g}" for v in s2) + " |"]
    rows.append("|---|---|" + "---|" * s2.size)
    pred = np.asarray(two["predicted_probability"], float)
    for i, d in enumerate(ds):
        th = two["threshold_sigma2"][i]
        th_s = "none" if not np.isfinite(float(th)) else f"{float(th):.3f}"
        cells = [f"{share[i, j]:.2f} ({pred[i, j]:.2f})" for j in range(s2.size)]
        rows.append(f"| {d} | {th_s} | " + " | ".join(cells) + " |")
    rows += [
        "",
        "Cells: share of pairs ending antipodal at finite depth (limit-SDE probability).",
        "",
        "| sigma^2 | final mean <x_i, x_j> | final mean abs | runs not collapsed |",
        "|---|---|---|---|",
    ]
    for v in many["sigma2"]:
        key = f"{v:g}"
        rows.append(
            f"| {key} | {many['final_mean_cosine'][key]:.3f} | "
            f"{many['final_mean_abs_cosine'][key]:.3f} | {many['runs_not_collapsed'][key]:.2f} |"
        )
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
