"""Causal and windowed masks on the four regimes of the clustering paper.

Under ``mask="causal"`` token 0 attends only to itself, so ``dx_0/dt = V x_0``:
``x_0(t) = e^{tV} x_0(0)`` exactly (``(I + dt V)^k x_0(0)`` for the discrete transformer),
and in the rescaled frame ``z_0`` stands still. Token 1 sees tokens 0 and 1, and so on: the
others follow token 0 or a leader of their own. ``mask=("window", w)`` lets each token see
only its ``w`` neighbours on each side.

Set-up: n = 20 tokens uniform in [-5, 5]^d (seed 0), Q = K = I, the discrete transformer
(``method="euler"``, dt = 0.1) to T = 12 (quick: 6), for the four regimes: polytope
(V = I_2), hyperplanes (the paper's 2 x 2 V), subspace (V = diag(1, 1, -1/2), d = 3;
quick: not run), origin (V = -I_2, original frame); each without a mask, causal, and
window 2. Measured at T: ``observe_limit`` (label, clusters), the layers to cluster
(``attnflow.experiments._layers``), the leaders (``argmax_j P_ij(T)`` for every token, and
how many distinct ones), the fraction of tokens in token 0's cluster (the clusters
counted by ``_layers``; for V = -I the layers until ``max_i |x_i| <= 0.2 max_i |x_i(0)|``),
and, for the causal runs, the largest deviation of
``x_0`` from ``(I + dt V)^k x_0(0)`` relative to ``|x_0|`` (and of the adaptive ODE solve's
``x_0`` from ``e^{tV} x_0(0)``, rtol 1e-10, to T = 4; not in the quick run).

Run:  python -m attnflow.experiments.fig_causal [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _layers as L
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_causal"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 8, "full": 20}
SEED, N, DT, WINDOW = 0, 20, 0.1, 2
V_PAPER = [[0.64709742, 0.81911926], [0.61210449, 0.63263484]]
REGIMES: dict[str, Any] = {
    "polytope": np.eye(2),
    "hyperplanes": np.asarray(V_PAPER),
    "subspace": np.diag([1.0, 1.0, -0.5]),
    "origin": -np.eye(2),
}
MASKS: dict[str, Any] = {
    "no mask": None,
    "causal": "causal",
    f"window {WINDOW}": ("window", WINDOW),
}


def run_case(
    regime: str, mask_name: str, T: float, ode: bool = True
) -> tuple[dict[str, Any], np.ndarray]:
    """One regime under one mask; the sidecar record and the saved states (z, or x in
    the original frame). ``ode``: also check token 0 of the adaptive ODE solve against
    ``e^{tV} x_0(0)`` (causal mask only)."""
    import attnflow as af
    from attnflow.analysis.observe import clusters

    V = REGIMES[regime]
    d = V.shape[0]
    mask = MASKS[mask_name]
    x0 = np.random.default_rng(SEED).uniform(-5, 5, (N, d))
    model = af.Attention(np.eye(d), np.eye(d), V, mask=mask)
    frame = "original" if regime == "origin" else "rescaled"
    ts = np.arange(int(round(T / DT)) + 1) * DT
    traj = af.simulate(model, x0, T, ts=ts, frame=frame, method="euler", dt=DT)
    traj.raise_for_status()
    x = np.asarray(traj.x)
    states = np.asarray(traj.z) if frame == "rescaled" else x
    P = np.asarray(traj.attention(-1))
    leaders = P.argmax(axis=1)
    pts, what = L.measured(states, V) if frame == "rescaled" else (states, "tokens x")
    last = pts[-1]
    labels, _ = clusters(last, L.TOL * max(float(np.abs(last).max()), 1e-300))
    n_cl, k = L.settle(L.cluster_counts(pts))
    layers = int(round(float(ts[k]) / DT))
    if frame == "original":
        # tokens collapsing to 0: relative cluster counts mean nothing there; the layer
        # count is the first layer with max_i |x_i| <= 0.2 max_i |x_i(0)| (observe_limit's
        # origin_tol), None if never
        radius = np.linalg.norm(x, axis=-1).max(axis=-1)
        below = np.flatnonzero(radius <= 0.2 * radius[0])
        layers = int(below[0]) if below.size else None
        n_cl = 1 if H.observation(traj)["label"] == "origin" else n_cl
    rec: dict[str, Any] = dict(
        name=f"{regime}, {mask_name}",
        regime=regime,
        mask=mask,
        seed=SEED,
        n=N,
        d=d,
        t1=T,
        dt=DT,
        frame=frame,
        solver="euler (discrete transformer)",
        Q=np.eye(d),
        K=np.eye(d),
        V=V,
        tolerances={"observe_tol": 1e-2, "move_tol": 1e-3},
        predicted=af.predict_regime(af.Attention(np.eye(d), np.eye(d), V)).label,
        observed=H.observation(traj),
        clusters=n_cl,
        clustered=what,
        layers_to_cluster=layers,
        leaders=leaders,
        distinct_leaders=int(np.unique(leaders).size),
        in_token0_cluster=float(np.mean(labels == labels[0])),
        x_final=x[-1],
    )
    if mask == "causal":
        R = np.eye(d) + DT * V
        ref = np.stack([np.linalg.matrix_power(R, j) @ x0[0] for j in range(ts.size)])
        rec["first_token_layers_error"] = float(np.abs(x[:, 0] - ref).max() / np.abs(ref).max())
        if frame == "rescaled":
            rec["first_token_z_drift"] = float(
                np.abs(states[:, 0] - x0[0]).max() / np.abs(x0[0]).max()
            )
    if mask == "causal" and ode:
        from scipy.linalg import expm

        tt = np.linspace(0, 4.0, 9)
        sol = af.simulate(model, x0, 4.0, ts=tt, frame="original", rtol=1e-10, atol=1e-12)
        exact = np.stack([expm(t * V) @ x0[0] for t in tt])
        rec["first_token_ode_error"] = float(
            np.abs(np.asarray(sol.x)[:, 0] - exact).max() / np.abs(exact).max()
        )
    return rec, states


def _t1(quick: bool) -> float:
    """The end time T of every run."""
    return 6.0 if quick else 12.0


def compute(quick: bool) -> F.Data:
    """Every regime under every mask (``run_case``).

    Args:
        quick: the small version (T = 6, polytope and hyperplanes only, no ODE check).

    Returns:
        the sidecar (one record per run) and, for ``draw``, ``r{i}_states``: the saved
        states of run ``i`` (the sidecar's ``runs[i]``), ``(saves, n, d)``.
    """
    H.setup()
    T = _t1(quick)
    regimes = ["polytope", "hyperplanes"] if quick else list(REGIMES)
    runs, arrays = [], {}
    for regime in regimes:
        for mask_name in MASKS:
            rec, st = run_case(regime, mask_name, T, ode=not quick)
            arrays[f"r{len(runs)}_states"] = st
            runs.append(rec)
    side = H.sidecar(
        script="attnflow.experiments.fig_causal",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "x0: numpy default_rng(SEED).uniform(-5, 5, (N, d)), the same tokens in every case"
        ),
        theorem="none with a mask; token 0 under a causal mask: x_0(t) = e^{tV} x_0(0)",
        layers_definition=L.__doc__.split("Definition")[1].strip() if L.__doc__ else "",
    )
    return F.Data(sidecar=side, arrays=arrays, result={"runs": runs})


def draw(data: F.Data) -> dict[str, Figure]:
    """One panel per regime (columns) and mask (rows), from ``compute``'s data
    (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    T = _t1(data.quick)
    runs = data.sidecar["runs"]
    states = {r["name"]: data.arrays[f"r{i}_states"] for i, r in enumerate(runs)}
    regimes = list(dict.fromkeys(r["regime"] for r in runs))
    fig = plt.figure(figsize=(6.5, 1.2 + 1.55 * len(MASKS)))
    nr, nc = len(MASKS), len(regimes)
    rows: list[list] = [[] for _ in MASKS]  # a panel per mask: its row of regimes
    for r, mask_name in enumerate(MASKS):
        for c, regime in enumerate(regimes):
            name = f"{regime}, {mask_name}"
            rec = next(q for q in runs if q["name"] == name)
            st = states[name]
            ax = fig.add_axes(
                (
                    0.07 + 0.94 * c / nc,
                    0.06 + (nr - 1 - r) * 0.86 / nr,
                    0.94 / nc - 0.07,
                    0.86 / nr - 0.08,
                )
            )
            rows[r].append(ax)
            ax.plot(st[0, :, 0], st[0, :, 1], "o", ms=2, mfc="none", mec="0.6", mew=0.4)
            for i in range(N):
                ax.plot(st[:, i, 0], st[:, i, 1], "-", lw=0.3, color=f"C{c}", alpha=0.5)
            ax.plot(st[-1, :, 0], st[-1, :, 1], "o", ms=2.2, color=f"C{c}")
            ax.plot(st[-1, 0, 0], st[-1, 0, 1], "*", ms=6, color="k", zorder=5)
            obs = rec["observed"]
            ax.set_title(
                f"{name}: {obs['label']}\n{rec['clusters']} cluster(s) at layer "
                f"{rec['layers_to_cluster']}, {rec['distinct_leaders']} leader(s)",
                fontsize=5.5,
                pad=2,
            )
            ax.tick_params(labelsize=5)
            if c == 0:
                ax.set_ylabel("$z_2$" if regime != "origin" else "$x_2$", labelpad=0, fontsize=6)
    H.panel_letters(rows)
    H.headline(
        fig,
        "Causal and windowed masks: token 0 (star) follows its own linear flow; "
        "the others cluster on it or on leaders of their own",
        rf"$n = {N}$, $x_0$ uniform in $[-5, 5]^d$, $Q = K = I$, discrete transformer "
        rf"$\mathrm{{d}}t = {DT}$, $T = {T:g}$; rescaled tokens $z$ (origin: $x$); grey: start",
        sub_y=0.965,
        size=7.5,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)


def table(runs: list[dict[str, Any]]) -> str:
    """The runs as a markdown table."""
    lines = [
        "| regime | mask | observed | clusters | layers to cluster | distinct leaders "
        "| in token 0's cluster |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        m = r["name"].split(", ", 1)[1]
        lines.append(
            f"| {r['regime']} | {m} | {r['observed']['label']} | {r['clusters']} | "
            f"{r['layers_to_cluster']} | {r['distinct_leaders']} | {r['in_token0_cluster']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    H.main(make, __doc__, report=lambda res: print(table(res["runs"])))
