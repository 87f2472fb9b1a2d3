"""The kernels with exact zeros (sparsemax, alpha-entmax, softpick, hardmax) and the
doubly stochastic one (Sinkhorn), each against an independent float64 numpy reference:
a root-finder for the thresholds, the formulas written out, the families' Sinkhorn."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from families import sinkhorn_numpy
from scipy.optimize import brentq

import attnflow as af
from attnflow import kernels as K

RNG = np.random.default_rng(11)
L = 2.0 * RNG.normal(size=(6, 9))
L[2, 4] = L[5, 0] = -np.inf  # masked keys


def _tau(row, total):
    """The threshold tau with total(tau) = 1, by a root-finder (independent of the
    library's sort and bisection)."""
    top = np.max(row[np.isfinite(row)])
    return brentq(lambda t: total(t) - 1.0, top - 1.0 - 1e-9, top, xtol=1e-15, rtol=1e-15)


def sparsemax_numpy(L):
    out = np.zeros_like(L)
    for i, row in enumerate(L):
        tau = _tau(row, lambda t, r=row: np.sum(np.maximum(r - t, 0.0)))
        out[i] = np.maximum(row - tau, 0.0)
    return out


def entmax_numpy(L, alpha):
    out = np.zeros_like(L)
    for i, row in enumerate(L):
        x = (alpha - 1) * row

        def total(t, x=x):
            return np.sum(np.maximum(x - t, 0.0) ** (1 / (alpha - 1)))

        out[i] = np.maximum(x - _tau(x, total), 0.0) ** (1 / (alpha - 1))
    return out


def test_sparsemax_is_the_projection_onto_the_simplex():
    P = np.asarray(K.get("sparsemax").weights(L))
    np.testing.assert_allclose(P, sparsemax_numpy(L), atol=1e-12)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-13)
    assert P[2, 4] == 0 and P[5, 0] == 0 and np.sum(P == 0) > 10  # exact zeros
    # the closed-form threshold, and the projection's optimality: <L - P, Q - P> <= 0
    tau = np.asarray(K.sparsemax_threshold(L))[:, 0]
    np.testing.assert_allclose(np.maximum(L - tau[:, None], 0), P, atol=1e-12)
    Lf = np.where(np.isfinite(L), L, -50.0)
    for _ in range(20):
        Q = RNG.dirichlet(np.ones(9), size=6)
        Q[2, 4] = Q[5, 0] = 0
        Q /= Q.sum(axis=1, keepdims=True)
        assert np.all(np.sum((Lf - P) * (Q - P), axis=1) <= 1e-10)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_entmax_against_a_root_finder(alpha):
    P = np.asarray(K.get("entmax", alpha=alpha).weights(L))
    np.testing.assert_allclose(P, entmax_numpy(L, alpha), atol=1e-10)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-13)
    assert P[2, 4] == 0 and P[5, 0] == 0


def test_entmax_limits_and_derivative():
    sm = np.asarray(K.get("sparsemax").weights(L))
    np.testing.assert_allclose(np.asarray(K.get("entmax", alpha=2.0).weights(L)), sm, atol=1e-14)
    soft = np.asarray(K.get("softmax").weights(L))
    near = np.asarray(K.get("entmax", alpha=1.001).weights(L))
    assert np.abs(near - soft).max() < 5e-3  # alpha -> 1 is softmax
    # the closed-form JVP against central differences of the forward map
    row = L[0]
    J = np.asarray(jax.jacfwd(lambda r: K.entmax(r, 1.5))(row))
    eps = 1e-6
    num = np.stack(
        [
            (np.asarray(K.entmax(row + eps * e, 1.5)) - np.asarray(K.entmax(row - eps * e, 1.5)))
            / (2 * eps)
            for e in np.eye(row.size)
        ],
        axis=1,
    )
    np.testing.assert_allclose(J, num, atol=1e-7)
    np.testing.assert_allclose(J.sum(axis=0), 0.0, atol=1e-12)  # rows stay on the simplex


