"""Several heads: does the summed V, the dominant head, or neither predict the limit?

(a) Random heads. No theorem covers ``dx_i/dt = sum_h sum_j P^h_ij V_h x_j``. Two
candidate predictions: the spectral structure of the summed ``W = sum_h V_h`` (its label
from the structure alone: V = cI -> polytope, a simple real positive dominant eigenvalue
-> hyperplanes, paranormal -> subspace, V = -cI -> origin, else unclassified; there is no
single Q^T K to test), and ``predict_regime`` of the dominant head alone (the head whose
V_h has the largest spectral radius; its own Q_h, K_h). Each is tested by
``observe_limit`` on the same tokens in its own rescaled frame (``MultiHeadAttention(...,
W=sum V)`` and ``W = V_dom``): the observation tests the conclusion matching W's
structure. Families (d = 3, h = 2 or 3 heads alternately, seeds from
``attnflow.sweep.rng``):

  scalar   V_h = c_h I, c_h ~ U(0.5, 2), Q_h^T K_h symmetric positive definite
  perron   V_h entrywise |N(0, 1)| / d (Perron: a simple real positive leading
           eigenvalue for every head and for the sum, with different phi_1),
           Q_h, K_h = I + 0.3 N(0, 1)
  ginibre  V_h = N(0, 1) / sqrt(d), Q_h, K_h = I + 0.5 N(0, 1)
  opposed  head 0 as in perron, the others minus a perron matrix times U(0.5, 1.5)

Every V_h is divided by the spectral radius of the sum (so that ``|lambda_1(sum V)| = 1``);
16 tokens uniform in [-5, 5]^3, the discrete transformer (dt = 0.1) to T = 12 (120
layers). Agreement is counted among the runs whose observation converged.

Run:  python -m attnflow.experiments.fig_multihead [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the sidecar's rows and records); the numbers
are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _layers as L
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_multihead"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 6, "full": 29}
SEED, D, N, DT, T = 0, 3, 16, 0.1, 12.0
FAMILIES = ("scalar", "perron", "ginibre", "opposed")
STREAM = 152


def structure_label(V: Any) -> str:
    """The label implied by V's spectral structure alone (no Q, K hypothesis)."""
    import attnflow as af

    kind = af.spectral_structure(np.asarray(V, np.float64)).kind
    return {
        "scalar-positive": "polytope",
        "simple": "hyperplanes",
        "paranormal": "subspace",
        "scalar-negative": "origin",
    }.get(kind, "unclassified")


