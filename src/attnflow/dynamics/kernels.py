"""Attention kernels: how the logits of one query row become attention weights.

A kernel maps the ``(n, n)`` logit matrix ``L_ij = beta <q_i, k_j>`` to the weight matrix
``P``, row by row. ``"softmax"`` is the kernel of the transformer and of the theory; the
others alter or escape softmax dispersion (Velickovic et al. 2024: with logits of spread
``delta``, no softmax coefficient exceeds ``1 / (1 + (n - 1) e^{-delta})``, so every
coefficient tends to 0 as ``n`` grows with the logits bounded):

``"softmax"``   ``softmax(L)``.
``"qknorm"``    queries and keys RMS-normalised per token (over the head dimension ``p``:
                ``q / sqrt(mean(q^2))``, so ``|q| = sqrt(p)``) before the logits, then
                softmax. The logits ``beta <q^, k^>`` lie in ``[-beta p, beta p]``: the
                spread is at most ``2 beta p`` whatever the tokens (it never overflows).
``"ssmax"``     scalable softmax ``softmax(s log(n) L)``, parameter ``s`` (default 1),
                ``n`` the number of keys. With one logit ``D`` above the rest the top
                weight is ``1 / (1 + (n - 1) n^{-s D})``: it tends to 1 if ``s D > 1``.
``"sigmoid"``   ``sigmoid(L - log n)``, not normalised: rows need not sum to 1 (zero logits
                give ``1 / (n + 1)``), so only the original frame applies.
``"adaptive"``  the adaptive temperature of Velickovic et al.: ``p = softmax(L)``,
                ``H = -sum p log(p + 1e-9)`` (nats); ``1/theta = max(polyval([-0.037,
                0.481, -2.3, 4.917, -1.791], H), 1)`` where ``H > 0.5``, else 1; returns
                ``softmax(L / theta)``. The factor is 1 unless ``0.84858 < H < 5.94452``
                and at most 2.4214 (at ``H = 4.412``).

Kernels that escape or alter dispersion in other ways (REFERENCES.md [K]; ``phi = elu + 1``):

``"linear"``        ``P_ij = beta phi(q_i) . phi(k_j)``, unnormalised (rows need not sum
                    to 1: original frame only). Nothing is exponentiated; the guard's bound
                    is that of ``|P|`` itself. ``"linearnorm"``: the same divided by its row
                    sum (rows sum to 1, every frame; beta cancels).
``"stickbreaking"`` (Tan et al. 2024) ``P_j = sigmoid(L_j) prod_{k > j} (1 - sigmoid(L_k))``
                    over the key order (the last key first), in log space. With
                    ``mask="causal"``: ``prod_{j < k <= i}``, ``j <= i`` (the query itself
                    counts, since attnflow's masks keep the diagonal; Tan et al.'s default
                    is ``j < i``). Rows sum to ``1 - prod (1 - sigmoid) < 1``: original
                    frame only.
``"selective"``     (Leviathan et al. 2024) causal always: ``S = relu(L)`` below the
                    diagonal, ``S[:, 0] = 0``, ``S_ii = 0``, ``F_ij = sum_{k<i} S_kj``,
                    ``P = softmax(L - F)`` over ``j <= i``. Rows sum to 1. Not row-wise
                    (row ``i`` reads rows ``k < i``): dense only, the tiled path refuses.
``"differential"``  (Ye et al. 2024) the head is split in halves, ``Q = [Q1; Q2]``,
                    ``K = [K1; K2]`` (head size ``p`` even): ``P = softmax(beta q1 k1^T) -
                    lam softmax(beta q2 k2^T)``, parameter ``lam`` (default 0.2, Ye et al.'s
                    ``lambda_init`` of the first layer). Rows sum to ``1 - lam`` and entries
                    may be negative; original frame only (see docs/dispersion.md). Its
                    logits are the two maps side by side, ``(n, 2n)``; no mask.
``"offbyone"``      ``e^{L_j} / (1 + sum_k e^{L_k})``, an implicit sink of logit 0; rows
                    sum to less than 1: original frame only.
``"prenorm"``       softmax of ``beta <Q x^_i, K x^_j>`` with ``x^ = x / rms(x)`` per token
                    (``|x^| = sqrt(d)``) before the query and key maps (dispersion paper,
                    Prop. 3.1): ``|L_ij| <= beta d ||Q^T K||_2``. Rows sum to 1; the
                    rescaled frame runs in standard coordinates (the norm is of ``x``).

Each kernel is a ``Kernel`` entry of the registry: an optional per-token ``prep(q, k)``
of queries and keys, the row-wise ``fn(L, **params)``, whether rows sum to one, the
numeric parameters with their defaults, and how much the kernel can enlarge a logit
(for the overflow guard ``log_logit_bound``). Parameters are passed as a mapping
(``params={"s": 2.0}``); inside a model they are array leaves, so changing their value
never recompiles.

Every kernel here is evaluated in the working precision of its inputs (float64 stays
float64: ``jax.nn.dot_product_attention`` is deliberately not used, as it computes its
softmax in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

__all__ = [
    "KERNELS",
    "Kernel",
    "logits",
    "softmax",
    "softmax_parts",
    "SoftmaxParts",
    "log_mass",
    "weights",
    "apply_weights",
    "attend",
    "row_stochastic",
    "auto_block",
    "DENSE_MAX_N",
    "BLOCK_ENTRIES",
    "prepare",
    "rms_normalize",
    "ssmax",
    "sigmoid_attention",
    "adaptive_softmax",
    "adaptive_inverse_temperature",
    "kernel_params",
    "log_logit_bound",
    "ADAPTIVE_POLY",
    "ADAPTIVE_MAX_INVERSE_TEMPERATURE",
    "get",
    "check_mask",
    "mask_keep",
    "apply_mask",
    "check_kernel_mask",
    "linear_attention",
    "linear_normalized",
    "stickbreaking",
    "selective_attention",
    "differential_attention",
    "offbyone",
    "prepare_tokens",
]

# Above this many tokens ``attend`` never forms the (n, n) matrix: it processes blocks of
# query rows, each against all keys, so memory is O(n * block).
DENSE_MAX_N = 2048
# Entries of one (block, n) logit tile.
BLOCK_ENTRIES = 1 << 22


# ----------------------------------------------------------------------- kernels
def _band_shift(L: Array, m: Array) -> Array:
    """``L - m`` with every entry within ``8 eps |m|`` of 0 (or above it) taken as exactly
    0, on values only (the gradient is that of ``L - m``). See ``softmax``."""
    s = L - m
    band = s >= -8 * jnp.finfo(L.dtype).eps * jnp.abs(m)
    return s - jax.lax.stop_gradient(jnp.where(band, s, 0.0))


def softmax(L: Float[Array, "*b n"]) -> Float[Array, "*b n"]:
    """Row softmax of logits ``L`` ``(..., n)``, exact to the accuracy of the logits.

    ``exp(s_j)`` with ``s_j = L_j - max_k L_k``, where every shifted logit within
    ``8 eps |max_k L_k|`` of 0 (or above it) is taken as exactly 0. The reason: inside
    ``jit`` on CPU, XLA may recompute a low-rank logit product inside the fused
    subtraction and contract it into one fused multiply-add, so the shifted logit of
    the maximum comes out as the product's rounding error (up to ``eps |max| / 2``
    for one product) instead of 0. Past ``|logit| ~ 1e18`` (float64) that error
    exceeds ``log(finfo.max)`` and ``jax.nn.softmax`` returns ``inf / inf = NaN`` (or
    drops the maximum). Entries within the band are ties at the precision of the
    logits, so giving them weight ``e^0`` changes nothing beyond that precision, and
    every row keeps its maximum at exactly 1.

    The band is applied to values only (``s - stop_gradient(s)`` inside it), and the
    max shift is not stop-gradiented: the gradient is the softmax gradient, ties
    included. An earlier version pinned the argmax entry instead; the extra
    ``argmax`` reduction cost ~15% of a vector-field evaluation at n = 1024.
    ``softmax_parts`` is the same computation with its row max and log-normaliser.
    """
    m = jnp.max(L, axis=-1, keepdims=True)
    e = jnp.exp(_band_shift(L, m))
    return e / jnp.sum(e, axis=-1, keepdims=True)


class SoftmaxParts(NamedTuple):
    """``softmax_parts(L)``: the weights and what the log-masses of subsets need.

    Attributes:
        P: ``(..., n)`` the weights, equal to ``softmax(L)``.
        max: ``(...)`` the row max ``m = max_j L_j``.
        log_norm: ``(...)`` ``log sum_j e^{s_j}``, ``s`` the shifted logits of
            ``softmax`` (band included), so that ``P_j = e^{s_j - log_norm}``.
    """

    P: Array
    max: Array
    log_norm: Array


def softmax_parts(L: Float[Array, "*b n"]) -> SoftmaxParts:
    """``softmax(L)`` with its row max and log-normaliser (the same band rule).

    Args:
        L: logits ``(..., n)``.

    Returns:
        A ``SoftmaxParts`` ``(P, max, log_norm)``; ``log_mass`` takes it.
    """
    m = jnp.max(L, axis=-1, keepdims=True)
    e = jnp.exp(_band_shift(L, m))
    S = jnp.sum(e, axis=-1, keepdims=True)
    return SoftmaxParts(e / S, m[..., 0], jnp.log(S[..., 0]))


def log_mass(
    L: Float[Array, "*b n"], keep: Bool[Array, "*b n"], parts: SoftmaxParts
) -> Float[Array, "*b"]:
    """``log sum_{j in keep} P_j`` per row, for ``P = softmax(L)``, from the logits.

    Finite long after the mass itself underflows (a subset far below the row max), and
    exact to relative rounding: the subset's own max ``m_k`` is shifted with the band
    rule of ``softmax`` (``e^0`` for the entries tied with it), and ``m_k - max`` with
    the band of the row (0 when ``m_k`` ties with the row max, as ``P`` has it), so the
    result is ``log`` of the sum of exactly the weights ``P`` holds. ``-inf`` for a row
    with nothing kept.

    Args:
        L: logits ``(..., n)``.
        keep: ``(..., n)`` the subset, per row.
        parts: ``softmax_parts(L)``.

    Returns:
        ``(...)`` the log-masses.
    """
    Lk = jnp.where(keep, L, -jnp.inf)
    mk = jnp.max(Lk, axis=-1, keepdims=True)
    some = jnp.isfinite(mk)
    mk = jnp.where(some, mk, 0.0)
    e = jnp.where(keep, jnp.exp(_band_shift(jnp.where(keep, L, mk), mk)), 0.0)
    shift = _band_shift(mk, parts.max[..., None])
    out = shift + jnp.log(jnp.sum(e, axis=-1, keepdims=True)) - parts.log_norm[..., None]
    return jnp.where(some, out, -jnp.inf)[..., 0]


def rms_normalize(u: Float[Array, "*b p"]) -> Float[Array, "*b p"]:
    """``u / sqrt(mean(u^2))`` over the last axis (``|result| = sqrt(p)``); zero rows stay 0.

    Exact scale invariance, no epsilon: each row is first divided by its largest
    ``|entry|``, so the mean square can neither underflow nor overflow (tokens of size
    1e-200 or 1e200 normalise to the same thing). Rows with a NaN or an infinite entry
    give NaN (reported by the overflow guard, never hidden as a finite row)."""
    a = jnp.max(jnp.abs(u), axis=-1, keepdims=True)
    zero = a == 0  # a NaN row has a NaN max: not zero, so it stays NaN below
    v = u / jnp.where(zero, 1.0, a)
    r = jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True))
    return jnp.where(zero, 0.0, v / jnp.where(zero, 1.0, r)).astype(u.dtype)


def _qknorm_prep(q: Array, k: Array) -> tuple[Array, Array]:
    return rms_normalize(q), rms_normalize(k)


def ssmax(L: Array, s=1.0) -> Array:
    """Scalable softmax ``softmax(s log(n) L)`` of logits ``L`` ``(..., n)``."""
    n = L.shape[-1]
    return softmax((jnp.asarray(s, L.dtype) * math.log(n)) * L)


def sigmoid_attention(L: Array) -> Array:
    """``sigmoid(L - log n)`` of logits ``L`` ``(..., n)``; rows need not sum to 1."""
    n = L.shape[-1]
    return jax.nn.sigmoid(L - math.log(n))


# Velickovic et al. (2024), adaptive temperature: coefficients of 1/theta in the entropy.
ADAPTIVE_POLY = (-0.037, 0.481, -2.3, 4.917, -1.791)


def _adaptive_peak() -> float:
    crit = np.roots(np.polyder(np.asarray(ADAPTIVE_POLY)))
    crit = crit[np.abs(crit.imag) < 1e-12].real
    vals = [np.polyval(ADAPTIVE_POLY, h) for h in crit if h > 0.5] + [1.0]
    return float(max(vals))


# Largest factor the adaptive rule can put on the logits (2.4214 at H = 4.412).
ADAPTIVE_MAX_INVERSE_TEMPERATURE = _adaptive_peak()


def adaptive_inverse_temperature(L: Array) -> Array:
    """``1/theta`` of each row of ``L`` ``(..., n)`` under the adaptive rule: ``(...)``."""
    p = softmax(L)
    H = -jnp.sum(p * jnp.log(p + 1e-9), axis=-1)
    poly = jnp.polyval(jnp.asarray(ADAPTIVE_POLY, L.dtype), H)
    return jnp.where(H > 0.5, jnp.maximum(poly, 1.0), 1.0).astype(L.dtype)


def adaptive_softmax(L: Array) -> Array:
    """``softmax(L / theta)`` with the adaptive temperature of each row (see module doc)."""
    return softmax(L * adaptive_inverse_temperature(L)[..., None])


# ---------------------------------------------------------------------- registry
def _no_gain(log_b, n, params):
    return log_b


def _ssmax_gain(log_b, n, params):
    return log_b + jnp.log(params["s"] * math.log(n))


def _sigmoid_gain(log_b, n, params):
    # |L - log n| <= |L| + log n <= 2 max(|L|, log n)
    return jnp.logaddexp(log_b, math.log(math.log(n)) if n > 1 else -jnp.inf)


def _adaptive_gain(log_b, n, params):
    return log_b + math.log(ADAPTIVE_MAX_INVERSE_TEMPERATURE)


class Kernel(NamedTuple):
    """One registry entry. The first two fields keep the old ``(fn, row_stochastic)`` form.

    Attributes:
        fn: ``fn(L, **params) -> P``, row-wise on logits ``L`` ``(..., n)``.
        row_stochastic: whether every row of ``P`` sums to one.
        prep: ``prep(q, k) -> (q, k)`` applied per token before the logits, or None.
        params: the numeric parameters and their defaults, e.g. ``{"s": 1.0}``.
        positive: names of the parameters that must be > 0.
        log_gain: ``log_gain(log_b, n, params)``: from a bound ``log_b`` of
            ``log max |L|`` to a bound of the log of the largest number the kernel
            exponentiates (the overflow guard).
        summary: one line for help texts.
        token_prep: ``token_prep(x) -> x`` applied to the tokens before the query and
            key maps (``prenorm``), or None.
        rowwise: whether each row of ``P`` depends on its own row of logits only (every
            kernel but ``selective``): only then may ``attend`` tile the query rows.
    """

    fn: Callable
    row_stochastic: bool
    prep: Callable | None
    params: Mapping[str, float]
    positive: tuple
    log_gain: Callable
    summary: str
    token_prep: Callable | None = None
    rowwise: bool = True


_REGISTRY: dict[str, Kernel] = {
    "softmax": Kernel(softmax, True, None, {}, (), _no_gain, "softmax(L)"),
    "qknorm": Kernel(
        softmax,
        True,
        _qknorm_prep,
        {},
        (),
        _no_gain,
        "softmax of beta <q^, k^>, q^ and k^ RMS-normalised per token",
    ),
    "ssmax": Kernel(
        ssmax, True, None, {"s": 1.0}, ("s",), _ssmax_gain, "scalable softmax: softmax(s log(n) L)"
    ),
    "sigmoid": Kernel(
        sigmoid_attention,
        False,
        None,
        {},
        (),
        _sigmoid_gain,
        "sigmoid(L - log n), unnormalised (original frame only)",
    ),
    "adaptive": Kernel(
        adaptive_softmax,
        True,
        None,
        {},
        (),
        _adaptive_gain,
        "softmax(L / theta), adaptive temperature of Velickovic et al.",
    ),
}


# --- unnormalised self-attention (issue 16) ---------------------------------------------
def usa(L: Array) -> Array:
    """Unnormalised self-attention of Geshkovski et al.: ``e^{L} / n`` of logits ``L``
    ``(..., n)``. Rows need not sum to 1, so only the original and sphere frames apply
    (not the rescaled one). With Q = K = V = I on the sphere its field is the gradient
    ascent of ``E_beta = (1/(2 beta n^2)) sum_{i,j} e^{beta <x_i, x_j>}``."""
    return jnp.exp(L) / L.shape[-1]


def _usa_gain(log_b, n, params):
    # The largest weight is e^{max L} / n <= e^{e^{log_b}} / n: the guard's exponent is
    # e^{log_b} - log n, so it stops once a logit passes log(finfo.max) - 4 + log n
    # (about 705.8 + log n in float64, 84.7 + log n in float32).
    return jnp.exp(log_b) - math.log(n)


_REGISTRY["usa"] = Kernel(
    usa, False, None, {}, (), _usa_gain, "e^L / n, unnormalised (original and sphere frames)"
)


# ----------------------------------------------- kernels that escape dispersion ([K])
def _elu1(u: Array) -> Array:
    """``phi(u) = elu(u) + 1 > 0`` (Katharopoulos et al. 2020), entry-wise."""
    return jax.nn.elu(u) + 1.0


def _linear_prep(q: Array, k: Array) -> tuple[Array, Array]:
    return _elu1(q), _elu1(k)


def linear_attention(L: Array) -> Array:
    """Unnormalised linear attention: the logits ``L = beta phi(q) . phi(k)`` themselves
    (``-inf``, a masked key, gives 0). Rows need not sum to 1."""
    return jnp.where(L == -jnp.inf, 0.0, L)


def linear_normalized(L: Array) -> Array:
    """Normalised linear attention ``L_ij / sum_k L_ik`` (``L > 0``; masked keys 0)."""
    P = linear_attention(L)
    return P / jnp.sum(P, axis=-1, keepdims=True)


def stickbreaking(L: Array) -> Array:
    """Stick-breaking weights over the key order, in log space:
    ``log P_j = log sigmoid(L_j) + sum_{k > j} log(1 - sigmoid(L_k))``, i.e.
    ``P_j = sigmoid(L_j) prod_{k > j} (1 - sigmoid(L_k))``: the last key breaks the stick
    first. Masked keys (``-inf``) weigh 0 and break nothing, so with ``mask="causal"``
    row ``i`` is ``sigmoid(L_ij) prod_{j < k <= i} (1 - sigmoid(L_ik))`` for ``j <= i``.
    Rows sum to ``1 - prod_k (1 - sigmoid(L_k)) < 1``."""
    log_keep = jax.nn.log_sigmoid(-L)  # log(1 - sigmoid(L)); 0 at a masked key
    after = jnp.flip(jnp.cumsum(jnp.flip(log_keep, -1), axis=-1), -1) - log_keep
    return jnp.exp(jax.nn.log_sigmoid(L) + after)


def selective_attention(L: Array) -> Array:
    """Selective attention (Leviathan et al. 2024) of the full square logits ``(..., n, n)``
    of one head, in causal order: ``S = relu(L)`` on ``j <= k`` (0 above the diagonal),
    ``S[:, 0] = 0`` and ``S_kk = 0``; ``F_ij = sum_{k < i} S_kj``;
    ``P = softmax(L - F)`` over ``j <= i``. The head's own logits are its selection logits
    (the paper takes those of head 0). Not row-wise: row ``i`` reads the rows ``k < i``."""
    n = L.shape[-1]
    if L.ndim < 2 or L.shape[-2] != n:
        raise ValueError(
            f"kernel 'selective' needs the full square (n, n) logits of a sequence (row i "
            f"reads the selection scores of the rows before it); got shape {L.shape}. "
            f"Pass every query row (dense path, block=0)."
        )
    i = jnp.arange(n)
    causal = i[None, :] <= i[:, None]
    S = jnp.where(causal & (i[None, :] > 0) & (i[None, :] != i[:, None]), L, 0.0)
    S = jnp.maximum(jnp.where(jnp.isfinite(S), S, 0.0), 0.0)
    F = jnp.cumsum(S, axis=-2) - S
    return softmax(jnp.where(causal, L - F, -jnp.inf))


def _differential_prep(q: Array, k: Array) -> tuple[Array, Array]:
    """Split the head in halves ``q = [q1 | q2]``, ``k = [k1 | k2]`` (Ye et al.) and stack
    the keys block-diagonally, ``[[k1, 0], [0, k2]]`` ``(2m, p)``, so that
    ``beta q @ k.T = [beta q1 k1^T | beta q2 k2^T]`` ``(n, 2m)``."""
    p = q.shape[-1]
    if p % 2:
        raise ValueError(
            f"kernel 'differential' splits the head into two halves (Q = [Q1; Q2], "
            f"K = [K1; K2]); the head size p must be even, got p = {p}."
        )
    h = p // 2
    z = jnp.zeros_like(k[..., :h])
    k2 = jnp.concatenate(
        [jnp.concatenate([k[..., :h], z], -1), jnp.concatenate([z, k[..., h:]], -1)], -2
    )
    return q, k2


def differential_attention(L: Array, lam=0.2) -> Array:
    """``softmax(L1) - lam softmax(L2)`` of the stacked logits ``[L1 | L2]`` ``(..., 2m)``
    (``differential``'s ``prep``); rows sum to ``1 - lam``, entries may be negative."""
    m = L.shape[-1] // 2
    return softmax(L[..., :m]) - jnp.asarray(lam, L.dtype) * softmax(L[..., m:])


def offbyone(L: Array) -> Array:
    """``e^{L_j} / (1 + sum_k e^{L_k})``: softmax with an implicit sink of logit 0."""
    m = jnp.maximum(jnp.max(L, axis=-1, keepdims=True), 0.0)
    e = jnp.exp(L - m)
    return e / (jnp.exp(-m) + jnp.sum(e, axis=-1, keepdims=True))


def prepare_tokens(kernel: str, x: Array) -> Array:
    """The tokens as the kernel's query and key maps see them (``prenorm``:
    ``x / rms(x)`` per token, ``|x^| = sqrt(d)``); the tokens themselves otherwise."""
    tp = get(kernel).token_prep
    return x if tp is None else tp(x)


_REGISTRY.update(
    {
        "linear": Kernel(
            linear_attention,
            False,
            _linear_prep,
            {},
            (),
            _no_gain,
            "beta phi(q) . phi(k), phi = elu + 1, unnormalised (original frame only)",
        ),
        "linearnorm": Kernel(
            linear_normalized,
            True,
            _linear_prep,
            {},
            (),
            _no_gain,
            "phi(q) . phi(k) / sum_k phi(q) . phi(k_k), phi = elu + 1",
        ),
        "stickbreaking": Kernel(
            stickbreaking,
            False,
            None,
            {},
            (),
            _no_gain,
            "sigmoid(L_j) prod_{k > j} (1 - sigmoid(L_k)), log space (original frame only)",
        ),
        "selective": Kernel(
            selective_attention,
            True,
            None,
            {},
            (),
            _no_gain,
            "softmax(L - F), F_ij = sum_{k<i} relu(L_kj) (causal; dense only)",
            rowwise=False,
        ),
        "differential": Kernel(
            differential_attention,
            False,
            _differential_prep,
            {"lam": 0.2},
            (),
            _no_gain,
            "softmax(beta q1 k1) - lam softmax(beta q2 k2), rows sum to 1 - lam",
        ),
        "offbyone": Kernel(
            offbyone, False, None, {}, (), _no_gain, "e^L / (1 + sum e^L), an implicit sink"
        ),
        "prenorm": Kernel(
            softmax,
            True,
            None,
            {},
            (),
            _no_gain,
            "softmax of beta <Q x^_i, K x^_j>, x^ = x / rms(x) per token",
            token_prep=rms_normalize,
        ),
    }
)

KERNELS = tuple(_REGISTRY)


def get(kernel: str) -> Kernel:
    """The registry entry of ``kernel``; ``ValueError`` listing the names if unknown."""
    try:
        return _REGISTRY[kernel]
    except (KeyError, TypeError):
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}.") from None


