"""Figure 2 -- hyperplanes: the authors' 2x2 and 3x3 value matrices.

Theorem ([E]): if V's eigenvalue of largest modulus lambda_1 is real, positive and simple
and <Q phi_1, K phi_1> > 0, every z_i (rescaled frame) approaches one of at most three
parallel hyperplanes {phi_1^*(z) = c}, c in {a, 0, b}, where phi_1^* is the left
eigenvector and a = lim min_j phi_1^*(z_j), b = lim max_j phi_1^*(z_j); max_j phi_1^*(z_j)
never increases and min_j never decreases.

Value matrices (attnflow.matrices.PAPER): "paper-2d" (eigenvalues 1.348, -0.068),
"paper-3d-re-pos" (1.078, 0.099 +- 0.082i), "paper-3d-re-neg" (0.991, -0.055 +- 0.254i).
Set-up: n = 20 tokens uniform in [-5, 5]^d, Q = K = I, the discrete transformer (Euler,
dt = 0.1; ``attnflow.plotting.simulate_tokens``, not the authors' scheme: see
docs/figures.md, "Set-up and scheme") to T = 12, float64. phi_1^* is
spectral_structure(V).phi1_left.

Top row: tokens with the lines / planes {phi_1^* = a}, {= 0} (dotted), {= b}, a and b
the min and max at T. Bottom row: phi_1^*(z_i(t)) for every token, a, 0, b dashed.
Also writes the movies movies/hyperplanes.gif and movies/hyperplanes-3d.gif.

Run:  python -m attnflow.experiments.fig_hyperplanes [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_hyperplanes"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 6, "full": 1}
SEED, N, T, DT = 0, 20, 12.0, 0.1
CASES = [
    ("paper-2d", r"$2\times2$ $V$: $\lambda=1.348,\ -0.068$"),
    ("paper-3d-re-pos", r"$3\times3$ $V$: $\lambda=1.078,\ 0.099\pm0.082i$"),
    ("paper-3d-re-neg", r"$3\times3$ $V$: $\lambda=0.991,\ -0.055\pm0.254i$"),
]


def compute(quick: bool) -> F.Data:
    """Simulate the three matrices; the levels phi_1^*(z_i(t)) and where they end."""
    H.setup()
    import attnflow as af
    import attnflow.plotting as AP
    from attnflow.io.matrices import PAPER

    runs, arrays, trajs = [], {}, []
    for j, (name, _) in enumerate(CASES):
        V = PAPER[name]
        traj, params = AP.simulate_tokens(V, n=N, seed=SEED, t1=T, dt=DT)
        traj.raise_for_status()
        st = af.spectral_structure(V)
        phi = st.phi1_left
        z = np.asarray(traj.z)
        p = z @ phi  # (m, n) levels phi_1^*(z_i(t))
        a, b = float(p[-1].min()), float(p[-1].max())
        obs = H.observation(traj)
        params.update(
            name=name,
            predicted=H.prediction(V),
            observed=obs,
            phi1_left=phi,
            a=a,
            b=b,
            final_levels=np.sort(p[-1]),
            max_phi_increase=float(np.max(np.diff(p.max(axis=1)))),
            min_phi_decrease=float(np.max(-np.diff(p.min(axis=1)))),
        )
        params["tokens_at_a_0_b"] = {
            nm: int(np.sum(np.abs(p[-1] - c) <= 1e-3 * max(abs(a), abs(b))))
            for c, nm in ((a, "a"), (0.0, "0"), (b, "b"))
        }
        runs.append(params)
        arrays.update({f"c{j}_z": z, f"c{j}_p": p, f"c{j}_phi": phi, f"c{j}_ts": traj.ts})
        trajs.append(traj)
    side = H.sidecar(
        script="attnflow.experiments.fig_hyperplanes",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "x0: numpy default_rng(SEED).uniform(-scale, scale, (n, d)) (simulate_tokens), "
            "every run"
        ),
        theorem="[E] lambda_1 real, > 0, simple, <Q phi_1, K phi_1> > 0: at most three "
        "parallel hyperplanes {phi_1^*(z) = c}, c in {a, 0, b}.",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"observed": {r["name"]: r["observed"]["label"] for r in runs}},
        movies=[(trajs[0], "hyperplanes", "levels"), (trajs[1], "hyperplanes-3d", "levels")],
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """Tokens and hyperplanes (top), levels against t (bottom), from ``compute``'s data."""
    import matplotlib.pyplot as plt
    from mpl_toolkits.mplot3d import Axes3D

    import attnflow.plotting as AP

    a_ = data.arrays
    res: list[dict[str, Any]] = [
        dict(
            label=label,
            z=a_[f"c{j}_z"],
            p=a_[f"c{j}_p"],
            phi=a_[f"c{j}_phi"],
            ts=a_[f"c{j}_ts"],
            a=run["a"],
            b=run["b"],
            obs=run["observed"],
            counts=run["tokens_at_a_0_b"],
        )
        for j, ((_, label), run) in enumerate(zip(CASES, data.sidecar["runs"]))
    ]
    fig = plt.figure(figsize=(6.5, 4.4))
    xs = [0.06, 0.385, 0.71]
    for j, r in enumerate(res):
        z, phi, a, b = r["z"], r["phi"], r["a"], r["b"]
        d = z.shape[-1]
        lo, hi = AP.data_box(z, pad=0.04)
        levels = (a, 0.0, b)
        if d == 2:
            ax = fig.add_axes((xs[j], 0.47, 0.26, 0.41), anchor="N")
            AP.draw_levels(
                ax, phi, levels, lo, hi, color="C3", lw=0.9, ls="-", zorder=1, zero={"ls": ":"}
            )
            AP.draw_trajectories(ax, z, color="0.6", lw=0.5)
            AP.set_box(ax, lo, hi)
            ax.set_aspect("equal", adjustable="box")
            ax.set_xlabel("$z_1$", labelpad=1)
            ax.set_ylabel("$z_2$", labelpad=0)
        else:
            ax = H.add_axes3d(fig, (xs[j] - 0.035, 0.44, 0.33, 0.49))
            AP.draw_levels(
                ax, phi, levels, lo, hi, color="C3", alpha=0.13, lw=0.4, zero={"alpha": 0.06}
            )
            AP.draw_trajectories(ax, z, color="0.55", lw=0.5, ms=2.5)
            AP.set_box(ax, lo, hi)
            elev, azim = AP.edge_on_view(phi, lo, hi)
            ax.view_init(elev=14, azim=azim + 28)
            H.axes3d(ax)
            # upright axis labels at every view (matplotlib turns them with their axis)
            for axis in (ax.xaxis, ax.yaxis):
                cast("Any", axis).set_rotate_label(False)  # an Axis3D method
        fig.text(xs[j] + 0.13, 0.895, r["label"], ha="center", va="bottom", fontsize=7)
        text = ax.text2D if isinstance(ax, Axes3D) else ax.text
        text(  # the panel letter, placed in the figure (the 3-d axes' box is larger)
            xs[j] - 0.045,
            0.895,
            f"({'abc'[j]})",
            transform=fig.transFigure,
            ha="left",
            va="bottom",
            fontweight="bold",
        )
        # bottom row: levels against t
        ax = fig.add_axes((xs[j], 0.13, 0.26, 0.25))
        p, ts = r["p"], r["ts"]
        ax.plot(ts, p, color="0.55", lw=0.5)
        ax.plot(ts, p.max(axis=1), color="C0", lw=1.1, label=r"$\max_j$ (never increases)")
        ax.plot(ts, p.min(axis=1), color="C1", lw=1.1, label=r"$\min_j$ (never decreases)")
        for c, nm in ((a, "a"), (0.0, "0"), (b, "b")):
            ax.axhline(c, color="C3", lw=0.7, ls="--" if c else ":")
            ax.text(ts[-1] * 1.015, c, f"${nm}$", color="C3", va="center", fontsize=7)
        ax.set_xlim(ts[0], ts[-1] * 1.07)
        ax.set_xlabel("$t$", labelpad=1)
        if j == 0:
            ax.set_ylabel(r"$\varphi_1^*(z_i(t))$")
            # the legend below the row, off the data
            fig.legend(
                *ax.get_legend_handles_labels(),
                loc="lower center",
                bbox_to_anchor=(0.5, 0.0),
                ncol=2,
                fontsize=6,
                frameon=False,
                handlelength=1.6,
            )
        counts = r["counts"]
        ax.set_title(
            f"tokens at $a$, 0, $b$: {counts['a']}, {counts['0']}, {counts['b']}", fontsize=7, pad=2
        )
        ax.text(
            0.9,
            0.3,
            f"observed: {r['obs']['label']}",
            transform=ax.transAxes,
            ha="right",
            va="center",
            fontsize=6,
            color="0.25",
        )
        H.panel_label(ax, "def"[j])
    H.headline(
        fig,
        r"Hyperplanes: $\lambda_1$ real, positive, simple $\Rightarrow$ "
        r"every $z_i$ approaches $\{\varphi_1^*=a\}$, $\{\varphi_1^*=0\}$ or "
        r"$\{\varphi_1^*=b\}$",
        r"the authors' value matrices; $\varphi_1^*$ the left eigenvector; "
        r"$a,b$ = min, max of $\varphi_1^*(z_i(T))$; $n=20$, $[-5,5]^d$, $Q=K=I$, "
        r"Euler $dt=0.1$, $T=12$",
        sub_y=0.955,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
