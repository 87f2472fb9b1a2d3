"""Figure 9 -- the phase diagram: predicted regime against observed limit.

Two 2-parameter families of value matrices, Q = K = I:

(a) d = 2, V = S diag(lambda_1, lambda_2) S^{-1}, S = [[1, 0.6], [0.3, 1]] (a fixed
    non-orthogonal eigenbasis), lambda_1, lambda_2 in [-2, 2]; lambda_1 = lambda_2 gives
    exactly lambda I (polytope for lambda > 0, origin for lambda < 0).
(b) d = 3, V = S3 (1 (+) rho R(theta)) S3^{-1}: one real eigenvalue 1 and a pair
    rho e^{+-i theta} (R the rotation by theta), rho in [0, 2], theta in [0, pi]. rho < 1:
    hyperplanes; rho > 1 and 0 < theta < pi: the leading pair is complex (no theorem);
    theta = 0, rho > 1: paranormal (subspace); theta = pi, rho > 1: leading eigenvalue
    negative; rho = 1, theta = 0: V = I (polytope).

Each cell is coloured by ``predict_regime(I, I, V).label`` (decided from V before any
simulation). Then 3 systems (1 with --quick) of n = 20 tokens uniform in [-5, 5]^d (one
batch, one compiled solve per cell shape) are simulated -- the discrete transformer, Euler dt = 0.1,
to t1 = min(60, max(15, 30 / |lambda_max|)) in the rescaled frame (the original frame,
t1 = min(100, 60 / c), for V = -cI) -- and ``observe_limit`` labels each. Where the
majority observed label differs from the prediction, an inner square shows it (white
with a dot: the tokens had not settled by t1).

Run:  python -m attnflow.experiments.fig_phase_diagram [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from attnflow.analysis.regimes import Label
from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_phase_diagram"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 3, "full": 44}
SEED, N, BATCH, DT, SAVES = 0, 20, 3, 0.1, 121
BATCH_QUICK = 1  # quick: the shapes of the other figures' runs (no extra compilation)
S2 = np.array([[1.0, 0.6], [0.3, 1.0]])
S3 = np.array([[1.0, 0.3, -0.2], [0.2, 1.0, 0.3], [-0.1, 0.25, 1.0]])
ORDER = list(Label)


def family_a(l1: float, l2: float) -> np.ndarray:
    """d = 2: eigenvalues l1, l2 on the columns of S2 (exactly l1 I when l1 = l2)."""
    if l1 == l2:
        return l1 * np.eye(2)
    return S2 @ np.diag([l1, l2]) @ np.linalg.inv(S2)


def family_b(rho: float, theta: float) -> np.ndarray:
    """d = 3: eigenvalue 1 and the pair rho e^{+-i theta}, on the columns of S3."""
    c, s = np.cos(theta), np.sin(theta)
    if theta == 0.0:
        c, s = 1.0, 0.0
    elif theta == np.pi:
        c, s = -1.0, 0.0
    if rho == 1.0 and s == 0.0 and c == 1.0:
        return np.eye(3)
    B = np.zeros((3, 3))
    B[0, 0] = 1.0
    B[1:, 1:] = rho * np.array([[c, -s], [s, c]])
    return S3 @ B @ np.linalg.inv(S3)


def run_cell(V: np.ndarray, seed: int, batch: int = BATCH) -> dict:
    """Predict, simulate a batch, observe each system."""
    import attnflow as af
    import attnflow.plotting as AP

    d = V.shape[0]
    reg = af.predict_regime(np.eye(d), np.eye(d), V)
    lmax = float(np.abs(reg.eigenvalues).max())
    if reg.structure.kind == "scalar-negative":
        frame, t1 = "original", min(100.0, 60.0 / lmax)
    else:
        frame, t1 = "rescaled", min(60.0, max(15.0, 30.0 / lmax)) if lmax > 0 else 15.0
    t1 = round(round(t1 / DT) * DT, 9)
    traj, params = AP.simulate_tokens(
        V, n=N, seed=seed, t1=t1, dt=DT, frame=frame, saves=SAVES, batch=batch
    )
    obs = [af.observe_limit(traj, system=i).label for i in range(batch)]
    major = Counter(obs).most_common()
    top = max(major, key=lambda kv: (kv[1], kv[0] == reg.label))[0]
    return {
        "V": V.tolist(),
        "predicted": reg.label,
        "observed": obs,
        "majority": top,
        "t1": t1,
        "frame": frame,
        "status": traj.status,
        "seconds": params["seconds"],
        "eigenvalues": reg.eigenvalues,
    }


def summarize(cells: list[list[dict]]) -> dict:
    """Counts over a grid of ``run_cell`` records: cells, how many agree (majority
    observed = predicted), differ or had not settled, and the predicted and observed
    labels."""
    agree = sum(c["majority"] == c["predicted"] for row in cells for c in row)
    unsettled = sum(
        c["majority"] != c["predicted"] and c["majority"] == Label.NOT_CONVERGED
        for row in cells
        for c in row
    )
    n_cells = sum(len(row) for row in cells)
    return {
        "cells": n_cells,
        "agree": agree,
        "disagree": n_cells - agree - unsettled,
        "not_settled": unsettled,
        "predicted_counts": dict(Counter(c["predicted"] for row in cells for c in row)),
        "observed_counts": dict(Counter(o for row in cells for c in row for o in c["observed"])),
    }


def compute(quick: bool) -> F.Data:
    """Sweep both families: predict, simulate and observe every cell.

    Args:
        quick: the small version (5 x 5 cells, one system per cell).

    Returns:
        the sidecar (one run per family with every cell and its summary) and, for
        ``draw``, each family's grid ``a_xs``, ``a_ys``, ``b_xs``, ``b_ys``.
    """
    H.setup()
    k = 5 if quick else 15
    batch = BATCH_QUICK if quick else BATCH
    lam = np.linspace(-2.0, 2.0, k)
    rho = np.linspace(0.0, 2.0, k)
    theta = np.linspace(0.0, np.pi, k)
    runs, summary, arrays = [], {}, {}
    for key, xs, ys, build in (
        ("a", lam, lam, lambda x, y: family_a(x, y)),
        ("b", theta, rho, lambda x, y: family_b(y, x)),
    ):
        cells = [[run_cell(build(float(x), float(y)), SEED, batch) for x in xs] for y in ys]
        summary[key] = summarize(cells)
        arrays.update({f"{key}_xs": xs, f"{key}_ys": ys})
        runs.append(
            {
                "name": f"family_{key}",
                "seed": SEED,
                "n": N,
                "batch": batch,
                "d": 2 if key == "a" else 3,
                "t1": "min(60, max(15, 30 / |lambda_max|)) (rescaled); min(100, 60 / c) for "
                "V = -cI (original frame); per cell in 'cells'",
                "Q": "identity",
                "K": "identity",
                "V": (
                    f"S2 diag(lambda_1, lambda_2) S2^-1 (lambda I when equal), S2 = {S2.tolist()}"
                    if key == "a"
                    else f"S3 (1 (+) rho R(theta)) S3^-1, S3 = {S3.tolist()}"
                ),
                "solver": {"method": "euler", "dt": DT, "saves": SAVES},
                "tolerances": {
                    "rtol": None,
                    "atol": None,
                    "observe_limit": {"tol": 1e-2, "move_tol": 1e-3},
                },
                "x0": f"numpy.random.default_rng({SEED}).uniform(-5, 5, ({batch}, {N}, d))",
                "grid_x": xs,
                "grid_y": ys,
                "grid_x_name": "lambda_1" if key == "a" else "theta",
                "grid_y_name": "lambda_2" if key == "a" else "rho",
                "cells": cells,
                "summary": summary[key],
            }
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_phase_diagram",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "every cell: x0 = numpy default_rng(SEED).uniform(-5, 5, (BATCH, N, d)), the same "
            "starts in every cell"
        ),
        summary=summary,
    )
    return F.Data(sidecar=side, arrays=arrays, result={"summary": summary})


def draw(data: F.Data) -> dict[str, Figure]:
    """The two phase diagrams, from ``compute``'s data (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    from attnflow.plotting import LABEL_COLORS

    runs = data.sidecar["runs"]
    batch = runs[0]["batch"]
    fig = plt.figure(figsize=(6.5, 3.55))
    rects = {"a": (0.07, 0.25, 0.36, 0.62), "b": (0.58, 0.25, 0.36, 0.62)}
    specs = {
        "a": dict(
            xlabel=r"$\lambda_1$ (on $Se_1$)",
            ylabel=r"$\lambda_2$ (on $Se_2$)",
            title=r"(a) $d=2$, $V=S\,\mathrm{diag}(\lambda_1,\lambda_2)\,S^{-1}$",
        ),
        "b": dict(
            xlabel=r"rotation angle $\theta/\pi$",
            ylabel=r"modulus $\rho$ of the pair $\rho e^{\pm i\theta}$",
            title=r"(b) $d=3$, eigenvalues $1$ and $\rho e^{\pm i\theta}$",
        ),
    }
    for run in runs:
        key = run["name"].removeprefix("family_")
        sp, cells, summary = specs[key], run["cells"], run["summary"]
        ax = fig.add_axes(rects[key])
        xs, ys = data.arrays[f"{key}_xs"], data.arrays[f"{key}_ys"]
        xv = xs / np.pi if key == "b" else xs
        dx, dy = xv[1] - xv[0], ys[1] - ys[0]
        for i, y in enumerate(ys):
            for j, x in enumerate(xv):
                c = cells[i][j]
                ax.add_patch(
                    Rectangle(
                        (x - dx / 2, y - dy / 2),
                        dx,
                        dy,
                        facecolor=LABEL_COLORS[c["predicted"]],
                        edgecolor="white",
                        lw=0.3,
                    )
                )
                m = c["majority"]
                if m == c["predicted"]:
                    continue
                ax.add_patch(
                    Rectangle(
                        (x - dx / 4, y - dy / 4),
                        dx / 2,
                        dy / 2,
                        facecolor=LABEL_COLORS[m],
                        edgecolor="k",
                        lw=0.4,
                    )
                )
                if m == Label.NOT_CONVERGED:
                    ax.plot(x, y, ".", color="k", ms=1.5)
        ax.set_xlim(xv[0] - dx / 2, xv[-1] + dx / 2)
        ax.set_ylim(ys[0] - dy / 2, ys[-1] + dy / 2)
        if key == "a":
            ax.plot([-2.2, 2.2], [-2.2, 2.2], color="k", lw=0.4, ls=":")
            ax.plot([-2.2, 2.2], [2.2, -2.2], color="k", lw=0.4, ls=":")
            ax.set_aspect("equal")
        else:
            ax.axhline(1.0, color="k", lw=0.4, ls=":")
        ax.set_xlabel(sp["xlabel"], labelpad=1)
        ax.set_ylabel(sp["ylabel"], labelpad=1)
        ax.set_title(sp["title"], pad=3, fontsize=7.5)
        ax.text(
            0.5,
            -0.2,
            f"{summary['agree']} of {summary['cells']} cells agree; {summary['disagree']} "
            f"differ, {summary['not_settled']} not settled",
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize=6.5,
            color="0.25",
        )
    handles = [
        Patch(facecolor=LABEL_COLORS[lab], edgecolor="0.5", lw=0.4, label=lab) for lab in ORDER
    ]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=6,
        frameon=False,
        fontsize=6.5,
        bbox_to_anchor=(0.5, 0.0),
        handlelength=1.2,
        columnspacing=1.0,
    )
    systems = f"{batch} systems" if batch > 1 else "1 system"
    H.headline(
        fig,
        "Phase diagram: cell colour = predicted regime (from V's "
        "spectrum); inner square = observed limit where it differs",
        rf"$Q=K=I$; per cell {systems} of $n={N}$ tokens uniform in "
        r"$[-5,5]^d$, Euler $dt=0.1$ to $t_1=\min(60,\max(15,30/|\lambda|_{\max}))$, "
        r"majority of observe_limit",
        sub_y=0.95,
        size=8.5,
        sub_size=6.5,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
