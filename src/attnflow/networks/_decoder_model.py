"""The long-context decoder's network and its forward pass, for
``attnflow.networks._decoder`` (whose module docstring states the architecture).

Contract. ``Decoder(config, key)`` holds the tied embedding, the layers (``DecoderLayer``)
and the final gain, in float32; each head's attention is an attnflow kernel object
(``Softmax``, ``Sink``, ``QKNorm``, ``QKNormSink``: trainable leaves) under
``attnflow.masks.Causal``, applied by ``networks._attention.head_weights`` (the
dynamics' mask and ``kernel.weights``; no softmax of its own).
``forward(model, tokens, q, scale)`` runs one sequence and returns the output logits of
its last ``q`` positions (the answer rows) with, per layer and head, the answer rows'
logits ``L`` (masked ``-inf``), weights ``P``, learned-sink shares and gates
(``RowParts``); ``layer_states`` gives each layer's normalised attention input (the
tokens a head reads). Every layer but the last is computed at every position, in tiles
of at most ``block`` query rows, each reading the keys up to its last row (memory
``O(block n)``, the causal half never formed); the last only at the answer rows, which
is all its output feeds. The arithmetic is in the dtype of the model's arrays (float32
as built; cast the model to float64 for a float64 forward).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..dynamics.kernels import QKNorm, QKNormSink, Sink, Softmax
from ..dynamics.kernels.masks import Causal
from ..dynamics.kernels.sink import sink_share
from ._attention import head_weights
from ._decoder_task import DecoderConfig

__all__ = ["Decoder", "DecoderLayer", "RowParts", "forward", "layer_states", "rms_norm", "EPS"]

EPS = 1e-6  # the RMSNorm epsilon of the layer norms (not of the QK norm: that has none)
_CAUSAL = Causal()


def rms_norm(x: Array, gain: Array) -> Array:
    """``x / sqrt(mean(x^2) + EPS) * gain`` over the last axis."""
    shape = (1,) * (x.ndim - 1) + (-1,)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * gain.reshape(shape)


def _normal(key: Array, shape: tuple[int, ...], std: float) -> Array:
    return std * jax.random.normal(key, shape, jnp.float32)


class DecoderLayer(eqx.Module):
    """One layer: causal depthwise convolution, attention, MLP, each pre-norm residual.

    Attributes:
        conv_gain, attn_gain, mlp_gain: ``(d,)`` RMSNorm gains.
        conv: ``(w, d)`` taps: ``c_t = sum_l conv[l] * u_{t - l}`` (zero before 0).
        Wq, Wk, Wv: ``(H p, d)`` query, key, value maps (rows of head ``h``:
            ``h p .. (h + 1) p``); Wo: ``(d, H p)`` the output map.
        kernels: one attnflow kernel per head.
        Wg, bg: ``(H, d)``, ``(H,)`` the head-wise gate (``None`` without a gate).
        W1, W2: ``(m, d)``, ``(d, m)`` the MLP.
    """

    conv_gain: Array
    conv: Array
    attn_gain: Array
    Wq: Array
    Wk: Array
    Wv: Array
    Wo: Array
    kernels: tuple
    Wg: Array | None
    bg: Array | None
    mlp_gain: Array
    W1: Array
    W2: Array

    def __init__(self, config: DecoderConfig, key: Array):
        d, m, w, H, p = (
            config.d_model,
            config.mlp_width,
            config.conv_width,
            config.heads,
            config.head_size,
        )
        qknorm, sink, gate = config.parts
        ks = jax.random.split(key, 8)
        out_std = 1.0 / math.sqrt(d) / math.sqrt(2 * config.layers)
        ones = jnp.ones((d,), jnp.float32)
        self.conv_gain, self.attn_gain, self.mlp_gain = ones, ones, ones
        self.conv = jax.random.uniform(ks[0], (w, d), jnp.float32, -1.0, 1.0) / math.sqrt(w)
        self.Wq = _normal(ks[1], (H * p, d), 1 / math.sqrt(d))
        self.Wk = _normal(ks[2], (H * p, d), 1 / math.sqrt(d))
        self.Wv = _normal(ks[3], (H * p, d), 1 / math.sqrt(d))
        self.Wo = _normal(ks[4], (d, H * p), out_std * math.sqrt(d / (H * p)))
        self.W1 = _normal(ks[5], (m, d), 1 / math.sqrt(d))
        self.W2 = _normal(ks[6], (d, m), out_std * math.sqrt(d / m))
        gains, b = jnp.ones((p,), jnp.float32), jnp.zeros((), jnp.float32)
        if qknorm:
            self.kernels = tuple(
                QKNormSink(gains, gains, b) if sink else QKNorm(gains, gains) for _ in range(H)
            )
        else:
            self.kernels = tuple(Sink(b) if sink else Softmax() for _ in range(H))
        if gate:
            self.Wg = _normal(ks[7], (H, d), 1 / math.sqrt(d))
            self.bg = jnp.zeros((H,), jnp.float32)
        else:
            self.Wg = self.bg = None


class Decoder(eqx.Module):
    """Tied embedding ``(vocab, d)``, layers, final RMSNorm gain; see the module doc."""

    embed: Array
    layers: tuple
    final_gain: Array
    heads: int = eqx.field(static=True)
    beta: float = eqx.field(static=True)

    def __init__(self, config: DecoderConfig, key: Array):
        ke, *kl = jax.random.split(key, 1 + config.layers)
        self.embed = _normal(ke, (config.vocab, config.d_model), 1.0)
        self.layers = tuple(DecoderLayer(config, k) for k in kl)
        self.final_gain = jnp.ones((config.d_model,), jnp.float32)
        self.heads = config.heads
        self.beta = 1.0 / math.sqrt(config.head_size)


class RowParts(NamedTuple):
    """One head's answer rows: logits ``L`` ``(r, n)`` (after the logit scale; masked
    ``-inf``), weights ``P`` ``(r, n)``, the learned sink's share ``(r,)`` (0 without
    one) and the gate ``(r,)`` (1 without one)."""

    L: Array
    P: Array
    sink: Array
    gate: Array


def _conv(taps: Array, u: Array) -> Array:
    """``c_t = sum_l taps[l] * u_{t - l}``, zero before position 0 (causal)."""
    w, n = taps.shape[0], u.shape[0]
    padded = jnp.concatenate([jnp.zeros((w - 1, u.shape[1]), u.dtype), u], axis=0)
    out = taps[0][None, :] * u
    for lag in range(1, w):
        out = out + taps[lag][None, :] * padded[w - 1 - lag : w - 1 - lag + n]
    return out


def _head(
    kernel: Any, q: Array, k: Array, rows: Array, beta_scale: Array
) -> tuple[Array, Array, Array]:
    """One head's logits (masked), weights and sink share for query rows ``rows``: the
    dynamics' kernel under ``Causal()`` (``networks._attention``), the logits
    ``beta (q k^T)`` of the prepared queries and keys."""

    def logits(qq: Array, kk: Array) -> Array:  # the order the models were trained with
        return beta_scale * (qq @ kk.T)

    P, L = head_weights(kernel, q, k, beta_scale, mask=_CAUSAL, rows=rows, logits=logits)
    b = getattr(kernel, "b", None)
    share = sink_share(L, b) if b is not None else jnp.zeros(L.shape[:1], L.dtype)
    return L, P, share


def _keys_values(layer: DecoderLayer, u: Array, heads: int) -> tuple[Array, Array]:
    """Keys and values ``(n, H, p)`` of every position."""
    n, p = u.shape[0], layer.Wq.shape[0] // heads
    return (u @ layer.Wk.T).reshape(n, heads, p), (u @ layer.Wv.T).reshape(n, heads, p)


def _attention(layer: DecoderLayer, kv: tuple, rows: Array, ur: Array, beta_scale: Array):
    """The attention output at ``rows`` (``ur = u[rows]``, keys and values ``kv``) and
    each head's ``RowParts``."""
    k, v = kv
    r, heads, p = rows.shape[0], k.shape[1], k.shape[2]
    q = (ur @ layer.Wq.T).reshape(r, heads, p)
    outs, parts = [], []
    for h, kernel in enumerate(layer.kernels):
        L, P, share = _head(kernel, q[:, h], k[:, h], rows, beta_scale)
        g = (
            jnp.ones((r,), ur.dtype)
            if layer.Wg is None or layer.bg is None
            else jax.nn.sigmoid(ur @ layer.Wg[h] + layer.bg[h])
        )
        outs.append(g[:, None] * (P @ v[:, h]))
        parts.append(RowParts(L, P, share, g))
    return jnp.concatenate(outs, axis=-1) @ layer.Wo.T, parts