def kernel_params(kernel: str, params: Mapping | None = None) -> dict:
    """The kernel's parameters: ``params`` over the defaults, names and values checked.

    Values may be numbers or (traced) arrays; concrete values must be finite real
    scalars, and positive where the kernel needs it (``ssmax``'s ``s``). Raises
    ``ValueError`` naming the kernel or the parameter."""
    spec = get(kernel)
    if params is not None and not hasattr(params, "items"):
        raise ValueError(f"kernel_params must be a mapping such as {{'s': 2.0}}; got {params!r}.")
    params = {} if params is None else dict(params)
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise ValueError(
            f"kernel_params: {kernel!r} takes no parameter {unknown[0]!r} "
            f"(its parameters: {allowed})."
        )
    out: dict[str, Any] = dict(spec.params)
    for name, value in params.items():
        if not isinstance(value, jax_core.Tracer):
            try:
                arr = np.asarray(value)
                v = float(arr)
            except Exception:
                raise ValueError(
                    f"kernel_params[{name!r}] must be a real number; got {value!r}."
                ) from None
            if arr.ndim != 0 or np.iscomplexobj(arr) or not math.isfinite(v):
                raise ValueError(
                    f"kernel_params[{name!r}] must be a finite real scalar; got {value!r}."
                )
            if name in spec.positive and v <= 0:
                raise ValueError(
                    f"kernel_params[{name!r}] must be > 0 for {kernel!r}; got {value!r}."
                )
        out[name] = value
    return out


