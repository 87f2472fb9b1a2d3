"""Rank collapse by mask, with and without LayerNorm: the distance to consensus of pure
attention layers against depth.

Wu, Ajorlou, Wang, Jegelka and Jadbabaie (2024, "On the role of attention masks and
LayerNorm in transformers"): pure masked attention, ``X <- P(X) X V^T`` without the skip
connection, collapses to rank one exponentially whenever the mask's graph is
quasi-strongly connected (a token that every token reaches); local masks slow the
collapse; LayerNorm, ``X <- N(P(X) X V^T)`` (``N`` puts each token on the unit sphere),
can prevent it for suitable ``V``. Their measure, drawn here against depth:
``mu(X) = ||X - 1 xbar^T||_F`` (``analysis.consensus_distance``), as ``mu(X_k) / mu(X_0)``.

Masks, every one quasi-strongly connected (checked, ``masks.quasi_strongly_connected``):
full, causal, window ``|i - j| <= w`` for w = 1, 2, 4, sink-plus-window (1 sink, window
2) and a random graph (``masks.random_qsc_graph(n, 2 / n, seed)``, one per seed or
sentence). Each runs as ``masks.Graph`` of its keep matrix (the mask object's own
``keep``): the same weights as the object (tested), and one compiled program for all.

Weights, one model per panel row:

- random: ``Q, K, V`` with i.i.d. ``N(0, 1/d)`` entries, beta = 1; n = 32 tokens drawn
  uniformly on ``S^15`` (d = 16); 4 seeds, seed s drawing from
  ``numpy.random.default_rng(SEED + s)``: ``Q, K, V`` (one ``(3, d, d)`` normal draw
  over ``sqrt(d)``), then the tokens (an ``(n, d)`` normal draw, rows normalised).
- MiniLM heads: a figure of their own, ``fig_collapse_minilm`` (the same masks, columns,
  fits and table; it needs the optional model and skips without it), so that this
  figure is the same on every install.

Columns: without LayerNorm (``simulate(..., frame="original", residual=False)``) and with
it (``frame="sphere", residual=False``), 40 layers. A curve is the geometric mean over
seeds or heads, its band their range. Without LayerNorm ``mu`` also carries the tokens'
scale (``V``'s growth or decay over the layers); the rates are fitted where
``mu / ||X||_F > 1e-12`` (above rounding). ``rows``, ``sidecar_of`` and ``draw_rows``
are shared with ``fig_collapse_minilm``.

Table (``fig_collapse.md``): per mask and panel the fitted per-layer factor
``exp(slope of log mu)`` (geometric mean over seeds or heads) and, for reference, the
factor of ``X <- P X`` near consensus for ``V = I``: there every logit of a row is equal,
``P = D^{-1} A`` (``A`` the adjacency, ``D`` its row sums), and the distance shrinks by
``|lambda_2(D^{-1} A)|`` per layer (0 for the full mask: faster than exponential).

Run:  python -m attnflow.experiments.fig_collapse [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from jaxtyping import Bool, Float

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_collapse"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 12, "full": 4}
SEED = 0
# mu / ||X||_F below this is rounding: the rates are fitted above it
FLOOR = 1e-12
# the masks by name and saved form ("graph": a random quasi-strongly connected graph)
MASKS: tuple[tuple[str, Any], ...] = (
    ("full", None),
    ("causal", ["causal"]),
    ("window 1", ["window", 1]),
    ("window 2", ["window", 2]),
    ("window 4", ["window", 4]),
    ("sink + window 2", ["sinkwindow", 1, 2]),
    ("random graph", "graph"),
)
PANELS = (("noln", "without LayerNorm"), ("ln", "with LayerNorm"))


def _size(quick: bool) -> dict[str, Any]:
    if quick:
        return dict(n=16, d=8, seeds=2, layers=20, heads={0: (0,), 5: (0,)}, sentences=1)
    return dict(
        n=32, d=16, seeds=4, layers=40, heads={0: (0, 3, 6, 9), 5: (0, 3, 6, 9)}, sentences=4
    )


def graph_p(n: int) -> float:
    """The edge probability of the random graphs on ``n`` tokens: two extra keys a row."""
    return 2.0 / n


def adjacencies(n: int, seed: int) -> Bool[np.ndarray, "masks n n"]:
    """The keep matrix of every mask of ``MASKS`` on ``n`` tokens, in order (the random
    graph from ``random_qsc_graph(n, graph_p(n), seed)``)."""
    import jax.numpy as jnp

    from attnflow.masks import check_mask, mask_keep, random_qsc_graph

    idx = jnp.arange(n)
    out = []
    for _, form in MASKS:
        if form == "graph":
            out.append(random_qsc_graph(n, graph_p(n), seed))
        else:
            keep = mask_keep(check_mask(form), idx, idx)
            out.append(np.ones((n, n), bool) if keep is None else np.asarray(keep))
    return np.stack(out)


def consensus_factor(adjacency: Bool[np.ndarray, "n n"]) -> float:
    """``|lambda_2(D^{-1} A)|``: the per-layer factor of ``X <- P X`` near consensus for
    ``V = I``, where every kept logit of a row is equal and ``P = D^{-1} A``."""
    A = np.asarray(adjacency, np.float64)
    ev = np.sort(np.abs(np.linalg.eigvals(A / A.sum(1, keepdims=True))))[::-1]
    return float(ev[1]) if ev.size > 1 else 0.0


def fit_factor(mu: Float[np.ndarray, " m"], rel: Float[np.ndarray, " m"]) -> tuple[float, int]:
    """``(exp(slope), K)``: the least-squares slope of ``log mu`` over layers ``0 .. K``,
    ``K`` the last layer before ``rel = mu / ||X||_F`` first falls below ``FLOOR`` (at
    least 1)."""
    below = np.flatnonzero(~(rel > FLOOR))
    last = int(below[0]) - 1 if below.size else mu.size - 1
    last = max(last, 1)
    k = np.arange(last + 1)
    y = np.log(np.maximum(mu[: last + 1], 1e-300))
    return float(math.exp(np.polyfit(k, y, 1)[0])), last


def _curves(af, model, x0: np.ndarray, adj: np.ndarray, layers: int) -> dict[str, Any]:
    """``mu(X_k)/mu(X_0)`` and ``mu(X_k)/||X_k||_F`` of ``model`` under each mask of
    ``adj``, without and with LayerNorm; the model's mask swapped by ``eqx.tree_at``."""
    import equinox as eqx

    from attnflow.analysis import consensus_distance
    from attnflow.masks import Graph

    out: dict[str, Any] = {}
    ts = np.arange(layers + 1.0)
    for key, frame in (("noln", "original"), ("ln", "sphere")):
        ratio, rel, status, scale = [], [], [], []
        for a in adj:
            m = eqx.tree_at(lambda mm: mm.mask, model, Graph(a))
            tr = af.simulate(
                m, x0, float(layers), method="euler", dt=1.0, frame=frame, residual=False, ts=ts
            )
            x = np.asarray(tr.x, np.float64)
            mu = consensus_distance(x)
            norm = np.linalg.norm(x, axis=(1, 2))
            ratio.append(mu / mu[0])
            rel.append(mu / norm)
            status.append(tr.status)
            scale.append(float(norm[-1] / norm[0]))
        out[key] = dict(ratio=np.array(ratio), rel=np.array(rel), status=status, scale=scale)
    return out


