"""How many metastable clusters: the fastest mean-field mode against counted clusters.

Bruno, Pasqualotto and Agazzi (2025): tokens started near the uniform measure on the
circle first form as many clusters as the fastest-growing Fourier mode of the linearised
mean-field equation, ``k* = argmax_k k^2 I_k(beta)`` (``attnflow.predict_metastable``).

Set-up: n tokens i.i.d. uniform on the circle (their empirical measure is the uniform
one up to fluctuations of relative size ``n^{-1/2}``), Q = K = V = I, SA on the sphere,
the adaptive solver (Tsit5, rtol 1e-8), several seeds per beta as one batch. Time is
read in units of ``T = log(sqrt n) / lambda_{k*}``, the time the fastest mode needs to
grow from ``n^{-1/2}`` to order one; the counted clusters (``count_clusters``, threshold
0.99) are saved to ``6 T`` and the plateau count of a run is its most frequent count over
``[3 T, 6 T]``. The table gives, per beta, ``k*``, the plateau counts of the seeds, their
mean and a 95% t-interval over seeds.

Run:  python -m attnflow.experiments.fig_modes [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_modes"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 12, "full": 77}
SEED, THRESHOLD, RTOL, ATOL, SAVES = 0, 0.99, 1e-8, 1e-10, 61
PLATEAU = (3.0, 6.0)  # the plateau window, in units of T


def plateau_count(ts_over_T: np.ndarray, counts: np.ndarray) -> int:
    """The most frequent count of one run over the window ``PLATEAU`` (ties: the
    smaller count)."""
    inside = counts[(ts_over_T >= PLATEAU[0]) & (ts_over_T <= PLATEAU[1])]
    values, freq = np.unique(inside, return_counts=True)
    return int(values[np.argmax(freq)])


def plateau_interval(plateau: list[int]) -> tuple[float, float, float]:
    """The mean of the plateau counts of the seeds and its 95% t-interval (the mean itself
    when there is one seed or no spread)."""
    from scipy import stats

    mean = float(np.mean(plateau))
    if len(plateau) < 2 or np.std(plateau) == 0:
        return mean, mean, mean
    lo, hi = stats.t.interval(0.95, len(plateau) - 1, loc=mean, scale=stats.sem(plateau))
    return mean, float(lo), float(hi)


def compute(quick: bool) -> F.Data:
    """Count the clusters of every seed and beta over time; the plateau counts.

    Args:
        quick: the small version (n = 200, beta = 2, 5, 10, two seeds; full: n = 400,
            beta = 1, 2, 3, 5, 8, 10, 20, 32, four seeds).

    Returns:
        the sidecar (per beta: ``k*``, the rate, ``T``, the per-seed counts over time,
        plateau counts, mean and interval) and, for ``draw``, ``betas`` and per beta
        ``b{i}_counts`` ``(seeds, saves)`` and ``b{i}_ts_over_T``.
    """
    H.setup()

    import attnflow as af

    if quick:
        n, betas, seeds = 200, (2.0, 5.0, 10.0), 2
    else:
        n, betas, seeds = 400, (1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 20.0, 32.0), 4
    rng = np.random.default_rng(SEED)
    runs, arrays = [], {"betas": np.asarray(betas)}
    for i, beta in enumerate(betas):
        pred = af.predict_metastable(beta)
        T = pred.growth_time * math.log(math.sqrt(n))
        ts = np.linspace(0.0, PLATEAU[1] * T, SAVES)
        angles = rng.uniform(0.0, 2 * math.pi, (seeds, n))
        x0 = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
        traj = af.simulate(
            af.IsotropicAttention(2, beta=beta),
            x0,
            ts[-1],
            ts=ts,
            frame="sphere",
            rtol=RTOL,
            atol=ATOL,
        )
        counts = np.asarray(af.count_clusters(traj, threshold=THRESHOLD))  # (seeds, m)
        plateau = [plateau_count(ts / T, c) for c in counts]
        mean, lo, hi = plateau_interval(plateau)
        arrays[f"b{i}_counts"] = counts
        arrays[f"b{i}_ts_over_T"] = ts / T
        runs.append(
            dict(
                name=f"beta={beta:g}",
                seed=SEED,
                n=n,
                d=2,
                beta=beta,
                Q="identity",
                K="identity",
                V="identity",
                kernel="softmax",
                solver=traj.solver,
                tolerances={"rtol": RTOL, "atol": ATOL},
                status=[str(s) for s in traj.statuses],
                seeds=seeds,
                predicted_clusters=pred.clusters,
                rate=pred.rate,
                T=T,
                ts=ts,
                clusters=counts,
                plateau_counts=plateau,
                plateau_mean=mean,
                plateau_interval_95=[float(lo), float(hi)],
                agrees=bool(lo - 1e-12 <= pred.clusters <= hi + 1e-12),
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_modes",
        quick=quick,
        runs=runs,
        threshold=THRESHOLD,
        plateau_window_in_T=list(PLATEAU),
        theorem="[BPA25]: the first metastable pattern has k* = argmax k^2 I_k(beta) clusters.",
    )
    result = {r["name"]: [r["predicted_clusters"], r["plateau_mean"]] for r in runs}
    return F.Data(sidecar=side, arrays=arrays, result={"predicted_and_counted": result})


def draw(data: F.Data) -> dict[str, Figure | str]:
    """The plateau counts against ``k*(beta)`` and the counts over time, with the table
    as Markdown (matplotlib only, from ``compute``'s data).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    from attnflow.analysis.modes import predict_metastable

    a, runs = data.arrays, data.sidecar["runs"]
    betas = np.asarray(a["betas"])
    fig, (ax_k, ax_t) = plt.subplots(1, 2, figsize=(7.0, 3.0))
    grid = np.geomspace(betas.min() * 0.8, betas.max() * 1.25, 300)
    ax_k.step(
        grid,
        [predict_metastable(b).clusters for b in grid],
        where="post",
        color="0.4",
        label=r"$k^* = \mathrm{argmax}_k\, k^2 I_k(\beta)$",
    )
    mean = np.array([r["plateau_mean"] for r in runs])
    ci = np.array([r["plateau_interval_95"] for r in runs])
    ax_k.errorbar(
        betas,
        mean,
        yerr=[mean - ci[:, 0], ci[:, 1] - mean],
        fmt="o",
        ms=4,
        capsize=2,
        color="C3",
        label="counted (mean, 95% over seeds)",
    )
    ax_k.set_xscale("log")
    ax_k.set_xticks(betas, [f"{b:g}" for b in betas])
    ax_k.minorticks_off()
    ax_k.set_xlabel(r"$\beta$")
    ax_k.set_ylabel("metastable clusters")
    ax_k.legend(fontsize=7, loc="upper left")
    for i, r in enumerate(runs):
        ax_t.plot(
            a[f"b{i}_ts_over_T"], a[f"b{i}_counts"][0], lw=1, label=rf"$\beta$ = {r['beta']:g}"
        )
    ax_t.axvspan(*PLATEAU, color="0.9", zorder=0)
    ax_t.set_yscale("log")
    ax_t.set_xlabel(r"$t / T$, $T = \log\sqrt{n} / \lambda_{k^*}$")
    ax_t.set_ylabel("clusters (first seed)")
    ax_t.legend(fontsize=6, ncol=2)
    fig.suptitle(f"n = {runs[0]['n']} tokens uniform on the circle, SA, Q = K = V = I", fontsize=9)
    rows = ["| beta | k* | plateau counts | mean | 95% interval |", "|---|---|---|---|---|"]
    for r in runs:
        lo, hi = r["plateau_interval_95"]
        rows.append(
            f"| {r['beta']:g} | {r['predicted_clusters']} | "
            f"{', '.join(str(c) for c in r['plateau_counts'])} | {r['plateau_mean']:.2f} | "
            f"[{lo:.2f}, {hi:.2f}] |"
        )
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