def _mlp(layer: DecoderLayer, x: Array) -> Array:
    h = jax.nn.gelu(rms_norm(x, layer.mlp_gain) @ layer.W1.T)
    return x + h @ layer.W2.T


def _pre_attention(layer: DecoderLayer, x: Array) -> tuple[Array, Array]:
    """The residual after the convolution and the attention's normalised input ``u``."""
    x = x + _conv(layer.conv, rms_norm(x, layer.conv_gain))
    return x, rms_norm(x, layer.attn_gain)


def _full_layer(layer: DecoderLayer, x: Array, heads: int, beta_scale: Array, block: int) -> Array:
    """The layer at every position, in tiles of ``block`` query rows; a tile reads only
    the keys up to its last row (the rest are masked), so the causal half is never
    formed."""
    n = x.shape[0]
    x, u = _pre_attention(layer, x)
    k, v = _keys_values(layer, u, heads)
    tiles = []
    for a in range(0, n, block):
        b = min(a + block, n)
        rows = jnp.arange(a, b)
        tiles.append(_attention(layer, (k[:b], v[:b]), rows, u[a:b], beta_scale)[0])
    return _mlp(layer, x + jnp.concatenate(tiles, axis=0))


def forward(
    model: Decoder,
    tokens: Int[Array, " n"],
    q: int,
    scale: Any = 1.0,
    *,
    block: int = 512,
    parts: bool = True,
) -> tuple[Float[Array, "q vocab"], list]:
    """One sequence through the decoder: the output logits of its last ``q`` positions
    and, when ``parts``, per layer a list of per-head ``RowParts`` of those rows.

    ``scale`` multiplies every attention logit ``beta <q, k>`` of every layer (the
    learned sink logit is not scaled)."""
    dtype = model.embed.dtype
    n = tokens.shape[0]
    beta_scale = jnp.asarray(model.beta, dtype) * jnp.asarray(scale, dtype)
    rows = jnp.arange(n - q, n)
    x = model.embed[tokens]
    out = []
    for i, layer in enumerate(model.layers):
        last = i == len(model.layers) - 1
        if last or parts:
            xa, u = _pre_attention(layer, x)
            kv = _keys_values(layer, u, model.heads)
            att, row_parts = _attention(layer, kv, rows, u[rows], beta_scale)
            out.append(row_parts)
        if not last:
            x = _full_layer(layer, x, model.heads, beta_scale, block)
        else:
            x = _mlp(layer, xa[rows] + att)  # type: ignore[possibly-undefined]
    logits = rms_norm(x, model.final_gain) @ model.embed.T / math.sqrt(model.embed.shape[1])
    return logits, out


def layer_states(model: Decoder, tokens: Int[Array, " n"], *, block: int = 512) -> list[Array]:
    """Each layer's normalised attention input ``u`` ``(n, d)`` for one sequence: the
    tokens its heads read."""
    one = jnp.asarray(1.0, model.embed.dtype)
    beta_scale = jnp.asarray(model.beta, model.embed.dtype) * one
    x = model.embed[tokens]
    states = []
    for layer in model.layers:
        states.append(_pre_attention(layer, x)[1])
        x = _full_layer(layer, x, model.heads, beta_scale, block)
    return states
