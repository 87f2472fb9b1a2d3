"""The hardmax limit as Frank-Wolfe: each token's cell, the Frank-Wolfe gap, stationary
tokens (Alcalde, Geshkovski and Ruiz-Balet 2025, "Attention's forward pass and
Frank-Wolfe").

Set-up. One head with logits ``L_ij = beta x_i^T A x_j``, ``A = Q^T K``, and ``V = I``.
As ``beta -> infinity`` softmax becomes ``kernel="hardmax"``: row ``i`` puts its weight on
the token ``s_i = x_{j*}``, ``j* = argmax_j L_ij`` (ties split evenly). In the rescaled
frame ``z = e^{-t} x`` the field is ``z_i' = s_i - z_i`` (the argmax is the same at ``x``
and at ``z``, the logits only scale by ``e^{2t}``), and one step of ``method="euler-ode"``
with ``dt = gamma`` is ``z_i <- (1 - gamma) z_i + gamma s_i``: a Frank-Wolfe step for

    f(x) = -(1/2) <x, A x>     over  K = conv{x_1, ..., x_n},

because the linear minimisation oracle ``argmin_{s in K} <grad f(x_i), s>`` with
``grad f(x_i) = -A x_i`` (``A`` symmetric) is attained at a token, the one of the largest
logit. Its Frank-Wolfe gap is read off the model's logits:

    g_i = max_{s in K} <-grad f(x_i), s - x_i> = (max_j L_ij - L_ii) / beta  >= 0,

and so is the objective, ``f(x_i) = -L_ii / (2 beta)``. Along the continuous flow
``d f(z_i) / dt = -g_i``; along a step of size ``gamma`` exactly
``f(z_i^+) = f(z_i) - gamma g_i - (gamma^2 / 2) <d_i, A d_i>``, ``d_i = s_i - z_i``.

``A`` positive semidefinite: ``f`` is concave and the flow pushes each token to a
vertex of ``K``. A token is stationary iff ``g_i = 0`` (``i`` among its own winners);
then (``A x_i != 0``) ``A x_i`` exposes ``x_i`` on the boundary of ``K`` (the hyperplane
``<A x_i, y> = <A x_i, x_i>`` supports ``K``), and a stationary token whose argmax is
strict is a vertex of ``K``. The converse fails in general: ``(1, 0)`` is a vertex of
the hull of ``(1, 0), (2, 1), (2, -1)`` but attends to the other two (``A = I``). It holds
when the tokens lie on an ellipsoid ``<x, A x> = c`` (``A`` positive definite), the
paper's pictures: there every vertex is stationary (Cauchy-Schwarz in the ``A`` inner
product), and the other tokens move in straight lines to the vertex of their cell,
``z_i(t) = v + e^{-t} (z_i(0) - v)``, so ``g_i(t) = e^{-t} <A v, v - z_i(0)> - e^{-2t}
<w, A w>``, ``w = z_i(0) - v``.

``A`` negative semidefinite: ``f`` is convex and its minimum over ``K`` is at the point
of ``K`` nearest the origin (in the ``-A`` norm). Each token heads for the token of the
smallest ``<x_i, -A x_j>``, the most opposite one in the ``-A`` inner product. For a centrally
symmetric set of tokens of equal ``-A``-norm every token targets its antipode, and the
contraction is exactly linear: ``z(t) = e^{-2t} z(0)`` (``x(t) = e^{-t} x(0)`` in the
original frame), ``z^k = (1 - 2 gamma)^k z^0`` for Frank-Wolfe steps of size ``gamma``.

Contract. ``hardmax_cells(model, x)`` reads the logits of one head of ``model`` at tokens
``x`` through the model's own ``queries_keys`` and ``attention_rows`` (the logits the
kernel weighs: masks applied, a mask's bias included, keys a mask drops never win), and
returns, per token, its winners (ties reported), leader, decision margin, Frank-Wolfe gap
and objective, float64 numpy. It computes no attention of its own and simulates nothing.
With a mask the feasible set of token ``i`` is the hull of the keys it keeps (the
model's declared ``kept_keys``). For a non-symmetric ``A`` the hardmax step is still
Frank-Wolfe's update with the linear oracle ``-A^T x_i``, and ``g_i`` its gap, but that
oracle is the gradient of ``f`` only for symmetric ``A``. The cells need the logits to be
the bilinear form ``beta x_i^T A x_j`` of the tokens, and are computed only for a model
that declares it: ``bilinear_logits`` True, ``positional`` False, ``normalizes_tokens``
False. Every other model is refused with a ``ValueError`` naming the model and the fact
(``qknorm``, ``linear``, ``differential`` map the queries and keys; RoPE turns them and
ALiBi biases them by position; ``prenorm`` normalises the tokens; a family that declares
nothing is not assumed bilinear). Which tokens to
pass: the Frank-Wolfe iterates are the rescaled tokens ``traj.z`` for ``V = I`` (the gaps
of the original-frame tokens ``x = e^t z`` are ``e^{2t}`` times larger).

Finite beta. Softmax weighs a key below the row's top by ``e^{-beta m_i}`` relative,
``m_i`` the decision margin (``margin``). Runs at finite beta follow the hardmax run to
``C e^{-beta m} / beta`` with ``m`` the smallest margin on the path (measured for
``A = I``: the exponent is the smallest initial margin to 0.1 %).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import Bool, Float, Int

from .. import _checks

__all__ = ["HardmaxCells", "hardmax_cells", "frank_wolfe_gap"]


@dataclasses.dataclass(frozen=True)
class HardmaxCells:
    """Each token's hardmax cell and its Frank-Wolfe numbers; arrays of shape ``(n,)``
    (``(n, n)`` for ``winners``) for one state, with a leading axis ``(m, ...)`` for
    several.

    Attributes:
        winners: ``winners[i, j]``: key ``j`` is among the largest logits of row ``i``
            (within ``atol``); the keys ``kernel="hardmax"`` weighs ``1 / count``.
        leader: the smallest winner of each row: the vertex (token index) the row attends.
        count: the number of winners of each row (``> 1``: a tie).
        margin: ``(max_j L_ij - max_{j not a winner} L_ij) / beta``: how far the row's
            best losing key is below its top (``inf`` when every kept key wins).
        gap: the Frank-Wolfe gap ``(max_j L_ij - L_ii) / beta >= 0``.
        objective: ``f(x_i) = -L_ii / (2 beta) = -(1/2) <x_i, A x_i>``.
        beta: the head's inverse temperature (divided out of every number above).
    """

    winners: Bool[np.ndarray, "*m n n"]
    leader: Int[np.ndarray, "*m n"]
    count: Int[np.ndarray, "*m n"]
    margin: Float[np.ndarray, "*m n"]
    gap: Float[np.ndarray, "*m n"]
    objective: Float[np.ndarray, "*m n"]
    beta: float

    @property
    def tied(self) -> Bool[np.ndarray, "*m n"]:
        """Rows with more than one winner."""
        return self.count > 1

    @property
    def stationary(self) -> Bool[np.ndarray, "*m n"]:
        """Tokens among their own winners (gap 0 within ``atol``): with ``V = I`` a
        hardmax token that is its own unique winner does not move in the rescaled
        frame."""
        return np.diagonal(self.winners, axis1=-2, axis2=-1).copy()

    @property
    def exposed(self) -> Bool[np.ndarray, "*m n"]:
        """Stationary tokens with a strict argmax (no tie): vertices of the tokens'
        convex hull, exposed by the direction ``A^T x_i`` (module docstring)."""
        return self.stationary & (self.count == 1)

    @property
    def total_gap(self) -> Float[np.ndarray, "*m"]:
        """``sum_i g_i``: the gap of the joint objective ``sum_i f(x_i)`` over ``K^n``."""
        return self.gap.sum(axis=-1)

    def members(self, j: int) -> Int[np.ndarray, " k"]:
        """The tokens whose leader is ``j`` (one state only), sorted."""
        if self.leader.ndim != 1:
            raise ValueError(
                f"members(j) reads one state; these cells hold {self.leader.shape[:-1]} "
                f"states: index the arrays instead."
            )
        j = _checks.index("j", j, self.leader.shape[-1], what="tokens")
        return np.flatnonzero(self.leader == j)


@eqx.filter_jit
def _head_logits(model: Any, x: Any) -> Any:
    """The logits the kernel of ``model`` (one head) weighs at tokens ``x`` ``(c, n, d)``:
    ``-inf`` where a mask drops the key."""

    def one(xi):
        q, k = model.queries_keys(xi)
        rows = jnp.arange(xi.shape[0])
        _, L, _ = model.attention_rows(q, k, rows)
        return jnp.where(model.kept_keys(xi, rows), L, -jnp.inf)

    return jax.vmap(one)(x)


def _head(model: Any, head: int | None) -> Any:
    from ..dynamics.base import AbstractAttentionSystem, AbstractModel

    _checks.refuse_mean_field(model, "hardmax_cells", "Pass a model of tokens.")
    if not isinstance(model, AbstractModel):
        raise ValueError(
            f"model must be an attnflow model with attention heads; got {type(model).__name__}."
        )
    if model.stack_size is not None:
        raise ValueError(
            f"model is a stack of {model.stack_size} models (attnflow.stack): pass one "
            f"of them (attnflow.unstack)."
        )
    one = model.head(head)
    if not isinstance(one, AbstractAttentionSystem):
        raise ValueError(f"model.head({head!r}) is no attention system; got {type(one).__name__}.")
    name = f"{type(one).__name__} ({one.attention_kind})"
    refusal = None
    if one.normalizes_tokens:
        refusal = "normalizes_tokens is True: it normalises its tokens before the logits"
    elif one.positional:
        refusal = "positional is True: token positions enter its logits (a turn or a bias)"
    elif not one.bilinear_logits:
        refusal = (
            "bilinear_logits is not True: it does not declare its logits beta <q_i, k_j> "
            "of its queries and keys"
        )
    if refusal is not None:
        raise ValueError(
            f"hardmax_cells refuses model {name}: {refusal}, so its logits are no bilinear "
            f"form x_i^T A x_j and the hardmax step no Frank-Wolfe step of a quadratic. "
            f"Use a kernel that weighs beta <q_i, k_j> under a mask that only drops keys."
        )
    return one


def hardmax_cells(
    model: Any,
    x: Float[npt.ArrayLike, "*m n d"],
    *,
    head: int | None = None,
    atol: float = 0.0,
) -> HardmaxCells:
    """The hardmax cell of every token and its Frank-Wolfe gap, from the model's logits.

    Args:
        model: an attention model (``Attention``, ``MultiHeadAttention``, ``Block``, ...)
            with any kernel: the cells are what ``kernel="hardmax"`` would pick from the
            same logits.
        x: tokens ``(n, d)``, or several states ``(m, n, d)`` (a run's saves). For the
            Frank-Wolfe picture with ``V = I`` pass the rescaled tokens ``traj.z``.
        head: which head of a multi-head model (``None`` for one head).
        atol: ties: key ``j`` wins row ``i`` when ``L_ij / beta >= max_k L_ik / beta -
            atol``. The default 0 is the exact rule of ``kernel="hardmax"``.

    Returns:
        A ``HardmaxCells`` (float64 numpy; the logits are computed in the model's dtype).

    Examples:
        >>> import numpy as np, attnflow as af
        >>> from attnflow.analysis import hardmax_cells
        >>> I = np.eye(2)
        >>> x = np.array([[2.0, 0.0], [0.0, 2.0], [0.5, 0.25], [0.25, 0.5]])
        >>> cells = hardmax_cells(af.Attention(I, I, I, kernel="hardmax"), x)
        >>> cells.leader.tolist(), cells.stationary.tolist()
        ([0, 1, 0, 1], [True, True, False, False])
        >>> cells.gap.tolist()  # <x_i, x_leader> - |x_i|^2
        [0.0, 0.0, 0.6875, 0.6875]
    """
    one = _head(model, head)
    d = one.d
    hint = f"(n, {d}) or (m, n, {d})"
    arr = _checks.real_array("x", x, ndim=(2, 3), shape_hint=hint)
    if arr.shape[-1] != d:
        raise ValueError(f"x must be tokens {hint} for this model; got shape {arr.shape}.")
    atol = _checks.number("atol", atol, lo=0.0)
    batch = arr.reshape((-1,) + arr.shape[-2:])
    L = np.asarray(_head_logits(one, jnp.asarray(batch, one.dtype)), np.float64)
    beta = float(np.asarray(one.beta))
    top = L.max(axis=-1, keepdims=True)
    winners = L >= top - atol * beta
    count = winners.sum(axis=-1)
    losers = np.where(winners, -np.inf, L).max(axis=-1)
    diag = np.diagonal(L, axis1=-2, axis2=-1)
    with np.errstate(invalid="ignore"):
        margin = np.where(np.isfinite(losers), top[..., 0] - losers, np.inf) / beta
    lead = arr.shape[:-2]

    def shaped(a: np.ndarray) -> np.ndarray:
        return a.reshape(lead + a.shape[1:])

    return HardmaxCells(
        winners=shaped(winners),
        leader=shaped(np.argmax(winners, axis=-1)),
        count=shaped(count),
        margin=shaped(margin),
        gap=shaped((top[..., 0] - diag) / beta),
        objective=shaped(-diag / (2.0 * beta)),
        beta=beta,
    )


def frank_wolfe_gap(
    model: Any, x: Float[npt.ArrayLike, "*m n d"], *, head: int | None = None
) -> Float[np.ndarray, "*m n"]:
    """The Frank-Wolfe gap ``g_i = (max_j L_ij - L_ii) / beta`` of every token: that of
    ``f(x) = -(1/2) <x, A x>``, ``A = Q^T K``, over the hull of the keys token ``i``
    sees (``hardmax_cells(model, x).gap``).

    Args:
        model: an attention model (see ``hardmax_cells``).
        x: tokens ``(n, d)`` or states ``(m, n, d)``.
        head: which head of a multi-head model.

    Returns:
        ``(n,)`` or ``(m, n)`` gaps, ``>= 0``; 0 exactly for the stationary tokens.

    Examples:
        >>> import numpy as np, attnflow as af
        >>> from attnflow.analysis import frank_wolfe_gap
        >>> I = np.eye(2)
        >>> x = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.5]])
        >>> frank_wolfe_gap(af.Attention(I, -I, I, kernel="hardmax"), x).tolist()
        [2.0, 2.0, 0.25]
    """
    return hardmax_cells(model, x, head=head).gap
