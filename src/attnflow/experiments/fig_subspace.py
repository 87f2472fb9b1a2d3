"""Figure 3 -- "paranormal" V = diag(1, 1, -0.5): polytope x subspace.

Theorem ([E]): R^d = F + G, both V-invariant, V = lambda Id on F (lambda > 0), spectral
radius of V on G below lambda, Q^T K positive definite: there is a convex polytope K in
F such that every z_i approaches (boundary of K, or 0) x G. Here F = span(e_1, e_2)
(V = I there) and G = span(e_3) (V = -0.5): the F-part clusters at the vertices of a
polygon, the G-part is free. In the rescaled frame dz_3/dt = -0.5 (sum_j P_ij z_3j - z_3i)
pushes a token's third coordinate away from its leader's: |z_3| grows like e^{0.5 t}
(in the original frame x_3 = e^{-0.5 t} z_3 stays bounded).

Set-up: n = 20 tokens uniform in [-5, 5]^3, Q = K = I, Euler dt = 0.1 to T = 12, float64.
Panels: (a) 3-d trajectories: vertical lines {vertex} x G; (b) the F-parts (z_1, z_2)
and the limit polygon; (c) |z_3 - z_3 of the attended leader| against t (log scale),
with the slope of the discrete rate log(1 + 0.05 / 0.95) / dt.

Run:  python -m attnflow.experiments.fig_subspace [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_subspace"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 3, "full": 1}
SEED, N, T, DT = 0, 20, 12.0, 0.1
V = np.diag([1.0, 1.0, -0.5])


def compute(quick: bool) -> F.Data:
    """Simulate; the leaders, the G-part gaps and their rate, the F-part limit points."""
    H.setup()
    import attnflow as af
    import attnflow.plotting as AP

    traj, params = AP.simulate_tokens(V, n=N, seed=SEED, t1=T, dt=DT)
    traj.raise_for_status()
    z = np.asarray(traj.z)
    ts = np.asarray(traj.ts)
    obs = af.observe_limit(traj)
    st = af.spectral_structure(V)
    # who attends to whom at the end (the package's attention matrix)
    P = np.asarray(traj.attention(-1))
    leader = P.argmax(axis=1)
    gap = np.abs(z[:, :, 2] - z[:, leader, 2])  # (m, n): |z_3i - z_3,leader(i)|
    followers = leader != np.arange(N)
    # discrete rate of the G-part: per layer z_3 - z_3L is multiplied by 1 - dt mu/(1+dt mu)
    mu = -0.5
    rate = float(np.log(1.0 - DT * mu / (1.0 + DT * mu)) / DT)
    late = ts >= T / 2
    fit = np.polyfit(ts[late], np.log(np.median(gap[late][:, followers], axis=1)), 1)
    F_points = z[-1, :, :2]
    # the limit points found by observe_limit (its clusters), drawn in (z_1, z_2)
    cl = np.asarray(obs.details["cluster_of"])
    limits = np.array([F_points[cl == c].mean(axis=0) for c in range(cl.max() + 1)])
    params.update(
        name="paranormal",
        predicted=H.prediction(V),
        observed={"label": obs.label, "n_clusters": obs.n_clusters, "reason": obs.reason},
        F_basis=st.F,
        G_rate_predicted=rate,
        G_rate_measured=float(fit[0]),
        F_limit_points=limits,
        leaders=np.unique(leader),
        z3_final_range=[float(z[-1, :, 2].min()), float(z[-1, :, 2].max())],
        x3_final_max=float(np.abs(np.asarray(traj.x)[-1, :, 2]).max()),
    )
    side = H.sidecar(
        script="attnflow.experiments.fig_subspace",
        quick=quick,
        runs=[params],
        seeds=[SEED],
        seeds_note="x0: numpy default_rng(SEED).uniform(-scale, scale, (n, d)) (simulate_tokens)",
        theorem="[E] paranormal V, Q^T K positive definite: z_i -> (boundary of a "
        "polytope in F, or 0) x G.",
    )
    arrays = dict(z=z, ts=ts, gap=gap, followers=followers, fit=fit, limits=limits)
    return F.Data(sidecar=side, arrays=arrays, result={"observed": obs.label})


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    import attnflow.plotting as AP

    a = data.arrays
    z, ts, gap, followers, fit, limits = (
        a[k] for k in ("z", "ts", "gap", "followers", "fit", "limits")
    )
    F_points = z[-1, :, :2]
    run = data.sidecar["runs"][0]
    rate, label = run["G_rate_predicted"], run["observed"]["label"]

    fig = plt.figure(figsize=(6.5, 2.75))
    # (a) 3-d
    ax = H.add_axes3d(fig, (-0.01, 0.06, 0.36, 0.82))
    AP.draw_trajectories(ax, z, color="0.5", lw=0.5, ms=2.5)
    zlo, zhi = z[..., 2].min(), z[..., 2].max()
    for p in limits:
        ax.plot([p[0], p[0]], [p[1], p[1]], [zlo, zhi], color="C3", lw=0.8, ls="--")
    ax.view_init(elev=12, azim=-62)
    H.axes3d(ax, pads=(-9, -9, -8))
    ax.set_title(r"red: $\{$limit point$\}\times G$", pad=-4, y=0.98, fontsize=7)
    H.panel_label(ax, "a", x=0.12, y=0.93)
    # (b) F-part
    ax = fig.add_axes((0.44, 0.2, 0.24, 0.6))
    AP.draw_hull(ax, F_points, color="C0", lw=1.0, zorder=1)
    AP.draw_hull(ax, z[0, :, :2], color="0.75", lw=0.6, ls="--", zorder=1)
    AP.draw_trajectories(ax, z[..., :2], color="0.6", lw=0.5)
    ax.plot(0, 0, "+", color="C3", ms=6, mew=1)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("$z_1$", labelpad=1)
    ax.set_ylabel("$z_2$", labelpad=0)
    ax.set_title(f"$F$-part: {len(limits)} limit points", pad=3, fontsize=7)
    H.panel_label(ax, "b")
    # (c) G-part
    ax = fig.add_axes((0.77, 0.2, 0.22, 0.6))
    ax.semilogy(ts, gap[:, followers], color="0.6", lw=0.5)
    ax.semilogy(ts, np.median(gap[:, followers], axis=1), color="k", lw=1.2, label="median")
    ref = np.exp(fit[1] + rate * ts)
    ax.semilogy(
        ts,
        ref,
        color="C3",
        ls="--",
        lw=0.9,
        label=f"predicted slope {rate:.3f}\n(fitted {fit[0]:.3f})",
    )
    ax.set_ylim(max(gap[:, followers].min(), 1e-3), gap.max() * 3)
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_ylabel(r"$|z_{3,i} - z_{3,\mathrm{leader}(i)}|$")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** 0.45)  # a band above the lines for the legend
    ax.legend(loc="upper left", frameon=False, fontsize=6)
    ax.set_title("$G$-part: free, unbounded", pad=3, fontsize=7)
    H.panel_label(ax, "c")
    H.headline(
        fig,
        r"Paranormal $V=\mathrm{diag}(1,1,-0.5)$: polytope in "
        r"$F=\mathrm{span}(e_1,e_2)$ $\times$ the free subspace $G=\mathrm{span}(e_3)$",
        rf"observed: {label}; (b) blue: hull of the $F$-parts at $T$, "
        r"dashed: at $t=0$; $n=20$, $[-5,5]^3$, $Q=K=I$, Euler $dt=0.1$, $T=12$",
        sub_y=0.93,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