def row_stochastic(kernel: str) -> bool:
    """Whether the kernel's rows sum to one (needed by the rescaled frame)."""
    return get(kernel).row_stochastic


def prepare(kernel: str, q: Array, k: Array) -> tuple[Array, Array]:
    """Queries and keys as the kernel sees them (``qknorm``: RMS-normalised per token)."""
    prep = get(kernel).prep
    return (q, k) if prep is None else prep(q, k)


def logits(q: Array, k: Array, beta) -> Array:
    """``beta * q @ k.T``: queries ``q`` ``(n, p)``, keys ``k`` ``(n, p)`` -> ``(n, n)``.

    The raw product: for ``qknorm`` pass ``prepare("qknorm", q, k)`` first."""
    return (beta * q) @ k.T


def weights(kernel: str, L: Array, params: Mapping | None = None) -> Array:
    """The attention matrix of the logits ``L`` ``(..., n)`` under ``kernel``.

    ``L`` are the pre-kernel logits (for ``qknorm``, those of the normalised queries and
    keys); ``params`` the kernel's parameters (defaults where missing)."""
    spec = get(kernel)
    if not spec.params:
        return spec.fn(L)
    return spec.fn(L, **kernel_params(kernel, params))


def apply_weights(kernel: str, L: Array, values: Array, params: Mapping | None = None) -> Array:
    """``weights(kernel, L) @ values`` for ``values`` of shape ``(n, d)``."""
    return weights(kernel, L, params) @ values


