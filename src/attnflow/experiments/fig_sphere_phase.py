"""The beta-t phase diagram of tokens on the sphere (the authors' figure, post-LN).

Set-up (borjanG/2023-transformers-rotf, phase-diagrams.py): n = 32 tokens uniform on
S^{d-1}, Q = K = V = I, post-LN layers x <- N(x + dt sum_j P_ij x_j) with dt = 0.1, t up
to 30, many independent systems per beta, beta = linspace(0.1, 9, 90); the colour is
the fraction of ordered pairs i != j with <x_i, x_j> > 0.999 (over all systems of a
beta), every 5 layers. d = 2 and d = 128. All betas and systems of one dimension run in
one compiled call (``attnflow.studies.sphere.phase_diagram``; beta is a traced leaf).
float32 (the threshold 0.999 is far above its rounding).

Overlay (d = 128): the equiangular boundary t*(beta), the time at which n pairwise
orthogonal tokens (possible for n <= d) reach <x_i, x_j> = 0.999
(``attnflow.equiangular_time``). Measured: for each beta the first saved time at which
half the pairs are clustered, and, at t = 30, the beta at which the fraction drops
through 1/2, against log n.

Run:  python -m attnflow.experiments.fig_sphere_phase [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_sphere_phase"
# seconds on a 2-core machine, quick (two jobs) and full (alone: EXCLUSIVE)
SECONDS = {"quick": 2, "full": 174}
# every beta's 1024 systems in one batch: XLA spreads it over every core
EXCLUSIVE = True
SEED, N, DT, EVERY, THRESHOLD = 0, 32, 0.1, 5, 0.999


def crossing(x: np.ndarray, y: np.ndarray, level: float = 0.5) -> float | None:
    """The first ``x`` where ``y`` (sampled at ``x``) crosses ``level`` from above
    (linear interpolation); None if it never does."""
    above = y >= level
    for i in range(len(y) - 1):
        if above[i] and not above[i + 1]:
            return float(x[i] + (level - y[i]) * (x[i + 1] - x[i]) / (y[i + 1] - y[i]))
    return None


def first_time(ts: np.ndarray, frac: np.ndarray, level: float = 0.5) -> list[float | None]:
    """Per beta (rows of ``frac``), the first saved time with ``frac >= level``."""
    out: list[float | None] = []
    for row in frac:
        hit = np.flatnonzero(row >= level)
        out.append(float(ts[hit[0]]) if hit.size else None)
    return out


def compute(quick: bool) -> F.Data:
    """Every beta and system of each dimension in one compiled call; the fractions.

    Args:
        quick: the small version (6 betas, t up to 6, d = 2 and 16, 16 systems).

    Returns:
        the sidecar (every run's fractions rounded to 4 digits, the crossings) and, for
        ``draw``, ``betas`` and per dimension ``d{d}_ts``, ``d{d}_fraction`` (unrounded)
        and ``d{d}_boundary`` (the equiangular curve, where ``n <= d``).
    """
    H.setup()
    import attnflow as af
    from attnflow.studies.sphere import phase_diagram

    if quick:
        betas, t1, dims, systems = np.linspace(0.1, 9, 6), 6.0, (2, 16), {2: 16, 16: 16}
    else:
        betas, t1, dims, systems = np.linspace(0.1, 9, 90), 30.0, (2, 128), {2: 1024, 128: 1024}
    runs, arrays = [], {"betas": betas}
    for d in dims:
        t0 = time.perf_counter()
        pdg = phase_diagram(
            betas,
            n=N,
            d=d,
            systems=systems[d],
            t1=t1,
            dt=DT,
            save_every=EVERY,
            threshold=THRESHOLD,
            dtype=np.float32,
            seed=SEED,
        )
        seconds = time.perf_counter() - t0
        boundary = [af.equiangular_time(N, float(b), THRESHOLD) for b in betas] if N <= d else None
        beta_half = crossing(betas, pdg.fraction[:, -1])
        runs.append(
            dict(
                name=f"d={d}",
                seed=SEED,
                n=N,
                d=d,
                t1=t1,
                Q="identity",
                K="identity",
                V="identity",
                solver={"method": "euler", "frame": "sphere", "layernorm": "post", "dt": DT},
                tolerances=None,
                systems_per_beta=systems[d],
                threshold=THRESHOLD,
                dtype=pdg.dtype,
                seconds=round(seconds, 1),
                betas=betas,
                ts=pdg.ts,
                fraction=pdg.fraction.round(4),
                one_cluster_fraction=pdg.one_cluster.round(4),
                time_to_half=first_time(pdg.ts, pdg.fraction),
                beta_half_at_t1=beta_half,
                log_n=math.log(N),
                equiangular_boundary=boundary,
                equiangular_time_at_log_n=af.equiangular_time(N, math.log(N), THRESHOLD),
            )
        )
        arrays[f"d{d}_ts"] = pdg.ts
        arrays[f"d{d}_fraction"] = pdg.fraction
        if boundary is not None:
            arrays[f"d{d}_boundary"] = np.asarray(boundary, dtype=np.float64)
    side = H.sidecar(
        script="attnflow.experiments.fig_sphere_phase",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note="phase_diagram(..., seed=SEED): the random starts of every d and beta",
        theorem="[P]: one cluster for almost every start when d >= 3; metastable "
        "clusters at large beta; the equiangular curve is the orthogonal start's.",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"beta_half_at_t1": {r["name"]: r["beta_half_at_t1"] for r in runs}},
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """One phase diagram per dimension, from ``compute``'s data (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    a, runs = data.arrays, data.sidecar["runs"]
    betas = a["betas"]
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5, 2.6), squeeze=False)
    for k, (ax, run) in enumerate(zip(axes[0], runs, strict=True)):
        d, beta_half = run["d"], run["beta_half_at_t1"]
        ts = a[f"d{d}_ts"]
        mesh = ax.pcolormesh(
            ts, betas, a[f"d{d}_fraction"], cmap="RdBu_r", vmin=0, vmax=1, shading="nearest"
        )
        if f"d{d}_boundary" in a:
            tb = a[f"d{d}_boundary"]
            keep = tb <= ts[-1]
            ax.plot(tb[keep], betas[keep], "k-", lw=1)
            H.label_line(ax, tb[keep], betas[keep], r"equiangular, $\gamma = 0.999$", at=0.75)
        ax.axhline(math.log(N), color="k", ls=":", lw=0.8)
        ax.text(0.3, math.log(N) + 0.15, r"$\log n$", va="bottom", fontsize=6)
        ax.set_xlabel("$t$")
        ax.set_ylabel(r"$\beta$")
        half = "none" if beta_half is None else f"{beta_half:.2f}"
        ax.set_title(rf"$d = {d}$: at $t_1$, half the pairs clustered at $\beta = {half}$", pad=3)
        H.panel_label(ax, "ab"[k], x=-0.1)
        bar = fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02)
        bar.set_label("Fraction of clustered pairs", fontsize=7)
    H.headline(
        fig,
        r"Tokens on the sphere (post-LN): fraction of pairs with $\langle x_i, x_j\rangle > 0.999$",
        rf"$n = {N}$, $Q = K = V = I$, $dt = {DT}$, "
        + ", ".join(rf"$d = {r['d']}$: {r['systems_per_beta']} systems per $\beta$" for r in runs),
        y=0.995,
        sub_y=0.93,
    )
    fig.subplots_adjust(top=0.8, bottom=0.16, left=0.07, right=0.94, wspace=0.35)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
