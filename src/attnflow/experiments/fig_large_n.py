"""n towards infinity on the circle: plateau counts against k*(beta), and particles
converging to the mean-field density, up to n = 100,000 tokens.

Both studies run isotropic attention (Q = K = V = I, SA) on the circle in the sphere
frame, where ``simulate`` takes the exact O(n K) circle field by itself from n = 1,024
(``attnflow.dynamics.fields``; the choice is in each run's metadata and in the sidecar).

1. Plateau counts (Bruno, Pasqualotto and Agazzi 2025: a near-uniform start first forms
   ``k* = argmax_k k^2 I_k(beta)`` clusters). n angles i.i.d. uniform, start ``s`` from
   ``numpy.random.default_rng(s)`` (the starts of ``fig_modes``, whose n = 400 is the
   first size here); the adaptive solver (Tsit5, rtol 1e-6, atol 1e-9); time in units
   of ``T = log(sqrt n) / lambda_{k*}``, saves every ``T / 10`` to ``8 T``. Two counts
   per save: the gap count of ``fig_modes`` (``count_clusters``, threshold 0.99: a
   cluster ends where neighbouring tokens are more than ``arccos 0.99`` apart) and the
   peak count of the tokens' histogram (``PEAK_BINS`` bins, at most ``n / 16``; a peak
   at least twice the uniform density high with a prominence of at least the uniform
   density, the rule of ``density_clusters``). The count of a run in a window ``[a T,
   2 a T]`` is its most frequent count there (``fig_modes.plateau_count``). Per beta, n
   and window: how many starts count ``k*``, with an exact 95% interval, and the mean
   count with its 95% t-interval.
2. Particles to the mean field: beta = 5 from ``rho0 = 1 + 0.4 cos theta + 0.3 cos(3
   theta + 0.5)`` (``fig_meanfield``'s start), the density solved by ``solve_density``
   (``CircleMeanField``, 128 modes); n tokens drawn i.i.d. from ``rho0`` (seed ``s``:
   ``default_rng(1000 + s)``) or placed at its quantiles; ``W1`` on the circle between
   the tokens and the density at t = 1, 2, 3 (``circle_wasserstein``), against n, with
   the spread over the i.i.d. seeds and the fitted exponents (expected: -1/2 i.i.d.,
   -1 at the quantiles while the flow is smooth).

The runs are one resumable sweep (``attnflow.studies.sweep``, one run per shard), kept in
``$ATTNFLOW_SWEEP_DIR`` (default ``~/.cache/attnflow/sweeps``) under a folder named
after the settings: a crashed or interrupted run resumes where it stopped.

Run:  python -m attnflow.experiments.fig_large_n [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_large_n"
SECONDS = {"quick": 45, "full": 2820}
LONG = "about 50 minutes of particle runs up to n = 100,000 tokens"
THRESHOLD, RTOL, ATOL = 0.99, 1e-6, 1e-9
PER_T, END_T = 10, 8.0
SAVES = int(END_T * PER_T) + 1  # every T / PER_T from 0 to END_T * T
WINDOWS = ((1.0, 2.0), (2.0, 4.0), (4.0, 8.0))
PEAK_BINS = 512
MF_BETA, MF_T1, MF_TIMES, MF_SEED0 = 5.0, 3.0, (1.0, 2.0, 3.0), 1000

FULL: dict[str, Any] = dict(
    betas=[2.0, 5.0, 10.0, 20.0, 32.0],
    ns=[400, 4000, 20000, 100000],
    seeds=16,
    mf_ns=[316, 1000, 3162, 10000, 31623, 100000],
    mf_seeds=8,
)
QUICK: dict[str, Any] = dict(betas=[5.0], ns=[400, 2000], seeds=2, mf_ns=[256, 1024], mf_seeds=2)


def _rho0(th: np.ndarray) -> np.ndarray:
    return 1 + 0.4 * np.cos(th) + 0.3 * np.cos(3 * th + 0.5)


def peak_count(angles: np.ndarray, bins: int) -> int:
    """Peaks of the tokens' histogram on the circle (``bins`` bins): local maxima at least
    twice the uniform density high with a prominence of at least the uniform density."""
    from attnflow.analysis.density import periodic_peaks

    h, _ = np.histogram(np.mod(angles, 2 * math.pi), bins=bins, range=(0.0, 2 * math.pi))
    return periodic_peaks(h / (angles.size * 2 * math.pi / bins))  # uniform: 1 / (2 pi)


def _cells(cfg: Mapping[str, Any]) -> list[dict]:
    """Every run of the sweep, in index order: the plateau runs, then the mean-field ones."""
    out = []
    for beta in cfg["betas"]:
        for n in cfg["ns"]:
            out += [dict(kind="plateau", beta=beta, n=n, seed=s) for s in range(cfg["seeds"])]
    for n in cfg["mf_ns"]:
        out.append(dict(kind="meanfield", n=n, seed=-1))  # the quantiles
        out += [dict(kind="meanfield", n=n, seed=s) for s in range(cfg["mf_seeds"])]
    return out


def _plateau_run(cell: dict) -> dict:
    import attnflow as af

    beta, n, seed = cell["beta"], cell["n"], cell["seed"]
    pred = af.predict_metastable(beta)
    T = pred.growth_time * math.log(math.sqrt(n))
    ts = np.linspace(0.0, END_T * T, SAVES)
    th = np.random.default_rng(seed).uniform(0.0, 2 * math.pi, n)
    x0 = np.stack([np.cos(th), np.sin(th)], axis=-1)
    traj = af.simulate(
        af.IsotropicAttention(2, beta=beta), x0, ts[-1], ts=ts, frame="sphere", rtol=RTOL, atol=ATOL
    )
    x = np.asarray(traj.x)
    angles = np.arctan2(x[..., 1], x[..., 0])
    bins = min(PEAK_BINS, n // 16)
    return dict(
        gap=np.asarray(af.count_clusters(traj, threshold=THRESHOLD)),
        peak=np.array([peak_count(a, bins) for a in angles]),
        T=np.array(T),
        status=np.array(af.Status(traj.statuses[0]).code),
        steps=np.array(int(np.asarray(traj.stats["num_steps"]))),
        circle=np.array(traj.solver.get("field") == "circle"),
    )


def _density():
    import attnflow as af

    ts = np.linspace(0.0, MF_T1, 13)
    sol = af.solve_density(af.CircleMeanField(MF_BETA, modes=128), _rho0, MF_T1, ts=ts)
    sol.raise_for_status()
    return sol, ts


def _meanfield_run(cell: dict, sol, ts) -> dict:
    import attnflow as af
    from attnflow.analysis import circle_wasserstein

    n, seed = cell["n"], cell["seed"]
    grid = np.linspace(0.0, 2 * math.pi, 40001)
    cdf = sol.cdf(grid, 0)
    if seed < 0:
        u = (np.arange(n) + 0.5) / n
    else:
        u = np.random.default_rng(MF_SEED0 + seed).uniform(size=n)
    th0 = np.interp(u, cdf, grid)
    x0 = np.stack([np.cos(th0), np.sin(th0)], axis=-1)
    traj = af.simulate(
        af.IsotropicAttention(2, beta=MF_BETA),
        x0,
        MF_T1,
        ts=ts,
        frame="sphere",
        rtol=1e-8,
        atol=1e-10,
    )
    x = np.asarray(traj.x)
    angles = np.arctan2(x[..., 1], x[..., 0])
    at = [int(np.argmin(np.abs(ts - t))) for t in MF_TIMES]
    return dict(
        w1=np.array([circle_wasserstein(angles[k], sol, save=k) for k in at]),
        status=np.array(af.Status(traj.statuses[0]).code),
        steps=np.array(int(np.asarray(traj.stats["num_steps"]))),
    )


def kernel(config: Mapping[str, Any], start: int, stop: int, seed: int) -> dict[str, np.ndarray]:
    """The sweep's kernel: runs ``start .. stop - 1`` of ``_cells(config)``; every run
    returns the same arrays (unused ones filled with -1), so that shards concatenate."""
    del seed  # every run draws from its own stated stream
    import jax

    jax.config.update("jax_enable_x64", True)
    cells = _cells(config)
    m = SAVES
    rows = []
    sol = ts = None
    for i in range(start, stop):
        cell = cells[i]
        row = dict(
            gap=np.full(m, -1),
            peak=np.full(m, -1),
            T=np.array(np.nan),
            w1=np.full(len(MF_TIMES), np.nan),
            status=np.array(-1),
            steps=np.array(-1),
            circle=np.array(False),
        )
        if cell["kind"] == "plateau":
            row.update(_plateau_run(cell))
        else:
            if sol is None:
                sol, ts = _density()
            row.update(_meanfield_run(cell, sol, ts))
        rows.append(row)
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _sweep_dir(config: dict) -> Path:
    base = os.environ.get("ATTNFLOW_SWEEP_DIR", "").strip()
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "attnflow" / "sweeps"
    tag = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return root / f"{NAME}-{tag}"


def _window_rows(counts: np.ndarray, ts_over_T: np.ndarray, k: int) -> list[dict]:
    from attnflow.experiments.fig_modes import plateau_count, window_summary

    out = []
    for w in WINDOWS:
        plateau = [plateau_count(ts_over_T, c, w) for c in counts]
        out.append(dict(window_in_T=list(w), **window_summary(plateau, k)))
    return out


def compute(quick: bool) -> F.Data:
    """Run (or resume) the sweep, then summarise it (see the module docstring).

    Args:
        quick: the small version (beta = 5, n = 400 and 2,000, two starts; mean field at
            n = 256 and 1,024, two seeds; full: beta = 2, 5, 10, 20, 32 at n = 400,
            4,000, 20,000 and 100,000, sixteen starts each; mean field at n = 10^2.5 .. 10^5,
            eight
            seeds and the quantiles).

    Returns:
        the sidecar (per beta and n the counts per window against ``k*``; per n the
        ``W1`` of every seed and their summary; the fitted exponents) and, for ``draw``,
        the arrays.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow._stats import loglog_slope
    from attnflow.dynamics.status import STATUS_CODES
    from attnflow.studies import sweep as S

    cfg = QUICK if quick else FULL
    config = dict(cfg, rtol=RTOL, atol=ATOL, threshold=THRESHOLD, per_T=PER_T, end_T=END_T)
    cells = _cells(config)
    sw = S.Sweep(NAME, kernel, config, size=len(cells), seed=0, shard_size=1, unit="run")
    where = _sweep_dir(config)
    S.run(sw, where, progress=True)
    data = S.merge(where, expect=sw)
    ts_over_T = np.linspace(0.0, END_T, SAVES)
    arrays: dict[str, np.ndarray] = {"ts_over_T": ts_over_T}
    runs, statuses = [], []
    for beta in cfg["betas"]:
        pred = af.predict_metastable(beta)
        for n in cfg["ns"]:
            idx = [
                i
                for i, c in enumerate(cells)
                if c["kind"] == "plateau" and c["beta"] == beta and c["n"] == n
            ]
            gap, peak = data["gap"][idx], data["peak"][idx]
            key = f"b{beta:g}_n{n}"
            arrays[f"{key}_gap"], arrays[f"{key}_peak"] = gap, peak
            statuses += [int(s) for s in data["status"][idx]]
            runs.append(
                dict(
                    name=f"beta={beta:g}, n={n}",
                    beta=beta,
                    n=n,
                    seeds=list(range(cfg["seeds"])),
                    predicted_clusters=pred.clusters,
                    rate=pred.rate,
                    T=float(data["T"][idx][0]),
                    circle_field=bool(np.all(data["circle"][idx])),
                    status=[STATUS_CODES[int(s)] for s in data["status"][idx]],
                    steps=[int(s) for s in data["steps"][idx]],
                    gap_windows=_window_rows(gap, ts_over_T, pred.clusters),
                    peak_windows=_window_rows(peak, ts_over_T, pred.clusters),
                )
            )
    mf = []
    for n in cfg["mf_ns"]:
        idx = [i for i, c in enumerate(cells) if c["kind"] == "meanfield" and c["n"] == n]
        w1 = data["w1"][idx]  # (1 + seeds, times): the quantiles first
        statuses += [int(s) for s in data["status"][idx]]
        iid = w1[1:]
        mean = iid.mean(axis=0)
        sem = iid.std(axis=0, ddof=1) / math.sqrt(len(iid))
        mf.append(
            dict(
                n=n,
                quantile=w1[0].tolist(),
                iid=iid.tolist(),
                iid_mean=mean.tolist(),
                iid_sem=sem.tolist(),
                status=[STATUS_CODES[int(s)] for s in data["status"][idx]],
            )
        )
    ns_mf = [r["n"] for r in mf]
    fits = {}
    for j, t in enumerate(MF_TIMES):
        s_i, e_i = loglog_slope(ns_mf, [r["iid_mean"][j] for r in mf])
        s_q, e_q = loglog_slope(ns_mf, [r["quantile"][j] for r in mf])
        fits[f"t={t:g}"] = dict(
            slope_iid=s_i, slope_iid_stderr=e_i, slope_quantile=s_q, slope_quantile_stderr=e_q
        )
    side = H.sidecar(
        script=f"attnflow.experiments.{NAME}",
        quick=quick,
        runs=runs,
        seeds=list(range(cfg["seeds"])),
        seeds_note=(
            "plateau start s: n angles from numpy.random.default_rng(s).uniform(0, 2 pi, n) "
            "(the same at every beta); mean-field seed s: default_rng(1000 + s).uniform(size=n) "
            "mapped through the inverse CDF of rho0, plus one placement at the quantiles"
        ),
        threshold=THRESHOLD,
        tolerances={"rtol": RTOL, "atol": ATOL, "meanfield": {"rtol": 1e-8, "atol": 1e-10}},
        windows_in_T=[list(w) for w in WINDOWS],
        peak_bins=f"min({PEAK_BINS}, n // 16)",
        intervals=(
            "fraction equal to k*: exact (Clopper-Pearson) 95%; mean count: 95% t-interval "
            "over the starts; W1: mean and standard error over the i.i.d. seeds"
        ),
        meanfield=dict(beta=MF_BETA, t1=MF_T1, times=list(MF_TIMES), runs=mf, fits=fits),
        sweep_runs=len(cells),
        all_ok=all(s == 0 for s in statuses),
    )
    return F.Data(side, arrays)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Three panels: the fraction of starts counting ``k*`` against n (per beta, the
    middle window, both counts); the mean count against n with ``k*``; ``W1`` against n."""
    import matplotlib.pyplot as plt

    side = data.sidecar
    runs = side["runs"]
    betas = sorted({r["beta"] for r in runs})
    fig, (ax_f, ax_k, ax_w) = plt.subplots(1, 3, figsize=(11.5, 3.4), gridspec_kw={"wspace": 0.34})
    j = 1 if len(WINDOWS) > 1 else 0  # the window [2T, 4T]
    for c, beta in enumerate(betas):
        rs = [r for r in runs if r["beta"] == beta]
        ns = np.array([r["n"] for r in rs], float)
        for kind, style in (("gap", "o-"), ("peak", "s--")):
            w = [r[f"{kind}_windows"][j] for r in rs]
            frac = np.array([x["fraction_equal"] for x in w])
            ci = np.array([x["fraction_equal_interval_95"] for x in w])
            ax_f.errorbar(
                ns * (1.04 if kind == "peak" else 1.0),
                frac,
                yerr=[frac - ci[:, 0], ci[:, 1] - frac],
                fmt=style,
                ms=3,
                lw=0.8,
                capsize=1.5,
                color=f"C{c}",
                label=rf"$\beta$ = {beta:g} ({kind})",
            )
            mean = np.array([x["mean"] for x in w])
            mci = np.array([x["mean_interval_95"] for x in w])
            ax_k.errorbar(
                ns * (1.04 if kind == "peak" else 1.0),
                mean,
                yerr=[mean - mci[:, 0], mci[:, 1] - mean],
                fmt=style,
                ms=3,
                lw=0.8,
                capsize=1.5,
                color=f"C{c}",
            )
        ax_k.axhline(rs[0]["predicted_clusters"], color=f"C{c}", lw=0.6, ls=":")
    w0, w1 = WINDOWS[j]
    for ax in (ax_f, ax_k):
        ax.set_xscale("log")
        ax.set_xlabel("Tokens $n$")
    ax_f.set_ylim(-0.03, 1.03)
    ax_f.set_ylabel(rf"fraction of starts counting $k^*$ in $[{w0:g}T, {w1:g}T]$")
    # below the panels, off the data
    handles, labels = ax_f.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=6, ncol=5, loc="upper center", bbox_to_anchor=(0.37, 0.0))
    ax_k.set_ylabel(r"count (mean, 95%); dotted: $k^*(\beta)$")
    mf = side["meanfield"]
    ns_mf = np.array([r["n"] for r in mf["runs"]], float)
    for c, t in enumerate(mf["times"]):
        mean = np.array([r["iid_mean"][c] for r in mf["runs"]])
        sem = np.array([r["iid_sem"][c] for r in mf["runs"]])
        q = np.array([r["quantile"][c] for r in mf["runs"]])
        fit = mf["fits"][f"t={t:g}"]
        ax_w.errorbar(
            ns_mf,
            mean,
            yerr=1.96 * sem,
            fmt="o-",
            ms=3,
            lw=0.8,
            capsize=1.5,
            color=f"C{c}",
            label=f"t = {t:g}: i.i.d., slope {fit['slope_iid']:.2f}",
        )
        ax_w.plot(
            ns_mf,
            q,
            "s--",
            ms=3,
            lw=0.8,
            color=f"C{c}",
            label=f"t = {t:g}: quantiles, slope {fit['slope_quantile']:.2f}",
        )
    ax_w.set_xscale("log")
    ax_w.set_yscale("log")
    ax_w.set_xlabel("Tokens $n$")
    ax_w.set_ylabel(r"$W_1$(tokens, mean-field density)")
    ax_w.legend(fontsize=5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    H.panel_letters((ax_f, ax_k, ax_w))
    fig.suptitle(
        r"Circle, SA, $Q = K = V = I$: plateau counts against $k^*(\beta)$ (left, middle) "
        rf"and particles against the mean field at $\beta$ = {mf['beta']:g} (right)",
        fontsize=8,
    )
    rows = [
        "Starts whose count equals k* (gap count | peak count), exact 95% intervals:",
        "",
        "| beta | k* | n | " + " | ".join(f"[{a:g}T, {b:g}T]" for a, b in WINDOWS) + " |",
        "|---|---|---|" + "---|" * len(WINDOWS),
    ]

    def cell(x: dict) -> str:
        lo, hi = x["fraction_equal_interval_95"]
        return f"{x['equal']}/{len(x['counts'])} [{100 * lo:.0f}, {100 * hi:.0f}]%"

    for r in runs:
        cells = [f"{cell(g)} \\| {cell(p)}" for g, p in zip(r["gap_windows"], r["peak_windows"])]
        head = f"| {r['beta']:g} | {r['predicted_clusters']} | {r['n']} |"
        rows.append(f"{head} {' | '.join(cells)} |")
    rows += [
        "",
        f"Mean counts (gap | peak) with 95% t-intervals, window [{w0:g}T, {w1:g}T]:",
        "",
        "| beta | k* | n | gap | peak |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        g, p = r["gap_windows"][j], r["peak_windows"][j]
        rows.append(
            f"| {r['beta']:g} | {r['predicted_clusters']} | {r['n']} | {g['mean']:.2f} "
            f"[{g['mean_interval_95'][0]:.2f}, {g['mean_interval_95'][1]:.2f}] | "
            f"{p['mean']:.2f} [{p['mean_interval_95'][0]:.2f}, {p['mean_interval_95'][1]:.2f}] |"
        )
    rows += ["", "W1 to the mean-field density (i.i.d.: mean +- standard error):", ""]
    rows += ["| n | " + " | ".join(f"t = {t:g}" for t in mf["times"]) + " |"]
    rows += ["|---|" + "---|" * len(mf["times"])]
    for r in mf["runs"]:
        cells = [
            f"{m:.2e} +- {s:.1e} (quantiles {q:.2e})"
            for m, s, q in zip(r["iid_mean"], r["iid_sem"], r["quantile"])
        ]
        rows.append(f"| {r['n']} | {' | '.join(cells)} |")
    rows += ["", "Fitted exponents of W1 against n (least squares in log-log, standard error):"]
    for t, f in mf["fits"].items():
        rows.append(
            f"- {t}: i.i.d. {f['slope_iid']:.3f} +- {f['slope_iid_stderr']:.3f}; quantiles "
            f"{f['slope_quantile']:.3f} +- {f['slope_quantile_stderr']:.3f}"
        )
    return {NAME: fig, NAME + ".md": "\n".join(rows) + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
