"""Gradients through ``attnflow.solve`` against central finite differences, in float64,
for every array leaf (Q, K, V, beta, x0) in every frame and with both solvers; V lives
once on the model, and a model moved by an optimiser stays consistent with itself."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import attnflow as af

TIGHT = af.AdaptiveSolver(rtol=1e-11, atol=1e-12, max_steps=4096)
LAYERS = af.LayerSolver(0.125)
# forward Euler on the rescaled frame's ODE reads e^{t_k V} at every step: the flow's
# derivative at a fraction of an adaptive solve's compile time
EULER = af.EulerODESolver(0.125)
SOLVERS = {"adaptive": TIGHT, "layers": LAYERS}
RNG = np.random.default_rng(7)
D, N = 3, 4
Q0, K0 = (RNG.normal(size=(D, D)) / np.sqrt(D) for _ in range(2))
V_KINDS = {
    # a complex pair and a real eigenvalue (modal 2x2 blocks)
    "complex": np.array([[0.3, -0.9, 0.1], [0.8, 0.2, 0.0], [0.1, 0.0, -0.4]]),
    "symmetric": np.array([[0.5, 0.2, 0.0], [0.2, -0.3, 0.1], [0.0, 0.1, 0.4]]),
    # repeated eigenvalues: eigenvectors are not differentiable, e^{tV} is
    "identity": np.eye(D),
    "jordan": np.array([[0.7, 1.0, 0.0], [0.0, 0.7, 0.0], [0.0, 0.0, -0.2]]),
}
X0 = RNG.normal(size=(N, D))
WEIGHT = RNG.normal(size=(N, D))


def _loss(model, x0, frame, solver, t1=0.5):
    sol = af.solve(model, x0, t1, frame=frame, solver=solver)
    return jnp.sum(jnp.asarray(WEIGHT) * sol.ys[-1]) + 0.1 * jnp.sum(sol.ys[-1] ** 2)


def _check_directional(loss, model, x0, leaves, *, rtol=2e-5, eps=1e-6):
    """For each leaf name (an attribute of the model, or "x0"): the gradient's inner
    product with a random direction equals the central difference along it."""
    grad_m, grad_x = eqx.filter_jit(eqx.filter_grad(loss, has_aux=False))(model, x0), None
    grad_x = jax.jit(jax.grad(lambda x: loss(model, x)))(x0)
    loss_j = eqx.filter_jit(loss)
    for name in leaves:
        if name == "x0":
            base, g = np.asarray(x0), np.asarray(grad_x)
        else:
            base, g = np.asarray(getattr(model, name)), np.asarray(getattr(grad_m, name))
        direction = RNG.normal(size=base.shape)

        def at(e, name=name, base=base, direction=direction):
            moved = jnp.asarray(base + e * direction)
            if name == "x0":
                return float(loss_j(model, moved))
            m = eqx.tree_at(lambda m: getattr(m, name), model, moved)
            return float(loss_j(m, x0))

        fd = (at(eps) - at(-eps)) / (2 * eps)
        got = float(np.sum(g * direction))
        assert np.isfinite(got), name
        assert abs(got - fd) <= rtol * max(1.0, abs(fd)), (name, got, fd)


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("frame", ["rescaled", "original", "sphere"])
def test_every_leaf_matches_finite_differences(frame, solver):
    model = af.Attention(Q0, K0, V_KINDS["complex"], beta=1.3)

    def loss(m, x):
        return _loss(m, x, frame, SOLVERS[solver])

    _check_directional(loss, model, jnp.asarray(X0), ["Q", "K", "V", "beta", "x0"])


@pytest.mark.parametrize("kind", ["symmetric", "identity", "jordan"])
def test_value_gradient_for_every_spectrum(kind):
    """Symmetric (eigh), repeated (the identity: the divided differences' diagonal) and
    defective (a Jordan block: expm) value matrices, rescaled frame, through e^{tV}."""
    model = af.Attention(Q0, K0, V_KINDS[kind])

    def loss(m, x):
        return _loss(m, x, "rescaled", EULER)

    _check_directional(loss, model, jnp.asarray(X0), ["V"])


def test_multihead_value_gradient_reaches_the_heads_through_w():
    """The default rescaling matrix W = sum_h V_h is derived from V at each use: the
    gradient of a rescaled-frame loss in V_h includes the path through W."""
    h = 2
    Qh = RNG.normal(size=(h, D, D)) / np.sqrt(D)
    Kh = RNG.normal(size=(h, D, D)) / np.sqrt(D)
    Vh = RNG.normal(size=(h, D, D)) / np.sqrt(D)
    model = af.MultiHeadAttention(Qh, Kh, Vh)

    def loss(m, x):
        return _loss(m, x, "rescaled", LAYERS)

    _check_directional(loss, model, jnp.asarray(X0), ["V"])


def test_the_cache_is_not_trainable_and_an_optimiser_step_keeps_the_model_whole():
    model = af.Attention(Q0, K0, V_KINDS["complex"])
    trainable = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array))
    # Q, K, V, beta: the decomposition is a cache of V, not a parameter of its own
    assert len(trainable) == 4
    assert sum(leaf is model.V for leaf in jax.tree_util.tree_leaves(model)) == 1

    def loss(m):
        return _loss(m, jnp.asarray(X0), "rescaled", EULER)

    opt = optax.adamw(0.05, weight_decay=0.5)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    grads = eqx.filter_grad(loss)(model)
    assert float(jnp.max(jnp.abs(grads.V))) > 1e-3  # the value matrix does get a gradient
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
    moved = eqx.apply_updates(model, updates)
    assert not np.allclose(np.asarray(moved.V), np.asarray(model.V))
    assert not moved.flow.built_from(moved.V)  # the cache still describes the old V ...
    rebuilt = af.Attention(moved.Q, moved.K, moved.V, beta=moved.beta)
    # ... and solve rebuilds it at its door: the moved model is the model of its weights
    a = af.solve(moved, jnp.asarray(X0), 0.5, solver=EULER).ys[-1]
    b = af.solve(rebuilt, jnp.asarray(X0), 0.5, solver=EULER).ys[-1]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-14)
    # so does simulate (whose rescaled frame reads the modal coordinates of the cache)
    ta = af.simulate(moved, X0, 0.5, method="euler-ode", dt=0.125)
    tb = af.simulate(rebuilt, X0, 0.5, method="euler-ode", dt=0.125)
    np.testing.assert_allclose(np.asarray(ta.z), np.asarray(tb.z), rtol=1e-13, atol=1e-14)
    assert af.dynamics.fresh(rebuilt) is rebuilt  # a fresh cache is kept as it is


def test_modal_coordinates_refuse_a_derivative_in_v_by_name():
    V = jnp.asarray(V_KINDS["complex"])
    cache = af.dynamics.FlowCache(V)

    def f(V):
        T = af.Propagator(V, flow=cache).T
        assert T is not None
        return jnp.sum(T)

    with pytest.raises(ValueError, match="coords='standard'"):
        jax.grad(f)(V)


def test_flow_derivative_is_the_frechet_derivative_of_expm():
    """The custom rule of e^{tV} against JAX's own derivative of expm, for V with a
    repeated eigenvalue and a complex pair, in every direction of a basis."""
    V = jnp.asarray(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, -0.5], [0.0, 0.5, 1.0]]))
    prop = af.Propagator(V)
    assert prop.method == "eig"
    t = 0.8
    for i in range(D):
        for j in range(D):
            E = jnp.zeros((D, D)).at[i, j].set(1.0)
            _, got = jax.jvp(lambda M: af.Propagator(M, flow=prop.flow)(t), (V,), (E,))
            _, want = jax.jvp(lambda M: jax.scipy.linalg.expm(t * M), (V,), (E,))
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-13)