def test_softpick_formula_mask_overflow_and_zero_rows():
    P = np.asarray(K.get("softpick").weights(L))
    kept = np.isfinite(L)
    e = np.where(kept, np.expm1(np.where(kept, L, 0.0)), 0.0)
    ref = np.maximum(e, 0) / np.abs(e).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(P, ref, atol=1e-13)
    assert np.all(P.sum(axis=1) < 1)  # rows sum to at most one
    big = np.asarray(K.softpick(np.array([[1000.0, 999.0, -5.0, 0.0]])))[0]
    np.testing.assert_allclose(big[:2], [1 / (1 + np.e**-1), np.e**-1 / (1 + np.e**-1)], rtol=1e-12)
    assert big[2] == 0 and big[3] == 0
    zero = np.asarray(K.softpick(np.zeros((1, 4))))
    assert np.array_equal(zero, np.zeros((1, 4)))  # 0/0 is a row of zeros, not NaN
    g = jax.grad(lambda r: K.softpick(r)[0, 0])(np.zeros((1, 4)))
    assert np.all(np.isfinite(np.asarray(g)))


def test_hardmax_ties_masks_and_the_beta_limit():
    Lt = np.array([[1.0, 3.0, 3.0, -2.0], [5.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(
        np.asarray(K.hardmax(Lt)),
        [[0, 0.5, 0.5, 0], [1, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]],
    )
    masked = np.asarray(K.hardmax(np.array([[-np.inf, 1.0, 0.0]])))
    np.testing.assert_array_equal(masked, [[0, 1, 0]])
    # softmax(beta L) -> hardmax(L) as beta grows (no ties in L)
    Lf = np.where(np.isfinite(L), L, -np.inf)
    H = np.asarray(K.hardmax(Lf))
    gaps = []
    for beta in (4.0, 16.0, 64.0):
        gaps.append(np.abs(np.asarray(K.softmax(beta * Lf)) - H).max())
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3


def test_sinkhorn_against_numpy_and_doubly_stochastic():
    Ls = RNG.normal(size=(7, 7))
    for iters in (1, 3, 10):
        P = np.asarray(K.get("sinkhorn", iters=iters).weights(Ls))
        np.testing.assert_allclose(P, sinkhorn_numpy(Ls, iters), rtol=1e-12)
        np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-13)
    many = np.asarray(K.get("sinkhorn", iters=200).weights(Ls))
    np.testing.assert_allclose(many.sum(axis=0), 1.0, atol=1e-10)  # columns too, in the limit
    # under a causal mask: zero above the diagonal, rows sum to one
    causal = np.where(np.tril(np.ones((7, 7), bool)), Ls, -np.inf)
    Pc = np.asarray(K.get("sinkhorn", iters=5).weights(causal))
    assert np.all(Pc[np.triu_indices(7, 1)] == 0)
    np.testing.assert_allclose(Pc, sinkhorn_numpy(causal, 5), rtol=1e-12)
    # the model computes it densely and refuses query tiles by name
    x = RNG.normal(size=(6, 2))
    A = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="sinkhorn", block=2)
    with pytest.raises(ValueError, match="couples the query rows.*block=0"):
        A.vector_field(x)


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("entmax", {"alpha": 1.0}, "alpha.*> 1"),
        ("entmax", {"alpha": "x"}, "alpha"),
        ("entmax", {"iters": 3}, "iters"),
        ("sinkhorn", {"iters": 0}, "iters"),
        ("sinkhorn", {"iters": 2.5}, "iters"),
        ("sparsemax", {"alpha": 2.0}, "takes no parameter 'alpha'"),
    ],
)
def test_bad_parameters_name_themselves(name, params, match):
    with pytest.raises(ValueError, match=match):
        K.get(name, **params)


def test_settings_are_saved_and_read_back(tmp_path):
    x = RNG.normal(size=(5, 2))
    for kern in (K.Entmax(alpha=1.75, iters=40), K.Sinkhorn(iters=4)):
        A = af.Attention(np.eye(2), np.eye(2), 0.5 * np.eye(2), kernel=kern)
        tr = af.simulate(A, x, 0.3, frame="original")
        tr.save(tmp_path / "k.npz")
        back = af.Trajectory.load(tmp_path / "k.npz").model
        assert back.kernel == kern and back.kernel.describe() == kern.describe()


