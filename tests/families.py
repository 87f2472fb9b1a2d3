"""Every model family and every kernel of attnflow, plus one family defined here, outside
the package, by the recipe of ``docs/architecture.md``: the list the conformance suite
(``test_conformance.py``) runs through every frame, method and analysis.

``SinkhornAttention`` is the external family: the attention matrix is the Sinkhorn
projection of ``exp(beta q k^T)`` (alternate row and column normalisation in log space,
ending with the rows, so rows sum to one), a doubly stochastic attention of the kind
studied by Sander et al. (Sinkformers, 2022). Its rows are not computed one by one
(``rowwise`` is False) and it names no kernel; it declares its logits bilinear.

``BandAttention`` is a second external family that masks inside its own weights: softmax
of ``beta q k^T`` over the keys ``|i - j| <= w``, declared through ``kept_keys`` (its
logits stay unmasked), so that the analyses count, spread and normalise over the kept
keys of each row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

import attnflow as af
from attnflow import kernels as K
from attnflow.dynamics.base import AbstractAttentionSystem
from attnflow.masks import AbstractMask


class SinkhornAttention(AbstractAttentionSystem):
    """One head whose weights are ``iters`` Sinkhorn steps of ``exp(beta q k^T)``."""

    Q: Array
    K: Array
    V: Array
    beta: Array
    flow: af.dynamics.FlowCache  # the decomposition of V: a cache, not a second V
    iters: int = eqx.field(static=True)
    family = "SinkhornAttention"

    def __init__(self, Q, K, V, *, beta=1.0, iters: int = 5):
        self.Q, self.K, self.V = (jnp.asarray(a) for a in (Q, K, V))
        self.beta = jnp.asarray(beta, self.V.dtype)
        self.iters = int(iters)
        self.flow = af.dynamics.FlowCache(self.V)

    @property
    def propagator(self):  # e^{tV} of the family's own V (gradients reach V)
        return af.Propagator(self.V, flow=self.flow)

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def dtype(self):
        return self.V.dtype

    @property
    def rows_sum_to_one(self) -> bool:
        return True

    @property
    def bilinear_logits(self) -> bool:
        return True

    def query_key_maps(self):
        return self.Q, self.K

    def logits_qk(self, q, k):
        return self.beta * q @ k.T

    def weights(self, q, k):
        L = self.logits_qk(q, k)
        for _ in range(self.iters):
            L = L - jax.nn.logsumexp(L, axis=0, keepdims=True)
            L = L - jax.nn.logsumexp(L, axis=1, keepdims=True)
        return jnp.exp(L)

    def log_bound(self, q, k):
        qn = jnp.max(jnp.linalg.norm(q, axis=-1))
        kn = jnp.max(jnp.linalg.norm(k, axis=-1))
        out = jnp.log(self.beta) + jnp.log(qn) + jnp.log(kn)
        return jnp.where(jnp.isnan(out), jnp.inf, out)

    def value_map(self, u):
        return u @ self.V.T

    def describe(self) -> dict:
        return {"family": self.family, "beta": float(self.beta), "iters": self.iters}

    def arrays(self) -> dict:
        return {"Q": self.Q, "K": self.K, "V": self.V, "beta": self.beta}

    @classmethod
    def from_saved(cls, description, arrays):
        return cls(
            arrays["Q"], arrays["K"], arrays["V"], beta=arrays["beta"], iters=description["iters"]
        )


class BandAttention(AbstractAttentionSystem):
    """One head of softmax over the keys ``|i - j| <= w``, masked inside ``weights``."""

    Q: Array
    K: Array
    V: Array
    beta: Array
    flow: af.dynamics.FlowCache  # the decomposition of V: a cache, not a second V
    w: int = eqx.field(static=True)
    family = "BandAttention"

    def __init__(self, Q, K, V, *, beta=1.0, w: int = 1):
        self.Q, self.K, self.V = (jnp.asarray(a) for a in (Q, K, V))
        self.beta = jnp.asarray(beta, self.V.dtype)
        self.w = int(w)
        self.flow = af.dynamics.FlowCache(self.V)

    @property
    def propagator(self):  # e^{tV} of the family's own V (gradients reach V)
        return af.Propagator(self.V, flow=self.flow)

    @property
    def d(self) -> int:
        return self.V.shape[-1]

    @property
    def dtype(self):
        return self.V.dtype

    @property
    def rows_sum_to_one(self) -> bool:
        return True

    @property
    def bilinear_logits(self) -> bool:
        return True

    def kept_keys(self, x, rows=None):
        n = x.shape[-2]
        rows = jnp.arange(n) if rows is None else jnp.asarray(rows)
        return jnp.abs(rows[:, None] - jnp.arange(n)[None, :]) <= self.w

    def query_key_maps(self):
        return self.Q, self.K

    def logits_qk(self, q, k):
        return self.beta * q @ k.T

    def weights(self, q, k):
        i = jnp.arange(q.shape[0])
        band = jnp.abs(i[:, None] - jnp.arange(k.shape[0])[None, :]) <= self.w
        return jax.nn.softmax(jnp.where(band, self.logits_qk(q, k), -jnp.inf), axis=-1)

    def log_bound(self, q, k):
        qn = jnp.max(jnp.linalg.norm(q, axis=-1))
        kn = jnp.max(jnp.linalg.norm(k, axis=-1))
        out = jnp.log(self.beta) + jnp.log(qn) + jnp.log(kn)
        return jnp.where(jnp.isnan(out), jnp.inf, out)

    def value_map(self, u):
        return u @ self.V.T

    def describe(self) -> dict:
        return {"family": self.family, "beta": float(self.beta), "w": self.w}

    def arrays(self) -> dict:
        return {"Q": self.Q, "K": self.K, "V": self.V, "beta": self.beta}

    @classmethod
    def from_saved(cls, description, arrays):
        return cls(arrays["Q"], arrays["K"], arrays["V"], beta=arrays["beta"], w=description["w"])


class Stride(AbstractMask):
    """A user's mask: token ``i`` keeps itself and the tokens ``j < i`` with ``i - j`` a
    multiple of ``s`` (a strided causal mask, Child et al. 2019)."""

    s: int = eqx.field(static=True)
    name: ClassVar[str] = "test-stride"

    def __init__(self, s: int):
        self.s = int(s)

    def keep(self, rows, cols):
        diff = rows[:, None] - cols[None, :]
        return (diff >= 0) & (diff % self.s == 0)

    def describe(self) -> list:
        return ["test-stride", self.s]


def sinkhorn_numpy(L: np.ndarray, iters: int) -> np.ndarray:
    """The numpy reference of ``SinkhornAttention.weights`` (scipy's logsumexp)."""
    from scipy.special import logsumexp

    L = np.asarray(L, np.float64)
    for _ in range(iters):
        L = L - logsumexp(L, axis=0, keepdims=True)
        L = L - logsumexp(L, axis=1, keepdims=True)
    return np.exp(L)


# A value matrix with a positive leading eigenvalue (the tokens spread in x but the
# rescaled frame stays bounded) and generic small weights.
_RNG = np.random.default_rng(7)
V2 = np.array([[0.6, 0.2], [-0.1, 0.3]])
Q2 = np.eye(2) + 0.2 * _RNG.normal(size=(2, 2))
K2 = np.eye(2) + 0.2 * _RNG.normal(size=(2, 2))
V4 = np.diag([0.5, 0.3, -0.2, 0.1]) + 0.05 * _RNG.normal(size=(4, 4))
Q4 = np.eye(4) + 0.2 * _RNG.normal(size=(4, 4))
K4 = np.eye(4) + 0.2 * _RNG.normal(size=(4, 4))
W1, W2 = 0.3 * _RNG.normal(size=(3, 2)), 0.3 * _RNG.normal(size=(2, 3))
GRAPH6 = np.array(
    [
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 1],
        [1, 0, 0, 0, 1, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 1, 0, 0, 1, 1],
        [0, 0, 0, 1, 0, 1],
    ],
    dtype=bool,
)


