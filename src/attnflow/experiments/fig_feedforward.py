"""Feed-forward layers added to the attention dynamics: what the tokens cluster to.

The clustering paper leaves the feed-forward transformer open (the project's references
record its form as ``dz_i/dt = W sigma(V sum_j P_ij (z_j - z_i))``; not checked against
the paper here); the authors' public repository
(borjanG/2023-transformers, every file of its history) has no feed-forward script, so
this figure is built here. The model is a residual block, ``attnflow.Block(attention,
FeedForward(W1, b1, W2, b2, activation))``, as a discrete transformer (``method="euler"``,
dt = 0.1): the attention sub-step ``y = x + dt sum_j P_ij V x_j``, then the feed-forward
sub-step ``x' = y + dt (W2 act(W1 y + b1) + b2)``. The rescaled frame is ``z = e^{-tV} x``
(for layers ``(I + dt V)^{-k} x``) with the attention's V, so the theorems' geometry is
tested on the same coordinates as without the feed-forward term.

(a-c) The paper's hyperplane set-up (n = 20 tokens uniform in [-5, 5]^2, seed 0,
Q = K = I, its 2 x 2 V, eigenvalues 1.348 and -0.068), to T = 12 (quick: 6): attention
alone, plus a ReLU feed-forward layer, plus a tanh one (the same weights: m = 8 hidden
units, W1, b1 standard normal, W2 normal / sqrt(m), b2 = 0, seed 1).
(d) A sweep over random feed-forward weights: for each of the theorem families of the
agreement study (polytope, hyperplanes, subspace, origin; ``agreement_study.draw``) and
each activation (relu, tanh) and strength eps (W2 normal * eps / sqrt(m)), random
(Q, K, V) and random (W1, b1, W2), 16 tokens uniform in [-5, 5]^d, to
V divided by ``|lambda_1|`` (so the leading eigenvalue has modulus 1; the theorems'
hypotheses are scale free), to t1 = 12 (120 layers; 60 for V = -I, original frame).

"Survives": ``observe_limit`` of the block's run returns the label that
``predict_regime`` gives for the attention alone (the same test of V's structure,
tolerance 1e-2, move_tol 1e-3), counted among the samples where the attention alone
reached its predicted label. "Not converged" is reported apart (the tested quantity still
moves at t1). Layers to cluster: ``attnflow.experiments._layers`` (the first layer from
which the single-linkage count of the levels phi_1*(z), or of z, stays final).

Run:  python -m attnflow.experiments.fig_feedforward [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved tokens and the sidecar); the
numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _layers as L
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_feedforward"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 9, "full": 86}
SEED, N, DT, M = 0, 20, 0.1, 8
FF_SEED = 1
V_PAPER = [[0.64709742, 0.81911926], [0.61210449, 0.63263484]]
ACTS = ("relu", "tanh")
FAMILIES = ("polytope", "hyperplanes", "subspace", "origin")
EPS = (0.1, 0.3, 1.0)
SWEEP_N = 16
SWEEP_TAG = 15


def ff_weights(rng: np.random.Generator, d: int, eps: float, m: int = M) -> tuple:
    """``(W1, b1, W2, b2)``: W1, b1 standard normal, W2 normal * eps / sqrt(m), b2 = 0."""
    W1 = rng.standard_normal((m, d))
    b1 = rng.standard_normal(m)
    W2 = rng.standard_normal((d, m)) * eps / np.sqrt(m)
    return W1, b1, W2, np.zeros(d)


def sample_cell(index: int) -> tuple[str, str, float]:
    """``(family, activation, eps)`` of sample ``index`` (cells cycle with the index)."""
    cells = [(f, a, e) for f in FAMILIES for a in ACTS for e in EPS]
    return cells[index % len(cells)]


def sample(index: int, seed: int = SEED) -> dict[str, Any]:
    """Sample ``index`` of the sweep: family, activation, eps, (Q, K, V), the feed-forward
    weights, x0 and t1, all from the sample's own stream (``attnflow.sweep.rng``)."""
    from attnflow.experiments.agreement_study import draw
    from attnflow.studies.sweep import rng as sample_rng

    fam, act, eps = sample_cell(index)
    g = sample_rng(seed, SWEEP_TAG, index)
    Q, K, V, scale = draw(fam, g)
    V = V / scale  # |lambda_1| = 1: one horizon (and one compiled loop) per family
    d = V.shape[0]
    W1, b1, W2, b2 = ff_weights(g, d, eps)
    x0 = g.uniform(-5, 5, (SWEEP_N, d))
    t1 = 60.0 if fam == "origin" else 12.0
    return dict(
        family=fam, activation=act, eps=eps, Q=Q, K=K, V=V, ff=(W1, b1, W2, b2), x0=x0, t1=t1
    )


