"""The forward pass of a trained post-LayerNorm encoder (BERT, ALBERT) in JAX: tokens are
particles, layers are time steps, and every step is recorded.

``encoder_forward(weights, input_ids, attention_mask)`` runs the model exactly as
Hugging Face's ``BertModel`` / ``AlbertModel`` do at inference (no dropout), with
tokens as rows ``x_i`` of ``(n, d)``:

    x^0 = LN(word[ids] + position[0..n-1] + token_type[types])       (embeddings)
          then, for ALBERT, x^0 <- x^0 W_proj^T + b_proj               (E -> H)
    per layer, per head h (rows r_h of the query, key and value maps):
      q = x W_Q^T + b_Q,  k = x W_K^T + b_K,  v = x W_V^T + b_V
      P^h_ij = softmax_j((q_i[r_h] . k_j[r_h]) / sqrt(d_h))  over the kept keys j
               (the dynamics' Softmax kernel under the padding mask: ``attention``)
      a = concat_h(P^h v[:, r_h]) W_O^T + b_O
      y = LN(x + a)                                                  (attention block)
      x' = LN(y + act(y W_1^T + b_1) W_2^T + b_2)                    (feed-forward block)

``LN(u) = (u - mean u) / sqrt(var u + eps) * w + b`` over the features (biased variance,
``eps = layer_norm_eps``); ``act`` is the config's ``hidden_act``: BERT's exact GELU
``u Phi(u) = u (1 + erf(u / sqrt 2)) / 2``, ALBERT's tanh approximation (``gelu_new``).
A padded key (attention mask 0) gets the logit ``-inf`` (the mask ``key_padding``, an
``attnflow.masks.Graph``), so weight exactly 0, as Hugging Face's extended attention mask
gives it. The attention is computed by the dynamics' kernel and mask
(``networks._attention.head_weights``: ``Softmax().weights`` of the masked logits
``(q k^T) / sqrt(d_h)``, the product in the order the encoder had it), the same code as a
particle model's.

The sentence embedding is the pooling the checkpoint's sentence-transformers files
declare (``attnflow.io.encoder_weights.read_pooling``): for all-MiniLM-L6-v2 the mean of
the last hidden states over the kept tokens, ``sum_i m_i x_i / max(sum_i m_i, 1e-9)``,
then ``x / max(|x|_2, 1e-12)`` (its ``modules.json``: Transformer, Pooling with
``pooling_mode_mean_tokens``, Normalize).

Precision: the working dtype is JAX's default float, float64 when x64 is on (the caller
turns it on; the library never does). ``EncoderOutput`` keeps every layer's hidden
states and every head's attention matrix, the inputs of the layerwise geometry study.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import Array, Bool, Float, Int

from ..dynamics.kernels import Softmax
from ..io.checkpoints import load_tokenizer, resolve_checkpoint
from ..io.encoder_weights import EncoderWeights, SentencePooling, load_encoder_weights
from ._attention import head_weights, key_padding

__all__ = [
    "EncoderOutput",
    "encoder_forward",
    "encode",
    "gelu",
    "mean_pool",
    "pool",
    "EncoderWeights",
    "load_encoder_weights",
    "attention",
]

_SOFTMAX = Softmax()


@dataclasses.dataclass(frozen=True, eq=False)
class EncoderOutput:
    """Everything a forward pass computes (``encoder_forward``, ``encode``).

    Attributes:
        hidden_states: ``(L + 1, b, n, d)``: the embeddings (after ALBERT's projection)
            and the output of every layer; rows of padded tokens are computed but
            belong to no sentence.
        attentions: ``(L, b, h, n, n)``: ``P^h`` of every layer and head (rows sum to 1;
            padded keys 0).
        pooled: ``(b, d)`` sentence embeddings (the declared pooling), or ``None`` when
            the checkpoint declares none.
        attention_mask: ``(b, n)`` booleans, the kept tokens.
        input_ids: ``(b, n)``; tokens: the word pieces per sentence (``encode`` only).
        pooling: the ``SentencePooling`` applied, or ``None``.
    """

    hidden_states: Float[Array, "Lp1 b n d"]
    attentions: Float[Array, "L b h n n"]
    pooled: Float[Array, "b d"] | None
    attention_mask: Array
    input_ids: Array
    pooling: SentencePooling | None = None
    tokens: tuple | None = None

    @property
    def last_hidden_state(self) -> Float[Array, "b n d"]:
        return self.hidden_states[-1]

    def sentence(self, k: int) -> dict[str, Any]:
        """Sentence ``k`` without its padding: ``{"hidden_states": (L + 1, n_k, d),
        "attentions": (L, h, n_k, n_k), "pooled": (d,) or None, "tokens"}``."""
        n = int(np.asarray(self.attention_mask[k]).sum())
        return {
            "hidden_states": self.hidden_states[:, k, :n],
            "attentions": self.attentions[:, k, :, :n, :n],
            "pooled": None if self.pooled is None else self.pooled[k],
            "tokens": None if self.tokens is None else self.tokens[k],
        }


def gelu(u: Float[npt.ArrayLike, "*s"], kind: str = "gelu") -> Float[Array, "*s"]:
    """``"gelu"``: ``u Phi(u)`` with the erf (BERT's); ``"gelu_tanh"``: the tanh
    approximation ``u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))) / 2``; ``"relu"``.

    Example:
        >>> round(float(gelu(1.0)), 6), round(float(gelu(1.0, "gelu_tanh")), 6)
        (0.841345, 0.841192)
    """
    u = jnp.asarray(u)
    if kind == "gelu":
        return 0.5 * u * (1.0 + jax.scipy.special.erf(u / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * u * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))
    if kind == "relu":
        return jnp.maximum(u, 0.0)
    raise ValueError(f"activation must be 'gelu', 'gelu_tanh' or 'relu'; got {kind!r}.")


def _ln(x: Array, w: Array, b: Array, eps: float) -> Array:
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w[None, None, :] + b[None, None, :]


def _dense(x: Array, w: Array, b: Array) -> Array:
    return x @ w.T + b[None, None, :]


def attention(
    q: Float[Array, "b h n p"], k: Float[Array, "b h n p"], keep: Bool[Array, "b n"]
) -> Float[Array, "b h n n"]:
    """Every head's ``P^h`` of every sentence: the dynamics' ``Softmax`` kernel of the
    logits ``q_i . k_j / sqrt(p)`` under the sentence's padding mask (``key_padding``:
    padded keys ``-inf``, so weight exactly 0), through ``networks._attention.head_weights``,
    the computation of a particle model's ``Attention.attention``."""
    root = math.sqrt(q.shape[-1])

    def logits(qh: Array, kh: Array) -> Array:  # Hugging Face's order: (q k^T) / sqrt(p)
        return (qh @ kh.T) / root

    def sentence(qs: Array, ks: Array, kept: Array) -> Array:
        mask = key_padding(kept)
        return jax.vmap(
            lambda qh, kh: head_weights(_SOFTMAX, qh, kh, 1 / root, mask=mask, logits=logits)[0]
        )(qs, ks)

    return jax.vmap(sentence)(q, k, keep)


