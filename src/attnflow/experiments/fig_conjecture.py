"""Figure 5 -- the codimension-k CONJECTURE (not a theorem): two positive eigenvalues.

V = PAPER["paper-codim"], symmetric, eigenvalues 1.963, 0.253, -0.222. The hyperplane
theorem applies (lambda_1 = 1.963 real, positive, simple): every z_i approaches one of
at most three parallel planes {phi_1^* = a, 0, b} -- proved. [E] conjecture (NOT
proved): with k eigenvalues of positive real part (here k = 2) the tokens approach at
most three parallel affine subspaces of codimension k -- here at most three parallel
lines, directed along the eigenvector of -0.222, i.e. the pairs (phi_1^*(z_i),
phi_2^*(z_i)) take at most three values in the limit.

Set-up: n = 20 tokens uniform in [-5, 5]^3, Q = K = I, Euler dt = 0.1 to T = 30 (the
second positive eigenvalue is small: its coordinate settles like e^{-0.25 t}), float64.
Coordinates: phi_k^*(z) = u_k . z with u_k V's orthonormal eigenvectors (V symmetric).
Panels: (a) tokens in eigen-coordinates, the proved planes and the conjectured lines;
(b) the plane of the two positive coordinates: the tokens converge to <= 3 points, as
conjectured; (c) the spread of phi_2^* within each group against t (log scale).

Run:  python -m attnflow.experiments.fig_conjecture [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_conjecture"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 5, "full": 1}
SEED, N, T, DT = 0, 20, 30.0, 0.1
SAVES = 121  # every 2.5 layers (the same shapes as the other figures: one compile)


def compute(quick: bool) -> F.Data:
    """Simulate; eigen-coordinates, level groups, the spread of phi_2^* in each."""
    H.setup()
    import attnflow as af
    import attnflow.plotting as AP
    from attnflow.io.matrices import PAPER

    V = PAPER["paper-codim"]
    traj, params = AP.simulate_tokens(V, n=N, seed=SEED, t1=T, dt=DT, saves=SAVES)
    traj.raise_for_status()
    z = np.asarray(traj.z)
    ts = np.asarray(traj.ts)
    reg = af.predict_regime(np.eye(3), np.eye(3), V)
    obs = af.observe_limit(traj)
    st = af.spectral_structure(V)
    lam, U = np.linalg.eigh(V)  # ascending: -0.222, 0.253, 1.963
    # orient u_1 like the package's phi_1^* (so that a, b are the same numbers)
    if U[:, 2] @ st.phi1_left < 0:
        U[:, 2] = -U[:, 2]
    c = z @ U  # (m, n, 3): coordinates (free, phi_2^*, phi_1^*)
    levels = np.asarray(obs.details["levels"])  # the levels observe_limit found
    groups = np.argmin(np.abs(c[-1, :, 2][:, None] - levels[None, :]), axis=1)
    a, b = float(obs.details["a"]), float(obs.details["b"])
    pairs = np.array([c[-1, groups == g][:, 1:].mean(axis=0) for g in range(groups.max() + 1)])
    spread = np.array(
        [[np.ptp(c[k, groups == g, 1]) for g in range(groups.max() + 1)] for k in range(len(ts))]
    )  # (m, groups)
    rate = float(-np.log(1.0 + DT * lam[1]) / DT)  # discrete rate of phi_2^*
    late = ts >= T / 2
    fits = [
        float(np.polyfit(ts[late], np.log(spread[late, g]), 1)[0])
        for g in range(spread.shape[1])
        if np.all(spread[late, g] > 0)
    ]
    params.update(
        name="paper-codim",
        eigenvalues=lam,
        predicted={"label": reg.label, "reason": reg.reason},
        observed={"label": obs.label, "n_clusters": obs.n_clusters, "reason": obs.reason},
        levels_phi1=levels,
        a=a,
        b=b,
        conjectured_line_points=pairs,
        phi2_spread_final=spread[-1],
        phi2_rate_predicted=rate,
        phi2_rate_fitted=fits,
        free_coordinate_range=[float(c[-1, :, 0].min()), float(c[-1, :, 0].max())],
    )
    side = H.sidecar(
        script="attnflow.experiments.fig_conjecture",
        quick=quick,
        runs=[params],
        seeds=[SEED],
        seeds_note="x0: numpy default_rng(SEED).uniform(-scale, scale, (n, d)) (simulate_tokens)",
        status_of_claim="CONJECTURE, not a theorem: codimension-k subspaces for k "
        "eigenvalues of positive real part. Proved here: the hyperplane "
        "theorem (codimension 1).",
    )
    arrays = dict(c=c, ts=ts, levels=levels, pairs=pairs, spread=spread)
    return F.Data(sidecar=side, arrays=arrays, result={"observed": obs.label})


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    import attnflow.plotting as AP

    c, ts, levels, pairs, spread = (
        data.arrays[k] for k in ("c", "ts", "levels", "pairs", "spread")
    )
    run = data.sidecar["runs"][0]
    a, b, rate = run["a"], run["b"], run["phi2_rate_predicted"]
    predicted, observed = run["predicted"]["label"], run["observed"]["label"]
    late = ts >= T / 2

    fig = plt.figure(figsize=(6.5, 3.0))
    # (a) 3-d, eigen-coordinates: x = free (-0.222), y = phi_2^*, z = phi_1^*
    ax = H.add_axes3d(fig, (-0.03, 0.04, 0.38, 0.78))
    AP.draw_trajectories(ax, c, color="0.55", lw=0.5, ms=2.5)
    lo, hi = AP.data_box(c, pad=0.03)
    e3 = np.array([0.0, 0.0, 1.0])
    AP.draw_levels(ax, e3, (a, 0.0, b), lo, hi, color="C0", alpha=0.1, lw=0.3, zero={"alpha": 0.04})
    for p in pairs:
        ax.plot([lo[0], hi[0]], [p[0], p[0]], [p[1], p[1]], color="C3", lw=1.0, ls="--")
    AP.set_box(ax, lo, hi)
    ax.view_init(elev=16, azim=-35)
    H.axes3d(
        ax,
        (r"$\varphi_3^*$ ($-0.222$)", r"$\varphi_2^*$ ($0.253$)", r"$\varphi_1^*$ ($1.963$)"),
        (-7, -7, -8),
        fontsize=7,
    )
    ax.set_title("blue planes: proved; red lines: conjectured", pad=-4, y=0.98, fontsize=7)
    H.panel_label(ax, "a", x=0.12, y=0.93)
    # (b) the two positive coordinates
    ax = fig.add_axes((0.45, 0.15, 0.23, 0.62))
    AP.draw_trajectories(ax, c[..., 1:], color="0.6", lw=0.5)
    for lev in (a, 0.0, b):
        ax.axhline(lev, color="C0", lw=0.7, ls="-" if lev else ":", zorder=0)
    ax.plot(pairs[:, 0], pairs[:, 1], "x", color="C3", ms=8, mew=1.5, zorder=5)
    ax.set_xlabel(r"$\varphi_2^*(z_i)$", labelpad=1)
    ax.set_ylabel(r"$\varphi_1^*(z_i)$", labelpad=0)
    ax.set_title(f"{len(pairs)} lines (red $\\times$), as conjectured", pad=3, fontsize=7)
    H.panel_label(ax, "b")
    # (c) spread of phi_2^* within each level group
    ax = fig.add_axes((0.785, 0.15, 0.205, 0.62))
    for g in range(spread.shape[1]):
        ok = spread[:, g] > 0
        ax.semilogy(
            ts[ok], spread[ok, g], lw=1.0, label=rf"tokens at $\varphi_1^*={levels[g]:.2f}$"
        )
    g0 = int(np.argmax(spread[-1]))
    ax.semilogy(
        ts[late],
        spread[-1, g0] * np.exp(rate * (ts[late] - ts[-1])),
        color="k",
        ls=":",
        lw=1.0,
        label=f"slope {rate:.3f}",
    )
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_ylabel(r"spread of $\varphi_2^*$ in a group", labelpad=1)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** 0.4)  # a band above the lines for the legend
    ax.legend(fontsize=5.5, loc="upper right", frameon=False, borderaxespad=0.1)
    ax.set_title(r"$\varphi_2^*$ settles like $e^{-0.25t}$", pad=3, fontsize=7)
    H.panel_label(ax, "c")
    H.headline(
        fig,
        r"CONJECTURE (not proved): $k=2$ eigenvalues $>0$ $\Rightarrow$ "
        r"at most 3 parallel affine subspaces of codimension 2 (lines)",
        r"$V$ = paper-codim (symmetric; eigenvalues $1.963, 0.253, -0.222$), "
        r"$Q=K=I$, $n=20$, $x_0$ uniform in $[-5,5]^3$, Euler $dt=0.1$, $T=30$"
        "\n"
        r"proved (hyperplane theorem): $\leq 3$ planes $\varphi_1^*\in\{a,0,b\}$; "
        rf"predict_regime: {predicted}; observe_limit: {observed}",
        sub_y=0.94,
        title_kw={"color": "C3"},
        linespacing=1.4,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
