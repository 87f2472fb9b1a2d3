"""How many metastable clusters: the fastest mean-field mode against counted clusters.

Bruno, Pasqualotto and Agazzi (2025): tokens started near the uniform measure on the
circle first form as many clusters as the fastest-growing Fourier mode of the linearised
mean-field equation, ``k* = argmax_k k^2 I_k(beta)`` (``attnflow.predict_metastable``).

Set-up: n tokens i.i.d. uniform on the circle (their empirical measure is the uniform
one up to fluctuations of relative size ``n^{-1/2}``), Q = K = V = I, SA on the sphere,
the adaptive solver (Tsit5, rtol 1e-8), 16 random starts per beta as one batch (start
``s`` draws its angles from ``numpy.random.default_rng(s)``: the same 16 starts at every
beta). Time is read in units of ``T = log(sqrt n) / lambda_{k*}``, the time the fastest
mode needs to grow from ``n^{-1/2}`` to order one; the counted clusters
(``count_clusters``, threshold 0.99) are saved every ``T / 10`` to ``16 T``. The count of
a run in a window is its most frequent count there (ties: the smaller), for every window
of the family ``[a T, 2 a T]``, ``a = 1, 1.5, 2, 3, 4, 6, 8`` (``WINDOWS``). Per beta and
window: the counts' distribution over the starts, how many equal ``k*`` with an exact
(Clopper-Pearson) 95% interval for that fraction, and the mean count with a 95%
t-interval; per window the same fraction pooled over every beta.

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
SECONDS = {"quick": 14, "full": 141}
SEED, THRESHOLD, RTOL, ATOL, SAVES = 0, 0.99, 1e-8, 1e-10, 61
# the windows [a T, 2 a T]: the doubling family [T, 2T] .. [8T, 16T] and the windows
# halfway between (the single window of earlier versions was [3T, 6T])
WINDOWS = ((1.0, 2.0), (1.5, 3.0), (2.0, 4.0), (3.0, 6.0), (4.0, 8.0), (6.0, 12.0), (8.0, 16.0))
PER_T = 10  # saves per T, from 0 to the end of the last window
# the window of experiments/plateau_counts.py (SAVES saves from 0 to 6 T)
PLATEAU = (3.0, 6.0)


def plateau_count(
    ts_over_T: np.ndarray, counts: np.ndarray, window: tuple[float, float] = PLATEAU
) -> int:
    """The most frequent count of one run over ``window`` (in units of T; ties: the
    smaller count). The ends are included, up to rounding of the save times."""
    t = np.asarray(ts_over_T)
    inside = np.asarray(counts)[(t >= window[0] - 1e-9) & (t <= window[1] + 1e-9)]
    values, freq = np.unique(inside, return_counts=True)
    return int(values[np.argmax(freq)])


def plateau_interval(plateau: list[int]) -> tuple[float, float, float]:
    """The mean of the plateau counts of the seeds and its 95% t-interval
    (``attnflow._stats.mean_interval``; the mean itself when there is one seed or no
    spread)."""
    from attnflow._stats import mean_interval

    r = mean_interval(plateau)
    lo, hi = r["interval"] or (r["mean"], r["mean"])
    return r["mean"], float(lo), float(hi)


def window_summary(plateau: list[int], k: int) -> dict:
    """The counts of the starts in one window against ``k``: their distribution
    (``{count: starts}``), how many equal ``k`` with the exact 95% interval of that
    fraction, how many are below and above, the mean and its 95% t-interval."""
    from attnflow._stats import binomial_interval

    values, freq = np.unique(plateau, return_counts=True)
    hits = int(sum(c == k for c in plateau))
    mean, lo, hi = plateau_interval(plateau)
    return dict(
        counts=[int(c) for c in plateau],
        distribution={str(int(v)): int(f) for v, f in zip(values, freq)},
        equal=hits,
        below=int(sum(c < k for c in plateau)),
        above=int(sum(c > k for c in plateau)),
        fraction_equal=hits / len(plateau),
        fraction_equal_interval_95=list(
            binomial_interval(hits, len(plateau), method="clopper-pearson")
        ),
        mean=mean,
        mean_interval_95=[lo, hi],
    )


def compute(quick: bool) -> F.Data:
    """Count the clusters of every start and beta over time; the counts per window.

    Args:
        quick: the small version (n = 200, beta = 2, 5, 10, four starts; full: n = 400,
            beta = 1, 2, 3, 5, 8, 10, 20, 32, sixteen starts).

    Returns:
        the sidecar (per beta: ``k*``, the rate, ``T``, the per-start counts over time
        and, per window, ``window_summary``; per window the fraction equal to ``k*``
        pooled over beta) and, for ``draw``, ``betas`` and per beta ``b{i}_counts``
        ``(starts, saves)`` and ``b{i}_ts_over_T``.
    """
    H.setup()

    import attnflow as af
    from attnflow._stats import binomial_interval

    if quick:
        n, betas, seeds = 200, (2.0, 5.0, 10.0), list(range(4))
    else:
        n, betas, seeds = 400, (1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 20.0, 32.0), list(range(16))
    end = WINDOWS[-1][1]
    # the same starts at every beta: start s from default_rng(s)
    angles = np.stack([np.random.default_rng(s).uniform(0.0, 2 * math.pi, n) for s in seeds])
    x0 = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    runs, arrays = [], {"betas": np.asarray(betas)}
    for i, beta in enumerate(betas):
        pred = af.predict_metastable(beta)
        T = pred.growth_time * math.log(math.sqrt(n))
        ts = np.linspace(0.0, end * T, int(end * PER_T) + 1)
        traj = af.simulate(
            af.IsotropicAttention(2, beta=beta),
            x0,
            ts[-1],
            ts=ts,
            frame="sphere",
            rtol=RTOL,
            atol=ATOL,
        )
        counts = np.asarray(af.count_clusters(traj, threshold=THRESHOLD))  # (starts, m)
        windows = []
        for w in WINDOWS:
            plateau = [plateau_count(ts / T, c, w) for c in counts]
            windows.append(dict(window_in_T=list(w), **window_summary(plateau, pred.clusters)))
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
                starts=len(seeds),
                predicted_clusters=pred.clusters,
                rate=pred.rate,
                T=T,
                ts=ts,
                clusters=counts,
                windows=windows,
            )
        )
    pooled = []
    for j, w in enumerate(WINDOWS):
        hits = sum(r["windows"][j]["equal"] for r in runs)
        total = sum(len(r["windows"][j]["counts"]) for r in runs)
        below = sum(r["windows"][j]["below"] for r in runs)
        pooled.append(
            dict(
                window_in_T=list(w),
                equal=hits,
                below=below,
                above=total - hits - below,
                starts=total,
                fraction_equal=hits / total,
                fraction_equal_interval_95=list(
                    binomial_interval(hits, total, method="clopper-pearson")
                ),
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_modes",
        quick=quick,
        runs=runs,
        seeds=seeds,
        seeds_note=(
            "start s (the same at every beta): n angles from "
            "numpy.random.default_rng(s).uniform(0, 2 pi, n)"
        ),
        threshold=THRESHOLD,
        windows_in_T=[list(w) for w in WINDOWS],
        window_count="the most frequent count over the window (ties: the smaller)",
        intervals=(
            "fraction equal to k*: exact (Clopper-Pearson) 95%; mean count: 95% t-interval "
            "over the starts"
        ),
        pooled=pooled,
        theorem="[BPA25]: the first metastable pattern has k* = argmax k^2 I_k(beta) clusters.",
    )
    result = {
        "fraction_equal": {
            f"[{w[0]:g}T, {w[1]:g}T]": [p["equal"], p["starts"]] for w, p in zip(WINDOWS, pooled)
        }
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Per window, the fraction of starts whose count is ``k*`` and the mean count against
    ``k*(beta)``; the counts over time; the tables as Markdown (matplotlib only, from
    ``compute``'s data).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": tables}``.
    """
    import matplotlib.pyplot as plt

    from attnflow.analysis.modes import predict_metastable

    a, side = data.arrays, data.sidecar
    runs, pooled = side["runs"], side["pooled"]
    betas = np.asarray(a["betas"])
    windows = [tuple(w) for w in side["windows_in_T"]]
    doubling = [j for j, w in enumerate(windows) if math.log2(w[0]).is_integer()]
    fig, (ax_f, ax_k, ax_t) = plt.subplots(1, 3, figsize=(7.4, 2.6))
    for c, j in enumerate(doubling):
        w = windows[j]
        frac = np.array([r["windows"][j]["fraction_equal"] for r in runs])
        ci = np.array([r["windows"][j]["fraction_equal_interval_95"] for r in runs])
        shift = betas * 1.06 ** (c - (len(doubling) - 1) / 2)
        ax_f.errorbar(
            shift,
            frac,
            yerr=[frac - ci[:, 0], ci[:, 1] - frac],
            fmt="o-",
            ms=3,
            lw=0.8,
            capsize=1.5,
            color=f"C{c}",
            label=f"[{w[0]:g}T, {w[1]:g}T]",
        )
        mean = np.array([r["windows"][j]["mean"] for r in runs])
        mci = np.array([r["windows"][j]["mean_interval_95"] for r in runs])
        ax_k.errorbar(
            shift,
            mean,
            yerr=[mean - mci[:, 0], mci[:, 1] - mean],
            fmt="o",
            ms=3,
            capsize=1.5,
            color=f"C{c}",
        )
    grid = np.geomspace(betas.min() * 0.8, betas.max() * 1.25, 300)
    ax_k.step(
        grid,
        [predict_metastable(b).clusters for b in grid],
        where="post",
        color="0.4",
        label=r"$k^* = \mathrm{argmax}_k\, k^2 I_k(\beta)$",
    )
    for ax in (ax_f, ax_k):
        ax.set_xscale("log")
        ax.set_xticks(betas, [f"{b:g}" for b in betas])
        ax.minorticks_off()
        ax.set_xlabel(r"$\beta$")
    ax_f.set_ylim(-0.03, 1.03)
    ax_f.set_ylabel(r"fraction of starts with count $= k^*$")
    ax_f.legend(
        fontsize=6,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=4,
        title="Window",
        title_fontsize=6,
        columnspacing=0.8,
        handletextpad=0.3,
    )
    ax_k.set_ylabel("count in the window (mean, 95%)")
    ax_k.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    for i, r in enumerate(runs):
        ax_t.plot(
            a[f"b{i}_ts_over_T"], a[f"b{i}_counts"][0], lw=1, label=rf"$\beta$ = {r['beta']:g}"
        )
    ax_t.set_yscale("log")
    ax_t.set_xlabel(r"$t / T$, $T = \log\sqrt{n} / \lambda_{k^*}$")
    ax_t.set_ylabel("clusters (start 0)")
    ax_t.set_ylim(top=ax_t.get_ylim()[1] * 6)  # a band above the curves for the legend
    ax_t.legend(fontsize=5, ncol=3, loc="upper center", columnspacing=0.8)
    starts = len(runs[0]["windows"][0]["counts"])
    fig.suptitle(
        f"n = {runs[0]['n']} tokens uniform on the circle, SA, Q = K = V = I, "
        f"{starts} starts per beta (95% intervals)",
        fontsize=8,
    )

    def pct(lo: float, hi: float) -> str:
        return f"[{100 * lo:.0f}, {100 * hi:.0f}]%"

    head = " | ".join(f"[{w[0]:g}T, {w[1]:g}T]" for w in windows)
    rows = [
        "Starts whose count equals k*, with the exact 95% interval of the fraction:",
        "",
        f"| beta | k* | {head} |",
        "|---|---|" + "---|" * len(windows),
    ]
    for r in runs:
        cells = [
            f"{w['equal']}/{len(w['counts'])} {pct(*w['fraction_equal_interval_95'])}"
            for w in r["windows"]
        ]
        rows.append(f"| {r['beta']:g} | {r['predicted_clusters']} | {' | '.join(cells)} |")
    cells = [f"{p['equal']}/{p['starts']} {pct(*p['fraction_equal_interval_95'])}" for p in pooled]
    rows.append(f"| all | | {' | '.join(cells)} |")
    rows += [
        "",
        "The counts' distribution (count: starts) and the mean count with its 95% t-interval:",
        "",
        "| beta | k* | window | distribution | mean | 95% interval |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        for w in r["windows"]:
            dist = ", ".join(f"{k}: {v}" for k, v in w["distribution"].items())
            lo, hi = w["mean_interval_95"]
            a0, a1 = w["window_in_T"]
            rows.append(
                f"| {r['beta']:g} | {r['predicted_clusters']} | [{a0:g}T, {a1:g}T] | {dist} | "
                f"{w['mean']:.2f} | [{lo:.2f}, {hi:.2f}] |"
            )
    H.panel_letters((ax_f, ax_k, ax_t))
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