@pytest.mark.parametrize("n", [16, 4096])
def test_needle_shares_against_their_closed_forms(n):
    """One logit g above n - 1 zeros: softmax gives 1 / (1 + (n - 1) e^{-g}); sparsemax 1
    for g >= 1 and g + (1 - g) / n below; alpha-entmax 1 for g >= 1 / (alpha - 1);
    hardmax 1 for any g > 0. The sparse kernels' shares do not depend on n."""
    for g in (0.25, 0.5, 1.0, 2.5):
        row = np.zeros((1, n))
        row[0, 0] = g

        def top(name, row=row, **p):
            return float(np.asarray(K.get(name, **p).weights(row))[0, 0])

        np.testing.assert_allclose(top("softmax"), 1 / (1 + (n - 1) * np.exp(-g)), rtol=1e-12)
        share = 1.0 if g >= 1 else g + (1 - g) / n
        np.testing.assert_allclose(top("sparsemax"), share, rtol=1e-12)
        assert top("hardmax") == 1.0
        for alpha in (1.5, 3.0):
            if g >= 1 / (alpha - 1):
                assert top("entmax", alpha=alpha) == pytest.approx(1.0, abs=1e-12)
            else:
                assert top("entmax", alpha=alpha) < 1


def test_sinkhorn_with_an_empty_column_is_defined_and_gains_are_checked():
    """A user's mask that leaves a column empty: that column weighs 0, the others are
    normalised, no NaN (it was all NaN); QK-norm gains of every array kind are checked
    for finiteness by name."""
    L = jnp.array([[0.0, -jnp.inf, 1.0], [0.5, -jnp.inf, 0.0], [0.2, -jnp.inf, 0.3]])
    P = np.asarray(K.get("sinkhorn", iters=20).weights(L))
    assert np.all(np.isfinite(P)) and np.all(P[:, 1] == 0.0)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-6)
    for bad in (jnp.array([1.0, jnp.inf]), np.array([1.0, np.nan]), [1.0, float("inf")]):
        with pytest.raises(ValueError, match="finite gains"):
            K.get("qknorm", wq=bad)


def _plain_sinkhorn(L: np.ndarray, tol: float, cap: int = 100_000) -> tuple[np.ndarray, int]:
    """Plain numpy Sinkhorn on the weights themselves (no logs): divide the columns by
    their sums, then the rows, until every column sums to one within ``tol``."""
    P = np.exp(np.asarray(L, np.float64) - np.max(L))
    for k in range(1, cap + 1):
        P = P / P.sum(axis=0, keepdims=True)
        P = P / P.sum(axis=1, keepdims=True)
        if np.max(np.abs(P.sum(axis=0) - 1)) <= tol:
            return P, k
    raise AssertionError("no convergence")


