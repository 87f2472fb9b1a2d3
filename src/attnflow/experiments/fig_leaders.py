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

Run:  python -m attnflow.experiments.fig_leaders [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _leaders as R
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_leaders"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 13, "full": 58}
SHOWN = ("d1", "d2_identity", "d2_hyperplane")  # the cases of the heat maps and tokens
_ARRAY_KEYS = ("ts", "rank", "D", "logD", "logC", "leaders", "attends", "fit", "deep")
_ARRAY_KEYS += ("order", "heat_k", "heat_P", "z")

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
    u = R.left_eigvec(V)
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


def _fig_heatmaps(show: list[tuple[dict, dict]]) -> Figure:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(show), 5, figsize=(7.2, 1.62 * len(show) + 0.5), constrained_layout=True
    )
    axes = np.atleast_2d(axes)
    im = None
    for row, (case, c) in enumerate(show):
        order = c["order"]
        leaders = set(c["leaders"].tolist())
        lead_pos = [p for p, tok in enumerate(order) if tok in leaders]
        for col, k in enumerate(c["heat_k"]):
            ax = axes[row, col]
            im = ax.imshow(c["heat_P"][col], vmin=0, vmax=1, cmap="magma", interpolation="nearest")
            D = float(c["D"][k])
            ax.set_title(
                rf"$t={float(c['ts'][k]):.2g}$, rank {int(c['rank'][k])}"
                "\n"
                rf"$D={_fmt_sci(D)}$",
                fontsize=7,
            )
            ax.set_xticks(lead_pos)
            ax.set_xticklabels([str(order[p]) for p in lead_pos], fontsize=6, color="C3")
            ax.tick_params(axis="x", length=2, pad=1, colors="C3")
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(case["title"], fontsize=7)
    assert im is not None
    H.panel_letters(axes)  # a row per case
    cb = fig.colorbar(im, ax=axes, shrink=0.6, aspect=30, pad=0.01)
    cb.set_label(r"$P_{ij}(t)$", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    fig.suptitle(
        "Attention matrix $P(t)$ (rows: queries, columns: keys, tokens grouped by "
        "leader); leaders' columns labelled in red",
        fontsize=8,
    )
    return fig


def _fig_rank(cases: list[tuple[dict, dict]]) -> Figure:
    import matplotlib.pyplot as plt

    k = len(cases)
    fig, axes = plt.subplots(
        k, 3, figsize=(7.2, 1.45 * k + 0.7), constrained_layout=True, squeeze=False
    )
    for r, (case, c) in enumerate(cases):
        ts, fit, deep = c["ts"], c["fit"], c["deep"]
        lam = float(fit[5])
        ax = axes[r, 0]
        ax.step(ts, c["rank"], where="post", color="k", lw=1)
        ax.set_ylim(0, max(int(c["rank"].max()), 3) + 1)
        ax.set_ylabel(case["title"] + "\n" + r"rank of $P$", fontsize=7)
        ax.text(
            0.97,
            0.93,
            f"final rank {int(c['rank'][-1])}, leaders {c['leaders'].tolist()}",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=6,
        )
        ax = axes[r, 1]
        D = c["D"]
        pos = D > 0
        ax.semilogy(ts[pos], D[pos], color="k", lw=1, label="$D(t)$")
        if np.isfinite(fit[0]):
            tt = np.linspace(fit[2], ts[-1], 400)
            fitD = np.exp(-np.exp(fit[0] * tt + fit[1]))
            ok = fitD > 1e-320
            ax.semilogy(tt[ok], fitD[ok], color="C1", lw=1, ls="--", label=r"fit $\exp(-e^{rt+b})$")
        ax.set_ylim(1e-310, 3)
        ax.set_yticks([1e0, 1e-100, 1e-200, 1e-300])
        ax.set_ylabel("Boolean distance $D$", fontsize=7)
        if r == 0:
            ax.legend(fontsize=6, loc="lower left")
        ax = axes[r, 2]
        y = c["logD"]
        good = y < 0
        ax.plot(ts[good], np.log(-y[good]), color="k", lw=1, label="$D$ (from the logits)")
        yc = c["logC"]
        goodc = np.isfinite(yc) & (yc < math.log(0.5))
        ax.plot(
            ts[goodc],
            np.log(-yc[goodc]),
            color="C0",
            lw=1,
            label="mass outside the leader's cluster",
        )
        for f, ls, col in ((fit, "--", "C1"), (deep, ":", "C3")):
            if np.isfinite(f[0]):
                tt = np.array([f[2], f[3]])
                ax.plot(tt, f[0] * tt + f[1], ls=ls, color=col, lw=1.6)
        ytop = np.nanmax(np.log(-yc[goodc])) if goodc.any() else np.nanmax(np.log(-y[good]))
        ax.set_ylim(-3, 1.08 * ytop)
        ax.text(
            0.02,
            0.97,
            rf"$\lambda={lam:.4g}$;  fit: $r/\lambda={fit[0] / lam:.3f}$, "
            rf"$R^2={fit[4]:.5f}$"
            "\n"
            rf"deep: $r/\lambda={deep[0] / lam:.3f}$;  "
            rf"cluster: $r/\lambda={deep[4] / lam:.2f}$",
            transform=ax.transAxes,
            va="top",
            fontsize=6,
        )
        ax.set_ylabel(r"$\log(-\log D)$", fontsize=7)
        if r == 0:  # below the figure: the curves of this panel fill it
            fig.legend(
                *ax.get_legend_handles_labels(), fontsize=6, loc="outside lower center", ncol=2
            )
    for ax in axes[-1]:
        ax.set_xlabel("$t$", fontsize=7)
    H.panel_letters(axes)  # a row per case
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
    return fig


def _fig_tokens(show: list[tuple[dict, dict]]) -> Figure:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(show), figsize=(7.2, 2.6), constrained_layout=True)
    axes = np.atleast_1d(axes)
    for ax, (case, c) in zip(axes, show):
        z, ts = c["z"], c["ts"]  # (m, n, d), (m,)
        lead_final = c["attends"]
        leaders = c["leaders"].tolist()
        colors = {L: f"C{j}" for j, L in enumerate(leaders)}
        if z.shape[-1] == 1:
            for i in range(z.shape[1]):
                if i in leaders:
                    continue
                ax.plot(
                    ts,
                    z[:, i, 0],
                    color=colors.get(int(lead_final[i]), "0.5"),
                    lw=0.6,
                    alpha=0.7,
                )
            for L in leaders:
                ax.plot(ts, z[:, L, 0], color="k", lw=2.2)
                ax.plot(ts, z[:, L, 0], color=colors[L], lw=1.2, label=f"leader {L}")
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
            V = np.asarray(case["V"])
            lo, hi = z.reshape(-1, 2).min(0), z.reshape(-1, 2).max(0)
            pad = 0.05 * (hi - lo).max()
            ax.set_xlim(lo[0] - pad, hi[0] + pad)
            ax.set_ylim(lo[1] - pad, hi[1] + pad)
            if not np.allclose(V, np.eye(V.shape[0])):
                u = R.left_eigvec(V)
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
        ax.set_title(case["title"] + f": leaders {leaders}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    H.panel_letters(axes)
    fig.suptitle(
        "Token trajectories (rescaled frame), coloured by the leader they attend "
        "at the end; dashed: the hyperplanes "
        r"$\{\varphi_1^*(z)=\varphi_1^*(z_{\mathrm{leader}})\}$",
        fontsize=7,
    )
    return fig


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


def _fig_clusters(two: dict, rvc: dict) -> Figure:
    import matplotlib.pyplot as plt

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
        rf"(a) Two tokens, $V = \mathrm{{diag}}(1, 1/2)$: {two['observed']}, "
        f"{two['n_clusters']} cluster",
        fontsize=6.5,
    )
    ax = axes[1]
    with np.errstate(divide="ignore"):
        ax.semilogy(two["ts"], np.maximum(two["off_diagonal"], 1e-300), "-", lw=1)
    ax2 = ax.twinx()
    ax2.step(two["ts"], two["rank"], where="post", color="C2", lw=1)
    ax2.set_ylim(0, 3)
    ax2.set_ylabel("Rank of $P(t)$", fontsize=7, color="C2")
    H.part_of_panel(ax2)
    ax.set_xlabel("$t$", fontsize=7)
    ax.set_ylabel("$P_{12}(t)$", fontsize=7)
    ax.set_title(rf"(b) $P(t) \to I$: rank {two['final_rank']}, one hyperplane", fontsize=6.5)
    ax = axes[2]
    for j, (key, v) in enumerate(rvc.items()):
        pr = np.array([[p[0] if p[0] is not None else -1, p[1]] for p in v["pairs"]], float)
        jit = (j - (len(rvc) - 1) / 2) * 0.12
        ax.plot(pr[:, 1] + jit, pr[:, 0], "o", ms=3, alpha=0.6, label=f"{key} ({v['equal']})")
    lim = max([max(p[1] for p in v["pairs"]) for v in rvc.values()] + [2]) + 1
    ax.plot([0, lim], [0, lim], "k:", lw=0.7)
    ax.set_xlabel("Final rank of $P$", fontsize=7)
    ax.set_ylabel("clusters (observe_limit)", fontsize=7)
    ax.set_title("(c) random starts: clusters against rank", fontsize=6.5)
    ax.legend(fontsize=5, loc="upper left")
    for a in axes:
        a.tick_params(labelsize=6)
    return fig


