"""Rank collapse versus clustering: pure attention against the residual transformer.

Dong, Cordonnier and Loukas (2021): pure self-attention ``X_{k+1} = P(X_k) X_k V^T`` (no
skip connection) drives the residual ``res(X) = X - 1 mean(X)^T`` to zero doubly
exponentially with depth (``log(1/r)`` grows by a factor ~3 per layer near collapse).
With the skip connection the tokens cluster instead ([E]): to a few points or
hyperplanes, and the residual stays of order one.

Set-up: n = 20 tokens uniform in [-s, s]^2, s = 1 and s = 5 (logits of order s^2),
Q = K = I, the paper's 2 x 2 value matrix V (eigenvalues 1.348, -0.068); and a layer of
3 random heads (Gaussian Q_h, K_h, V_h / sqrt(2)) on the s = 1 tokens. Pure attention:
``simulate(..., method="euler", residual=False)``, 12 layers. Residual transformer:
``method="euler"``, dt = 0.1, to T = 10 (100 layers; quick: T = 5). float64.
Measured: the relative residual ``r_k = |res(X_k)|_F / |X_k|_F`` per layer (scale free:
V rescales X); the layers until ``r < 1e-12``; the growth factor of ``log(1/r)``; for the
residual transformer, the clusters of the rescaled tokens z at the end and the layer from
which their number no longer changes.
Panels: (a) r_k against depth, both architectures; (b) ``log10 log10(1/r_k)`` for pure
attention (a straight line is a doubly exponential collapse; slope log10 3 drawn);
(c) the residual transformer's z at the end (s = 1), with the initial tokens.

Run:  python -m attnflow.experiments.fig_rank_collapse [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_rank_collapse"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 4, "full": 5}
SEED, N, DT, PURE_LAYERS = 0, 20, 0.1, 12
V_PAPER = [[0.64709742, 0.81911926], [0.61210449, 0.63263484]]
COLLAPSED = 1e-12


def relative_residual(x: np.ndarray) -> np.ndarray:
    """``|X - 1 mean(X)^T|_F / |X|_F`` for each saved state ``x`` ``(m, n, d)``."""
    res = x - x.mean(axis=1, keepdims=True)
    return np.linalg.norm(res, axis=(1, 2)) / np.linalg.norm(x, axis=(1, 2))


def growth_factor(r: np.ndarray) -> float | None:
    """Median of ``log(1/r_{k+1}) / log(1/r_k)`` over the layers where ``r_k`` lies in
    ``(1e-14, 0.5)`` and ``r_{k+1} > 1e-14`` (a doubly exponential collapse: a constant
    above 1); None when fewer than one such pair."""
    with np.errstate(divide="ignore"):
        g = -np.log(r)
    ok = (r[:-1] < 0.5) & (r[:-1] > 1e-14) & (r[1:] > 1e-14)
    if not ok.any():
        return None
    return float(np.median(g[1:][ok] / g[:-1][ok]))


def settle_layer(z: np.ndarray, tol: float = 1e-2) -> tuple[int, int]:
    """``(final cluster count, first save from which the count stays final)`` of the
    points ``z`` ``(m, n, k)`` (tokens, or their levels ``phi_1*(z)`` with ``k = 1``),
    single-linkage at ``tol * max|z_k|``."""
    from attnflow.analysis.observe import clusters

    counts = []
    for zk in z:
        scale = max(float(np.abs(zk).max()), 1e-300)
        counts.append(int(clusters(zk, tol * scale)[1].shape[0]))
    counts = np.asarray(counts)
    final = int(counts[-1])
    changed = np.flatnonzero(counts != final)
    return final, int(changed[-1] + 1) if changed.size else 0


def _t1(quick: bool) -> float:
    """The residual transformer's end time."""
    return 5.0 if quick else 10.0