@partial(jax.jit, static_argnames=("num_heads", "eps", "act"))
def _layer(p: dict, x: Array, keep: Array, num_heads: int, eps: float, act: str):
    b, n, d = x.shape
    dh = d // num_heads

    def heads(u):  # (b, n, d) -> (b, h, n, d_h)
        return u.reshape(b, n, num_heads, dh).transpose(0, 2, 1, 3)

    q, k, v = (heads(_dense(x, p[f"{c}_w"], p[f"{c}_b"])) for c in "qkv")
    P = attention(q, k, keep)
    ctx = (P @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    y = _ln(x + _dense(ctx, p["o_w"], p["o_b"]), p["ln1_w"], p["ln1_b"], eps)
    f = _dense(gelu(_dense(y, p["ff1_w"], p["ff1_b"]), act), p["ff2_w"], p["ff2_b"])
    return _ln(y + f, p["ln2_w"], p["ln2_b"], eps), P


def mean_pool(hidden: Float[Array, "b n d"], attention_mask: npt.ArrayLike) -> Float[Array, "b d"]:
    """``sum_i m_i x_i / max(sum_i m_i, 1e-9)`` per sentence (sentence-transformers'
    mean pooling).

    Example:
        >>> h = jnp.arange(12.0).reshape(1, 3, 4)  # one sentence, 3 tokens, d = 4
        >>> mean_pool(h, [[1, 1, 0]]).tolist()  # the padded third token is left out
        [[2.0, 3.0, 4.0, 5.0]]
    """
    m = jnp.asarray(attention_mask).astype(hidden.dtype)[:, :, None]
    return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


def pool(
    hidden: Float[Array, "b n d"], attention_mask: npt.ArrayLike, pooling: SentencePooling
) -> Float[Array, "b d"]:
    """The sentence embedding ``pooling`` declares, from the last hidden states."""
    m = jnp.asarray(attention_mask).astype(hidden.dtype)[:, :, None]
    if pooling.mode == "mean":
        out = mean_pool(hidden, attention_mask)
    elif pooling.mode == "mean_sqrt_len":
        out = jnp.sum(hidden * m, axis=1) / jnp.sqrt(jnp.maximum(jnp.sum(m, axis=1), 1e-9))
    elif pooling.mode == "cls":
        out = hidden[:, 0]
    elif pooling.mode == "max":  # sentence-transformers sets padded tokens to -1e9 first
        out = jnp.max(jnp.where(m > 0, hidden, -1e9), axis=1)
    else:
        raise ValueError(f"pooling.mode {pooling.mode!r} is not 'mean', 'cls', 'max', ...")
    if pooling.normalize:
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def _ids(name: str, a: Any, shape: tuple | None, hi: int) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{name} must be a non-empty (n,) or (b, n) array of integers; got shape "
            f"{arr.shape}, dtype {arr.dtype}."
        )
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name} must have the shape of input_ids {shape}; got {arr.shape}.")
    if arr.min() < 0 or arr.max() >= hi:
        raise ValueError(f"{name} must lie in [0, {hi}); got [{arr.min()}, {arr.max()}].")
    return arr