def log_logit_bound(
    q: Array, k: Array, beta, *, kernel: str = "softmax", params: Mapping | None = None
) -> Array:
    """An upper bound of the log of the largest ``|number|`` the kernel exponentiates.

    ``log(beta max_i |q_i| max_j |k_j|)`` for the queries and keys the kernel sees (after
    ``prepare``: for ``qknorm`` this is ``log(beta p)``, it never overflows), plus what the
    kernel multiplies the logits by (``ssmax``: ``s log n``; ``adaptive``: at most 2.4214;
    ``sigmoid``: the shift ``log n``). Queries ``(n, p)``, keys ``(m, p)``; cheap
    (``O((n + m) p)``); ``+inf`` rather than NaN when the inputs have overflowed."""
    spec = get(kernel)
    if spec.prep is not None:
        q, k = spec.prep(q, k)
    qn = jnp.max(jnp.linalg.norm(q, axis=-1))
    kn = jnp.max(jnp.linalg.norm(k, axis=-1))
    out = jnp.log(beta) + jnp.log(qn) + jnp.log(kn)
    out = spec.log_gain(out, k.shape[0], kernel_params(kernel, params))
    return jnp.where(jnp.isnan(out), jnp.inf, out)


# ------------------------------------------------------------------------- masks
def check_mask(mask: Any) -> tuple | None:
    """The mask argument of an attention model, checked and normalised.

    ``None`` (every token sees every token), ``"causal"`` (``P_ij = 0`` for ``j > i``: token
    ``i`` sees itself and the tokens before it, in index order) or ``("window", w)``
    (``P_ij = 0`` unless ``|i - j| <= w``, an integer ``w >= 0``). Returns ``None``,
    ``("causal",)`` or ``("window", w)``; ``ValueError`` naming ``mask`` otherwise. Every
    mask keeps the diagonal, so no row is empty."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask == "causal":
            return ("causal",)
    elif isinstance(mask, (tuple, list)) and len(mask) >= 1 and isinstance(mask[0], str):
        if tuple(mask) == ("causal",):
            return ("causal",)
        if mask[0] == "window" and len(mask) == 2:
            w = mask[1]
            if isinstance(w, (int, np.integer)) and not isinstance(w, (bool, np.bool_)) and w >= 0:
                return ("window", int(w))
            raise ValueError(
                f"mask=('window', w) needs a whole number w >= 0 (the largest |i - j| "
                f"attended); got w = {w!r}."
            )
    raise ValueError(
        f"mask must be None, 'causal' or ('window', w) with an integer w >= 0; got {mask!r}."
    )


def mask_keep(mask: tuple | None, rows: Array, cols: Array) -> Array | None:
    """Boolean ``(len(rows), len(cols))``: which logits of query rows ``rows`` on key
    columns ``cols`` (token indices) the mask keeps; ``None`` when it keeps all."""
    if mask is None:
        return None
    r, c = rows[:, None], cols[None, :]
    if mask[0] == "causal":
        return c <= r
    return jnp.abs(r - c) <= mask[1]


def apply_mask(L: Array, mask: tuple | None, row0: Any = 0) -> Array:
    """Logits ``L`` ``(r, m)`` of query rows ``row0 .. row0 + r - 1`` with the entries the
    mask drops set to ``-inf`` (weight 0 under every kernel here). ``mask=None`` returns
    ``L`` itself, untouched."""
    if mask is None:
        return L
    keep = mask_keep(mask, row0 + jnp.arange(L.shape[-2]), jnp.arange(L.shape[-1]))
    assert keep is not None
    return jnp.where(keep, L, -jnp.inf)


def check_kernel_mask(kernel: str, mask: tuple | None) -> None:
    """``ValueError`` for a mask the kernel cannot take: ``differential`` stacks two logit
    maps side by side (``(n, 2m)``), which the masks' column indices do not describe."""
    if mask is not None and kernel == "differential":
        raise ValueError(
            "kernel 'differential' takes no mask (its logits are two maps side by side); "
            "use mask=None."
        )


