"""Attention construction, validation and the propagator e^{tV}."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference as ref

import attnflow as af
from attnflow.dynamics.frames import make_frame
from attnflow.dynamics.terms import FlowTerm

I2 = np.eye(2)

BAD_MODELS = [
    (dict(Q=np.eye(3)), "Q"),
    (dict(K=np.ones((2, 3))), "K"),
    (dict(V=np.ones(2)), "V"),
    (dict(V=np.zeros((0, 0))), "V"),
    (dict(V=np.array([[1.0, np.nan], [0, 1]])), "V"),
    (dict(Q=np.array([[np.inf, 0], [0, 1]])), "Q"),
    (dict(K=np.eye(2) * 1j), "K"),
    (dict(V=[["a", "b"], ["c", "d"]]), "V"),
    (dict(beta=0.0), "beta"),
    (dict(beta=-1.0), "beta"),
    (dict(beta=float("inf")), "beta"),
    (dict(beta=np.ones(2)), "beta"),
    (dict(kernel="relu"), "kernel"),
    (dict(propagator="taylor"), "propagator"),
]


@pytest.mark.parametrize("kwargs,word", BAD_MODELS)
def test_bad_model_input_names_the_argument(kwargs, word):
    args = dict(Q=I2, K=I2, V=I2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word):
        af.Attention(args.pop("Q"), args.pop("K"), args.pop("V"), **args)


def test_model_is_a_pytree_with_dtype_promotion():
    m = af.Attention([[1, 0], [0, 1]], I2, I2, beta=2)
    assert m.dtype == jnp.float64 and m.beta.dtype == jnp.float64
    leaves = jax.tree_util.tree_leaves(m)
    assert any(leaf is m.V for leaf in leaves)
    m32 = af.Attention(*(np.eye(2, dtype=np.float32),) * 3)
    assert m32.dtype == jnp.float32


@pytest.mark.parametrize(
    "V,method",
    [
        (np.array([[0.8, 0.3], [0.3, -0.4]]), "eigh"),
        (np.array([[1.0, 2.0], [0.0, 0.5]]), "eig"),
        (np.array([[0.3, -1.0], [1.0, 0.3]]), "eig"),
        (np.array([[0.7, 1.0], [0.0, 0.7]]), "expm"),  # Jordan block
        (np.array([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 2.0]]), "expm"),
        (np.array([[1.0, 1e4], [0.0, 1.0 + 1e-6]]), "expm"),  # nearly defective
    ],
)
def test_propagator_matches_taylor_exponential(V, method):
    p = af.Propagator(jnp.asarray(V))
    assert p.method == method
    for t in [-1.0, 0.0, 0.37, 2.5]:
        want = ref.expm(t * V)
        got = np.asarray(p(t))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_jordan_block_closed_form():
    """e^{t(lam I + N)} = e^{t lam} (I + t N) for a 2x2 Jordan block."""
    lam = 0.7
    p = af.Propagator(jnp.asarray([[lam, 1.0], [0.0, lam]]))
    for t in [0.5, 3.0]:
        want = np.exp(t * lam) * np.array([[1.0, t], [0.0, 1.0]])
        np.testing.assert_allclose(np.asarray(p(t)), want, rtol=1e-13)


def test_propagator_inside_jit_is_guarded():
    """A model built from traced weights still gets e^{tV} right, Jordan block included."""

    def f(V):
        return af.Attention(jnp.eye(2), jnp.eye(2), V).propagator(1.5)

    for V in [np.array([[0.7, 1.0], [0.0, 0.7]]), np.array([[0.3, -1.0], [1.0, 0.3]])]:
        np.testing.assert_allclose(
            np.asarray(jax.jit(f)(jnp.asarray(V))), ref.expm(1.5 * V), rtol=1e-10
        )


def test_vector_fields_match_reference():
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((3, 3)) for _ in range(3))
    z = rng.standard_normal((5, 3))
    m = af.Attention(Q, K, V, beta=0.5)
    np.testing.assert_allclose(
        np.asarray(m.vector_field(jnp.asarray(z))),
        ref.field_original(0.0, z, Q, K, V, 0.5),
        rtol=1e-12,
    )
    # the rescaled frame's field, in standard and in modal coordinates
    zj = jnp.asarray(z)
    for coords in ("standard", "modal"):
        fr = make_frame("rescaled", m, coords)
        w = FlowTerm(fr).field(0.8, fr.initial_state(zj))
        dz = w if coords == "standard" else m.propagator.from_modal(w)
        np.testing.assert_allclose(
            np.asarray(dz), ref.field_rescaled(0.8, z, Q, K, V, 0.5), rtol=1e-9, atol=1e-12
        )


def test_softmax_survives_huge_logits_inside_jit():
    """|logit| ~ 1e20 in d = 1: no NaN, and the exact Boolean limit."""
    m = af.Attention([[1.0]], [[1.0]], [[1.0]])
    x = jnp.asarray(np.linspace(-1.0, 1.0, 8)[:, None] * 1e10)
    P = np.asarray(jax.jit(lambda m, x: m.attention(x))(m, x))
    assert np.all(np.isfinite(P))
    # <x_i, x_j> = x_i x_j: positive tokens attend the largest, negative the smallest.
    want = np.zeros((8, 8))
    want[:4, 0] = 1.0
    want[4:, 7] = 1.0
    np.testing.assert_array_equal(P, want)
    fr = make_frame("rescaled", m, "standard")
    dz = np.asarray(jax.jit(lambda tm, z: tm.field(0.0, z))(FlowTerm(fr), x))
    assert np.all(np.isfinite(dz))


def test_softmax_matches_reference_and_its_gradient():
    L = jnp.asarray(np.random.default_rng(3).normal(size=(5, 7)) * 4)
    np.testing.assert_allclose(
        np.asarray(af.kernels.softmax(L)), ref.softmax_rows(np.asarray(L)), rtol=1e-14
    )
    f = lambda s: lambda L: jnp.sum(s(L) ** 2 * jnp.arange(7.0)[None, :])  # noqa: E731
    g = jax.grad(f(af.kernels.softmax))(L)
    g_ref = jax.grad(f(lambda L: jax.nn.softmax(L, axis=-1)))(L)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-12, atol=1e-14)


def test_softmax_ties_and_huge_rows_keep_value_and_gradient():
    """Exact ties (symmetric tokens give them) get the softmax gradient, not zero, and a
    row at 1e300 keeps its maximum at exactly 1."""
    L = jnp.asarray([[2.0, 2.0, 0.5, -1.0], [3.0, 1.0, 3.0, 3.0], [1e300, 1e300, -1e300, 0.0]])
    P = np.asarray(af.kernels.softmax(L))
    np.testing.assert_allclose(P[:2], ref.softmax_rows(np.asarray(L[:2])), rtol=1e-15)
    np.testing.assert_array_equal(P[2], [0.5, 0.5, 0.0, 0.0])
    w = jnp.arange(1.0, 5.0)
    f = lambda s: lambda L: jnp.sum(s(L) ** 2 * w[None, :])  # noqa: E731
    g = jax.grad(f(af.kernels.softmax))(L[:2])
    g_ref = jax.grad(f(lambda L: jax.nn.softmax(L, axis=-1)))(L[:2])
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-12, atol=1e-15)


def test_rectangular_head_equals_bilinear_form():
    """A (p, d) head: logits depend on Q^T K only, so (I, Q^T K) gives the same flow."""
    rng = np.random.default_rng(5)
    d, p = 5, 2
    Q, K, V = rng.normal(size=(p, d)), rng.normal(size=(p, d)), rng.normal(size=(d, d))
    with pytest.raises(ValueError, match="rectangular"):
        af.Attention(Q, K, V)
    with pytest.raises(ValueError, match="rectangular"):
        af.Attention(Q, K[:1], V, rectangular=True)
    a = af.Attention(Q, K, V, beta=0.5, rectangular=True)
    b = af.Attention(np.eye(d), Q.T @ K, V, beta=0.5)
    x0 = rng.normal(size=(6, d))
    ta, tb = af.simulate(a, x0, 1.0), af.simulate(b, x0, 1.0)
    np.testing.assert_allclose(np.asarray(ta.x), np.asarray(tb.x), rtol=1e-9, atol=1e-10)
    z = rng.normal(size=(6, d))
    np.testing.assert_allclose(
        np.asarray(a.vector_field(jnp.asarray(z))),
        ref.field_original(0.0, z, Q, K, V, 0.5),
        rtol=1e-12,
    )


@pytest.mark.parametrize("family", ["Attention", "MultiHeadAttention"])
def test_unknown_kernel_and_bad_kernel_params_are_named(family):
    I = np.eye(2)
    make = (
        (lambda **kw: af.Attention(I, I, I, **kw))
        if family == "Attention"
        else (lambda **kw: af.MultiHeadAttention(I[None], I[None], I[None], **kw))
    )
    with pytest.raises(ValueError, match=r"kernel must be one of .*'softmax'.*got 'sofmax'"):
        make(kernel="sofmax")
    with pytest.raises(ValueError, match=r"kernel must be one of .*got \['softmax'\]"):
        make(kernel=["softmax"])
    with pytest.raises(ValueError, match=r"kernel_params must be a mapping .*got \[2\.0\]"):
        make(kernel="ssmax", kernel_params=[2.0])
    with pytest.raises(ValueError, match=r"kernel_params\['s'\] must be > 0"):
        make(kernel="ssmax", kernel_params={"s": -1.0})


@pytest.mark.parametrize(
    "V",
    [
        [[1.0, 1.0], [0.0, 1.0]],  # a Jordan block
        [[0.0, 1.0], [0.0, 0.0]],  # nilpotent
        [[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 2.0]],  # a 3x3 Jordan block
    ],
)
def test_a_forced_eigen_propagator_refuses_a_defective_v(V):
    """A defective V has no eigenbasis: propagator='eig' would build e^{tV} from a basis of
    nearly parallel vectors and run with status ok. Refused; 'auto' and 'expm' are exact
    (against scipy's expm)."""
    from scipy.linalg import expm

    V = np.asarray(V)
    d = V.shape[0]
    eye = np.eye(d)
    with pytest.raises(ValueError, match="propagator='eig' needs a diagonalisable V"):
        af.Attention(eye, eye, V, propagator="eig")
    for method in ("auto", "expm"):
        prop = af.Attention(eye, eye, V, propagator=method).propagator
        np.testing.assert_allclose(np.asarray(prop(0.7)), expm(0.7 * V), rtol=1e-12, atol=1e-14)