def _random(af, size: dict) -> dict[str, Any]:
    n, d, seeds, layers = size["n"], size["d"], size["seeds"], size["layers"]
    runs = []
    for s in range(seeds):
        rng = np.random.default_rng(SEED + s)
        Q, K, V = rng.normal(size=(3, d, d)) / math.sqrt(d)
        x0 = rng.normal(size=(n, d))
        x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
        adj = adjacencies(n, SEED + s)
        model = af.Attention(Q, K, V, beta=1.0, mask=af.masks.Graph(adj[0]), propagator="expm")
        runs.append((adj, _curves(af, model, x0, adj, layers)))
    return _gather(runs, [f"seed {SEED + s}" for s in range(seeds)])


def _gather(runs: list, labels: list[str]) -> dict[str, Any]:
    """Stack the runs ``(adjacency, curves)`` into ``(masks, runs, layers + 1)`` arrays,
    with the fitted factors."""
    out: dict[str, Any] = dict(labels=labels, adjacency=np.stack([a for a, _ in runs]))
    for key, _ in PANELS:
        ratio = np.stack([c[key]["ratio"] for _, c in runs], axis=1)
        rel = np.stack([c[key]["rel"] for _, c in runs], axis=1)
        fits = [
            [fit_factor(ratio[i, j], rel[i, j]) for j in range(len(runs))]
            for i in range(len(MASKS))
        ]
        out[key] = dict(
            ratio=ratio,
            rel=rel,
            factor=[[f for f, _ in row] for row in fits],
            fitted_layers=[[k for _, k in row] for row in fits],
            factor_mean=[float(math.exp(np.mean(np.log([f for f, _ in row])))) for row in fits],
            status=[[c[key]["status"][i] for _, c in runs] for i in range(len(MASKS))],
            final_norm_ratio=[[c[key]["scale"][i] for _, c in runs] for i in range(len(MASKS))],
            # mu / ||X||_F after the last layer: scale-free (rounding is ~1e-16)
            relative_final=rel[..., -1].tolist(),
        )
    return out