# ------------------------------------------------------------------------ tiling
def auto_block(n: int) -> int:
    """Query rows per tile for ``n`` tokens: 0 (dense) up to ``DENSE_MAX_N``, else about
    ``BLOCK_ENTRIES / n`` (at least 16): a tile of 4M entries, 16 MB in float32."""
    if n <= DENSE_MAX_N:
        return 0
    return max(16, BLOCK_ENTRIES // n)


def attend(
    kernel: str,
    q: Array,
    k: Array,
    beta,
    values: Array,
    *,
    block: int | None = None,
    params: Mapping | None = None,
    mask: tuple | None = None,
) -> Array:
    """``weights(kernel, beta q k^T) @ values`` without the ``(n, n)`` matrix when n is large.

    Args:
        kernel: a kernel name.
        q: queries ``(n, p)``; k: keys ``(m, p)``; values: ``(m, d)``. Raw: the kernel's
            ``prep`` (``qknorm``) is applied here.
        beta: inverse temperature.
        block: query rows per tile; ``None`` chooses by size (``auto_block``), 0 forces
            the dense path.
        params: the kernel's parameters (e.g. ``{"s": 2.0}`` for ``ssmax``).
        mask: ``check_mask``'s normal form (``None``, ``("causal",)``, ``("window", w)``):
            dropped logits are ``-inf`` before the kernel; each tile masks its own rows.

    Each tile holds whole rows of logits (a block of queries against every key), so every
    row-wise kernel is evaluated exactly as in the dense path (``ssmax`` and ``sigmoid``
    see the full ``n = m`` keys in every tile): the results agree to rounding (the same
    operations per row). Memory ``O(block * m)``.
    """
    check_kernel_mask(kernel, mask)
    q, k = prepare(kernel, q, k)
    n = q.shape[0]
    if block is None:
        block = auto_block(k.shape[0])
    if not get(kernel).rowwise and 0 < block < n:
        raise ValueError(
            f"kernel {kernel!r} couples the query rows (row i reads the selection scores "
            f"of the rows before it), so query tiles cannot compute it exactly; use "
            f"block=0 (dense, O(n^2) memory) for n = {n}."
        )
    if block <= 0 or block >= n:
        return weights(kernel, apply_mask(logits(q, k, beta), mask), params) @ values
    nb = -(-n // block)
    pad = nb * block - n
    qb = jnp.pad(q, ((0, pad), (0, 0))).reshape(nb, block, q.shape[-1])

    if mask is None:

        def tile(qi):
            return weights(kernel, logits(qi, k, beta), params) @ values

        out = jax.lax.map(tile, qb)
    else:

        def masked_tile(args):
            qi, row0 = args
            return weights(kernel, apply_mask(logits(qi, k, beta), mask, row0), params) @ values

        out = jax.lax.map(masked_tile, (qb, jnp.arange(nb) * block))
    return out.reshape(nb * block, values.shape[-1])[:n]