def test_sinkhorn_is_doubly_stochastic_to_its_tolerance_by_default():
    """The default iterates to the tolerance (1e-12 in float64, 1e-6 in float32): rows
    and columns sum to one within it, and the weights are plain numpy Sinkhorn's to the
    same tolerance. The issue's case: logits whose rows spread over 24 leave the columns
    0.38 off after the three iterations of earlier versions (still what iters=3 gives)."""
    from attnflow.dynamics.kernels.sinkhorn import TOLERANCES, sinkhorn_info

    kern = K.get("sinkhorn")
    assert kern.iters is None and kern.tol is None and kern.max_iters == 1000
    rng = np.random.default_rng(5)
    for n, spread in ((6, 1.0), (16, 2.0), (40, 1.5)):
        L = spread * rng.normal(size=(n, n))
        P = np.asarray(kern.weights(jnp.asarray(L)))
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(P.sum(axis=0), 1.0, rtol=0, atol=1e-12)
        want, _ = _plain_sinkhorn(L, 1e-13)
        np.testing.assert_allclose(P, want, rtol=0, atol=1e-11)
        info = kern.info(jnp.asarray(L))
        assert 1 < int(info.iterations) < 1000 and float(info.residual) <= 1e-12
        # float32: to its own default tolerance
        P32 = np.asarray(kern.weights(jnp.asarray(L, jnp.float32)), np.float64)
        assert P32.dtype == np.float64 and TOLERANCES["float32"] == 1e-6
        assert np.max(np.abs(P32.sum(axis=0) - 1)) < 2e-6
        np.testing.assert_allclose(P32, want, atol=2e-6)
    spread = rng.permuted(np.tile(np.linspace(0.0, 24.0, 8), (8, 1)), axis=1)
    three = np.asarray(K.get("sinkhorn", iters=3).weights(jnp.asarray(spread)))
    assert np.max(np.abs(three.sum(axis=0) - 1)) > 0.1
    np.testing.assert_allclose(three, sinkhorn_numpy(spread, 3), rtol=1e-12)
    full = np.asarray(kern.weights(jnp.asarray(spread)))
    assert np.max(np.abs(full.sum(axis=0) - 1)) <= 1e-12
    # a stated tolerance and a cap that stops it short: the residual says how far
    loose = sinkhorn_info(jnp.asarray(spread), tol=1e-3)
    assert 1e-4 < float(loose.residual) <= 1e-3
    short = sinkhorn_info(jnp.asarray(spread), max_iters=2)
    assert int(short.iterations) == 2 and float(short.residual) > 1e-3
    with pytest.warns(RuntimeWarning, match="stopped at its cap of 2 iterations"):
        K.get("sinkhorn", max_iters=2).weights(jnp.asarray(spread))
    with pytest.raises(ValueError, match="not both"):
        K.get("sinkhorn", iters=3, tol=1e-6)


def test_sinkhorn_to_tolerance_gradients_against_central_differences():
    """Reverse-mode derivatives through the checkpointed loop to the tolerance, against
    central differences of a weighted sum of the weights; vmapped over a batch too."""

    kern = K.get("sinkhorn")
    rng = np.random.default_rng(7)
    L = jnp.asarray(1.2 * rng.normal(size=(5, 5)))
    C = jnp.asarray(rng.normal(size=(5, 5)))

    def f(L):
        return jnp.sum(C * kern.weights(L))

    g = np.asarray(jax.jit(jax.grad(f))(L))
    f = jax.jit(f)
    h = 1e-6
    fd = np.zeros((5, 5))
    for i in range(5):
        for j in range(5):
            e = np.zeros((5, 5))
            e[i, j] = h
            fd[i, j] = (float(f(L + e)) - float(f(L - e))) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=1e-8)
    batch = jnp.stack([L, 0.5 * L])
    gb = jax.grad(lambda B: jnp.sum(jax.vmap(f)(B)))(batch)
    np.testing.assert_allclose(np.asarray(gb[0]), g, atol=1e-12)


@pytest.mark.slow  # 60 s: check_model's gradient checks through the loop to tolerance
def test_sinkhorn_default_passes_the_kit():
    """``check_kernel`` on the default (to tolerance) and on the fixed count of earlier
    versions, gradients included."""
    from attnflow.testing import check_kernel

    check_kernel(K.Sinkhorn())
    check_kernel(K.Sinkhorn(iters=3))


def test_sinkhorn_runs_saved_with_iters_3_load_and_compute_as_before(tmp_path):
    """A run saved with the earlier default (``{"iters": 3}``) keeps its fixed count: the
    kernel read back computes exactly three iterations."""
    x = RNG.normal(size=(5, 2))
    A = af.Attention(
        np.eye(2), np.eye(2), 0.5 * np.eye(2), kernel="sinkhorn", kernel_params={"iters": 3}
    )
    tr = af.simulate(A, x, 0.3, frame="original")
    tr.save(tmp_path / "k.npz")
    back = af.Trajectory.load(tmp_path / "k.npz")
    assert back.model.kernel.iters == 3 and back.model.kernel.tol is None
    L = RNG.normal(size=(5, 5))
    np.testing.assert_allclose(
        np.asarray(back.model.kernel.weights(jnp.asarray(L))), sinkhorn_numpy(L, 3), rtol=1e-12
    )
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(tr.x))