def setup_x64() -> Any:
    """The drawing style set up and x64 on; returns ``attnflow``."""
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af

    return af


def rows_of(rows: dict[str, dict[str, Any]]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, sidecar rows)`` of the gathered ``rows`` (``_gather``'s, by row name):
    the curves for ``draw``, and per row its labels, whether each graph is quasi-strongly
    connected, the fits and the ``V = I`` reference factor of every mask."""
    from attnflow.masks import quasi_strongly_connected

    arrays: dict[str, np.ndarray] = {}
    side_rows: dict[str, Any] = {}
    for row, r in rows.items():
        qsc = [[quasi_strongly_connected(a) for a in adj] for adj in r["adjacency"]]
        arrays[f"{row}_adjacency"] = r["adjacency"].astype(np.uint8)
        side_rows[row] = dict(labels=r["labels"], quasi_strongly_connected=qsc)
        for key, _ in PANELS:
            arrays[f"{row}_{key}"] = r[key]["ratio"]
            arrays[f"{row}_{key}_rel"] = r[key]["rel"]
            side_rows[row][key] = {k: v for k, v in r[key].items() if k not in ("ratio", "rel")}
        # the V = I reference factor of every mask, averaged over the row's graphs
        side_rows[row]["consensus_factor_identity_V"] = [
            float(np.mean([consensus_factor(adj[i]) for adj in r["adjacency"]]))
            for i in range(len(MASKS))
        ]
    return arrays, side_rows


def sidecar_of(
    script: str, quick: bool, size: dict[str, Any], seeds: list[int], seeds_note: str, **more: Any
) -> dict[str, Any]:
    """The sidecar fields both collapse figures share (``seeds``: every seed the figure
    used), then ``more``."""
    return H.sidecar(
        script=script,
        quick=quick,
        runs=[],
        seeds=seeds,
        seeds_note=seeds_note,
        seed=SEED,
        masks=[[name, form] for name, form in MASKS],
        graph_p="2 / n (random_qsc_graph(n, 2 / n, seed))",
        masks_run_as="masks.Graph of each mask's keep matrix",
        layers=size["layers"],
        t1=float(size["layers"]),
        solver="euler layers, dt = 1, residual=False (pure attention, no skip connection)",
        propagator="expm (unused by pure layers; skips V's eigendecomposition)",
        floor=FLOOR,
        **more,
    )


def factors(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``make``'s result: the geometric-mean factor per row, panel and mask."""
    return {
        row: {key: dict(zip([m for m, _ in MASKS], r[key]["factor_mean"])) for key, _ in PANELS}
        for row, r in rows.items()
    }


def compute(quick: bool) -> F.Data:
    """Every mask under random weights, without and with LayerNorm.

    Args:
        quick: the small version (n = 16, d = 8, 2 seeds, 20 layers).

    Returns:
        the sidecar (every parameter, the fitted factors per run, statuses) and, for
        ``draw``, the curves ``(masks, runs, layers + 1)`` per column.
    """
    af = setup_x64()
    size = _size(quick)
    rows: dict[str, dict[str, Any]] = {"random": _random(af, size)}
    arrays, side_rows = rows_of(rows)
    side = sidecar_of(
        "attnflow.experiments.fig_collapse",
        quick,
        size,
        [SEED + s for s in range(size["seeds"])],
        "seed s: Q, K, V and x0 from numpy default_rng(s), the random graph from "
        "random_qsc_graph(n, 2 / n, s)",
        random=dict(
            n=size["n"],
            d=size["d"],
            seeds=[SEED + s for s in range(size["seeds"])],
            beta=1.0,
            weights="Q, K, V = default_rng(SEED + s).normal(size=(3, d, d)) / sqrt(d)",
            tokens="then x0 = normal(size=(n, d)), rows normalised",
        ),
        minilm="MiniLM's heads: fig_collapse_minilm (with the optional model installed)",
        layernorm="N(u) = u / |u| per token: simulate(frame='sphere', residual=False)",
        no_layernorm="simulate(frame='original', residual=False)",
        rows=side_rows,
        paper=PAPER,
    )
    return F.Data(sidecar=side, arrays=arrays, result=factors(rows))


PAPER = (
    "Wu, Ajorlou, Wang, Jegelka and Jadbabaie (2024), On the role of attention "
    "masks and LayerNorm in transformers"
)
ROW_TITLES = {"random": r"random $Q, K, V \sim N(0, 1/d)$"}


def draw_rows(
    data: F.Data, name: str, titles: dict[str, str], reference: tuple[str, str]
) -> dict[str, Figure | str]:
    """The curves (rows: ``titles``' rows; columns: without and with LayerNorm) and the
    table ``NAME.md``; ``reference = (row, what)``: the row whose ``V = I`` factors the
    table's last column shows, and what the caption says of it."""
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    rows = [r for r in titles if f"{r}_ln" in a]
    fig, grid = plt.subplots(
        len(rows), 2, figsize=(7.0, 2.3 * len(rows) + 0.6), squeeze=False, layout="constrained"
    )
    names = [m for m, _ in s["masks"]]
    for i, row in enumerate(rows):
        for j, (key, label) in enumerate(PANELS):
            ax = grid[i, j]
            ratio = np.maximum(a[f"{row}_{key}"], 1e-300)
            k = np.arange(ratio.shape[-1])
            for m, mask in enumerate(names):
                logs = np.log10(ratio[m])
                ax.plot(k, 10 ** logs.mean(0), color=f"C{m}", lw=1.2, label=mask)
                ax.fill_between(
                    k, 10 ** logs.min(0), 10 ** logs.max(0), color=f"C{m}", alpha=0.12, lw=0
                )
            ax.set_yscale("log")
            low = max(float(np.min(ratio)), 1e-40)
            ax.set_ylim(low / 3, max(float(np.max(ratio)) * 3, 3.0))
            ax.set_title(f"{titles[row]}: {label}", fontsize=7)
            ax.set_xlabel("Layer $k$")
            ax.set_ylabel(r"$\mu(X_k) / \mu(X_0)$")
    # below the figure: the bands fill every panel
    fig.legend(
        *grid[0, 0].get_legend_handles_labels(), fontsize=6, ncol=4, loc="outside lower center"
    )
    H.panel_letters(grid.ravel())
    fig.suptitle("Pure attention by mask: distance to consensus against depth", fontsize=9)
    head = ["mask"] + [f"{titles[r]}, {label}" for r in rows for _, label in PANELS]
    ref_head = "V = I near consensus: abs(lambda_2(D^-1 A))"
    ref_row, ref_what = reference
    lines = [
        "Per-layer factor exp(slope of log mu), fitted over the layers where "
        f"mu / ||X||_F > {s['floor']:g}, geometric mean over seeds or heads, "
        f"{s['layers']} layers. The last column: the factor of X <- P X (V = I) near "
        f"consensus, {ref_what}.",
        "",
        "| " + " | ".join([*head, ref_head]) + " |",
        "|" + "---|" * (len(head) + 1),
    ]
    for m, mask in enumerate(names):
        cells = [mask]
        for r in rows:
            for key, _ in PANELS:
                cells.append(f"{s['rows'][r][key]['factor_mean'][m]:.3g}")
        ref = s["rows"][ref_row]["consensus_factor_identity_V"][m]
        cells.append("0" if ref < FLOOR else f"{ref:.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"mu(X_L) / ||X_L||_F after L = {s['layers']} layers, geometric mean (scale-free: "
        "without LayerNorm mu also carries the tokens' scale; rounding is ~1e-16).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for m, mask in enumerate(names):
        cells = [mask]
        for r in rows:
            for key, _ in PANELS:
                rel = np.maximum(np.asarray(s["rows"][r][key]["relative_final"][m]), 1e-300)
                cells.append(f"{10 ** np.log10(rel).mean():.2g}")
        lines.append("| " + " | ".join(cells) + " |")
    return {name: fig, name + ".md": "\n".join(lines) + "\n"}


def draw(data: F.Data) -> dict[str, Figure | str]:
    """The curves (columns: without and with LayerNorm) and the table.

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    n = data.sidecar["random"]["n"]
    what = f"for the random rows' n = {n} (the random graph averaged over seeds)"
    return draw_rows(data, NAME, ROW_TITLES, ("random", what))


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
