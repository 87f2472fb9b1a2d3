"""Softmax dispersion: the largest attention coefficient, leaders and sinks as n grows.

Velickovic et al. (2024, Lemma 2.1): for n logits of spread delta no softmax coefficient
exceeds 1/(1 + (n-1) e^{-delta}) <= e^{delta}/n. Bertsch et al. (2026): QK norm bounds
delta by the weights alone and weakens attention sinks. Three figures:

  fig_dispersion_max.{png,pdf}     fixed weights, tokens uniform on the unit sphere of
                                   R^8, n = 16 ... 16,384: the largest coefficient of 16
                                   fixed query rows against n, per kernel, with both
                                   bounds (from the measured spread of each row) and the
                                   bound of the logits the kernel actually exponentiates;
                                   its "all kernels" panel adds linearnorm, stickbreaking,
                                   offbyone, prenorm and differential (dashed, same
                                   weights and beta as softmax)
  fig_dispersion_leaders.{png,pdf} the particle system (original frame, V = Q = K = I,
                                   d = 2, discrete transformer with dt = 0.05): the first
                                   time some token holds more than half of a row's
                                   attention, against n, per kernel (a batch of seeds)
  fig_dispersion_sink.{png,pdf}    a sink token (the first token, c times the common
                                   direction of the others): sink mass and normalised
                                   entropy against n, softmax vs qknorm
  fig_dispersion.json              every parameter and number, and versions

Calibration ("trained at n = 16"): ssmax uses s = 1/log 16, so that it equals softmax at
n = 16; in figure 1 qknorm's beta is chosen so that its largest coefficient at n = 16
equals softmax's. Figure 3 shows qknorm at the same beta as softmax and at 4 times it.

Run:  python -m attnflow.experiments.fig_dispersion [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the sidecar's results); the numbers are
``compute``.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_dispersion"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 13, "full": 100}
KERNEL_ORDER = ("softmax", "qknorm", "ssmax", "adaptive", "sigmoid")
COLORS = {
    "softmax": "#1f77b4",
    "qknorm": "#d62728",
    "ssmax": "#2ca02c",
    "adaptive": "#9467bd",
    "sigmoid": "#ff7f0e",
}
N_TRAIN = 16
# The kernels beyond the first five, drawn in figure 1's "all kernels" panel only (dashed).
EXTRA_KERNELS = ("linearnorm", "stickbreaking", "offbyone", "prenorm", "differential")
EXTRA_COLORS = dict(zip(EXTRA_KERNELS, ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")))


def _config(quick: bool) -> dict:
    # Every (kernel, n) pair compiles once (shapes are static): the lists stay short.
    if quick:
        ns1 = [16, 256]
        ns2 = [16]
        ns3 = [16, 256]
        seeds, t1, sinks = 2, 2.0, [8.0, 32.0]
    else:
        ns1 = [16 * 4**k for k in range(6)]  # 16, 64, ..., 16,384
        ns2 = [16, 64, 256, 1024]
        ns3 = [16 * 4**k for k in range(6)]
        seeds, t1, sinks = 3, 4.5, [4.0, 8.0, 16.0, 32.0]
    return dict(
        max=dict(
            d=8,
            ns=ns1,
            queries=N_TRAIN,
            beta=2.5,
            seed=1,
            tokens="uniform on the unit sphere of R^8 (normalised Gaussians), "
            "numpy default_rng(seed), one fixed stream: n tokens = its first n",
            weights="Q, K with iid N(0, 1/d) entries from the same generator",
            ssmax_s=1.0 / math.log(N_TRAIN),
            qknorm_beta="calibrated at n = 16",
        ),
        leaders=dict(
            d=2,
            ns=ns2,
            seeds=seeds,
            beta=1.0,
            t1=t1,
            dt=0.05,
            save_every=3,
            threshold=0.5,
            frame="original",
            method="euler",
            V="identity",
            Q="identity",
            K="identity",
            tokens="uniform in [-1, 1]^2, numpy default_rng(100 + seed), "
            "n tokens = the first n of a stream of max(ns)",
            ssmax_s=1.0 / math.log(N_TRAIN),
            metric="first saved time at which max over rows of "
            "max_j P_ij / sum_j P_ij exceeds the threshold",
        ),
        sink=dict(
            d=8,
            ns=ns3,
            queries=256,
            beta=1.0 / math.sqrt(8),
            sink_scales=sinks,
            mean_scale=1.0,
            seed=2,
            qknorm_gains=[1.0, 4.0],
            tokens="x_j = a u + r_j, u = e_1, a = mean_scale, r_j uniform in the "
            "unit ball; the sink x_0 = c u; queries = tokens 1 .. 256",
            Q="identity",
            K="identity",
        ),
    )


def _sphere(rng, n, d):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _max_vs_n(cfg: dict) -> dict:
    import attnflow as af
    from attnflow.dynamics import kernels as K

    rng = np.random.default_rng(cfg["seed"])
    d = cfg["d"]
    Q = rng.normal(size=(d, d)) / math.sqrt(d)
    Kw = rng.normal(size=(d, d)) / math.sqrt(d)
    x = _sphere(rng, max(cfg["ns"]), d)
    beta = cfg["beta"]
    # qknorm's beta: the same largest coefficient at n = 16 as softmax (bisection; the
    # largest coefficient of a row increases with beta)
    x16 = x[:N_TRAIN]
    target = float(np.max(af.dispersion(af.Attention(Q, Kw, np.eye(d), beta=beta), x=x16).max))
    lo, hi = 1e-3, 50.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        m = af.Attention(Q, Kw, np.eye(d), beta=mid, kernel="qknorm")
        if float(np.max(af.dispersion(m, x=x16).max)) < target:
            lo = mid
        else:
            hi = mid
    beta_qk = math.sqrt(lo * hi)
    s = cfg["ssmax_s"]
    res = {}
    for kern in KERNEL_ORDER:
        b = beta_qk if kern == "qknorm" else beta
        m = af.Attention(
            Q,
            Kw,
            np.eye(d),
            beta=b,
            kernel=kern,
            kernel_params={"s": s} if kern == "ssmax" else None,
        )
        r = {
            key: []
            for key in (
                "max",
                "median",
                "bound_tight",
                "bound_loose",
                "delta",
                "entropy_normalized",
            )
        }
        for n in cfg["ns"]:
            rep = af.dispersion(m, x=x[:n], rows=slice(0, cfg["queries"]))
            r["max"].append(float(np.max(rep.max)))
            r["median"].append(float(np.median(rep.max)))
            # each row's coefficient is below its own bound: the largest bound over rows
            r["bound_tight"].append(float(np.max(rep.bound_tight)))
            r["bound_loose"].append(float(np.max(rep.bound_loose)))
            r["delta"].append(float(np.max(rep.delta)))
            r["entropy_normalized"].append(float(np.mean(rep.entropy_normalized)))
        med = r["median"]
        ns = np.asarray(cfg["ns"], float)
        delta = np.asarray(r["delta"])
        if kern == "ssmax":
            eff = 1 / (1 + (ns - 1) * np.exp(-s * np.log(ns) * delta))
            eff_label = r"softmax bound of $s\log n\cdot L$"
        elif kern == "adaptive":
            g = K.ADAPTIVE_MAX_INVERSE_TEMPERATURE
            eff = 1 / (1 + (ns - 1) * np.exp(-g * delta))
            eff_label = rf"softmax bound of ${g:.3f}\,L$ (largest $1/\theta$)"
        else:
            eff, eff_label = None, None
        res[kern] = dict(
            beta=b,
            max=r["max"],
            median_row_max=med,
            bound_tight=r["bound_tight"],
            bound_loose=r["bound_loose"],
            delta=r["delta"],
            effective_bound=None if eff is None else eff.tolist(),
            effective_bound_label=eff_label,
            entropy_normalized=r["entropy_normalized"],
        )
    extra = {}
    for kern in EXTRA_KERNELS:
        m = af.Attention(Q, Kw, np.eye(d), beta=beta, kernel=kern)
        reps = [af.dispersion(m, x=x[:n], rows=slice(0, cfg["queries"])) for n in cfg["ns"]]
        extra[kern] = dict(
            max=[float(np.max(rep.max)) for rep in reps],
            delta=[float(np.max(rep.delta)) for rep in reps],
        )
    sv = lambda A: float(np.linalg.svd(A, compute_uv=False)[0])  # noqa: E731
    return dict(
        kernels_extra=extra,
        ns=cfg["ns"],
        beta=beta,
        beta_qknorm=beta_qk,
        ssmax_s=s,
        target_max_at_16=target,
        kernels=res,
        delta_worst_case=2 * beta * sv(Q) * sv(Kw),
        delta_worst_case_qknorm=2 * beta_qk * d,
        Q=Q.tolist(),
        K=Kw.tolist(),
    )


def _leaders(cfg: dict) -> dict:
    import attnflow as af

    d, dt, t1 = cfg["d"], cfg["dt"], cfg["t1"]
    n_max = max(cfg["ns"])
    x_all = np.stack(
        [np.random.default_rng(100 + s).uniform(-1, 1, (n_max, d)) for s in range(cfg["seeds"])]
    )
    layers = int(round(t1 / dt))
    ts = np.arange(0, layers + 1, cfg["save_every"]) * dt
    out = {}
    for kern in KERNEL_ORDER:
        params = {"s": cfg["ssmax_s"]} if kern == "ssmax" else None
        model = af.Attention(
            np.eye(d), np.eye(d), np.eye(d), beta=cfg["beta"], kernel=kern, kernel_params=params
        )
        rows = []
        for n in cfg["ns"]:
            traj = af.simulate(
                model, x_all[:, :n], t1, ts=ts, frame=cfg["frame"], method="euler", dt=dt
            )
            share = np.full((cfg["seeds"], len(ts)), np.nan)
            for k in range(len(ts)):
                rep = af.dispersion(traj, k=k)
                share[:, k] = np.nanmax(rep.share_max, axis=-1)
            reached = np.asarray(traj.reached)
            share[~reached] = np.nan
            times, status = [], []
            for b in range(cfg["seeds"]):
                hit = np.flatnonzero(share[b] > cfg["threshold"])
                times.append(float(ts[hit[0]]) if hit.size else None)
                status.append(traj.statuses[b])
            rows.append(
                dict(
                    n=n,
                    times=times,
                    statuses=status,
                    t_stop=[float(t) for t in traj.t_stop],
                    share_median_over_seeds=np.nanmedian(share, 0).tolist(),
                    share_initial=share[:, 0].tolist(),
                )
            )
        out[kern] = rows
    return dict(ns=cfg["ns"], ts=ts.tolist(), kernels=out)


def _sink(cfg: dict) -> dict:
    import attnflow as af

    rng = np.random.default_rng(cfg["seed"])
    d, n_max = cfg["d"], max(cfg["ns"])
    u = np.zeros(d)
    u[0] = 1.0
    r = _sphere(rng, n_max, d) * rng.uniform(size=(n_max, 1)) ** (1.0 / d)
    base = cfg["mean_scale"] * u + r
    cases = [("softmax", c, cfg["beta"]) for c in cfg["sink_scales"]]
    cases += [("qknorm", c, cfg["beta"]) for c in cfg["sink_scales"]]
    # a larger qknorm gain: the sink's share then depends on the weights, not its norm
    cases += [
        ("qknorm", cfg["sink_scales"][-1], g * cfg["beta"]) for g in cfg["qknorm_gains"] if g != 1.0
    ]
    out = []
    for kern, c, beta in cases:
        x = base.copy()
        x[0] = c * u
        m = af.Attention(np.eye(d), np.eye(d), np.eye(d), beta=beta, kernel=kern)
        mass, ent, bt = [], [], []
        for n in cfg["ns"]:
            rep = af.dispersion(m, x=x[:n], rows=slice(1, min(n, cfg["queries"] + 1)))
            mass.append(float(rep.mean_sink_mass))
            ent.append(float(np.mean(rep.entropy_normalized)))
            bt.append(float(np.mean(rep.bound_tight)))
        out.append(
            dict(
                kernel=kern,
                sink_scale=c,
                beta=beta,
                sink_mass=mass,
                entropy_normalized=ent,
                mean_bound_tight=bt,
            )
        )
    return dict(ns=cfg["ns"], cases=out)


def _plot_max(data: dict) -> Figure:
    import matplotlib.pyplot as plt

    ns = np.asarray(data["ns"], float)
    fig, axes = plt.subplots(2, 3, figsize=(7.0, 4.6), sharex=True, sharey=True)
    axes = axes.ravel()
    for ax, kern in zip(axes, KERNEL_ORDER):
        r = data["kernels"][kern]
        c = COLORS[kern]
        ax.plot(ns, r["max"], "o-", color=c, ms=3, lw=1.2, label="largest coefficient")
        ax.plot(
            ns, r["median_row_max"], "s:", color=c, ms=2, lw=0.8, alpha=0.7, label="median row max"
        )
        ax.plot(
            ns, np.minimum(r["bound_tight"], 1.0), "k--", lw=0.9, label=r"$1/(1+(n-1)e^{-\delta})$"
        )
        ax.plot(ns, np.minimum(r["bound_loose"], 2.0), "k:", lw=0.9, label=r"$e^{\delta}/n$")
        own = None
        if r["effective_bound"] is not None:
            (own,) = ax.plot(
                ns,
                r["effective_bound"],
                "-.",
                color="0.45",
                lw=0.9,
                label=r["effective_bound_label"],
            )
        title = {"qknorm": "QK norm", "ssmax": "SSMax"}.get(kern, kern)  # as prose
        title += rf" ($\beta = {r['beta']:.3g}$)" if kern == "qknorm" else ""
        if kern == "ssmax":
            title += rf" ($s=1/\log {N_TRAIN}$)"
        ax.set_title(title)
        if ax is axes[0]:  # the same four curves in every panel: named once
            ax.legend(fontsize=5, loc="lower left")
        elif own is not None:  # and what a panel adds
            ax.legend(handles=[own], fontsize=5, loc="lower left")
    ax = axes[-1]
    for kern in KERNEL_ORDER:
        ax.plot(
            ns, data["kernels"][kern]["max"], "o-", color=COLORS[kern], ms=2.5, lw=1, label=kern
        )
    for kern, r in data.get("kernels_extra", {}).items():
        ax.plot(ns, r["max"], "s--", color=EXTRA_COLORS[kern], ms=2, lw=0.8, label=kern)
    ax.plot(ns, 1 / ns, color="0.6", lw=0.8, label="$1/n$")
    ax.set_title("All kernels")
    ax.legend(fontsize=5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylim(2e-6, 1.5)  # room below the curves for the legends
        ax.grid(alpha=0.25, lw=0.4)
        ax.tick_params(labelsize=6)
    for ax in axes[3:]:
        ax.set_xlabel("$n$ (keys)")
    for ax in axes[::3]:
        ax.set_ylabel(r"$\max_{i,j} P_{ij}$ over 16 queries")
    H.panel_letters(axes)
    fig.suptitle(
        rf"Largest attention coefficient against $n$ (fixed weights, tokens on "
        rf"$S^{{7}}$, $\beta$={data['beta']:g}); bounds from each row's logit "
        r"spread $\delta$, max over rows",
        fontsize=7,
    )
    fig.tight_layout()
    return fig


def _plot_leaders(data: dict, t1: float, qk_limit: float | None = None) -> Figure:
    import matplotlib.pyplot as plt

    ns = np.asarray(data["ns"], float)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(7.0, 2.8))
    for i, kern in enumerate(KERNEL_ORDER):
        rows = data["kernels"][kern]
        c = COLORS[kern]
        jit = 1 + 0.04 * (i - 2)
        med, lo, hi, cens_n, over_n = [], [], [], [], []
        for n, row in zip(ns, rows):
            # no leader by t1 counts as +inf: the median is censored when most seeds are
            t = np.array([np.inf if v is None else v for v in row["times"]])
            m = float(np.median(t))
            if not np.isfinite(m):
                med.append(np.nan)
                lo.append(np.nan)
                hi.append(np.nan)
                if any(s == "overflow" for s in row["statuses"]):
                    over_n.append(n)
                else:
                    cens_n.append(n)
                continue
            fin = t[np.isfinite(t)]
            med.append(m)
            lo.append(fin.min())
            hi.append(t.max())
        med, lo, hi = map(np.asarray, (med, lo, hi))
        hi_c = np.minimum(hi, t1 * 1.04)  # a censored seed: the bar reaches the marker line
        ax.errorbar(
            ns * jit,
            med,
            yerr=[med - lo, hi_c - med],
            fmt="o-",
            color=c,
            ms=3,
            lw=1,
            capsize=1.5,
            label=kern,
        )
        if cens_n:
            ax.plot(
                np.asarray(cens_n) * jit, [t1 * 1.04] * len(cens_n), "^", color=c, ms=4, mfc="none"
            )
        if over_n:
            ax.plot(np.asarray(over_n) * jit, [t1 * 1.04] * len(over_n), "x", color=c, ms=4)
        big = rows[-1]
        # a save no seed reached is NaN, "nan" in the sidecar: back to a float
        share = np.asarray(big["share_median_over_seeds"], dtype=float)
        ax2.plot(data["ts"], share, color=c, lw=1, label=kern)
    ax.axhline(t1, color="0.6", lw=0.6)
    ax.text(
        ns[0],
        t1 * 1.09,
        r"$\triangle$ no leader by $t_1$ (median over seeds); "
        r"$\times$ overflow first",
        fontsize=5.5,
        va="bottom",
    )
    if qk_limit is not None:
        ax.text(
            ns[-1],
            0.2,
            rf"qknorm: no leader possible for $n > 1+e^{{2\beta p}}$ = "
            rf"{qk_limit:.3g} (the lemma)",
            fontsize=5.5,
            ha="right",
            color=COLORS["qknorm"],
        )
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.1, t1 * 1.25)
    ax.set_xlabel("$n$ (tokens)")
    ax.set_ylabel("first time a token holds $>1/2$ of a row")
    ax.set_title("(a) time to a leader (median, min-max over seeds)")  # legend: in (b)
    ax2.axhline(0.5, color="0.6", lw=0.6)
    ax2.set_xlabel("$t$ (layers of $dt$ = 0.05)")
    ax2.set_ylabel(r"$\max_i \max_j P_{ij}/\sum_j P_{ij}$")
    ax2.set_title(f"(b) n = {int(ns[-1])}: largest share over rows (median over seeds)")
    ax2.legend(fontsize=5.5, loc="center left", bbox_to_anchor=(1.02, 0.5))  # (a)'s too
    for a in (ax, ax2):
        a.grid(alpha=0.25, lw=0.4)
        a.tick_params(labelsize=6)
    fig.suptitle(
        r"Particle system $\dot x_i=\sum_j P_{ij}x_j$ ($Q=K=V=I$, $d=2$, "
        r"tokens uniform in $[-1,1]^2$, original frame, Euler $dt=0.05$)",
        fontsize=7,
    )
    fig.tight_layout()
    return fig


def _plot_sink(data: dict) -> Figure:
    import matplotlib.pyplot as plt

    ns = np.asarray(data["ns"], float)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(7.0, 2.8))
    scales = sorted({c["sink_scale"] for c in data["cases"]})
    shades = {s: 0.35 + 0.65 * i / max(1, len(scales) - 1) for i, s in enumerate(scales)}
    base_beta = data["cases"][0]["beta"]
    for case in data["cases"]:
        kern, c = case["kernel"], case["sink_scale"]
        if kern == "softmax":
            style = dict(color=COLORS["softmax"], alpha=shades[c], ls="-", marker="o")
            label = f"softmax, sink $c$ = {c:g}"
        elif case["beta"] == base_beta:
            style = dict(color=COLORS["qknorm"], alpha=shades[c], ls="--", marker="s")
            label = f"qknorm, $c$ = {c:g}"
        else:
            style = dict(color="k", ls=":", marker="^")
            label = (
                rf"qknorm, $c$ = {c:g}, gain {case['beta'] / base_beta:g}: "
                rf"$\beta$ = {case['beta']:.3g}"
            )
        ax.plot(ns, case["sink_mass"], ms=2.5, lw=1, label=label, **style)
        ax2.plot(ns, case["entropy_normalized"], ms=2.5, lw=1, **style)
    ax.plot(ns, 1 / ns, color="0.6", lw=0.8, label="$1/n$ (uniform)")
    ax.set_yscale("log")
    ax.set_ylabel("sink mass (mean over 256 queries of $P_{i0}$)")
    ax.set_title("(a) attention on the sink token")
    ax2.set_ylabel(r"mean entropy / $\log n$")
    ax2.set_title("(b) normalised entropy")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("$n$ (tokens)")
        a.grid(alpha=0.25, lw=0.4)
        a.tick_params(labelsize=6)
    fig.suptitle(
        r"A sink token $x_0=c\,u$ among $x_j=u+r_j$ ($|r_j|\leq 1$, $d=8$, "
        r"$Q=K=I$, $\beta=1/\sqrt{8}$): qknorm removes the sink's norm",
        fontsize=7,
    )
    fig.tight_layout()
    handles, labels = ax.get_legend_handles_labels()  # below both: the curves fill (a)
    fig.legend(handles, labels, fontsize=5.5, ncol=4, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    return fig


def _summary(f1: dict, f2: dict, f3: dict) -> dict:
    s = {"max_at_n": {}, "leader_time_median": {}, "sink_mass": {}}
    for kern, r in f1["kernels"].items():
        s["max_at_n"][kern] = {
            str(f1["ns"][0]): r["max"][0],
            str(f1["ns"][-1]): r["max"][-1],
            "bound_tight_last": r["bound_tight"][-1],
        }
    for kern, rows in f2["kernels"].items():
        med = {}
        for row in rows:  # no leader by t1 counts as +inf; None: censored median
            m = float(np.median([np.inf if v is None else v for v in row["times"]]))
            med[str(row["n"])] = m if np.isfinite(m) else None
        s["leader_time_median"][kern] = med
    for case in f3["cases"]:
        key = f"{case['kernel']} c={case['sink_scale']:g} beta={case['beta']:.4g}"
        s["sink_mass"][key] = {
            str(f3["ns"][0]): case["sink_mass"][0],
            str(f3["ns"][-1]): case["sink_mass"][-1],
        }
    return s


def compute(quick: bool) -> F.Data:
    """The three experiments and their summary (figure 2's data gets the qknorm limit)."""
    H.setup()
    from attnflow._meta import run_metadata

    t0 = time.perf_counter()
    cfg = _config(quick)
    seconds = {}
    f1 = _max_vs_n(cfg["max"])
    seconds["max"] = time.perf_counter() - t0
    f2 = _leaders(cfg["leaders"])
    seconds["leaders"] = time.perf_counter() - t0 - seconds["max"]
    f3 = _sink(cfg["sink"])
    seconds["sink"] = time.perf_counter() - t0 - seconds["max"] - seconds["leaders"]
    lc = cfg["leaders"]
    # share > 1/2 needs 1/(1 + (n-1) e^{-delta}) > 1/2 with delta <= 2 beta p (p = d here)
    f2["qknorm_no_leader_above_n"] = 1 + math.exp(2 * lc["beta"] * lc["d"])
    summary = _summary(f1, f2, f3)
    sidecar = dict(
        script="attnflow.experiments.fig_dispersion",
        quick=bool(quick),
        x64=run_metadata()["x64"],
        seeds=[cfg["max"]["seed"], cfg["sink"]["seed"]]
        + [100 + s for s in range(cfg["leaders"]["seeds"])],
        seeds_note="numpy default_rng(seed): the max study (parameters.max.seed), the sink "
        "study (parameters.sink.seed) and each of the leaders study's starts (100 + seed)",
        parameters=cfg,
        versions=run_metadata(),
        summary=summary,
        results=dict(max=f1, leaders=f2, sink=f3),
        figures=[],
        seconds=dict(seconds, total=time.perf_counter() - t0),
    )
    return F.Data(sidecar=sidecar, result={"summary": summary})


def draw(data: F.Data) -> dict[str, Figure]:
    """The three figures from the sidecar's results (matplotlib only)."""
    res, t1 = data.sidecar["results"], data.sidecar["parameters"]["leaders"]["t1"]
    f2 = res["leaders"]
    return {
        f"{NAME}_max": _plot_max(res["max"]),
        f"{NAME}_leaders": _plot_leaders(f2, t1, f2["qknorm_no_leader_above_n"]),
        f"{NAME}_sink": _plot_sink(res["sink"]),
    }


make = F.figure(NAME, compute, draw, rc=H.small_text(7), tight=True, compact=False)


if __name__ == "__main__":
    H.main(make, __doc__, report=lambda res: print(json.dumps(res["summary"], indent=1)))