def encoder_forward(
    weights: EncoderWeights,
    input_ids: Int[npt.ArrayLike, "b n"],
    attention_mask: Int[npt.ArrayLike, "b n"] | None = None,
    token_type_ids: Int[npt.ArrayLike, "b n"] | None = None,
) -> EncoderOutput:
    """Run a BERT or ALBERT encoder on token ids and keep every intermediate state.

    Args:
        weights: from ``attnflow.io.encoder_weights.load_encoder_weights``.
        input_ids: ``(b, n)`` (or ``(n,)``: one sentence) token ids, padded on the right.
        attention_mask: ``(b, n)`` 1 for a token, 0 for padding (default all 1); every
            sentence keeps at least one token.
        token_type_ids: ``(b, n)`` segment ids (default 0).

    Returns:
        An ``EncoderOutput``: ``hidden_states`` ``(L + 1, b, n, d)``, ``attentions``
        ``(L, b, h, n, n)``, ``pooled`` ``(b, d)`` (the declared pooling; ``None`` if
        none), in JAX's default float (float64 under x64).

    Raises:
        ValueError: naming the argument that is not ids of the right shape and range.

    Example:
        >>> import jax; jax.config.update("jax_enable_x64", True)  # doctest: +SKIP
        >>> w = load_encoder_weights("minilm")  # doctest: +SKIP
        >>> out = encoder_forward(w, [[101, 7592, 2088, 102]])  # doctest: +SKIP
        >>> out.hidden_states.shape, out.attentions.shape  # doctest: +SKIP
        ((7, 1, 4, 384), (6, 1, 12, 4, 4))
    """
    if not isinstance(weights, EncoderWeights):
        raise ValueError(
            f"weights must be an EncoderWeights (load_encoder_weights); got "
            f"{type(weights).__name__}."
        )
    E = weights.embeddings
    vocab, maxlen = E["word"].shape[0], E["position"].shape[0]
    ids = _ids("input_ids", input_ids, None, vocab)
    b, n = ids.shape
    if n > maxlen:
        raise ValueError(f"input_ids has {n} tokens per row; the model has {maxlen} positions.")
    if attention_mask is None:
        mask = np.ones((b, n), bool)
    else:
        mask = _ids("attention_mask", attention_mask, (b, n), 2).astype(bool)
        if not mask.any(axis=1).all():
            raise ValueError("attention_mask must keep at least one token in every row.")
    types = E["token_type"]
    if token_type_ids is None:
        tt = np.zeros((b, n), np.int64)
    else:
        tt = _ids("token_type_ids", token_type_ids, (b, n), 1 if types is None else types.shape[0])
    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    cast = partial(jnp.asarray, dtype=dtype)
    x = cast(E["word"])[ids] + cast(E["position"][:n])[None, :, :]
    if types is not None:
        x = x + cast(types)[tt]
    x = _ln(x, cast(E["ln_w"]), cast(E["ln_b"]), weights.eps)
    if weights.projection is not None:
        x = _dense(x, cast(weights.projection[0]), cast(weights.projection[1]))
    keep = jnp.asarray(mask)
    params: dict[int, dict] = {}  # ALBERT's shared layers are cast once
    hidden, atts = [x], []
    for layer in weights.layers:
        p = params.setdefault(id(layer), {k: cast(v) for k, v in layer.items()})
        x, P = _layer(p, x, keep, weights.num_heads, weights.eps, weights.activation)
        hidden.append(x)
        atts.append(P)
    pooled = None if weights.pooling is None else pool(x, keep, weights.pooling)
    return EncoderOutput(
        hidden_states=jnp.stack(hidden),
        attentions=jnp.stack(atts),
        pooled=pooled,
        attention_mask=keep,
        input_ids=jnp.asarray(ids),
        pooling=weights.pooling,
    )


