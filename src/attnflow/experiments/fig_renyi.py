"""How many metastable clusters under causal attention: counted against the Renyi centres.

Karagodin, Polyanskiy and Rigollet (2024, "Clustering in causal attention masking"): with
a causal mask on the sphere the metastable clusters form around the Renyi centres of the
tokens in causal order (the first token, then each token farther than
``delta = 4 beta^{-1/2}`` from every earlier centre), about ``beta^{(d-1)/2}`` of them.

Set-up: n tokens i.i.d. uniform on ``S^{d-1}`` (d = 2 and 3), Q = K = V = I, SA with
``mask="causal"`` on the sphere, the adaptive solver (Tsit5, rtol 1e-7), several seeds
per beta as one batch. The counted clusters (``count_clusters``, threshold 0.999) are
saved at log-spaced times to ``t = 150`` (the horizon of the paper's Figure 2, n = 200,
d = 2, beta = 64), and the plateau count of a run is its most frequent count over
``PLATEAU = [10, 100]`` (ties: the smaller). Each is compared with the number of Renyi
centres of the run's initial tokens (``renyi_centres(x0, beta=beta)``), and both counts
are fitted as ``log count = c + p log beta`` over every seed (95% t-intervals on ``p``),
to compare with ``(d - 1) / 2``. ``delta_eff``: the constant ``c`` in
``delta = c beta^{-1/2}`` whose Renyi count equals the run's plateau count (the median
over seeds; 4 is the paper's).

Run:  python -m attnflow.experiments.fig_renyi [--quick] [--out figures] [--redraw]

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

NAME = "fig_renyi"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 10, "full": 87}
SEED, THRESHOLD, RTOL, ATOL, SAVES, T1 = 0, 0.999, 1e-7, 1e-9, 41, 150.0
PLATEAU = (10.0, 100.0)  # the plateau window in t
CONSTANTS = np.linspace(1.0, 8.0, 141)  # the grid of c in delta = c beta^{-1/2}


def plateau_count(ts: np.ndarray, counts: np.ndarray) -> int:
    """The most frequent count of one run over the window ``PLATEAU`` (ties: the
    smaller count)."""
    inside = counts[(ts >= PLATEAU[0]) & (ts <= PLATEAU[1])]
    values, freq = np.unique(inside, return_counts=True)
    return int(values[np.argmax(freq)])


def effective_constant(x0: np.ndarray, beta: float, count: int) -> float:
    """The smallest ``c`` of ``CONSTANTS`` whose Renyi count at ``delta = c beta^{-1/2}``
    is at most ``count`` (the count falls as ``c`` grows)."""
    from attnflow.analysis import renyi_centres

    for c in CONSTANTS:
        if len(renyi_centres(x0, delta=c / math.sqrt(beta))) <= count:
            return float(c)
    return math.inf


def power_fit(betas: np.ndarray, counts: np.ndarray) -> dict:
    """``log count = c + p log beta`` by least squares over every (beta, seed): ``p``, its
    95% t-interval and ``e^c``."""
    from scipy import stats

    x = np.repeat(np.log(betas), counts.shape[1])
    y = np.log(counts.reshape(-1))
    fit = stats.linregress(x, y)
    half = float(stats.t.ppf(0.975, len(x) - 2) * fit.stderr)  # pyright: ignore[reportAttributeAccessIssue]
    p = float(fit.slope)  # pyright: ignore[reportAttributeAccessIssue]
    return {
        "exponent": p,
        "interval_95": [p - half, p + half],
        "prefactor": math.exp(float(fit.intercept)),  # pyright: ignore[reportAttributeAccessIssue]
    }


def compute(quick: bool) -> F.Data:
    """Count the clusters of every seed, beta and d over time; plateau and Renyi counts.

    Args:
        quick: the small version (d = 2, n = 100; d = 3, n = 150; beta = 16, 64, two
            seeds; full: d = 2, n = 200; d = 3, n = 400; beta = 16, 32, 64, 128, 256,
            four seeds).

    Returns:
        the sidecar (per d and beta: per-seed counts over time, plateau counts, Renyi
        counts, ``delta_eff``; per d the two fits) and, for ``draw``, ``ts`` and per
        ``d`` ``d{d}_betas``, ``d{d}_plateau``, ``d{d}_renyi`` ``(betas, seeds)`` and
        ``d{d}_b{i}_counts`` ``(seeds, saves)``.
    """
    H.setup()
    import attnflow as af
    from attnflow.analysis import renyi_centres

    if quick:
        sizes, betas, seeds = {2: 64}, (16.0, 64.0), 2
    else:
        sizes, betas, seeds = {2: 200, 3: 400}, (16.0, 32.0, 64.0, 128.0, 256.0), 4
    ts = np.concatenate([[0.0], np.geomspace(1.0, T1, SAVES - 1)])
    rng = np.random.default_rng(SEED)
    runs, fits, arrays = [], {}, {"ts": ts}
    for d, n in sizes.items():
        plateau = np.zeros((len(betas), seeds), np.int64)
        renyi = np.zeros_like(plateau)
        for i, beta in enumerate(betas):
            x0 = rng.normal(size=(seeds, n, d))
            x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
            traj = af.simulate(
                af.IsotropicAttention(d, beta=beta, mask="causal"),
                x0,
                T1,
                ts=ts,
                frame="sphere",
                rtol=RTOL,
                atol=ATOL,
            )
            counts = np.asarray(af.count_clusters(traj, threshold=THRESHOLD))
            plateau[i] = [plateau_count(ts, c) for c in counts]
            renyi[i] = [len(renyi_centres(x, beta=beta)) for x in x0]
            eff = [effective_constant(x, beta, int(k)) for x, k in zip(x0, plateau[i])]
            arrays[f"d{d}_b{i}_counts"] = counts
            runs.append(
                dict(
                    name=f"d={d},beta={beta:g}",
                    seed=SEED,
                    n=n,
                    d=d,
                    t1=T1,
                    beta=beta,
                    Q="identity",
                    K="identity",
                    V="identity",
                    kernel="softmax",
                    mask="causal",
                    solver=traj.solver,
                    tolerances={"rtol": RTOL, "atol": ATOL},
                    status=[str(s) for s in traj.statuses],
                    seeds=seeds,
                    ts=ts,
                    clusters=counts,
                    plateau_counts=plateau[i],
                    renyi_counts=renyi[i],
                    plateau_over_renyi=float(plateau[i].sum() / renyi[i].sum()),
                    delta_eff_median=float(np.median(eff)),
                )
            )
        arrays[f"d{d}_betas"] = np.asarray(betas)
        arrays[f"d{d}_plateau"] = plateau
        arrays[f"d{d}_renyi"] = renyi
        b = np.asarray(betas)
        fits[f"d{d}"] = {
            "n": n,
            "predicted_exponent": (d - 1) / 2,
            "plateau": power_fit(b, plateau),
            "renyi": power_fit(b, renyi),
        }
    side = H.sidecar(
        script="attnflow.experiments.fig_renyi",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "one numpy default_rng(SEED) stream draws the starts of every d and beta in order "
            "(runs[].seeds starts each)"
        ),
        threshold=THRESHOLD,
        plateau_window=list(PLATEAU),
        fits=fits,
        theorem=(
            "[KPR24]: under causal attention the metastable clusters sit at the Renyi "
            "centres, delta = 4 beta^{-1/2}, about beta^{(d-1)/2} of them."
        ),
    )
    result = {
        f"d{d}": [fits[f"d{d}"]["plateau"]["exponent"], fits[f"d{d}"]["renyi"]["exponent"]]
        for d in sizes
    }
    return F.Data(sidecar=side, arrays=arrays, result={"exponents_plateau_renyi": result})


def draw(data: F.Data) -> dict[str, Figure | str]:
    """The plateau and Renyi counts against beta, with the fitted powers, and the counts
    over time of the first seed; the table as Markdown.

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator, ScalarFormatter

    a, side = data.arrays, data.sidecar
    dims = [int(k[1:]) for k in side["fits"]]
    fig, axes = plt.subplots(1, 1 + len(dims), figsize=(3.0 + 2.6 * len(dims), 3.0))
    ax_c = axes[0]
    for j, d in enumerate(dims):
        betas = np.asarray(a[f"d{d}_betas"])
        fit = side["fits"][f"d{d}"]
        for key, marker, shift in (("plateau", "o", 0.97), ("renyi", "s", 1.03)):
            vals = np.asarray(a[f"d{d}_{key}"], float)
            ax_c.errorbar(
                betas * shift,
                vals.mean(axis=1),
                yerr=vals.std(axis=1),
                fmt=marker,
                ms=3.5,
                capsize=2,
                color=f"C{j}",
                mfc="none" if key == "renyi" else f"C{j}",
                label=(
                    f"d = {d}, {'counted' if key == 'plateau' else 'Renyi'}: "
                    rf"$\beta^{{{fit[key]['exponent']:.2f}}}$"
                ),
            )
            grid = np.geomspace(betas.min(), betas.max(), 50)
            ax_c.plot(
                grid,
                fit[key]["prefactor"] * grid ** fit[key]["exponent"],
                color=f"C{j}",
                lw=0.8,
                ls="-" if key == "plateau" else "--",
            )
    ax_c.set_xscale("log")
    ax_c.set_yscale("log")
    every = np.unique(np.concatenate([np.asarray(a[f"d{d}_betas"]) for d in dims]))
    ax_c.set_xticks(every, [f"{b:g}" for b in every])
    ax_c.xaxis.set_minor_locator(NullLocator())
    ax_c.set_xlabel(r"$\beta$")
    ax_c.set_ylabel("clusters (mean, sd over seeds)")
    ax_c.legend(fontsize=6, loc="upper left")
    ts = np.asarray(a["ts"])
    for ax, d in zip(axes[1:], dims):
        betas = np.asarray(a[f"d{d}_betas"])
        for i, beta in enumerate(betas):
            line = ax.plot(ts[1:], a[f"d{d}_b{i}_counts"][0, 1:], lw=1, label=rf"$\beta$={beta:g}")
            ax.axhline(a[f"d{d}_renyi"][i, 0], color=line[0].get_color(), lw=0.6, ls=":")
        ax.axvspan(*PLATEAU, color="0.9", zorder=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("t")
        ax.set_title(f"d = {d}, n = {side['fits'][f'd{d}']['n']} (first seed)", fontsize=7)
        if ax is axes[-1]:  # the same betas in every panel: one legend, beside the last
            ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    axes[1].set_ylabel("clusters; dotted: Renyi centres")
    fig.suptitle("causal SA on the sphere, Q = K = V = I, tokens i.i.d. uniform", fontsize=9)
    rows = [
        "| d | n | beta | plateau counts | Renyi counts | ratio | delta_eff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in side["runs"]:
        rows.append(
            f"| {r['d']} | {r['n']} | {r['beta']:g} | "
            f"{', '.join(str(c) for c in r['plateau_counts'])} | "
            f"{', '.join(str(c) for c in r['renyi_counts'])} | "
            f"{r['plateau_over_renyi']:.2f} | {r['delta_eff_median']:.2f} |"
        )
    rows += ["", "| d | fit | exponent | 95% interval | (d-1)/2 |", "|---|---|---|---|---|"]
    for key, fit in side["fits"].items():
        for which in ("plateau", "renyi"):
            lo, hi = fit[which]["interval_95"]
            rows.append(
                f"| {key[1:]} | {which} | {fit[which]['exponent']:.3f} | "
                f"[{lo:.3f}, {hi:.3f}] | {fit['predicted_exponent']:g} |"
            )
    H.panel_letters(axes)
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