def run_sample(s: dict[str, Any]) -> dict[str, Any]:
    """Attention alone and the block on the sample's tokens; what each reached."""
    import attnflow as af

    att = af.Attention(s["Q"], s["K"], s["V"])
    blk = af.Block(att, af.FeedForward(*s["ff"], activation=s["activation"]))
    pred = af.predict_regime(att)
    frame = "original" if s["family"] == "origin" else "rescaled"
    ts = np.arange(int(round(s["t1"] / DT)) + 1) * DT
    out: dict[str, Any] = {"family": s["family"], "activation": s["activation"], "eps": s["eps"]}
    out["predicted"] = str(pred.label)
    for key, model in (("attention", att), ("block", blk)):
        traj = af.simulate(model, s["x0"], s["t1"], ts=ts, frame=frame, method="euler", dt=DT)
        obs = af.observe_limit(traj) if traj.status == "ok" else None
        out[f"{key}_status"] = traj.status
        out[f"{key}_observed"] = None if obs is None else str(obs.label)
        out[f"{key}_clusters"] = None if obs is None else obs.n_clusters
        x = np.asarray(traj.x)
        out[f"{key}_direction_clusters"] = (
            int(L.cluster_counts((x[-1] / np.abs(x[-1]).max())[None])[0])
            if np.isfinite(x[-1]).all() and np.abs(x[-1]).max() > 0
            else None
        )
        if traj.status == "ok" and frame == "rescaled":
            out[f"{key}_layers_to_cluster"] = L.layers_to_cluster(
                np.asarray(traj.z), s["V"], DT, ts
            )["layers_to_cluster"]
        else:
            out[f"{key}_layers_to_cluster"] = None
    out["survives"] = out["block_observed"] == out["predicted"]
    return out


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (family, activation, eps): samples, attention alone as predicted,
    survives / not converged / other among those."""
    rows = []
    for fam in FAMILIES:
        for act in ACTS:
            for eps in EPS:
                sel = [
                    r
                    for r in records
                    if r["family"] == fam and r["activation"] == act and r["eps"] == eps
                ]
                if not sel:
                    continue
                base = [r for r in sel if r["attention_observed"] == r["predicted"]]
                surv = [r for r in base if r["survives"]]
                nc = [r for r in base if r["block_observed"] == "not-converged"]
                other: dict[str, int] = {}
                for r in base:
                    if not r["survives"] and r["block_observed"] != "not-converged":
                        lab = str(r["block_observed"] or r["block_status"])
                        other[lab] = other.get(lab, 0) + 1
                lay = [r["block_layers_to_cluster"] for r in surv]
                lay = [v for v in lay if v is not None]
                dirs = [r["block_direction_clusters"] for r in base]
                dirs = [v for v in dirs if v is not None]
                rows.append(
                    dict(
                        family=fam,
                        activation=act,
                        eps=eps,
                        samples=len(sel),
                        attention_as_predicted=len(base),
                        survives=len(surv),
                        not_converged=len(nc),
                        other=other,
                        median_layers_to_cluster=float(np.median(lay)) if lay else None,
                        median_direction_clusters=float(np.median(dirs)) if dirs else None,
                    )
                )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The sweep's rows as a markdown table."""

    def dash(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    header = [
        "family", "act", "eps", "samples", "attention as predicted", "survives",
        "not converged", "other", "median layers to cluster (survivors)",
        "median clusters of x(T)/max|x(T)|",
    ]  # fmt: skip
    body = [
        [
            r["family"],
            r["activation"],
            f"{r['eps']:g}",
            r["samples"],
            r["attention_as_predicted"],
            r["survives"],
            r["not_converged"],
            ", ".join(f"{k} {v}" for k, v in r["other"].items()) or "-",
            dash(r["median_layers_to_cluster"]),
            dash(r["median_direction_clusters"]),
        ]
        for r in rows
    ]
    return H.markdown_table(header, body)


def _t1(quick: bool) -> float:
    return 6.0 if quick else 12.0


def _per_cell(quick: bool) -> int:
    return 2 if quick else 16


def _key(name: str) -> str:
    """The array name of a panel's run: "attention", "+ relu" -> "relu"."""
    return name.removeprefix("+ ")


def compute(quick: bool) -> F.Data:
    """The three runs on the paper's set-up and the sweep."""
    H.setup()
    import attnflow as af

    T = _t1(quick)
    V = np.asarray(V_PAPER)
    x0 = np.random.default_rng(SEED).uniform(-5, 5, (N, 2))
    W1, b1, W2, b2 = ff_weights(np.random.default_rng(FF_SEED), 2, 1.0)
    att = af.Attention(np.eye(2), np.eye(2), V)
    models: dict[str, Any] = {"attention": att}
    for act in ACTS:
        models[f"+ {act}"] = af.Block(att, af.FeedForward(W1, b1, W2, b2, activation=act))
    ts = np.arange(int(round(T / DT)) + 1) * DT
    left = af.spectral_structure(V).phi1_left
    assert left is not None
    runs, arrays = [], {"x0": x0, "left": left}
    for name, model in models.items():
        traj = af.simulate(model, x0, T, ts=ts, frame="rescaled", method="euler", dt=DT)
        traj.raise_for_status()
        z, x = np.asarray(traj.z), np.asarray(traj.x)
        lay = L.layers_to_cluster(z, V, DT, ts)
        runs.append(
            dict(
                name=name,
                weights=model.describe(),
                seed=SEED,
                ff_seed=FF_SEED,
                n=N,
                d=2,
                t1=T,
                dt=DT,
                solver="euler (discrete transformer)",
                V=V,
                Q=np.eye(2),
                K=np.eye(2),
                tolerances={"observe_tol": 1e-2, "move_tol": 1e-3},
                predicted=af.predict_regime(model).label,
                observed=H.observation(traj),
                levels_final=np.sort(z[-1] @ left),
                x_final=x[-1],
                z_final=z[-1],
                growth_rate_final=float(np.log(np.abs(x[-1]).max() / np.abs(x[-2]).max()) / DT),
                normalised_token_clusters=int(
                    L.cluster_counts((x[-1] / np.abs(x[-1]).max())[None])[0]
                ),
                **lay,
            )
        )
        arrays[f"z_{_key(name)}"] = z

    # the sweep
    n_cells = len(FAMILIES) * len(ACTS) * len(EPS)
    per_cell = _per_cell(quick)
    # quick: the hyperplane family at eps = 1 only (cells 6 .. 11 hold the hyperplanes)
    keep = range(per_cell * n_cells)
    if quick:
        keep = [i for i in keep if sample_cell(i) == ("hyperplanes", sample_cell(i)[1], 1.0)]
    records = [run_sample(sample(i)) for i in keep]
    rows = summarise(records)
    side = H.sidecar(
        script="attnflow.experiments.fig_feedforward",
        quick=quick,
        runs=runs,
        seeds=[SEED, FF_SEED],
        seeds_note=(
            "the paper's set-up: x0 from numpy default_rng(SEED), the feed-forward weights "
            "from default_rng(FF_SEED); sweep sample i: "
            "attnflow.sweep.rng(SEED, SWEEP_TAG, i)"
        ),
        theorem="none: the feed-forward transformer is open in [E]; survival is measured",
        survive_definition=(
            "observe_limit(block run).label == predict_regime(attention alone).label, "
            "among the samples where observe_limit(attention alone) gave that label"
        ),
        layers_definition=L.__doc__.split("Definition")[1].strip() if L.__doc__ else "",
        sweep={
            "families": list(FAMILIES),
            "activations": list(ACTS),
            "eps": list(EPS),
            "per_cell": per_cell,
            "n": SWEEP_N,
            "hidden": M,
            "seed": SEED,
            "stream_key": SWEEP_TAG,
            "rows": rows,
            "records": records,
        },
        table=table(rows),
    )
    return F.Data(sidecar=side, arrays=arrays, result={"rows": rows})


def draw(data: F.Data) -> dict[str, Figure]:
    """Panels (a-c) from the saved tokens, (d) from the sweep's rows (matplotlib only)."""
    import matplotlib.pyplot as plt

    a, runs = data.arrays, data.sidecar["runs"]
    rows, per_cell = data.sidecar["sweep"]["rows"], data.sidecar["sweep"]["per_cell"]
    x0, left, T = a["x0"], a["left"], _t1(data.quick)
    panels = {r["name"]: a[f"z_{_key(r['name'])}"] for r in runs}
    fig = plt.figure(figsize=(6.5, 4.6))
    lim = 1.15 * max(np.abs(panels[k][-1]).max() for k in ("attention", "+ tanh"))
    for j, (name, z) in enumerate(panels.items()):
        ax = fig.add_axes((0.06 + 0.33 * j, 0.5, 0.25, 0.32))
        r = runs[j]
        zz = z[-1]
        ax.plot(x0[:, 0], x0[:, 1], "o", ms=2.5, mfc="none", mec="0.6", mew=0.5)
        for i in range(N):
            ax.plot(z[:, i, 0], z[:, i, 1], "-", lw=0.3, color=f"C{j}", alpha=0.5)
        ax.plot(zz[:, 0], zz[:, 1], "o", ms=2.5, color=f"C{j}")
        u = np.array([-left[1], left[0]]) / np.linalg.norm(left)
        for c in np.unique(np.round(r["levels_final"], 6)):
            p0 = c * left / (left @ left)
            seg = p0[None] + np.outer(np.linspace(-2 * lim, 2 * lim, 2), u)
            ax.plot(seg[:, 0], seg[:, 1], ":", color="C3", lw=0.6)
        big = np.abs(zz).max()
        L_ = lim if big <= 2 * lim else 1.15 * big
        ax.set_xlim(-L_, L_)
        ax.set_ylim(-L_, L_)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel("$z_1$", labelpad=1)
        ax.set_ylabel("$z_2$", labelpad=0)
        obs = r["observed"]
        ax.set_title(
            f"{name}: {obs['label']}"
            + (f", {obs['n_clusters']}" if obs["n_clusters"] is not None else "")
            + f"\n{r['clusters']} level cluster(s), "
            + rf"$x / \max|x|$: {r['normalised_token_clusters']}",
            pad=3,
            fontsize=6,
        )
        H.panel_label(ax, "abc"[j])
    # (d) survival in the sweep
    ax = fig.add_axes((0.08, 0.12, 0.88, 0.26))
    labels, frac, colours = [], [], []
    for r in rows:
        labels.append(f"{r['family'][:5]}\n{r['activation']}\n{r['eps']:g}")
        base = r["attention_as_predicted"]
        frac.append(r["survives"] / base if base else np.nan)
        colours.append("C1" if r["activation"] == "relu" else "C2")
    ax.bar(np.arange(len(rows)), frac, color=colours)
    ax.set_xticks(np.arange(len(rows)))
    ax.set_xticklabels(labels, fontsize=4.5)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("fraction where the\nregime survives", labelpad=1)
    ax.set_title(
        f"random feed-forward weights ({per_cell} per bar; orange ReLU, green tanh; "
        r"$\varepsilon$ = scale of $W_2$)",
        pad=3,
    )
    H.panel_label(ax, "d")
    H.headline(
        fig,
        "A bounded (tanh) feed-forward layer keeps the attention's clusters; "
        "an unbounded (ReLU) one need not",
        rf"(a-c) $n = {N}$, $d = 2$, $x_0$ uniform in $[-5, 5]^2$, $Q = K = I$, the paper's "
        rf"$V$, discrete transformer $\mathrm{{d}}t = {DT}$, $T = {T:g}$, "
        rf"$z = (I + \mathrm{{d}}t\, V)^{{-k}} x$; $m = {M}$ hidden units",
        sub_y=0.95,
        sub_size=6,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)


if __name__ == "__main__":
    H.main(make, __doc__, report=lambda res: print(table(res["rows"])))
