"""Where a trained encoder's tokens go, layer by layer, over a corpus, and where the
particle-system idealisation of each layer says they should go.

Measured, per sentence and per layer ``l = 0..L`` (``l = 0``: the embeddings, ``l``:
the output of layer ``l``; the forward pass of ``attnflow.networks.encoder``), on the
sentence's tokens ``x_1..x_n`` ([CLS] and [SEP] included):

- the pairwise cosines ``<x_i, x_j> / (|x_i| |x_j|)``, ``i < j``, as counts over ``bins``
  equal bins of ``[-1, 1]`` (``cosine_histogram``; pooled over the corpus by adding
  counts), and their mean;
- the clusters: ``attnflow.analysis.count_clusters`` of the normalised tokens at its
  documented tolerance, ``<x_i, x_j> > 0.999`` joins two tokens;
- the effective rank of the ``(n, d)`` token matrix (Roy and Vetterli 2007):
  ``exp(-sum_k p_k log p_k)`` with ``p_k = s_k / sum s`` over its singular values
  (``effective_rank``; 1 for rank one, ``min(n, d)`` for equal singular values);
- for layers ``1..L`` and every head, the distance of the attention matrix to the
  nearest Boolean row-stochastic one (``attnflow.analysis.rank.boolean_distance``,
  inf-norm, max over rows), the rank of that Boolean matrix (distinct attended
  columns), and the column sums ``sum_i P_ij`` (the attention token ``j`` receives).

Predicted from the tokens entering layer ``l`` (the measured ``x^l``):

(a) the layer as a block of attnflow's transformer dynamics, one step ``dt = 1``
    (``layer_step``): ``attnflow.MultiHeadAttention`` with the layer's heads and biases
    (tokens carry a constant coordinate 1: ``Q_h = [W_Q,h, b_Q,h]``, ``K_h = [W_K,h,
    b_K,h]``, ``V_h = [[W_O,h W_V,h, W_O,h b_V,h + [h = 0] b_O], [0, 0]]``; the rows of
    every head's attention sum to one, so this is the attention sub-layer with all its
    biases), the LayerNorm, ``attnflow.FeedForward`` with the exact GELU, the LayerNorm.
    Compared with the real ``x^{l+1}`` (``block_error``, largest entry of the difference
    over the largest entry): a consistency check, not a prediction;
(b) each head ``h`` of layer ``l`` alone as the continuous-time particle system of
    Geshkovski, Letrouit, Polyanskiy and Rigollet (2023) (biases dropped, no LayerNorm,
    no feed-forward, ``beta = 1/sqrt(d_h)``), started from ``x^l`` and run to
    ``t1 = min(20 / |lambda_1|, 80)`` (``attnflow.studies._head_flow``, exactly in the
    ``<= 4 d_h`` coordinates where the head acts). The same statistics of its tokens at
    ``t1``, in the original frame (``x``) and in the rescaled frame ``z = e^{-t1 V_h} x``
    (the theorems' frame), the final attention matrix's Boolean distance and column
    sums, and its leaders. Only the sentences listed by ``simulated_sentences`` are run.

``run_layerwise`` writes one archive per sentence (``attnflow.networks._sentence_store``:
resumable, progress with tqdm); ``load_layerwise`` reads a run back and
``LayerwiseResult.summary()`` pools it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Float

from .. import _checks
from ..io.checkpoints import HeadWeights
from ._head_flow import HeadPrediction, ReducedHead, predict_head, reduce_head
from ._layerwise_summary import LayerwiseResult

__all__ = [
    "pairwise_cosines",
    "cosine_histogram",
    "effective_rank",
    "token_geometry",
    "encoder_heads",
    "LayerModels",
    "layer_models",
    "layer_step",
    "simulated_sentences",
    "run_layerwise",
    "load_layerwise",
    "LayerwiseResult",
    "ReducedHead",
    "HeadPrediction",
    "reduce_head",
    "predict_head",
]

CLUSTER_THRESHOLD = 0.999  # attnflow.analysis.count_clusters' default


# ================================================================== statistics
def _tokens(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, np.float64)
    if a.ndim != 2 or a.shape[0] < 2 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be a finite (n, d) array with n >= 2; got shape {a.shape}.")
    if not np.all(np.linalg.norm(a, axis=1) > 0):
        raise ValueError(f"{name} has a zero token: it has no direction, so no cosine.")
    return a


def pairwise_cosines(x: Float[npt.ArrayLike, "n d"]) -> Float[np.ndarray, " m"]:
    """The cosines of the ``m = n (n - 1) / 2`` pairs ``i < j`` (row-major order),
    clipped to ``[-1, 1]`` against rounding.

    Example:
        >>> pairwise_cosines([[1.0, 0.0], [1.0, 1.0], [0.0, -2.0]]).round(4).tolist()
        [0.7071, 0.0, -0.7071]
    """
    a = _tokens("x", x)
    u = a / np.linalg.norm(a, axis=1, keepdims=True)
    i, j = np.triu_indices(a.shape[0], k=1)
    return np.clip(np.einsum("kd,kd->k", u[i], u[j]), -1.0, 1.0)


def cosine_histogram(x: Float[npt.ArrayLike, "n d"], bins: int = 40) -> np.ndarray:
    """Counts of the pairwise cosines in ``bins`` equal bins of ``[-1, 1]`` (the last
    bin holds 1): ``(bins,)`` integers summing to ``n (n - 1) / 2``.

    Example:
        >>> cosine_histogram([[1.0, 0.0], [1.0, 1.0], [0.0, -2.0]], bins=4).tolist()
        [1, 0, 1, 1]
    """
    bins = _checks.integer("bins", bins, lo=1)
    return np.histogram(pairwise_cosines(x), bins=bins, range=(-1.0, 1.0))[0].astype(np.int64)


def effective_rank(x: Float[npt.ArrayLike, "n d"]) -> float:
    """Roy and Vetterli's (2007) effective rank ``exp(-sum_k p_k log p_k)``, ``p_k =
    s_k / sum_k s_k`` over the singular values of ``x`` (terms with ``p_k = 0`` are 0).

    Example:
        >>> round(effective_rank(np.eye(3)), 6), round(effective_rank([[1.0, 2.0], [2.0, 4.0]]), 6)
        (3.0, 1.0)
    """
    a = np.asarray(x, np.float64)
    if a.ndim != 2 or a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"x must be a finite non-empty (n, d) array; got shape {a.shape}.")
    s = np.linalg.svd(a, compute_uv=False)
    if s.sum() <= 0:
        raise ValueError("x is the zero matrix: its effective rank is undefined.")
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def token_geometry(x: Float[npt.ArrayLike, "n d"], bins: int = 40) -> dict[str, Any]:
    """``{"histogram", "mean_cosine", "clusters", "effective_rank"}`` of tokens ``x``
    (module docstring; clusters at ``count_clusters``' tolerance 0.999)."""
    from ..analysis.sphere import count_clusters

    a = _tokens("x", x)
    cos = pairwise_cosines(a)
    return {
        "histogram": np.histogram(cos, bins=bins, range=(-1.0, 1.0))[0].astype(np.int64),
        "mean_cosine": float(cos.mean()),
        "clusters": int(count_clusters(a[None], CLUSTER_THRESHOLD)[0]),
        "effective_rank": effective_rank(a),
    }


# ======================================================== the encoder's layers
def encoder_heads(weights: Any) -> list[list[HeadWeights]]:
    """The heads of every layer of an ``EncoderWeights``, in the convention of
    ``attnflow.io.checkpoints`` (biases dropped): ``Q_h = W_Q[r_h]``, ``K_h = W_K[r_h]``,
    ``V_h = W_O[:, r_h] W_V[r_h]``, ``beta = 1/sqrt(d_h)``."""
    out = []
    for l, p in enumerate(weights.layers):
        d = p["q_w"].shape[0]
        dh = d // weights.num_heads
        heads = []
        for h in range(weights.num_heads):
            r = slice(h * dh, (h + 1) * dh)
            WO, WV = p["o_w"][:, r].copy(), p["v_w"][r].copy()
            heads.append(
                HeadWeights(
                    layer=l, head=h, Q=p["q_w"][r].copy(), K=p["k_w"][r].copy(), V=WO @ WV,
                    beta=1 / np.sqrt(dh), W_O_h=WO, W_V_h=WV, source=weights.source,
                )
            )  # fmt: skip
        out.append(heads)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class LayerModels:
    """One encoder layer as attnflow models (``layer_models``): ``attention`` a
    ``MultiHeadAttention`` on tokens with a constant last coordinate, ``feedforward`` a
    ``FeedForward``, the two LayerNorms ``(w, b)`` and their ``eps``."""

    layer: int
    attention: Any
    feedforward: Any
    ln1: tuple[np.ndarray, np.ndarray]
    ln2: tuple[np.ndarray, np.ndarray]
    eps: float


def layer_models(weights: Any, layer: int) -> LayerModels:
    """Layer ``layer`` of an ``EncoderWeights`` as attnflow models (module docstring, (a)).

    Raises:
        ValueError: for an activation attnflow's ``FeedForward`` lacks (the tanh GELU).
    """
    from ..dynamics.transformer import FeedForward, MultiHeadAttention

    if weights.activation not in ("gelu", "relu"):
        raise ValueError(
            f"the checkpoint's activation is {weights.activation!r}; attnflow's FeedForward "
            f"has the exact GELU and ReLU only (layer_step needs one of them)."
        )
    p = weights.layers[layer]
    d, H = p["q_w"].shape[0], weights.num_heads
    dh = d // H
    Q, K, V = np.zeros((H, dh, d + 1)), np.zeros((H, dh, d + 1)), np.zeros((H, d + 1, d + 1))
    for h in range(H):
        r = slice(h * dh, (h + 1) * dh)
        Q[h, :, :d], Q[h, :, d] = p["q_w"][r], p["q_b"][r]
        K[h, :, :d], K[h, :, d] = p["k_w"][r], p["k_b"][r]
        V[h, :d, :d] = p["o_w"][:, r] @ p["v_w"][r]
        V[h, :d, d] = p["o_w"][:, r] @ p["v_b"][r] + (p["o_b"] if h == 0 else 0.0)
    mha = MultiHeadAttention(Q, K, V, beta=1 / np.sqrt(dh), W=np.eye(d + 1))
    ff = FeedForward(p["ff1_w"], p["ff1_b"], p["ff2_w"], p["ff2_b"], activation=weights.activation)
    return LayerModels(
        layer=layer,
        attention=mha,
        feedforward=ff,
        ln1=(p["ln1_w"], p["ln1_b"]),
        ln2=(p["ln2_w"], p["ln2_b"]),
        eps=float(weights.eps),
    )


def _layernorm(u: np.ndarray, wb: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    mu = u.mean(axis=-1, keepdims=True)
    var = ((u - mu) ** 2).mean(axis=-1, keepdims=True)
    return (u - mu) / np.sqrt(var + eps) * wb[0] + wb[1]


def layer_step(models: LayerModels, x: Float[npt.ArrayLike, "n d"]) -> Float[np.ndarray, "n d"]:
    """One step ``dt = 1`` of the layer's attnflow models with the LayerNorms:
    ``y = LN1(x + A(x))``, ``x' = LN2(y + FF(y))`` (module docstring, (a))."""
    import jax.numpy as jnp

    a = np.asarray(x, np.float64)
    xa = jnp.asarray(np.concatenate([a, np.ones((a.shape[0], 1))], axis=1))
    u = np.asarray(models.attention.layer(xa, 1.0), np.float64)[:, :-1]
    y = _layernorm(u, models.ln1, models.eps)
    v = np.asarray(models.feedforward.layer(jnp.asarray(y), 1.0), np.float64)
    return _layernorm(v, models.ln2, models.eps)


# ================================================================== the study
def simulated_sentences(size: int, count: int) -> list[int]:
    """The ``count`` sentences (of ``size``) whose heads are simulated: evenly spaced over
    the corpus, ``round(linspace(0, size - 1, count))``.

    Example:
        >>> simulated_sentences(10, 4)
        [0, 3, 6, 9]
    """
    size = _checks.integer("size", size, lo=1)
    count = _checks.integer("count", count, lo=0, hi=size)
    return sorted({int(i) for i in np.rint(np.linspace(0, size - 1, count))}) if count else []


def _record(
    k: int,
    sent: dict,
    heads: list[list[ReducedHead]] | None,
    layers: list[LayerModels],
    bins: int,
    sim_kw: dict,
) -> dict[str, Any]:
    from ..analysis.rank import boolean_distance

    H_all = np.asarray(sent["hidden_states"], np.float64)  # (L + 1, n, d)
    A_all = np.asarray(sent["attentions"], np.float64)  # (L, h, n, n)
    L, nh = A_all.shape[0], A_all.shape[1]
    rec: dict[str, Any] = {"index": k, "ids": sent["ids"], "tokens": np.asarray(sent["tokens"])}
    geo = [token_geometry(H_all[l], bins) for l in range(L + 1)]
    for key in ("histogram", "mean_cosine", "clusters", "effective_rank"):
        rec[key] = np.asarray([g[key] for g in geo])
    rec["attn_boolean_distance"] = np.asarray(boolean_distance(A_all))
    rec["attn_attended"] = np.asarray(
        [[np.unique(A_all[l, h].argmax(axis=1)).size for h in range(nh)] for l in range(L)]
    )
    rec["attn_mass"] = A_all.sum(axis=2)  # (L, h, n): column sums
    err, bgeo = [], []
    for l in range(L):
        out = layer_step(layers[l], H_all[l])
        err.append(float(np.abs(out - H_all[l + 1]).max() / np.abs(H_all[l + 1]).max()))
        bgeo.append(token_geometry(out, bins))
    rec["block_error"] = np.asarray(err)
    for key in ("mean_cosine", "clusters", "effective_rank"):
        rec[f"block_{key}"] = np.asarray([g[key] for g in bgeo])
    rec["simulated"] = np.asarray(heads is not None)
    if heads is None:
        return rec
    out_keys: dict[str, list] = {}
    for l in range(L):
        for h in range(nh):
            pred = predict_head(heads[l][h], H_all[l], **sim_kw)
            for frame in ("x", "z"):
                g = token_geometry(getattr(pred, frame), bins)
                for key, v in g.items():
                    out_keys.setdefault(f"head_{frame}_{key}", []).append(v)
            for key in ("boolean_distance", "attended", "status", "method", "num_steps", "t1"):
                out_keys.setdefault(f"head_{key}", []).append(getattr(pred, key))
            out_keys.setdefault("head_mass", []).append(pred.column_mass)
    for key, vals in out_keys.items():
        a = np.asarray(vals)
        rec[key] = a.reshape((L, nh) + a.shape[1:])
    return rec


def run_layerwise(
    out_dir: str | Path,
    corpus: Any,
    *,
    checkpoint: str | Path = "minilm",
    simulate: int | None = 24,
    horizon: float = 20.0,
    t1_max: float = 80.0,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 4000,
    bins: int = 40,
    batch: int = 16,
    progress: bool = True,
) -> LayerwiseResult:
    """Measure every sentence of ``corpus`` layer by layer and run the predictions
    (module docstring); resumable: an interrupted run started again with the same
    arguments computes only the sentences not yet saved in ``out_dir``.

    Args:
        out_dir: the store's folder.
        corpus: a ``attnflow.networks.corpus.Corpus`` or a list of sentences.
        checkpoint: a BERT-layout encoder (``"minilm"`` or a path; the exact or tanh
            GELU decides whether ``layer_step`` applies: it needs the exact one or ReLU).
        simulate: how many sentences get the single-head runs (b),
            ``simulated_sentences(len(corpus), simulate)``; ``None``: all.
        horizon, t1_max, rtol, atol, max_steps: of the single-head runs (``predict_head``).
        bins: cosine-histogram bins over ``[-1, 1]``.
        batch: sentences per forward pass (padded to the longest sentence of the corpus).
        progress: a tqdm bar over the sentences.

    Returns:
        The ``LayerwiseResult`` (``load_layerwise(out_dir)``).

    Needs x64 (the caller turns it on: the library never does).

    Example:
        >>> from attnflow.networks.corpus import reference_corpus  # doctest: +SKIP
        >>> res = run_layerwise("runs/layerwise", reference_corpus(8), simulate=2)  # doctest: +SKIP
        >>> measured = res.summary()["measured"]  # doctest: +SKIP
        >>> measured.get("mean_cosine")  # one per layer 0..L  # doctest: +SKIP
    """
    from .._meta import run_metadata
    from .._parallel import blas_threads
    from ..io.checkpoints import load_tokenizer, resolve_checkpoint
    from ..io.encoder_weights import load_encoder_weights
    from ..networks._sentence_store import SentenceStore, code_hash

    sentences = list(getattr(corpus, "sentences", corpus))
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError("corpus must be a Corpus or a non-empty list of non-empty sentences.")
    bins = _checks.integer("bins", bins, lo=1)
    batch = _checks.integer("batch", batch, lo=1)
    count = len(sentences) if simulate is None else simulate
    sim = simulated_sentences(len(sentences), count)
    sim_kw = dict(
        horizon=_checks.positive("horizon", horizon),
        t1_max=_checks.positive("t1_max", t1_max),
        rtol=_checks.positive("rtol", rtol),
        atol=_checks.positive("atol", atol),
        max_steps=_checks.integer("max_steps", max_steps, lo=1),
    )
    path = resolve_checkpoint(checkpoint)
    weights = load_encoder_weights(path)
    tok = load_tokenizer(path)
    enc = tok.encode_batch(sentences)
    config = dict(
        checkpoint=str(path),
        sentences=sentences,
        corpus=corpus.describe() if hasattr(corpus, "describe") else None,
        simulated=sim,
        bins=bins,
        cluster_threshold=CLUSTER_THRESHOLD,
        code=code_hash(__name__, f"{__package__}._head_flow", "attnflow.networks.encoder"),
        **sim_kw,
    )
    store = SentenceStore(out_dir, "layerwise", config, info=run_metadata())
    # one BLAS thread: OpenBLAS's spinning threads made the small SVDs and products of
    # this loop ten times slower on a busy machine (attnflow._parallel.blas_threads)
    with store.locked(), blas_threads(1):
        todo = [k for k in range(len(sentences)) if k not in store.done()]
        _compute(store, todo, sentences, enc, weights, sim, bins, batch, sim_kw, progress)
    return load_layerwise(out_dir)


def _compute(store, todo, sentences, enc, weights, sim, bins, batch, sim_kw, progress) -> None:
    from tqdm.auto import tqdm

    from ..networks.encoder import encoder_forward

    if todo:
        layers = [layer_models(weights, l) for l in range(weights.num_layers)]
        heads = None
        if any(k in sim for k in todo):
            heads = [[reduce_head(h) for h in hs] for hs in encoder_heads(weights)]
        width = max(len(e.ids) for e in enc)
        bar = tqdm(total=len(todo), desc="layerwise", unit="sentence", disable=not progress)
        for c in range(0, len(todo), batch):
            chunk = todo[c : c + batch]
            ids = np.full((batch, width), weights.pad_token_id, np.int64)
            mask = np.zeros((batch, width), np.int64)
            for row, k in enumerate(chunk + [chunk[0]] * (batch - len(chunk))):
                n = len(enc[k].ids)
                ids[row, :n], mask[row, :n] = enc[k].ids, 1
            out = encoder_forward(weights, ids, mask)
            for row, k in enumerate(chunk):
                s = out.sentence(row)
                s["ids"], s["tokens"] = np.asarray(enc[k].ids), list(enc[k].tokens)
                rec = _record(k, s, heads if k in sim else None, layers, bins, sim_kw)
                store.write(k, rec)
                bar.update(1)
        bar.close()


def load_layerwise(out_dir: str | Path) -> LayerwiseResult:
    """A layerwise run read back from its folder (finished sentences only)."""
    from ..io.files import read_json
    from ..networks._sentence_store import SentenceStore

    meta = read_json(Path(out_dir) / "meta.json", kind="the metadata of a layerwise store")
    if meta.get("kind") != "layerwise":
        raise ValueError(f"{out_dir} is not a layerwise store (kind {meta.get('kind')!r}).")
    store = SentenceStore(out_dir, "layerwise", meta["config"])
    records = [store.read(k) for k in sorted(store.done())]
    return LayerwiseResult(config=meta["config"], info=meta.get("info", {}), records=records)