def compute(quick: bool) -> F.Data:
    """Run both architectures on the same tokens; the relative residuals and clusters.

    Args:
        quick: the small version (the residual transformer to T = 5).

    Returns:
        the sidecar (every run's residuals, collapse layers, growth factor, clusters)
        and, for ``draw``, per run ``i`` (the sidecar's ``runs[i]``) ``r{i}_pure`` and
        ``r{i}_res`` (the relative residual at every layer), and for the first run (one
        head, s = 1) ``x0``, ``z_final`` and, when W's leading eigenvalue is simple,
        ``phi1_left``.
    """
    H.setup()
    import attnflow as af

    T = _t1(quick)
    V = np.asarray(V_PAPER)
    rng = np.random.default_rng(SEED)
    heads = rng.normal(size=(3, 3, 2, 2)) / np.sqrt(2.0)  # Q_h, K_h, V_h for 3 heads
    models = {
        "one head": af.Attention(np.eye(2), np.eye(2), V),
        "3 heads": af.MultiHeadAttention(heads[0], heads[1], heads[2]),
    }
    cases = [("one head", 1.0), ("one head", 5.0), ("3 heads", 1.0)]
    runs, arrays = [], {}
    for model_name, s in cases:
        model = models[model_name]
        x0 = np.random.default_rng(SEED).uniform(-s, s, (N, 2))
        name = f"{model_name}, s={s:g}"
        pure = af.simulate(
            model,
            x0,
            PURE_LAYERS * DT,
            ts=np.arange(PURE_LAYERS + 1) * DT,
            frame="original",
            method="euler",
            dt=DT,
            residual=False,
        )
        n_layers = int(round(T / DT))
        resid = af.simulate(
            model, x0, T, ts=np.arange(n_layers + 1) * DT, frame="rescaled", method="euler", dt=DT
        )
        pure.raise_for_status()
        resid.raise_for_status()
        r_pure = relative_residual(np.asarray(pure.x))
        r_res = relative_residual(np.asarray(resid.x))
        z = np.asarray(resid.z)
        # what clusters: the levels phi_1*(z) when W's leading eigenvalue is simple (the
        # hyperplane case), else the tokens themselves
        st = af.spectral_structure(np.asarray(model.propagator.V))
        left = st.phi1_left
        measured = z if left is None else z @ left[:, None]
        n_cl, settle = settle_layer(measured)
        below = np.flatnonzero(r_pure < COLLAPSED)
        obs = H.observation(resid)
        arrays[f"r{len(runs)}_pure"] = r_pure
        arrays[f"r{len(runs)}_res"] = r_res
        if not runs:  # the tokens of panel (c): one head, s = 1
            arrays.update(x0=x0, z_final=z[-1])
            if left is not None:
                arrays["phi1_left"] = np.asarray(left)
        runs.append(
            dict(
                name=name,
                model=model.describe()["family"],
                weights=model.describe(),
                seed=SEED,
                n=N,
                d=2,
                x0_half_width=s,
                dt=DT,
                pure_layers=PURE_LAYERS,
                residual_t1=T,
                predicted=af.predict_regime(model).label,
                pure_relative_residual=r_pure,
                pure_layers_to_collapse=int(below[0]) if below.size else None,
                pure_log_growth_factor=growth_factor(r_pure),
                residual_relative_residual=r_res[:: max(1, n_layers // 50)],
                residual_relative_residual_final=float(r_res[-1]),
                residual_relative_residual_min=float(r_res.min()),
                residual_clustered="tokens z" if left is None else "levels phi_1*(z)",
                residual_clusters=n_cl,
                residual_layers_to_settle=settle,
                residual_observed=obs,
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_rank_collapse",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note="numpy default_rng(SEED): the three random heads; a fresh default_rng(SEED): x0",
        theorem="[D] pure attention: res(X) -> 0 doubly exponentially in depth; "
        "[E] with the skip connection: clustering (here the hyperplane case).",
    )
    result = {
        "pure_layers_to_collapse": {r["name"]: r["pure_layers_to_collapse"] for r in runs},
        "residual_clusters": {r["name"]: r["residual_clusters"] for r in runs},
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure]:
    """The three panels, from ``compute``'s data (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    T = _t1(data.quick)
    a, runs = data.arrays, data.sidecar["runs"]
    res = {
        r["name"]: dict(r_pure=a[f"r{i}_pure"], r_res=a[f"r{i}_res"]) for i, r in enumerate(runs)
    }
    fig = plt.figure(figsize=(6.5, 2.5))
    colours = {name: f"C{i}" for i, name in enumerate(res)}
    # (a) relative residual against depth
    ax = fig.add_axes((0.065, 0.17, 0.27, 0.64))
    for name, q in res.items():
        c = colours[name]
        k = 1 + np.arange(q["r_pure"].size)
        ax.loglog(k, np.maximum(q["r_pure"], 1e-17), "-o", ms=2, color=c, lw=1, label=name)
        kr = 1 + np.arange(q["r_res"].size)
        ax.loglog(kr, q["r_res"], "--", color=c, lw=1)
    ax.set_xlim(1, max(q["r_res"].size for q in res.values()))
    ax.set_ylim(1e-17, 3)
    ax.set_xlabel("layer $k + 1$", labelpad=1)
    ax.set_ylabel(r"$|\mathrm{res}(X_k)|/|X_k|$", labelpad=1)
    ax.set_title("solid: no skip; dashed: residual", pad=3)
    ax.legend(fontsize=6, frameon=False, loc="center right")
    H.panel_label(ax, "a")
    # (b) log log (1/r) against depth, pure attention
    ax = fig.add_axes((0.415, 0.17, 0.25, 0.64))
    for name, q in res.items():
        r = q["r_pure"]
        ok = (r > 1e-15) & (r < 1)
        k = np.arange(r.size)[ok]
        ax.plot(k, np.log10(-np.log10(r[ok])), "-o", ms=2, color=colours[name], lw=1)
    r = res["one head, s=1"]["r_pure"]
    ok = np.flatnonzero((r > 1e-15) & (r < 1e-1))
    if ok.size:
        k0 = ok[0]
        kk = np.arange(k0, k0 + 4)
        ax.plot(kk, np.log10(-np.log10(r[k0])) + np.log10(3.0) * (kk - k0), "k:", lw=0.8)
        ax.text(kk[-1], np.log10(-np.log10(r[k0])) + 3 * np.log10(3.0), " slope log 3", fontsize=6)
    ax.set_xlabel("layer $k$ (no skip)", labelpad=1)
    ax.set_ylabel(r"$\log_{10}\log_{10}(|X_k|/|\mathrm{res}(X_k)|)$", labelpad=1)
    ax.set_title("doubly exponential = straight", pad=3)
    H.panel_label(ax, "b")
    # (c) the residual transformer's clusters (one head, s = 1)
    ax = fig.add_axes((0.745, 0.17, 0.24, 0.64))
    x0, z_final = a["x0"], a["z_final"]
    ax.plot(x0[:, 0], x0[:, 1], "o", ms=2.5, mfc="none", mec="0.5", mew=0.5)
    ax.plot(z_final[:, 0], z_final[:, 1], "o", ms=2.5, color="C0")
    if "phi1_left" in a:  # the hyperplanes phi_1*(z) = c through the extreme levels
        ell = a["phi1_left"]
        lev = z_final @ ell
        u = np.array([-ell[1], ell[0]]) / np.linalg.norm(ell)
        for c in (lev.min(), lev.max()):
            p0 = c * ell / (ell @ ell)
            seg = p0[None] + np.outer(np.linspace(-3, 3, 2), u)
            ax.plot(seg[:, 0], seg[:, 1], "-", color="C3", lw=0.6)
    lim = 1.2 * np.abs(z_final).max()
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xlabel("$z_1$", labelpad=1)
    ax.set_ylabel("$z_2$", labelpad=0)
    ax.set_aspect("equal", adjustable="box")
    ax.set_title(f"residual, $s=1$: $z$ at $T={T:g}$", pad=3)
    H.panel_label(ax, "c")
    one = runs[0]
    H.headline(
        fig,
        "Without the skip connection attention collapses the tokens to one point, "
        "doubly exponentially; with it they cluster",
        rf"$n = {N}$, $d = 2$, $x_0$ uniform in $[-s, s]^2$, $Q = K = I$, the paper's $V$; "
        rf"no skip: $r < 10^{{-12}}$ after {one['pure_layers_to_collapse']} layers ($s = 1$), "
        rf"never ($s = 5$); residual, $\mathrm{{d}}t = {DT}$: "
        rf"{one['residual_observed']['label']}, $r = {a['r0_res'][-1]:.2f}$ at $T = {T:g}$",
        sub_y=0.925,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