def encode(
    checkpoint: str | Path | EncoderWeights,
    texts: Sequence[str],
    *,
    tokenizer_from: str | Path | None = None,
) -> EncoderOutput:
    """Tokenise ``texts`` with the checkpoint's tokenizer, pad them into one batch and run
    ``encoder_forward``.

    Args:
        checkpoint: ``"minilm"``, a path (see ``resolve_checkpoint``), or weights
            already loaded (then ``tokenizer_from`` names the checkpoint of the
            ``tokenizer.json``).
        texts: sentences (each whole: no truncation; at most the model's positions).

    Returns:
        The ``EncoderOutput`` with ``tokens`` (the word pieces, [CLS] ... [SEP]).

    Example:
        >>> out = encode("minilm", ["The cat sat.", "Attention clusters tokens."])  # doctest: +SKIP
        >>> float(out.pooled[0] @ out.pooled[1])  # cosine similarity  # doctest: +SKIP
    """
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError(f"texts must be a non-empty list of non-empty strings; got {texts!r}.")
    if isinstance(checkpoint, EncoderWeights):
        weights = checkpoint
        src = tokenizer_from if tokenizer_from is not None else weights.source
    else:
        weights = load_encoder_weights(checkpoint)
        src = tokenizer_from if tokenizer_from is not None else checkpoint
    tok = load_tokenizer(resolve_checkpoint(src))
    enc = [tok.encode(t) for t in texts]
    n = max(len(e.ids) for e in enc)
    ids = np.full((len(enc), n), weights.pad_token_id, np.int64)
    mask = np.zeros((len(enc), n), np.int64)
    types = np.zeros((len(enc), n), np.int64)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
        types[i, : len(e.ids)] = e.type_ids
    out = encoder_forward(weights, ids, mask, types)
    return dataclasses.replace(out, tokens=tuple(tuple(e.tokens) for e in enc))
