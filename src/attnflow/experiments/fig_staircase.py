"""The staircase of metastability at large beta (beta = 500 to 4000).

Geshkovski, Koubbi, Polyanskiy and Rigollet (2024, "Dynamic metastability in the
self-attention model"): under USA on the circle the tokens pass from saddle to saddle of
the energy, each visit lasting like e^{c beta}; with time rescaled so that every step
moves the tokens the same distance (their protocol), the energy climbs a staircase whose
steps are the merges. Their set-up: five tokens at angles 0.5 (0, 0.5, 2, 4, 7) log(beta)
/ sqrt(beta), steps theta <- theta + lr log(beta) g / |g| with lr = 1e-5, and tokens
closer than 1e-3 made one once the flow stops (|g| below 1e-5 in their units, 5e-5 in
attnflow's, whose USA weights carry 1/n).

Set-up here: the same, through ``attnflow.studies.staircase.staircase`` with the model
``IsotropicAttention(2, beta, kernel=USA(shift=beta))`` (weights e^{beta(<x_i, x_j> - 1)}
/ n, finite at any beta), 40,000 steps (rescaled time 0.4; the last merge happens before
0.21 at every beta), float64. Panels: (a) the energy (1/n^2) sum e^{beta(<x_i, x_j> - 1)}
(``interaction_energy(..., shifted=True)``) against rescaled time, with the levels
sum m_c^2 / n^2 of the clusters' multiplicities; (b) the angles at beta = 4000.

Run:  python -m attnflow.experiments.fig_staircase [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_staircase"
SECONDS = {"quick": 4, "full": 4}
LR, STEPS, RECORD, MERGE_BELOW, MERGE_ANGLE = 1e-5, 40_000, 20, 5e-5, 1e-3


def _betas(quick: bool) -> tuple[float, ...]:
    return (500.0, 4000.0) if quick else (500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0)


def compute(quick: bool) -> F.Data:
    """Run the protocol at each beta; the merges and their levels."""
    H.setup()
    import attnflow as af
    from attnflow.studies.staircase import authors_start, staircase

    runs, arrays = [], {}
    for i, beta in enumerate(_betas(quick)):
        model = af.IsotropicAttention(2, beta=beta, kernel=af.kernels.USA(shift=beta))
        run = staircase(
            model,
            authors_start(beta),
            ds=LR,
            steps=STEPS,
            speed=math.log(beta),
            record_every=RECORD,
            merge_below=MERGE_BELOW,
            merge_angle=MERGE_ANGLE,
        )
        energy = af.interaction_energy(run.x, beta, shifted=True)
        change = np.nonzero(np.diff(run.distinct))[0] + 1
        merges = []
        for k in change:
            angles = np.arctan2(run.x[k, :, 1], run.x[k, :, 0])
            _, m = np.unique(np.round(angles, 12), return_counts=True)
            merges.append(
                dict(
                    s=float(run.s[k]),
                    clusters=int(run.distinct[k]),
                    multiplicities=sorted(m.tolist(), reverse=True),
                    level=float((m**2).sum() / m.sum() ** 2),
                    energy=float(energy[k]),
                )
            )
        runs.append(
            dict(
                beta=beta,
                start_angles=np.arctan2(*authors_start(beta)[:, ::-1].T),
                merges=merges,
                energy_start=float(energy[0]),
                energy_end=float(energy[-1]),
                largest_energy_decrease=float(max(0.0, -np.min(np.diff(energy)))),
            )
        )
        arrays[f"b{i}_energy"] = energy
        if i == len(_betas(quick)) - 1:
            arrays["angles"] = np.arctan2(run.x[..., 1], run.x[..., 0])
        arrays["s"] = run.s
    side = H.sidecar(
        script=f"attnflow.experiments.{NAME}",
        quick=quick,
        n=5,
        model="IsotropicAttention(2, beta, kernel=USA(shift=beta)): V = I, USA",
        lr=LR,
        steps=STEPS,
        record_every=RECORD,
        speed="log(beta)",
        merge_below=MERGE_BELOW,
        merge_angle=MERGE_ANGLE,
        runs=runs,
        seeds=[],
        seeds_note="deterministic: the authors' start at each beta, no random draw",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"merges": {r["beta"]: [m["s"] for m in r["merges"]] for r in runs}},
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """Two panels from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    a, runs = data.arrays, data.sidecar["runs"]
    s = a["s"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6.5, 2.7))
    cmap = plt.get_cmap("viridis")
    for i, r in enumerate(runs):
        ax.plot(
            s,
            a[f"b{i}_energy"],
            color=cmap(i / max(1, len(runs) - 1)),
            lw=1.2,
            label=rf"$\beta={r['beta']:g}$",
        )
    levels = sorted({m["level"] for r in runs for m in r["merges"]} | {0.2})
    for lv in levels:
        ax.axhline(lv, color="0.6", lw=0.5, ls=":")
        ax.text(
            1.01,
            lv,
            f"{round(lv * 25)}/25",
            fontsize=6,
            va="center",
            ha="left",
            transform=ax.get_yaxis_transform(),
        )
    ax.set_xlabel("rescaled time", labelpad=1)
    ax.set_ylabel("energy (shifted)", labelpad=1)
    ax.set_xlim(0, s[-1])
    ax.legend(fontsize=6, loc="lower right", frameon=False, bbox_to_anchor=(1.0, 0.45))
    ax.set_title("the energy climbs a staircase", pad=3)
    H.panel_label(ax, "a")
    th = a["angles"]
    for j in range(th.shape[1]):
        ax2.plot(s, th[:, j], lw=1.0)
    for m in runs[-1]["merges"]:
        ax2.axvline(m["s"], color="0.7", lw=0.5, ls="--")
    ax2.set_xlim(0, 1.4 * runs[-1]["merges"][-1]["s"])
    ax2.set_xlabel("rescaled time", labelpad=1)
    ax2.set_ylabel(r"$\theta_i$", labelpad=1)
    ax2.set_title(rf"the five angles, $\beta={runs[-1]['beta']:g}$", pad=3)
    H.panel_label(ax2, "b")
    H.headline(
        fig,
        r"metastability at large $\beta$: USA on the circle, unit-speed steps, merges",
        r"$n=5$ tokens at $0.5\,(0,0.5,2,4,7)\log\beta/\sqrt{\beta}$; "
        r"$\theta\leftarrow\theta+10^{-5}\log\beta\;\omega/|\omega|$",
        sub_y=0.925,
    )
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.16, top=0.8, wspace=0.33)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, tight=False)

if __name__ == "__main__":
    H.main(make, __doc__)