@dataclass(frozen=True)
class Case:
    """One entry of the conformance list: a name and a factory of the model."""

    name: str
    build: Callable[[], Any]


def _kernel_case(name: str) -> Case:
    if name == "differential":  # two halves of the head: p even
        return Case(f"kernel-{name}", lambda: af.Attention(Q4, K4, V4, kernel=name))
    if not K.get(name).rowwise:  # couples the rows: the dense path
        return Case(f"kernel-{name}", lambda: af.Attention(Q2, K2, V2, kernel=name, block=0))
    if name in ("usa", "linear"):  # unnormalised and growing with the tokens: contract
        return Case(f"kernel-{name}", lambda: af.Attention(Q2, K2, -V2, kernel=name))
    return Case(f"kernel-{name}", lambda: af.Attention(Q2, K2, V2, kernel=name))


CASES: list[Case] = [_kernel_case(name) for name in K.KERNELS] + [
    Case("kernel-object-ssmax", lambda: af.Attention(Q2, K2, V2, kernel=K.SSMax(s=1.5))),
    Case(
        "kernel-object-qknorm-gains",
        lambda: af.Attention(Q2, K2, V2, kernel=K.QKNorm(wq=[1.5, 0.5], wk=[0.8, 1.2])),
    ),
    Case("kernel-object-sink", lambda: af.Attention(Q2, K2, V2, kernel=K.Sink(b=1.5))),
    Case("mask-causal", lambda: af.Attention(Q2, K2, V2, mask=K.Causal())),
    Case("mask-window", lambda: af.Attention(Q2, K2, V2, mask=("window", 1))),
    Case("mask-alibi", lambda: af.Attention(Q2, K2, V2, mask=af.masks.ALiBi(0.4))),
    Case(
        "mask-rope-causal",
        lambda: af.Attention(Q2, K2, V2, mask=af.masks.RoPE(10.0, af.masks.Causal())),
    ),
    Case("mask-sinkwindow", lambda: af.Attention(Q2, K2, V2, mask=af.masks.SinkWindow(1, 2))),
    # a graph on the suite's 6 tokens: quasi-strongly connected, a row without its
    # diagonal (token 2 sees 0 and 4 only), the tokens in no index order
    Case("mask-graph", lambda: af.Attention(Q2, K2, V2, mask=af.masks.Graph(GRAPH6))),
    Case(
        "MultiHeadAttention-alibi-per-head",
        lambda: af.MultiHeadAttention(
            np.stack([Q2, K2]),
            np.stack([K2, Q2]),
            np.stack([V2, V2.T]),
            mask=af.masks.ALiBi(af.masks.alibi_slopes(2)),
        ),
    ),
    Case("IsotropicAttention", lambda: af.IsotropicAttention(2, beta=1.5)),
    Case("IsotropicAttention-prenorm", lambda: af.IsotropicAttention(2, kernel="prenorm")),
    Case("MultiHeadAttention-1", lambda: af.MultiHeadAttention(Q2[None], K2[None], V2[None])),
    Case(
        "MultiHeadAttention-2",
        lambda: af.MultiHeadAttention(np.stack([Q2, K2]), np.stack([K2, Q2]), np.stack([V2, V2.T])),
    ),
    Case(
        "GatedAttention-element",
        lambda: af.GatedAttention(af.Attention(Q2, K2, V2), np.array([[0.5, -0.3], [0.2, 0.4]])),
    ),
    Case(
        "GatedAttention-head",
        lambda: af.GatedAttention(af.Attention(Q2, K2, V2), np.array([[0.5, -0.3]]), [0.3]),
    ),
    Case("Block-attention", lambda: af.Block(af.Attention(Q2, K2, V2))),
    Case("Block-isotropic", lambda: af.Block(af.IsotropicAttention(2))),
    Case(
        "Block-feedforward",
        lambda: af.Block(
            af.Attention(Q2, K2, V2),
            af.FeedForward(W1, np.zeros(3), W2, np.zeros(2)),
        ),
    ),
    Case(
        "FeedForward",
        lambda: af.FeedForward(W1, np.zeros(3), W2, np.zeros(2)),
    ),
    Case("SinkhornAttention", lambda: SinkhornAttention(Q2, K2, V2, beta=1.0, iters=5)),
    Case("BandAttention", lambda: BandAttention(Q2, K2, V2, beta=1.5, w=1)),
]