def draw_heads(family: str, h: int, g: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``(Q, K, V)`` stacks ``(h, d, d)`` of ``family`` (see the module doc)."""
    from attnflow.experiments.agreement_study import _qk_with, _spd

    Q, K, V = (np.zeros((h, D, D)) for _ in range(3))
    for i in range(h):
        if family == "scalar":
            Q[i], K[i] = _qk_with(g, D, _spd(g, D))
            V[i] = g.uniform(0.5, 2.0) * np.eye(D)
            continue
        noise = 0.3 if family in ("perron", "opposed") else 0.5
        Q[i] = np.eye(D) + noise * g.standard_normal((D, D))
        K[i] = np.eye(D) + noise * g.standard_normal((D, D))
        if family == "ginibre":
            V[i] = g.standard_normal((D, D)) / np.sqrt(D)
        else:
            P = np.abs(g.standard_normal((D, D))) / D
            V[i] = P if (family == "perron" or i == 0) else -g.uniform(0.5, 1.5) * P
    rho = float(np.abs(np.linalg.eigvals(V.sum(axis=0))).max())
    return Q, K, V / max(rho, 1e-12)


def levels_test(z: np.ndarray, left: np.ndarray, ts: np.ndarray, tol: float = 1e-2) -> str:
    """The hyperplane conclusion for the functional ``left`` on saves ``z`` (as
    ``observe_limit`` tests it for a simple lambda_1): "not-converged" if the levels
    ``left . z_i`` still move (relative rate above 1e-3 between the last two saves), else
    "hyperplanes" when they take at most three values (single linkage at ``tol`` of the
    largest) each within ``tol`` of {min, 0, max}, else "unclassified"."""
    from attnflow.analysis.observe import clusters

    lv = z[-2:] @ left
    scale = max(float(np.abs(lv).max()), 1e-300)
    if np.abs(lv[1] - lv[0]).max() / scale / (ts[-1] - ts[-2]) > 1e-3:
        return "not-converged"
    _, c = clusters(lv[1][:, None], tol * scale)
    levels = c[:, 0]
    targets = np.array([lv[1].min(), 0.0, lv[1].max()])
    near = np.abs(levels[:, None] - targets[None]).min(axis=1) <= tol * scale
    return "hyperplanes" if levels.size <= 3 and near.all() else "unclassified"


def run_sample(index: int, seed: int = SEED) -> dict[str, Any]:
    """Sample ``index``: the multi-head run observed in both frames, the dominant head
    alone; labels and clusters."""
    import attnflow as af
    from attnflow.studies.sweep import rng as sample_rng

    family = FAMILIES[index % len(FAMILIES)]
    h = 2 + (index // len(FAMILIES)) % 2
    g = sample_rng(seed, STREAM, index)
    Q, K, V = draw_heads(family, h, g)
    x0 = g.uniform(-5, 5, (N, D))
    Vsum = V.sum(axis=0)
    dom = int(np.argmax([np.abs(np.linalg.eigvals(v)).max() for v in V]))
    head = af.Attention(Q[dom], K[dom], V[dom])
    ts = np.arange(int(round(T / DT)) + 1) * DT
    rec: dict[str, Any] = dict(
        family=family,
        heads=h,
        dominant=dom,
        sum_structure=structure_label(Vsum),
        dominant_predicted=str(af.predict_regime(head).label),
        sum_eigenvalues=np.linalg.eigvals(Vsum),
        dominant_eigenvalues=np.linalg.eigvals(V[dom]),
    )
    for key, model, W in (
        ("sum", af.MultiHeadAttention(Q, K, V), Vsum),
        ("dom_frame", af.MultiHeadAttention(Q, K, V, W=V[dom]), V[dom]),
        ("head_alone", head, V[dom]),
    ):
        negative = structure_label(W) == "origin"
        traj = af.simulate(
            model,
            x0,
            T,
            ts=ts,
            frame="original" if negative else "rescaled",
            method="euler",
            dt=DT,
        )
        rec[f"{key}_status"] = traj.status
        if key == "sum":
            rec["x_final"] = np.asarray(traj.x)[-1]
        obs = af.observe_limit(traj) if traj.status == "ok" else None
        rec[f"{key}_observed"] = None if obs is None else str(obs.label)
        rec[f"{key}_clusters"] = None if obs is None else obs.n_clusters
        if obs is not None and not negative:
            rec[f"{key}_layers_to_cluster"] = L.layers_to_cluster(np.asarray(traj.z), W, DT, ts)[
                "layers_to_cluster"
            ]
        else:
            rec[f"{key}_layers_to_cluster"] = None
        if key == "sum" and traj.status == "ok" and not negative:
            left = af.spectral_structure(V[dom]).phi1_left
            rec["dominant_levels_in_sum_frame"] = (
                None if left is None else levels_test(np.asarray(traj.z), left, ts)
            )
    rec.setdefault("dominant_levels_in_sum_frame", None)
    rec["agree_sum"] = rec["sum_observed"] == rec["sum_structure"]
    rec["agree_dominant"] = rec["dom_frame_observed"] == rec["dominant_predicted"]
    return rec


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per family: the counts of the agreement table."""

    def counts(vals):
        u, c = np.unique([str(v) for v in vals], return_counts=True)
        return {str(a): int(b) for a, b in zip(u, c)}

    rows = []
    for fam in FAMILIES:
        sel = [r for r in records if r["family"] == fam]
        if not sel:
            continue
        bad = (None, "not-converged")
        sum_conv = [r for r in sel if r["sum_observed"] not in bad]
        dom_conv = [r for r in sel if r["dom_frame_observed"] not in bad]
        rows.append(
            dict(
                family=fam,
                runs=len(sel),
                sum_structure=counts(r["sum_structure"] for r in sel),
                sum_observed=counts(r["sum_observed"] for r in sel),
                dominant_predicted=counts(r["dominant_predicted"] for r in sel),
                dominant_observed=counts(r["dom_frame_observed"] for r in sel),
                head_alone_observed=counts(r["head_alone_observed"] for r in sel),
                dominant_levels_in_sum_frame=counts(
                    r["dominant_levels_in_sum_frame"]
                    for r in sel
                    if r["dominant_predicted"] == "hyperplanes"
                ),
                sum_converged=len(sum_conv),
                agree_sum=sum(r["agree_sum"] for r in sum_conv),
                dominant_converged=len(dom_conv),
                agree_dominant=sum(r["agree_dominant"] for r in dom_conv),
                neither=sum(not r["agree_sum"] and not r["agree_dominant"] for r in sel),
            )
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The agreement table in markdown."""

    def fmt(c: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in c.items())

    header = [
        "family", "runs", "summed V: structure", "observed (W = sum V)",
        "dominant head: predicted", "observed (W = V_dom)", "sum agrees (of converged)",
        "dominant agrees (of converged)", "neither", "dominant head alone: observed",
        "dominant's hyperplanes tested on the summed frame's z",
    ]  # fmt: skip
    body = [
        [
            r["family"],
            r["runs"],
            fmt(r["sum_structure"]),
            fmt(r["sum_observed"]),
            fmt(r["dominant_predicted"]),
            fmt(r["dominant_observed"]),
            f"{r['agree_sum']} / {r['sum_converged']}",
            f"{r['agree_dominant']} / {r['dominant_converged']}",
            r["neither"],
            fmt(r["head_alone_observed"]),
            fmt(r["dominant_levels_in_sum_frame"]) or "-",
        ]
        for r in rows
    ]
    return H.markdown_table(header, body)


def _per_family(quick: bool) -> int:
    return 2 if quick else 16


def compute(quick: bool) -> F.Data:
    """The random-heads agreement study: every sample run and observed, the table."""
    H.setup()
    per = _per_family(quick)
    idx = range(per * len(FAMILIES))
    if quick:  # two families, one of each head count
        idx = [i for i in idx if FAMILIES[i % len(FAMILIES)] in ("scalar", "perron")]
    records = [run_sample(i) for i in idx]
    rows = summarise(records)
    runs = [
        dict(
            name="random heads",
            seed=SEED,
            n=N,
            d=D,
            t1=T,
            dt=DT,
            solver="euler (discrete transformer)",
            Q="random per sample",
            K="random per sample",
            V="random per sample",
            tolerances={"observe_tol": 1e-2, "move_tol": 1e-3},
            families=list(FAMILIES),
            per_family=per,
            stream_key=STREAM,
        )
    ]
    side = H.sidecar(
        script="attnflow.experiments.fig_multihead",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note="sample i draws its heads and tokens from attnflow.sweep.rng(SEED, STREAM, i)",
        theorem="none: several heads are open in [E]; both predictions are measured",
        rows=rows,
        records=records,
        table=table(rows),
        layers_definition=L.__doc__.split("Definition")[1].strip() if L.__doc__ else "",
    )
    return F.Data(sidecar=side, result={"rows": rows, "records": records})


def draw(data: F.Data) -> dict[str, Figure]:
    """(a) agreement per family, (b) layers to cluster, from the sidecar's rows and
    records (matplotlib only)."""
    import matplotlib.pyplot as plt

    rows, records = data.sidecar["rows"], data.sidecar["records"]
    fig = plt.figure(figsize=(6.5, 2.6))
    ax = fig.add_axes((0.08, 0.2, 0.55, 0.6))
    xs = np.arange(len(rows))
    w = 0.2
    for k, (key, lab) in enumerate(
        (("agree_sum", "summed V"), ("agree_dominant", "dominant head"), ("neither", "neither"))
    ):
        frac = [r[key] / r["runs"] for r in rows]
        ax.bar(xs + (k - 1) * w, frac, w, label=lab, color=f"C{k}")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r['family']}\n({r['runs']} runs)" for r in rows])
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("fraction of runs where the\nobserved limit is the predicted", labelpad=1)
    ax.legend(fontsize=6, frameon=False, loc="upper right", ncol=3)
    ax.set_title("random heads: which prediction the observed limit matches", pad=3)
    H.panel_label(ax, "a")
    ax = fig.add_axes((0.72, 0.2, 0.26, 0.6))
    lay = {"sum": [], "head_alone": []}
    for r in records:
        for k in lay:
            if r[f"{k}_layers_to_cluster"] is not None and r[f"{k}_observed"] != "not-converged":
                lay[k].append(r[f"{k}_layers_to_cluster"])
    ax.boxplot([lay["sum"] or [np.nan], lay["head_alone"] or [np.nan]])
    ax.set_xticks([1, 2])
    ax.set_xticklabels(["all heads", "dominant\nhead alone"])
    ax.set_ylabel("layers to cluster", labelpad=1)
    ax.set_title("converged runs", pad=3)
    H.panel_label(ax, "b")
    H.headline(
        fig,
        "Several random heads: the summed V against the dominant head",
        f"d = {D}, h = 2 or 3, n = {N}, x0 uniform in [-5, 5]^3, |lambda_1(sum V)| = 1, "
        f"discrete transformer dt = {DT}, T = {T:g}",
        sub_y=0.925,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)


if __name__ == "__main__":
    H.main(make, __doc__, report=lambda res: print(table(res["rows"])))
