"""Figure 4 -- V = -I: the original frame collapses to the origin.

Theorem ([E]): V = -I_d and Q^T K = I: every x_i(t) (original frame) tends to 0, one
cluster at the origin. The collapse is fast for the mean of the tokens and slow for their
spread, which decays only like t^{-1/2} (measured here, see panel c).

Set-up: n = 20 tokens uniform in [-5, 5]^d, Q = K = I, V = -I, d = 2 and d = 3, the
discrete transformer (Euler, dt = 0.1) in the original frame to T = 100 (1000 layers),
every layer saved, float64.
Panels: (a) d = 2 trajectories x_i(t), coloured by time; (b) the same cloud at late times,
zoomed in: it keeps shrinking, slowly; (c) the largest |x_i|, the spread
max_i |x_i - mean| and |mean| against t (log-log), with a t^{-1/2} line.

Run:  python -m attnflow.experiments.fig_origin [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_origin"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 3, "full": 3}
SEED, N, DT = 0, 20, 0.1


def _t1(quick: bool) -> float:
    return 30.0 if quick else 100.0


def compute(quick: bool) -> F.Data:
    """Simulate d = 2 and d = 3 in the original frame; the curves of panel (c)."""
    H.setup()
    import attnflow.plotting as AP

    T = _t1(quick)
    runs, arrays = [], {}
    for d in (2, 3):
        V = -np.eye(d)
        # full: every layer (the log-log panel needs the early times); quick: 121 saves,
        # the shapes of the other figures (no extra compilation)
        traj, params = AP.simulate_tokens(
            V, n=N, seed=SEED, t1=T, dt=DT, frame="original", saves=121 if quick else None
        )
        traj.raise_for_status()
        x = np.asarray(traj.x)
        ts = np.asarray(traj.ts)
        mean = x.mean(axis=1)
        radius = np.linalg.norm(x, axis=-1).max(axis=1)
        spread = np.linalg.norm(x - mean[:, None], axis=-1).max(axis=1)
        obs = H.observation(traj)
        late = ts >= T / 4
        slope = float(np.polyfit(np.log(ts[late]), np.log(spread[late]), 1)[0])
        params.update(
            name=f"d{d}",
            predicted=H.prediction(V),
            observed=obs,
            radius_0=float(radius[0]),
            radius_T=float(radius[-1]),
            mean_T=float(np.linalg.norm(mean[-1])),
            spread_T=float(spread[-1]),
            spread_loglog_slope_late=slope,
            spread_times_sqrt_t_T=float(spread[-1] * np.sqrt(ts[-1])),
        )
        runs.append(params)
        arrays.update({f"d{d}_ts": ts, f"d{d}_mean": mean, f"d{d}_radius": radius})
        arrays[f"d{d}_spread"] = spread
        if d == 2:
            arrays["d2_x"] = x
    side = H.sidecar(
        script="attnflow.experiments.fig_origin",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "x0: numpy default_rng(SEED).uniform(-scale, scale, (n, d)) (simulate_tokens), "
            "every run"
        ),
        theorem="[E] V = -I, Q^T K = I: every x_i (original frame) tends to 0.",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"observed": {r["name"]: r["observed"]["label"] for r in runs}},
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.colors import Normalize

    import attnflow.plotting as AP

    T = _t1(data.quick)
    a = data.arrays
    res = {
        d: dict(
            ts=a[f"d{d}_ts"],
            mean=a[f"d{d}_mean"],
            radius=a[f"d{d}_radius"],
            spread=a[f"d{d}_spread"],
            slope=run["spread_loglog_slope_late"],
            obs=run["observed"],
        )
        for d, run in zip((2, 3), data.sidecar["runs"])
    }
    res[2]["x"] = a["d2_x"]

    fig = plt.figure(figsize=(6.5, 2.6))
    r = res[2]
    x, ts = r["x"], r["ts"]
    cmap = plt.get_cmap("viridis")
    # (a) trajectories, coloured by log time
    ax = fig.add_axes((0.055, 0.17, 0.26, 0.65))
    tt = np.log10(np.maximum(ts, DT))
    norm = Normalize(tt[0], tt[-1])
    for i in range(N):
        seg = np.stack([x[:-1, i], x[1:, i]], axis=1)
        # the stub asks for a sequence; an (m, 2, 2) array of segments is accepted
        lc = LineCollection(seg, colors=cmap(norm(tt[:-1])), lw=0.7)  # pyright: ignore[reportArgumentType]
        ax.add_collection(lc)
    ax.plot(x[0, :, 0], x[0, :, 1], "o", ms=2.5, mfc="none", mec="0.35", mew=0.5)
    ax.plot(x[-1, :, 0], x[-1, :, 1], "o", ms=2, color="k")
    ax.plot(0, 0, "+", color="C3", ms=7, mew=1)
    ax.set_xlim(-5.5, 5.5)
    ax.set_ylim(-5.5, 5.5)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("$x_1$", labelpad=1)
    ax.set_ylabel("$x_2$", labelpad=0)
    ax.set_title("$d=2$ trajectories", pad=3)
    H.panel_label(ax, "a")
    # (b) late snapshots, zoomed
    ax = fig.add_axes((0.36, 0.17, 0.26, 0.65))
    snaps = [t for t in (5, 10, 25, 50, 100) if t <= T]
    for th in snaps:
        k = int(np.argmin(np.abs(ts - th)))
        c = cmap(norm(tt[k]))
        ax.plot(x[k, :, 0], x[k, :, 1], "o", ms=2.5, color=c)
        AP.draw_hull(ax, x[k], color=c, lw=0.6)
    ax.plot(0, 0, "+", color="C3", ms=7, mew=1)
    lim = 1.15 * np.abs(x[int(np.argmin(np.abs(ts - snaps[0])))]).max()
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("$x_1$", labelpad=1)
    ax.set_title(f"zoom: $t={', '.join(str(v) for v in snaps)}$", pad=3)
    cax = fig.add_axes((0.635, 0.17, 0.01, 0.65))
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    cb = fig.colorbar(sm, cax=cax)
    cb.set_ticks([-1, 0, 1, 2][: int(np.floor(tt[-1])) + 2])
    cb.set_ticklabels(["0.1", "1", "10", "100"][: int(np.floor(tt[-1])) + 2])
    cb.ax.set_title("$t$", fontsize=7, pad=2)
    H.part_of_panel(cax)  # the colour bar of (b)
    cb.ax.tick_params(labelsize=6)
    H.panel_label(ax, "b")
    # (c) radius, spread, mean against t
    ax = fig.add_axes((0.735, 0.17, 0.255, 0.65))
    for d, ls in ((2, "-"), (3, "--")):
        q = res[d]
        s = q["ts"] > 0
        ax.loglog(
            q["ts"][s],
            q["radius"][s],
            color="C0",
            ls=ls,
            lw=1.0,
            label=r"$\max_i|x_i|$" if d == 2 else None,
            zorder=3,
        )
        ax.loglog(
            q["ts"][s],
            q["spread"][s],
            color="C1",
            ls=ls,
            lw=2.4,
            alpha=0.6,
            label=r"$\max_i|x_i-\bar x|$" if d == 2 else None,
        )
        ax.loglog(
            q["ts"][s],
            np.linalg.norm(q["mean"], axis=1)[s],
            color="C2",
            ls=ls,
            lw=1.0,
            label=r"$|\bar x|$ (mean)" if d == 2 else None,
        )
    q = res[2]
    ref = q["spread"][-1] * np.sqrt(q["ts"][-1] / q["ts"][1:])
    ax.loglog(q["ts"][1:], ref, color="k", lw=0.7, ls=":", label=r"$\propto t^{-1/2}$")
    ax.set_ylim(max(1e-9, np.linalg.norm(q["mean"], axis=1)[1:].min() / 3), 30)
    ax.set_xlabel("$t$", labelpad=1)
    ax.legend(fontsize=6, loc="lower left", frameon=False, borderaxespad=0.1)
    ax.set_title("solid: $d=2$, dashed: $d=3$", pad=3)
    ax.text(
        0.97,
        0.6,
        f"late slope of the spread:\n{res[2]['slope']:.3f} ($d=2$), {res[3]['slope']:.3f} ($d=3$)",
        transform=ax.transAxes,
        ha="right",
        fontsize=6,
    )
    H.panel_label(ax, "c")
    H.headline(
        fig,
        r"$V=-I$, $Q=K=I$: every token tends to 0 (original frame); "
        r"the mean collapses fast, the spread only like $t^{-1/2}$",
        rf"observed: {res[2]['obs']['label']} ($d=2$), "
        rf"{res[3]['obs']['label']} ($d=3$); $n=20$, $x_0$ uniform in $[-5,5]^d$, "
        rf"Euler $dt=0.1$ to $T={T:g}$",
        sub_y=0.925,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
