"""One trained head as the continuous-time particle system, run from given tokens in the
few coordinates where it acts (for ``attnflow.studies.layerwise``).

Contract. For a head ``(Q_h, K_h, V_h = W_O,h W_V,h, beta)`` in ``d`` dimensions let
``U`` (``d x r``, ``r <= 4 d_h``) be an orthonormal basis of ``range(W_O,h) +
range(W_V,h^T) + range(Q_h^T) + range(K_h^T)`` and write a token ``x = U a + c`` with
``c`` orthogonal to ``U``. Then ``Q_h c = K_h c = W_V,h c = 0`` and ``V_h U = U V_r``
with ``V_r = U^T V_h U``, so under ``dx_i/dt = sum_j P_ij V_h x_j`` the complement ``c_i``
never moves and ``a`` follows the head ``(Q_h U, K_h U, V_r, beta)`` in ``r`` dimensions,
exactly; ``e^{-t V_h}`` fixes ``c`` too, so the rescaled frame ``z = e^{-t V_h} x``
splits the same way, and the attention matrix and the levels ``phi_1*(z_i)``
(``phi_1*`` lies in ``range(W_V,h^T)``) are those of the ``d``-dimensional system.

``predict_head`` runs the small system with ``attnflow.simulate`` to the horizon of
``attnflow.studies.heads.head_dynamics``, ``t1 = min(horizon / |lambda_1|, t1_max)``:
adaptive Tsit5 in the original frame (the attention, and so the leaders, do not depend
on the frame; the original frame needs no propagator in the field and took fewer steps
than the rescaled one on MiniLM's heads), a system that exhausts ``max_steps`` rerun as
the discrete transformer with ``dt = t1 / max_steps``; then ``z(t1) = e^{-t1 V_r} a(t1)``
(``scipy.linalg.expm``), and both ends mapped back to ``d`` dimensions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxtyping import Float

from ..io.checkpoints import HeadWeights

__all__ = ["ReducedHead", "HeadPrediction", "reduce_head", "predict_head"]


@dataclasses.dataclass(frozen=True, eq=False)
class ReducedHead:
    """A head in its own coordinates (``reduce_head``).

    Attributes:
        layer, head: indices; beta: the inverse temperature.
        U: ``(d, r)`` orthonormal basis; Q, K: ``(d_h, r)``; V: ``(r, r)``.
        lambda1_abs: the largest modulus of V's eigenvalues.
        model: the ``attnflow.Attention`` of ``(Q, K, V, beta)`` (built once).
    """

    layer: int
    head: int
    beta: float
    U: np.ndarray
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    lambda1_abs: float
    model: Any


def reduce_head(head: HeadWeights) -> ReducedHead:
    """The head in the coordinates of the module docstring.

    Raises:
        ValueError: when ``head.V`` is not ``W_O_h @ W_V_h`` (the reduction needs the
            factors).
    """
    from ..dynamics.model import Attention

    if not isinstance(head, HeadWeights):
        raise ValueError(f"head must be a HeadWeights; got {type(head).__name__}.")
    A, B = np.asarray(head.W_O_h, np.float64), np.asarray(head.W_V_h, np.float64)
    V = np.asarray(head.V, np.float64)
    if not np.allclose(A @ B, V, rtol=0, atol=1e-12 * max(np.abs(V).max(), 1e-300)):
        raise ValueError(f"head {head.layer}.{head.head}: V is not W_O_h @ W_V_h.")
    M = np.concatenate([A, B.T, head.Q.T, head.K.T], axis=1)
    Us, sv, _ = np.linalg.svd(M, full_matrices=False)
    r = int((sv > max(M.shape) * np.finfo(float).eps * sv[0]).sum()) if sv[0] > 0 else 0
    if r == 0:
        raise ValueError(f"head {head.layer}.{head.head} has zero weights.")
    U = Us[:, :r]
    Vr = (U.T @ A) @ (B @ U)
    Qr, Kr = head.Q @ U, head.K @ U
    w = np.linalg.eigvals(Vr)
    return ReducedHead(
        layer=head.layer,
        head=head.head,
        beta=float(head.beta),
        U=U,
        Q=Qr,
        K=Kr,
        V=Vr,
        lambda1_abs=float(np.abs(w).max()),
        model=Attention(Qr, Kr, Vr, beta=head.beta, rectangular=True),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class HeadPrediction:
    """Where one head takes a set of tokens (``predict_head``).

    Attributes:
        x: ``(n, d)`` tokens at ``t1`` (original frame); z: ``(n, d)`` rescaled,
            ``e^{-t1 V_h} x``.
        attention: ``(n, n)`` the head's attention matrix at ``t1``.
        column_mass: ``(n,)`` its column sums (the attention each token receives).
        leaders: tokens with column mass above 0.5 (``attnflow.analysis.rank.leaders_of``).
        boolean_distance: of the final attention matrix (inf-norm, max over rows).
        attended: distinct columns of the nearest Boolean matrix (its rank).
        status: the solve's status; method: ``"adaptive"`` or ``"euler dt=..."``;
        num_steps: solver steps; t1: the horizon.
    """

    x: np.ndarray
    z: np.ndarray
    attention: np.ndarray
    column_mass: np.ndarray
    leaders: tuple[int, ...]
    boolean_distance: float
    attended: int
    status: str
    method: str
    num_steps: int
    t1: float


def predict_head(
    red: ReducedHead,
    x0: Float[np.ndarray, "n d"],
    *,
    horizon: float = 20.0,
    t1_max: float = 80.0,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 4000,
) -> HeadPrediction:
    """Run the head from ``x0`` (``(n, d)``) to ``t1 = min(horizon / |lambda_1|, t1_max)``
    (module docstring). Needs x64 for meaningful horizons (the caller turns it on)."""
    import jax.numpy as jnp
    from scipy.linalg import expm

    from ..analysis.rank import boolean_distance, leaders_of
    from ..dynamics.simulate import simulate
    from ..dynamics.trajectory import Status
    from .heads import choose_t1

    x0 = np.asarray(x0, np.float64)
    if x0.ndim != 2 or x0.shape[1] != red.U.shape[0]:
        raise ValueError(f"x0 must be (n, {red.U.shape[0]}) tokens; got shape {x0.shape}.")
    t1 = choose_t1(red.lambda1_abs, horizon=horizon, t1_max=t1_max)
    a0 = x0 @ red.U
    rest = x0 - a0 @ red.U.T
    kw: dict[str, Any] = dict(ts=[0.0, t1], frame="original")
    traj = simulate(red.model, a0, t1, rtol=rtol, atol=atol, max_steps=max_steps, **kw)
    method = "adaptive"
    if traj.status == Status.MAX_STEPS:
        dt = t1 / max_steps
        traj = simulate(red.model, a0, t1, method="euler", dt=dt, **kw)
        method = f"euler dt={dt:.4g}"
    steps = int(np.asarray(traj.stats["num_steps"]).reshape(-1)[0])
    a = np.asarray(traj.x[-1], np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(
            f"head {red.layer}.{red.head}: the solve ended with status {traj.status} "
            f"before t1 = {t1:.4g}; lower horizon."
        )
    za = a @ expm(-t1 * red.V).T
    P = np.asarray(red.model.attention(jnp.asarray(a)), np.float64)
    return HeadPrediction(
        x=a @ red.U.T + rest,
        z=za @ red.U.T + rest,
        attention=P,
        column_mass=P.sum(axis=0),
        leaders=tuple(int(c) for c in leaders_of(P)),
        boolean_distance=float(boolean_distance(P)),
        attended=int(np.unique(P.argmax(axis=1)).size),
        status=str(traj.status),
        method=method,
        num_steps=steps,
        t1=float(t1),
    )