# what the kit's check_kernel and check_mask run over (each through a head of its own),
# and the families check_model runs over
KERNEL_OBJECTS: list = [K.get(name) for name in K.KERNELS] + [
    K.SSMax(s=1.5),
    K.QKNorm(wq=[1.5, 0.5, 1.0, 0.8], wk=[0.8, 1.2, 1.0, 0.6]),
    K.Sink(b=1.5),
]
MASKS: list = [
    K.Causal(),
    K.Window(1),
    af.masks.ALiBi(0.4),
    af.masks.RoPE(10.0, af.masks.Causal()),
    af.masks.SinkWindow(1, 2),
    af.masks.Graph(GRAPH6),
    Stride(2),
]
FAMILY_CASES: list[Case] = [c for c in CASES if not c.name.startswith(("kernel-", "mask-"))]


def reference(model: Any) -> Any:
    """The model an independent reference reduces it to, or ``None``: the identity
    family to ``Attention(I, I, I)``, a one-head ``MultiHeadAttention`` and a ``Block``
    without feed-forward term to their ``Attention``."""
    if isinstance(model, af.IsotropicAttention):
        eye = np.eye(model.d)
        return af.Attention(eye, eye, eye, beta=model.beta, kernel=model.kernel, mask=model.mask)
    if isinstance(model, af.MultiHeadAttention) and model.heads == 1:
        return af.Attention(
            model.Q[0], model.K[0], model.V[0], beta=model.beta, kernel=model.kernel
        )
    if isinstance(model, af.Block) and model.ffn is None:
        return reference(model.attn) or model.attn
    return None
