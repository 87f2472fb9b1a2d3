"""Figure 1 -- V = I: the tokens converge to the vertices of a polytope.

Theorem ([E], V = I_d, Q^T K positive definite): in the rescaled frame z_i = e^{-t} x_i
the convex hull of the tokens never grows and converges to a polytope K; every z_i tends
to 0 or to a point of the boundary of K, and every vertex of K is a limit.

Set-up: the authors' tokens, weights and step -- n = 20 tokens uniform in [-5, 5]^d,
Q = K = I, d = 2 and d = 3, dt = 0.1 -- with attnflow's discrete transformer
(``attnflow.plotting.simulate_tokens``) to T = 12, every layer saved, float64. How that
scheme relates to the authors' script: docs/figures.md, "Set-up and scheme".

Panels: (a) d = 2 trajectories with the convex hull at several times; (b) d = 3
trajectories and the limit polytope (the initial hull as a wire frame); (c) hull area
(d = 2) and volume (d = 3) against t, relative to t = 0: non-increasing.
Also writes the movies movies/polytope.gif and movies/polytope-3d.gif.

Run:  python -m attnflow.experiments.fig_polytope [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_polytope"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 2, "full": 1}
SEED, N, T, DT = 0, 20, 12.0, 0.1
HULL_TIMES = (0.0, 0.5, 1.0, 2.0, T)


def compute(quick: bool) -> F.Data:
    """Simulate d = 2 and d = 3; the hull measure at every saved time."""
    H.setup()
    import attnflow.plotting as AP

    runs, arrays, trajs = [], {}, {}
    for d in (2, 3):
        traj, params = AP.simulate_tokens(np.eye(d), n=N, seed=SEED, t1=T, dt=DT)
        traj.raise_for_status()
        z = np.asarray(traj.z)
        ts = np.asarray(traj.ts)
        measure = np.array([AP.hull_measure(z[k]) for k in range(len(ts))])
        obs = H.observation(traj)
        params.update(
            name=f"d{d}",
            observed=obs,
            predicted=H.prediction(np.eye(d)),
            hull_measure_relative_end=float(measure[-1] / measure[0]),
            hull_measure_max_increase=float(np.max(np.diff(measure)) / measure[0]),
        )
        runs.append(params)
        arrays.update({f"d{d}_ts": ts, f"d{d}_z": z, f"d{d}_measure": measure})
        trajs[d] = traj
    side = H.sidecar(
        script="attnflow.experiments.fig_polytope",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note="x0: numpy default_rng(SEED).uniform(-scale, scale, (n, d)) (simulate_tokens)",
        hull_times=list(HULL_TIMES),
        theorem="[E] V = I, Q^T K positive definite: hull non-increasing, converges to a "
        "polytope K; every z_i tends to 0 or to the boundary of K.",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"observed": {r["name"]: r["observed"]["label"] for r in runs}},
        # the same runs as the figure (= attnflow animate --case CASE)
        movies=[(trajs[2], "polytope", "hull"), (trajs[3], "polytope-3d", "hull")],
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    import attnflow.plotting as AP

    a = data.arrays
    obs, obs3 = (run["observed"] for run in data.sidecar["runs"])

    fig = plt.figure(figsize=(6.5, 2.9))
    # (a) d = 2
    ax = fig.add_axes((0.06, 0.25, 0.26, 0.58))
    ts, z, measure = a["d2_ts"], a["d2_z"], a["d2_measure"]
    cmap = plt.get_cmap("viridis")
    for j, th in enumerate(HULL_TIMES):
        k = int(np.argmin(np.abs(ts - th)))
        AP.draw_hull(
            ax,
            z[k],
            color=cmap(j / (len(HULL_TIMES) - 1)),
            lw=0.9,
            label=f"$t={ts[k]:g}$",
            zorder=1,
        )
    AP.draw_trajectories(ax, z, color="0.6", lw=0.5)
    ax.plot(0, 0, "+", color="C3", ms=6, mew=1)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("$z_1$", labelpad=1)
    ax.set_ylabel("$z_2$", labelpad=0)
    ax.set_title(f"$d=2$: {obs['n_clusters']} limit points", pad=3)
    ax.legend(
        title="convex hull at",
        fontsize=6,
        title_fontsize=6,
        ncol=3,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.17),
        handlelength=1.2,
        columnspacing=0.8,
        frameon=False,
        borderaxespad=0,
    )
    H.panel_label(ax, "a")
    # (b) d = 3
    ax = H.add_axes3d(fig, (0.34, 0.12, 0.34, 0.76))
    ts3, z3, measure3 = a["d3_ts"], a["d3_z"], a["d3_measure"]
    AP.draw_trajectories(ax, z3, color="0.45", lw=0.6, ms=2.5)
    AP.draw_hull(ax, z3[-1], color="C0", alpha=0.22, lw=0.4)
    ax.view_init(elev=18, azim=-55)
    H.axes3d(ax, pads=(-8, -8, -9))
    ax.set_title(f"$d=3$: {obs3['n_clusters']} limit points, polytope $K$", pad=-6, y=0.98)
    H.panel_label(ax, "b", x=0.1, y=0.92)
    # (c) hull measure
    ax = fig.add_axes((0.79, 0.25, 0.2, 0.58))
    ax.plot(ts, measure / measure[0], color="C0", label="area, $d=2$")
    ax.plot(ts3, measure3 / measure3[0], color="C1", label="volume, $d=3$")
    ax.set_xlabel("$t$")
    ax.set_ylabel("hull size / size at $t=0$", labelpad=1)
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower left", frameon=False)
    ax.set_title("the hull never grows", pad=3)
    H.panel_label(ax, "c")
    H.headline(
        fig,
        r"$V=I$: the tokens $z_i=e^{-tV}x_i$ cluster at the vertices "
        r"of a polytope $K$ (or at 0)",
        r"$n=20$, $x_0$ uniform in $[-5,5]^d$, $Q=K=I$, discrete "
        r"transformer (Euler, $dt=0.1$) to $T=12$; open circles: start, dots: end",
        y=0.985,
        sub_y=0.925,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