def _case_arrays(res: dict) -> dict[str, np.ndarray]:
    """What draw needs of one case (system 0 of its batch), as ``KEY_what`` arrays."""
    rt, deep, traj = res["rt"], res["deep"], res["traj"]
    out: dict[str, Any] = dict(
        ts=rt.ts,
        rank=rt.rank[0],
        D=rt.boolean_distance[0],
        logD=rt.log_boolean_distance[0],
        logC=rt.log_cluster_distance[0],
        leaders=rt.leaders[0],
        attends=rt.attends_to[0, -1],
        # rate, intercept, window start, end, R^2, lambda_max; deep: the same, cluster rate
        fit=[rt.rate[0], rt.intercept[0], *rt.fit_window[0], rt.r2[0], rt.lambda_max],
        deep=[deep.rate[0], deep.intercept[0], *deep.fit_window[0], deep.cluster_rate[0]],
    )
    if res["case"]["key"] in SHOWN:
        order, ks = _order(res), _heatmap_times(rt)
        P = [np.asarray(traj.attention(k))[0][np.ix_(order, order)] for k in ks]
        out.update(order=order, heat_k=ks, heat_P=np.stack(P), z=np.asarray(traj.z)[0])
    return {f"{res['case']['key']}_{k}": np.asarray(v) for k, v in out.items()}


