"""Attention collapses to its leaders: P(t) becomes a Boolean low-rank matrix.

The attention matrix is computed from the simulated tokens at every saved time, so P is
fed back into the dynamics (the tokens move under P, and P is recomputed from where they
are), unlike a picture of softmax(e^{2t} <x_i(0), x_j(0)>) with frozen tokens.

Cases (Q = K = I throughout; tokens uniform in a cube; a batch of seeds per case):
  d = 1, V = 1              the proved case: rows -> e_1 or e_n, rank <= 2, leaders = extremes
  d = 2, V = I              polytope case (observed: rank = number of attended vertices)
  d = 2, V = paper-2d       hyperplane case of the paper (lambda_1 = 1.348)
  d = 3, V = I              polytope case
  d = 3, V = paper-3d-re-pos  hyperplane case (lambda_1 = 1.078, complex pair 0.099 +- 0.082i)

Figures (PNG and PDF) and a sidecar JSON with every parameter and number go to out_dir:
  fig_leaders_heatmaps.{png,pdf}   P(t) at several times, rank and distance in the titles
  fig_leaders_rank.{png,pdf}       rank, Boolean distance and log(-log D) against t, fits
  fig_leaders_tokens.{png,pdf}     token trajectories with the leaders highlighted
  fig_leaders_clusters.{png,pdf}   rank is not the number of clusters: (a, b) two tokens in
                                   d = 2 (V = diag(1, 1/2), z = (1, +-1)) on one hyperplane
                                   while P(t) -> I (rank 2); (c) cluster count (observe_limit)
                                   against the final rank over the random starts of the d = 2
                                   and d = 3 cases
  fig_leaders.json

Run:  python -m attnflow.experiments.fig_leaders [--quick] [--out figures]
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from attnflow.experiments import _plotting as H

NAME = "fig_leaders"

# Hyperplane-case value matrices of the clustering paper (also attnflow.matrices.PAPER).
V_PAPER_2D = [[0.64709742, 0.81911926], [0.61210449, 0.63263484]]
V_PAPER_3D_RE_POS = [
    [0.18608476, 0.34391026, 0.13905949],
    [0.35244288, 0.6694859, 0.39992145],
    [0.46685606, 0.17094454, 0.42092308],
]


def _cases(quick: bool) -> list[dict[str, Any]]:
    # quick: one system of 20 tokens to t1 <= 12, every Euler layer saved: the shapes of
    # the other figure scripts' runs, so `attnflow figures --quick` compiles them once
    n, batch = (20, 1) if quick else (20, 16)
    saves = 141 if quick else 561
    t_max = 12.0 if quick else math.inf

    def case(key: str, title: str, V: list[list[float]], t1: float, scale: float = 5.0):
        d = len(V)
        return {
            "key": key,
            "title": title,
            "d": d,
            "V": V,
            "n": n,
            "scale": scale,
            "t1": min(t1, t_max),
            "batch": batch,
            "saves": saves,
            "seed": 0,
            "Q": np.eye(d).tolist(),
            "K": np.eye(d).tolist(),
            "x0": f"uniform in [-{scale:g}, {scale:g}]^{d}, numpy default_rng(seed + {d})",
        }

    cases = [
        case("d1", r"$d=1$, $V=1$", [[1.0]], 14.0, scale=1.0),
        case("d2_identity", r"$d=2$, $V=I$", np.eye(2).tolist(), 14.0),
        case("d2_hyperplane", r"$d=2$, $V$ = paper-2d", V_PAPER_2D, 11.0),
        case("d3_identity", r"$d=3$, $V=I$", np.eye(3).tolist(), 14.0),
        case("d3_hyperplane", r"$d=3$, $V$ = paper-3d-re-pos", V_PAPER_3D_RE_POS, 14.0),
    ]
    return cases[:3] if quick else cases


# Solver settings: tight tolerances so that follower-leader gaps stay resolved to the end.
SOLVER = dict(method="adaptive", rtol=1e-9, atol=1e-10, frame="rescaled")
# --quick (a smoke test, seconds): the discrete transformer, Euler layers of dt = 0.1,
# which compiles much faster; its rates are log(1 + lambda dt)/dt, not lambda.
SOLVER_QUICK = dict(method="euler", dt=0.1, frame="rescaled")


class _Window(TypedDict):
    fit_max: float
    fit_min: float


# The deep window for the asymptotic slope: D <= 1e-30, logit-based values to the end.
DEEP: _Window = {"fit_max": 1e-30, "fit_min": 0.0}


def _left_eigvec(V: np.ndarray) -> np.ndarray:
    w, vl = np.linalg.eig(V.T)
    i = int(np.argmax(np.real(w)))
    v = np.real(vl[:, i])
    return v / np.linalg.norm(v)


def _run_case(case: dict, solver: dict) -> dict:
    import attnflow as af

    d, n, b = case["d"], case["n"], case["batch"]
    rng = np.random.default_rng(case["seed"] + d)
    x0 = rng.uniform(-case["scale"], case["scale"], size=(b, n, d))
    model = af.Attention(np.asarray(case["Q"]), np.asarray(case["K"]), np.asarray(case["V"]))
    t0 = time.perf_counter()
    if solver["method"] == "euler":
        ts = np.arange(int(round(case["t1"] / solver["dt"])) + 1) * solver["dt"]
        traj = af.simulate(
            model, x0, case["t1"], ts=ts, method="euler", dt=solver["dt"], frame=solver["frame"]
        )
    else:
        ts = np.linspace(0.0, case["t1"], case["saves"])
        traj = af.simulate(
            model,
            x0,
            case["t1"],
            ts=ts,
            method=solver["method"],
            rtol=solver["rtol"],
            atol=solver["atol"],
            frame=solver["frame"],
        )
    rt = af.track_rank(traj)
    deep = af.track_rank(traj, **DEEP)
    seconds = time.perf_counter() - t0
    return dict(case=case, x0=x0, traj=traj, rt=rt, deep=deep, seconds=seconds)


def _order(res: dict, i: int = 0) -> np.ndarray:
    """Token order for the heat maps: grouped by final leader, then by position."""
    x0 = res["x0"][i]
    rt = res["rt"]
    if x0.shape[1] == 1:
        return np.argsort(x0[:, 0])
    lead = rt.attends_to[i, -1]
    V = np.asarray(res["case"]["V"])
    u = _left_eigvec(V)
    proj = x0 @ u
    group_key = proj[lead]  # leaders ordered along phi_1^*
    return np.lexsort((proj, group_key))


def _heatmap_times(rt, i: int = 0) -> list[int]:
    D = rt.boolean_distance[i]
    m = len(rt.ts)
    picks = [0]
    for thr in (0.5, 1e-2, 1e-8):
        hit = np.flatnonzero(D < thr)
        if hit.size:
            picks.append(int(hit[0]))
    picks.append(m - 1)
    out = sorted(set(picks))
    while len(out) < 5:
        gaps = np.diff(out)
        j = int(np.argmax(gaps))
        out.insert(j + 1, (out[j] + out[j + 1]) // 2)
    return out[:5]


def _fmt_sci(v: float) -> str:
    if v == 0:
        return "0"
    e = int(math.floor(math.log10(abs(v))))
    mant = v / 10**e
    return rf"{mant:.1f}\times10^{{{e}}}"


def _fig_heatmaps(results, out_dir: Path, plt, quick: bool) -> list[Path]:
    show = [r for r in results if r["case"]["key"] in ("d1", "d2_identity", "d2_hyperplane")]
    fig, axes = plt.subplots(
        len(show), 5, figsize=(7.2, 1.62 * len(show) + 0.5), constrained_layout=True
    )
    axes = np.atleast_2d(axes)
    im = None
    for row, res in enumerate(show):
        rt = res["rt"]
        order = _order(res)
        leaders = set(rt.leaders[0].tolist())
        lead_pos = [p for p, tok in enumerate(order) if tok in leaders]
        for col, k in enumerate(_heatmap_times(rt)):
            ax = axes[row, col]
            P = np.asarray(res["traj"].attention(k))[0][np.ix_(order, order)]
            im = ax.imshow(P, vmin=0, vmax=1, cmap="magma", interpolation="nearest")
            D = float(rt.boolean_distance[0, k])
            ax.set_title(
                rf"$t={float(rt.ts[k]):.2g}$, rank {int(rt.rank[0, k])}"
                "\n"
                rf"$D={_fmt_sci(D)}$",
                fontsize=7,
            )
            ax.set_xticks(lead_pos)
            ax.set_xticklabels([str(order[p]) for p in lead_pos], fontsize=6, color="C3")
            ax.tick_params(axis="x", length=2, pad=1, colors="C3")
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(res["case"]["title"], fontsize=7)
    cb = fig.colorbar(im, ax=axes, shrink=0.6, aspect=30, pad=0.01)
    cb.set_label(r"$P_{ij}(t)$", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    fig.suptitle(
        "Attention matrix $P(t)$ (rows: queries, columns: keys, tokens grouped by "
        "leader); leaders' columns labelled in red",
        fontsize=8,
    )
    return H.save(fig, out_dir, f"{NAME}_heatmaps", quick=quick)


def _fig_rank(results, out_dir: Path, plt, quick: bool) -> list[Path]:
    k = len(results)
    fig, axes = plt.subplots(
        k, 3, figsize=(7.2, 1.45 * k + 0.7), constrained_layout=True, squeeze=False
    )
    for r, res in enumerate(results):
        rt, deep = res["rt"], res["deep"]
        ts = rt.ts
        lam = rt.lambda_max
        ax = axes[r, 0]
        ax.step(ts, rt.rank[0], where="post", color="k", lw=1)
        ax.set_ylim(0, max(int(rt.rank[0].max()), 3) + 1)
        ax.set_ylabel(res["case"]["title"] + "\n" + r"rank of $P$", fontsize=7)
        ax.text(
            0.97,
            0.93,
            f"final rank {int(rt.rank[0, -1])}, leaders {rt.leaders[0].tolist()}",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=6,
        )
        ax = axes[r, 1]
        D = rt.boolean_distance[0]
        pos = D > 0
        ax.semilogy(ts[pos], D[pos], color="k", lw=1, label="$D(t)$")
        if np.isfinite(rt.rate[0]):
            tt = np.linspace(rt.fit_window[0][0], ts[-1], 400)
            fitD = np.exp(-np.exp(rt.rate[0] * tt + rt.intercept[0]))
            ok = fitD > 1e-320
            ax.semilogy(tt[ok], fitD[ok], color="C1", lw=1, ls="--", label=r"fit $\exp(-e^{rt+b})$")
        ax.set_ylim(1e-310, 3)
        ax.set_yticks([1e0, 1e-100, 1e-200, 1e-300])
        ax.set_ylabel("Boolean distance $D$", fontsize=7)
        if r == 0:
            ax.legend(fontsize=6, loc="lower left")
        ax = axes[r, 2]
        y = rt.log_boolean_distance[0]
        good = y < 0
        ax.plot(ts[good], np.log(-y[good]), color="k", lw=1, label="$D$ (from the logits)")
        yc = rt.log_cluster_distance[0]
        goodc = np.isfinite(yc) & (yc < math.log(0.5))
        ax.plot(
            ts[goodc],
            np.log(-yc[goodc]),
            color="C0",
            lw=1,
            label="mass outside the leader's cluster",
        )
        for fit, ls, col in ((rt, "--", "C1"), (deep, ":", "C3")):
            if np.isfinite(fit.rate[0]):
                w = fit.fit_window[0]
                tt = np.array([w[0], w[1]])
                ax.plot(tt, fit.rate[0] * tt + fit.intercept[0], ls=ls, color=col, lw=1.6)
        ytop = np.nanmax(np.log(-yc[goodc])) if goodc.any() else np.nanmax(np.log(-y[good]))
        ax.set_ylim(-3, 1.08 * ytop)
        ax.text(
            0.02,
            0.97,
            rf"$\lambda={lam:.4g}$;  fit: $r/\lambda={rt.rate[0] / lam:.3f}$, "
            rf"$R^2={rt.r2[0]:.5f}$"
            "\n"
            rf"deep: $r/\lambda={deep.rate[0] / lam:.3f}$;  "
            rf"cluster: $r/\lambda={deep.cluster_rate[0] / lam:.2f}$",
            transform=ax.transAxes,
            va="top",
            fontsize=6,
        )
        ax.set_ylabel(r"$\log(-\log D)$", fontsize=7)
        if r == 0:
            ax.legend(fontsize=5.5, loc="center right")
    for ax in axes[-1]:
        ax.set_xlabel("$t$", fontsize=7)
    for ax in axes.ravel():
        ax.tick_params(labelsize=6)
    fig.suptitle(
        r"Rank of $P(t)$, Boolean distance $D$ (max over rows of "
        r"$1-\max_j P_{ij}$, tol $10^{-6}$) and the law $D\approx\exp(-e^{rt+b})$"
        "\n"
        r"orange: fit over the default window $10^{-305}\leq D\leq10^{-10}$; "
        r"red: deep window $D\leq10^{-30}$ (from the logits, to the end)",
        fontsize=7,
    )
    return H.save(fig, out_dir, f"{NAME}_rank", quick=quick)


def _fig_tokens(results, out_dir: Path, plt, quick: bool) -> list[Path]:
    show = [r for r in results if r["case"]["key"] in ("d1", "d2_identity", "d2_hyperplane")]
    fig, axes = plt.subplots(1, len(show), figsize=(7.2, 2.6), constrained_layout=True)
    axes = np.atleast_1d(axes)
    for ax, res in zip(axes, show):
        rt, traj = res["rt"], res["traj"]
        z = np.asarray(traj.z)[0]  # (m, n, d)
        lead_final = rt.attends_to[0, -1]
        leaders = rt.leaders[0].tolist()
        colors = {L: f"C{j}" for j, L in enumerate(leaders)}
        if z.shape[-1] == 1:
            for i in range(z.shape[1]):
                if i in leaders:
                    continue
                ax.plot(
                    rt.ts,
                    z[:, i, 0],
                    color=colors.get(int(lead_final[i]), "0.5"),
                    lw=0.6,
                    alpha=0.7,
                )
            for L in leaders:
                ax.plot(rt.ts, z[:, L, 0], color="k", lw=2.2)
                ax.plot(rt.ts, z[:, L, 0], color=colors[L], lw=1.2, label=f"leader {L}")
            ax.set_xlabel("$t$", fontsize=7)
            ax.set_ylabel("$z_i(t)$ (rescaled frame)", fontsize=7)
        else:
            for i in range(z.shape[1]):
                if i in leaders:
                    continue
                c = colors.get(int(lead_final[i]), "0.5")
                ax.plot(z[:, i, 0], z[:, i, 1], color=c, lw=0.6, alpha=0.7)
                ax.plot(z[0, i, 0], z[0, i, 1], "o", ms=1.8, color=c)
            for L in leaders:
                ax.plot(z[:, L, 0], z[:, L, 1], color="k", lw=1.6)
                ax.plot(
                    z[-1, L, 0],
                    z[-1, L, 1],
                    "*",
                    ms=9,
                    mec="k",
                    mew=0.6,
                    color=colors[L],
                    label=f"leader {L}",
                )
            V = np.asarray(res["case"]["V"])
            lo, hi = z.reshape(-1, 2).min(0), z.reshape(-1, 2).max(0)
            pad = 0.05 * (hi - lo).max()
            ax.set_xlim(lo[0] - pad, hi[0] + pad)
            ax.set_ylim(lo[1] - pad, hi[1] + pad)
            if not np.allclose(V, np.eye(V.shape[0])):
                u = _left_eigvec(V)
                lim = 2 * np.abs(z).max()
                s = np.linspace(-lim, lim, 2)
                perp = np.array([-u[1], u[0]])
                for L in leaders:
                    c0 = float(z[-1, L] @ u)
                    pts = c0 * u[None, :] + s[:, None] * perp[None, :]
                    ax.plot(pts[:, 0], pts[:, 1], ls="--", color="0.4", lw=0.7)
            ax.set_aspect("equal", adjustable="box")
            ax.set_xlabel("$z_1$", fontsize=7)
            ax.set_ylabel("$z_2$", fontsize=7)
        ax.set_title(res["case"]["title"] + f": leaders {leaders}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=5.5, loc="best")
    fig.suptitle(
        "Token trajectories (rescaled frame), coloured by the leader they attend "
        "at the end; dashed: the hyperplanes "
        r"$\{\varphi_1^*(z)=\varphi_1^*(z_{\mathrm{leader}})\}$",
        fontsize=7,
    )
    return H.save(fig, out_dir, f"{NAME}_tokens", quick=quick)


def _checks(res: dict, i: int) -> dict:
    """Independent checks of the leaders, from the tokens alone (numpy, scipy)."""
    x0 = res["x0"][i]
    z = np.asarray(res["traj"].z)[i]
    rt = res["rt"]
    leaders = set(rt.leaders[i].tolist())
    V = np.asarray(res["case"]["V"])
    out = {}
    if x0.shape[1] == 1:
        lo, hi = int(np.argmin(x0)), int(np.argmax(x0))
        x = np.asarray(res["traj"].x)[i, -1, :, 0]
        out["order_preserved"] = bool(np.all(np.diff(z[:, np.argsort(x0[:, 0]), 0], axis=1) > 0))
        out["leaders_are_extreme_tokens"] = leaders <= {lo, hi}
        out["rows_attend_by_sign"] = bool(
            np.array_equal(rt.attends_to[i, -1], np.where(x > 0, hi, lo))
        )
    elif np.allclose(V, np.eye(V.shape[0])):
        try:
            from scipy.spatial import ConvexHull

            hull = set(ConvexHull(x0).vertices.tolist())
            out["leaders_are_initial_hull_vertices"] = leaders <= hull
            out["initial_hull_vertices"] = len(hull)
        except ImportError:  # scipy is optional
            pass
    else:
        # Leaders lie on the extreme hyperplanes {phi_1^*(z) = max} and {= min} at the end.
        # (Which token of a collapsed group leads is decided by lower-order terms, so the
        # leader need not be the exact argmax of phi_1^*: followers on the same hyperplane
        # agree with it to about e^{-lambda t}.)
        u = _left_eigvec(V)
        p = z[-1] @ u
        tol = 1e-6 * (p.max() - p.min())
        on = [min(abs(p[L] - p.max()), abs(p[L] - p.min())) <= tol for L in leaders]
        out["leaders_on_extreme_hyperplanes"] = bool(all(on))
        p0 = x0 @ u
        out["leaders_were_phi1_extremes_at_start"] = leaders == {int(p0.argmin()), int(p0.argmax())}
    out["rank_equals_number_of_leaders"] = int(rt.final_rank[i]) == len(leaders)
    return out


def _summary(res: dict) -> dict:
    rt, deep, traj = res["rt"], res["deep"], res["traj"]
    lam = rt.lambda_max
    b = len(traj.statuses)
    per = []
    for i in range(b):
        per.append(
            dict(
                checks=_checks(res, i),
                status=traj.statuses[i],
                final_rank=int(rt.final_rank[i]),
                leaders=rt.leaders[i].tolist(),
                leaders_settled=bool(rt.leaders_settled[i]),
                final_boolean_distance=float(rt.boolean_distance[i][traj.reached[i]][-1]),
                final_log_boolean_distance=float(rt.log_boolean_distance[i][traj.reached[i]][-1]),
                rate=float(rt.rate[i]),
                r2=float(rt.r2[i]),
                intercept=float(rt.intercept[i]),
                rate_stderr=float(rt.rate_stderr[i]),
                fit_window=[float(v) for v in rt.fit_window[i]],
                fit_points=int(rt.fit_points[i]),
                deep_rate=float(deep.rate[i]),
                deep_r2=float(deep.r2[i]),
                deep_fit_window=[float(v) for v in deep.fit_window[i]],
                cluster_rate_deep=float(deep.cluster_rate[i]),
                cluster_r2_deep=float(deep.cluster_r2[i]),
            )
        )

    def stats(key, scale=1.0):
        v = np.array([p[key] for p in per], float) / scale
        v = v[np.isfinite(v)]
        if v.size == 0:
            return None
        return dict(mean=float(v.mean()), min=float(v.min()), max=float(v.max()), count=int(v.size))

    ranks = [p["final_rank"] for p in per]
    checks = {}
    for p in per:
        for key, v in p["checks"].items():
            if isinstance(v, bool):
                checks[key] = checks.get(key, 0) + int(v)
    return dict(
        checks_passed={k: f"{v} of {b}" for k, v in checks.items()},
        lambda_max=lam,
        seconds=res["seconds"],
        final_rank_counts={str(r): ranks.count(r) for r in sorted(set(ranks))},
        rate_over_lambda=stats("rate", lam),
        r2=stats("r2"),
        deep_rate_over_lambda=stats("deep_rate", lam),
        cluster_rate_over_lambda_deep=stats("cluster_rate_deep", lam),
        systems=per,
    )


# Rank is not the number of clusters (d = 2): both tokens keep the level z^(1) = 1 (one
# hyperplane of the hyperplane theorem, phi_1* = e_1) while each attends more and more to
# itself, P(t) -> I (rank 2). Constructed from the theorem (see docs/transformer.md).
TWO_TOKENS: dict[str, Any] = {
    "V": [[1.0, 0.0], [0.0, 0.5]],
    "x0": [[1.0, 1.0], [1.0, -1.0]],
    "t1": 6.0,
}


def _two_tokens(solver: dict) -> dict:
    import attnflow as af

    V = np.asarray(TWO_TOKENS["V"])
    t1 = TWO_TOKENS["t1"]
    model = af.Attention(np.eye(2), np.eye(2), V)
    ts = np.linspace(0.0, t1, 61)
    if solver["method"] == "euler":
        traj = af.simulate(model, TWO_TOKENS["x0"], t1, ts=ts, method="euler", dt=solver["dt"])
    else:
        traj = af.simulate(model, TWO_TOKENS["x0"], t1, ts=ts, rtol=1e-12, atol=1e-14)
    rt = af.track_rank(traj)
    obs = af.observe_limit(traj)
    off = np.array([float(np.asarray(traj.attention(k))[0, 1]) for k in range(ts.size)])
    z = np.asarray(traj.z)
    return dict(
        ts=ts,
        z=z,
        off_diagonal=off,
        rank=np.asarray(rt.rank),
        observed=obs.label,
        n_clusters=obs.n_clusters,
        final_rank=int(rt.final_rank),
        level_deviation=float(np.abs(z[:, :, 0] - 1.0).max()),
    )


def _rank_vs_clusters(results: list[dict]) -> dict:
    """Per case with d >= 2: (observe_limit's cluster count, final rank) of every system."""
    import attnflow as af

    out = {}
    for res in results:
        if res["case"]["d"] < 2:
            continue
        traj, rt = res["traj"], res["rt"]
        from attnflow.experiments import _layers as L

        pairs, settle_t = [], []
        z_all = np.asarray(traj.z)
        ts = np.asarray(traj.ts)
        for i in range(len(traj.statuses)):
            obs = af.observe_limit(traj, system=i)
            pairs.append((obs.n_clusters, int(rt.final_rank[i]), str(obs.label)))
            pts, _ = L.measured(z_all[i], np.asarray(res["case"]["V"]))
            settle_t.append(float(ts[L.settle(L.cluster_counts(pts))[1]]))
        agree = sum(c == r for c, r, _ in pairs)
        out[res["case"]["key"]] = dict(
            pairs=[list(p) for p in pairs],
            equal=f"{agree} of {len(pairs)}",
            time_to_cluster=settle_t,
            median_time_to_cluster=float(np.median(settle_t)),
            median_layers_to_cluster_at_dt_0_1=float(np.median(settle_t)) / 0.1,
        )
    return out


def _fig_clusters(two: dict, rvc: dict, out_dir: Path, plt, quick: bool) -> list[Path]:
    fig, axes = plt.subplots(1, 3, figsize=(7.2, 2.4), constrained_layout=True)
    ax = axes[0]
    z = two["z"]
    for i, c in enumerate(("C0", "C1")):
        ax.plot(z[:, i, 0], z[:, i, 1], "-", color=c, lw=1)
        ax.plot(z[-1, i, 0], z[-1, i, 1], "o", color=c, ms=4)
        ax.plot(z[0, i, 0], z[0, i, 1], "o", mfc="none", mec=c, ms=4)
    ax.axvline(1.0, color="C3", ls="--", lw=0.7)
    ax.set_xlim(0, 2)
    ax.set_ylim(-1.2, 1.2)
    ax.set_xlabel("$z_1$", fontsize=7)
    ax.set_ylabel("$z_2$", fontsize=7)
    ax.set_title(
        f"(a) two tokens, V = diag(1, 1/2): {two['observed']}, {two['n_clusters']} cluster",
        fontsize=6.5,
    )
    ax = axes[1]
    with np.errstate(divide="ignore"):
        ax.semilogy(two["ts"], np.maximum(two["off_diagonal"], 1e-300), "-", lw=1)
    ax2 = ax.twinx()
    ax2.step(two["ts"], two["rank"], where="post", color="C2", lw=1)
    ax2.set_ylim(0, 3)
    ax2.set_ylabel("rank of P(t)", fontsize=7, color="C2")
    ax.set_xlabel("$t$", fontsize=7)
    ax.set_ylabel("$P_{12}(t)$", fontsize=7)
    ax.set_title(f"(b) P(t) -> I: rank {two['final_rank']}, one hyperplane", fontsize=6.5)
    ax = axes[2]
    for j, (key, v) in enumerate(rvc.items()):
        pr = np.array([[p[0] if p[0] is not None else -1, p[1]] for p in v["pairs"]], float)
        jit = (j - (len(rvc) - 1) / 2) * 0.12
        ax.plot(pr[:, 1] + jit, pr[:, 0], "o", ms=3, alpha=0.6, label=f"{key} ({v['equal']})")
    lim = max([max(p[1] for p in v["pairs"]) for v in rvc.values()] + [2]) + 1
    ax.plot([0, lim], [0, lim], "k:", lw=0.7)
    ax.set_xlabel("final rank of P", fontsize=7)
    ax.set_ylabel("clusters (observe_limit)", fontsize=7)
    ax.set_title("(c) random starts: clusters against rank", fontsize=6.5)
    ax.legend(fontsize=5, loc="upper left")
    for a in axes:
        a.tick_params(labelsize=6)
    return H.save(fig, out_dir, f"{NAME}_clusters", quick=quick)


@H.styled(H.small_text(7))
def make(out_dir: Path, quick: bool = False) -> dict:
    """Run the cases, write the figures and ``fig_leaders.json`` into ``out_dir``.

    Args:
        out_dir: directory for the PNG/PDF files and the JSON sidecar (created).
        quick: a small version for tests, in seconds: 3 cases, 1 seed, 20 tokens to t <= 12, and
            the discrete transformer (Euler layers, dt = 0.1) instead of the adaptive
            solver (so its rates are log(1 + lambda dt)/dt).

    Returns:
        ``{"figures": [paths], "json": path, "summary": {case: numbers}}`` (the
        per-system numbers are in the JSON file).
    """
    plt = H.setup()
    from attnflow._meta import run_metadata

    t_start = time.perf_counter()
    cases = _cases(quick)
    solver = SOLVER_QUICK if quick else SOLVER
    results = [_run_case(c, solver) for c in cases]
    figures = []
    figures += _fig_heatmaps(results, out_dir, plt, quick)
    figures += _fig_rank(results, out_dir, plt, quick)
    figures += _fig_tokens(results, out_dir, plt, quick)
    two = _two_tokens(solver)
    rvc = _rank_vs_clusters(results)
    figures += _fig_clusters(two, rvc, out_dir, plt, quick)
    summary = {r["case"]["key"]: _summary(r) for r in results}
    sidecar = dict(
        script="attnflow.experiments.fig_leaders",
        quick=bool(quick),
        x64=run_metadata()["x64"],
        solver=solver,
        track_rank=dict(
            default=dict(
                tol=1e-6,
                norm="inf",
                leader_threshold=0.5,
                fit_max=1e-10,
                fit_min="1e3 * finfo(float64).tiny",
            ),
            deep=DEEP,
        ),
        heatmap_system="seed index 0 of each batch",
        cases=[dict(c, x0_values=r["x0"].tolist()) for c, r in zip(cases, results)],
        versions=run_metadata(),
        results=summary,
        rank_is_not_clusters=dict(
            TWO_TOKENS,
            observed=two["observed"],
            n_clusters=two["n_clusters"],
            final_rank=two["final_rank"],
            level_deviation=two["level_deviation"],
            off_diagonal_final=float(two["off_diagonal"][-1]),
        ),
        clusters_against_rank=rvc,
        figures=[str(p) for p in figures],
        seconds=time.perf_counter() - t_start,
    )
    jpath = H.write_json(out_dir, NAME, H.jsonable(sidecar))
    compact = {k: {kk: vv for kk, vv in v.items() if kk != "systems"} for k, v in summary.items()}
    return {
        "figures": figures,
        "json": jpath,
        "summary": compact,
        "clusters_against_rank": {k: v["equal"] for k, v in rvc.items()},
    }


def report(res: dict) -> None:
    """Print the summary of each case (standalone use)."""
    for key, s in res["summary"].items():
        r = s["rate_over_lambda"] or {}
        dd = s["deep_rate_over_lambda"] or {}
        cl = s["cluster_rate_over_lambda_deep"] or {}
        print(
            f"{key:15s} lambda={s['lambda_max']:.4g} final ranks {s['final_rank_counts']} "
            f"rate/lambda {r.get('mean', float('nan')):.3f} "
            f"[{r.get('min', float('nan')):.3f}, {r.get('max', float('nan')):.3f}] "
            f"deep {dd.get('mean', float('nan')):.3f} "
            f"[{dd.get('min', float('nan')):.3f}, {dd.get('max', float('nan')):.3f}] "
            f"cluster(deep) {cl.get('mean', float('nan')):.3f}"
        )
        print(f"{'':15s} checks {s['checks_passed']}")


if __name__ == "__main__":
    H.main(make, __doc__, report=report)
