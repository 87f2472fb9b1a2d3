"""Hemispheres and special starts on the sphere.

(a) The fraction of uniform random starts that end in one cluster against Wendel's
probability that n uniform points lie in an open hemisphere,
``2^{-(n-1)} sum_{k<d} C(n-1, k)``. All points in an open hemisphere imply exponential
collapse to one cluster ([P]), so the one-cluster fraction must be at least the
hemisphere fraction (up to sampling); in d >= 3 almost every start ends in one cluster,
so the gap is the point. Set-up: Q = K = V = I, beta = 1, post-LN layers dt = 0.1 to
t = 200 (quick: 50), d in {2, 3}, n in {2, 3, 4, 6, 8, 12}, 256 starts each (quick: 32);
"one cluster" = every pair above 0.999. Each start's hemisphere membership is measured
too (d = 2: the largest angular gap exceeds pi; d = 3: a linear program finds w with
<w, x_i> >= 1 for all i), and every start in a hemisphere must end in one cluster.
(b) An antipodal pair is stationary (for every beta): the distance moved by t = 100
(it is an unstable equilibrium: rounding errors grow, see the sidecar).
(c) n = 8 orthogonal tokens in d = 8 follow the equiangular curve: the largest gap
between simulated inner products and ``equiangular_curve``.

Run:  python -m attnflow.experiments.fig_hemisphere [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_hemisphere"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 13, "full": 40}
SEED, BETA, DT, THRESHOLD = 0, 1.0, 0.1, 0.999
NS = (2, 3, 4, 6, 8, 12)


def in_open_hemisphere(x: np.ndarray) -> bool:
    """Whether the unit vectors ``x`` ``(n, d)`` lie in some open hemisphere: a ``w`` with
    ``<w, x_i> > 0`` for all ``i`` (by scaling, ``>= 1``), by ``scipy.optimize.linprog``."""
    from scipy.optimize import linprog

    n, d = x.shape
    res = linprog(np.zeros(d), A_ub=-x, b_ub=-np.ones(n), bounds=[(None, None)] * d, method="highs")
    return bool(res.status == 0)


def in_open_half_circle(x: np.ndarray) -> bool:
    """d = 2: the largest angular gap between consecutive points exceeds pi."""
    ang = np.sort(np.arctan2(x[:, 1], x[:, 0]))
    gaps = np.diff(np.concatenate([ang, ang[:1] + 2 * np.pi]))
    return bool(gaps.max() > np.pi)


def compute(quick: bool) -> F.Data:
    """Run the three parts: random starts, the antipodal pair, the orthogonal start."""
    H.setup()
    import attnflow as af

    t1, systems = (20.0, 16) if quick else (200.0, 256)
    ns = (3, 6) if quick else NS
    rng = np.random.default_rng(SEED)
    runs = []
    for d in (2, 3):
        I = np.eye(d)
        model = af.Attention(I, I, I, beta=BETA)
        one, hemi, wendel, implied = [], [], [], []
        for n in ns:
            x0 = rng.standard_normal((systems, n, d))
            x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
            traj = af.simulate(model, x0, t1, frame="sphere", method="euler", dt=DT)
            single = af.clustered_fraction(traj, threshold=THRESHOLD)[:, -1] == 1.0
            test = in_open_half_circle if d == 2 else in_open_hemisphere
            inside = np.array([test(x) for x in x0])
            one.append(float(single.mean()))
            hemi.append(float(inside.mean()))
            wendel.append(af.wendel_probability(n, d))
            implied.append(bool(np.all(single[inside])))
        runs.append(
            dict(
                name=f"random starts, d={d}",
                seed=SEED,
                n=list(ns),
                d=d,
                t1=t1,
                Q="identity",
                K="identity",
                V="identity",
                beta=BETA,
                solver={"method": "euler", "frame": "sphere", "layernorm": "post", "dt": DT},
                tolerances=None,
                systems=systems,
                one_cluster_fraction=one,
                hemisphere_fraction_measured=hemi,
                wendel_probability=wendel,
                hemisphere_starts_all_end_in_one_cluster=implied,
            )
        )
    # (b) antipodal pair
    moved = {}
    t_anti = 10.0 if quick else 100.0
    for beta in (1.0, 9.0):
        I = np.eye(3)
        x0 = np.array([[0.6, 0.0, 0.8], [-0.6, 0.0, -0.8]])
        tr = af.simulate(af.Attention(I, I, I, beta=beta), x0, t_anti, frame="sphere")
        moved[f"beta={beta:g}"] = float(np.abs(np.asarray(tr.x[-1]) - x0).max())
    # (c) orthogonal start
    n = d = 4 if quick else 8
    t_orth = 5.0 if quick else 20.0
    ts = np.linspace(0, t_orth, 21 if quick else 81)
    Qo, _ = np.linalg.qr(rng.standard_normal((d, d)))
    I = np.eye(d)
    tr = af.simulate(
        af.Attention(I, I, I, beta=BETA),
        Qo[:n],
        t_orth,
        ts=ts,
        frame="sphere",
        rtol=1e-12,
        atol=1e-14,
    )
    G = np.einsum("mid,mjd->mij", tr.x, tr.x)[:, ~np.eye(n, dtype=bool)]
    gamma = af.equiangular_curve(n, BETA, ts)
    gap = float(np.abs(G - gamma[:, None]).max())
    runs.append(
        dict(
            name="special starts",
            seed=SEED,
            n=n,
            d=d,
            t1=t_orth,
            Q="identity",
            K="identity",
            V="identity",
            beta=BETA,
            solver=tr.solver,
            tolerances={"rtol": 1e-12, "atol": 1e-14},
            antipodal_pair_max_move=moved,
            antipodal_t1=t_anti,
            orthogonal_start_max_gap_to_equiangular_curve=gap,
        )
    )
    side = H.sidecar(
        script="attnflow.experiments.fig_hemisphere",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "one numpy default_rng(SEED) stream draws, in order, the random starts of every d "
            "and the orthogonal matrix of the last start"
        ),
        theorem="[P]/[S]: points in an open hemisphere collapse to one cluster; an "
        "antipodal pair is stationary; Wendel (1962).",
    )
    return F.Data(
        sidecar=side,
        arrays={"ts": ts, "gamma": gamma, "G": G},
        result={"orthogonal_gap": gap, "antipodal_moved": moved},
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    ts, gamma, G = data.arrays["ts"], data.arrays["gamma"], data.arrays["G"]
    runs = data.sidecar["runs"]
    curves = {
        r["d"]: (
            r["one_cluster_fraction"],
            r["hemisphere_fraction_measured"],
            r["wendel_probability"],
        )
        for r in runs[:2]
    }
    ns, t1 = runs[0]["n"], runs[0]["t1"]
    special = runs[2]
    n, moved, t_anti = special["n"], special["antipodal_pair_max_move"], special["antipodal_t1"]
    gap = special["orthogonal_start_max_gap_to_equiangular_curve"]

    fig, axes = plt.subplots(1, 3, figsize=(6.5, 2.8))
    ax = axes[0]
    for d, (one, hemi, wendel) in curves.items():
        c = "C0" if d == 2 else "C1"
        ax.plot(ns, one, "o-", color=c, ms=3, lw=1, label=f"one cluster, d={d}")
        ax.plot(ns, wendel, "--", color=c, lw=1, label=f"Wendel, d={d}")
        ax.plot(ns, hemi, "x", color=c, ms=4)
    ax.set_xlabel("$n$")
    ax.set_ylabel("fraction of starts")
    ax.set_title(rf"One cluster at $t = {t1:g}$ ($\times$: hemisphere)", pad=3, fontsize=6)
    ax.legend(fontsize=5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    H.panel_label(ax, "a", x=-0.12)
    ax = axes[1]
    names = [rf"$\beta = {k.removeprefix('beta=')}$" for k in moved]
    ax.bar(names, [max(v, 1e-17) for v in moved.values()], color="0.5")
    ax.set_yscale("log")
    ax.set_ylim(1e-17, 1e-8)
    ax.set_title(f"antipodal pair: move by t = {t_anti:g}", pad=3, fontsize=6)
    H.panel_label(ax, "b")
    ax = axes[2]
    ax.plot(ts, gamma, "k-", lw=1, label="equiangular curve")
    ax.plot(
        ts[::4], G[::4, 0], "o", ms=2.5, color="C3", label=r"simulated $\langle x_1, x_2\rangle$"
    )
    ax.set_xlabel("$t$")
    ax.set_title(f"orthogonal, n = d = {n}: gap {gap:.1e}", pad=3, fontsize=6)
    ax.legend(fontsize=6, frameon=False)
    H.panel_label(ax, "c")
    fig.subplots_adjust(top=0.87, bottom=0.32, left=0.08, right=0.98, wspace=0.4)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