def compute(quick: bool) -> F.Data:
    """Run the cases and the two-token example; the fits, checks and cluster counts."""
    H.setup()
    from attnflow._meta import run_metadata

    t_start = time.perf_counter()
    cases = _cases(quick)
    solver = SOLVER_QUICK if quick else SOLVER
    results = [_run_case(c, solver) for c in cases]
    arrays = {k: v for r in results for k, v in _case_arrays(r).items()}
    two = _two_tokens(solver)
    for k in ("ts", "z", "off_diagonal", "rank"):
        arrays[f"two_{k}"] = np.asarray(two[k])
    rvc = R.rank_vs_clusters(results)
    summary = {r["case"]["key"]: R.summary(r) for r in results}
    sidecar = dict(
        script="attnflow.experiments.fig_leaders",
        quick=bool(quick),
        x64=run_metadata()["x64"],
        seeds=sorted({c["seed"] + c["d"] for c in cases}),
        seeds_note="the batch of starts of a case in d dimensions: numpy default_rng(seed + d) "
        "(cases[].x0)",
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
        figures=[],
        seconds=time.perf_counter() - t_start,
    )
    compact = {k: {kk: vv for kk, vv in v.items() if kk != "systems"} for k, v in summary.items()}
    result = {
        "summary": compact,
        "clusters_against_rank": {k: v["equal"] for k, v in rvc.items()},
    }
    return F.Data(sidecar=sidecar, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure]:
    """The four figures from ``compute``'s data (matplotlib only)."""
    a, side = data.arrays, data.sidecar
    cases = [
        (c, {k: a[f"{c['key']}_{k}"] for k in _ARRAY_KEYS if f"{c['key']}_{k}" in a})
        for c in side["cases"]
    ]
    show = [(c, arr) for c, arr in cases if c["key"] in SHOWN]
    two = dict(side["rank_is_not_clusters"])
    two.update({k: a[f"two_{k}"] for k in ("ts", "z", "off_diagonal", "rank")})
    return {
        f"{NAME}_heatmaps": _fig_heatmaps(show),
        f"{NAME}_rank": _fig_rank(cases),
        f"{NAME}_tokens": _fig_tokens(show),
        f"{NAME}_clusters": _fig_clusters(two, side["clusters_against_rank"]),
    }


make = F.figure(NAME, compute, draw, rc=H.small_text(7), compact=False)


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
