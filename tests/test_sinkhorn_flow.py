"""Sinkhorn attention as a gradient flow (Sander, Ablin, Blondel and Peyre 2022,
"Sinkformers: Transformers with doubly stochastic attention").

Logits ``K_ij = beta x_i^T A x_j`` with ``A = Q^T K`` symmetric; the doubly stochastic
limit of Sinkhorn's iterations is ``P_ij = exp(f_i + f_j + K_ij)`` with symmetric
potentials ``f`` (``f_i = -log sum_j exp(f_j + K_ij)``). Differentiating that constraint,
``df_i = -sum_j P_ij (df_j + dK_ij)``, and summing over ``i`` with the columns of ``P``
summing to one gives ``2 dE = -sum_ij P_ij dK_ij`` for ``E = sum_i f_i``, so

    grad_{x_i} E = -beta sum_j P_ij A x_j      (P and A symmetric),

and the particle field with ``V = beta A``, ``x_i' = sum_j P_ij V x_j``, is ``-grad E``:
``dE/dt = -sum_i |x_i'|^2``. For a non-symmetric ``A`` (two potentials ``f, g``,
``E = (sum f + sum g) / 2``) the same computation gives ``grad_{x_i} E = -(beta / 2)
sum_j (P_ij A x_j + P_ji A^T x_j)``, which the field is not.

The references here are plain numpy float64: the potentials by the symmetric (averaged)
Sinkhorn iteration to a fixed point, ``E`` and its central differences; the package
gives the field and the trajectory (kernel ``Sinkhorn``, dense, original frame).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp

import attnflow as af

N, D, BETA = 6, 3, 0.7
RNG = np.random.default_rng(0)
_S = RNG.normal(size=(D, D))
A_SYM = (_S + _S.T) / 2  # eigenvalues -1.64, -0.34, 0.86: indefinite
X0 = 0.36 * RNG.normal(size=(N, D))  # logit spread 0.70 at t = 0, 1.35 at most up to t = 2
A_NONSYM = RNG.normal(size=(D, D))
ITERS = 8  # columns sum to one within 6.4e-14 along the run below (measured)


def _model(A: np.ndarray) -> af.Attention:
    """Q = I, K = A (so Q^T K = A) and V = beta A."""
    return af.Attention(
        np.eye(D), A, BETA * A, beta=BETA, kernel="sinkhorn", kernel_params={"iters": ITERS}
    )


def _lse(a: np.ndarray, axis: int) -> np.ndarray:
    return np.asarray(logsumexp(a, axis=axis), np.float64)


def _potentials(x: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(f, g, P)``: Sinkhorn's potentials of ``K = beta x A x^T`` to a fixed point,
    ``P_ij = exp(f_i + g_j + K_ij)`` doubly stochastic. For a symmetric ``K`` the
    averaged symmetric iteration ``f <- (f - log sum_j exp(f_j + K_ij)) / 2`` (``g = f``);
    else the alternating one."""
    K = BETA * x @ A @ x.T
    f = np.zeros(len(x))
    g = np.zeros(len(x))
    symmetric = np.array_equal(A, A.T)
    for _ in range(1000):
        if symmetric:
            new_f = 0.5 * (f - _lse(f[None, :] + K, axis=1))
            new_g = new_f
        else:
            new_f = -_lse(g[None, :] + K, axis=1)
            new_g = -_lse(new_f[:, None] + K, axis=0)
        change = max(np.abs(new_f - f).max(), np.abs(new_g - g).max())
        f, g = new_f, new_g
        if change < 1e-15:  # rounding level: about 60 iterations here
            break
    P = np.exp(f[:, None] + g[None, :] + K)
    assert np.abs(P.sum(0) - 1).max() < 1e-14 and np.abs(P.sum(1) - 1).max() < 1e-14
    return f, g, P


def _energy(x: np.ndarray, A: np.ndarray) -> float:
    f, g, _ = _potentials(x, A)
    return 0.5 * float(f.sum() + g.sum())


def _grad_fd(x: np.ndarray, A: np.ndarray, h: float = 1e-5) -> np.ndarray:
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        out[idx] = (_energy(x + e, A) - _energy(x - e, A)) / (2 * h)
    return out


def test_the_sinkhorn_field_is_minus_the_gradient_of_the_potentials_sum():
    model = _model(A_SYM)
    P = np.asarray(model.attention(jnp.asarray(X0)))
    assert np.abs(P.sum(0) - 1).max() < 1e-12 and np.abs(P.sum(1) - 1).max() < 1e-12
    np.testing.assert_allclose(P, _potentials(X0, A_SYM)[2], atol=1e-13)
    field = np.asarray(model.vector_field(jnp.asarray(X0)))
    grad = _grad_fd(X0, A_SYM)
    # measured 6.4e-11 (central differences, h = 1e-5: h^2 E''' and eps E / h both ~1e-10)
    np.testing.assert_allclose(grad, -field, atol=1e-8)
    assert np.abs(field).max() > 0.05  # a field worth comparing


def test_the_energy_falls_by_the_integral_of_the_squared_speed():
    """dE/dt = -sum_i |x_i'|^2 along the package's run. The speeds at the 41 saves
    integrated by the trapezoid rule miss the drop of E by its O(h^2) error, 1.5e-4 here;
    Richardson's estimate from the 21 even saves, (T_21 - T_41) / 3, predicts it, and
    their extrapolation T_41 - (T_21 - T_41) / 3 (Simpson's rule, error O(h^4)) meets
    the drop to 4e-8 (measured); the solver's rtol 1e-11 is far below both."""
    t1, saves = 2.0, 41
    ts = np.linspace(0.0, t1, saves)
    tr = af.simulate(_model(A_SYM), X0, t1, ts=ts, frame="original", rtol=1e-11, atol=1e-12)
    assert tr.status == "ok"
    x = np.asarray(tr.x)
    E = np.empty(saves)
    speed2 = np.empty(saves)
    for k, xk in enumerate(x):
        f, _, P = _potentials(xk, A_SYM)
        E[k] = f.sum()
        speed2[k] = np.sum((BETA * P @ xk @ A_SYM) ** 2)
    assert np.all(np.diff(E) < 0)  # measured: every step falls by at least 3.5e-3
    drop = E[0] - E[-1]  # 0.50799
    fine = np.trapezoid(speed2, ts)
    coarse = np.trapezoid(speed2[::2], ts[::2])
    richardson = (coarse - fine) / 3  # 1.5247e-4
    np.testing.assert_allclose(fine - drop, richardson, rtol=0.01)  # measured 1.5251e-4
    assert abs(drop - (fine - richardson)) < 1e-6


def test_a_non_symmetric_a_breaks_the_gradient_identity():
    """With A non-symmetric the field beta P X A^T is not -grad E: the gradient is the
    symmetrised -(beta/2)(P X A^T + P^T X A), which the central differences confirm."""
    model = _model(A_NONSYM)
    field = np.asarray(model.vector_field(jnp.asarray(X0)))
    grad = _grad_fd(X0, A_NONSYM)
    _, _, P = _potentials(X0, A_NONSYM)
    np.testing.assert_allclose(
        grad, -0.5 * BETA * (P @ X0 @ A_NONSYM.T + P.T @ X0 @ A_NONSYM), atol=1e-8
    )
    np.testing.assert_allclose(field, BETA * P @ X0 @ A_NONSYM.T, atol=1e-12)
    miss = np.abs(grad + field).max() / np.abs(field).max()
    assert miss > 0.2  # measured 0.37: the identity fails by a third of the field itself
