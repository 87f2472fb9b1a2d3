"""The public compiled core ``attnflow.solve``: jit, vmap and grad go through it; its
numbers are simulate's; gradients match central finite differences in float64."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af

RNG = np.random.default_rng(11)
Q = np.eye(2) + 0.3 * RNG.normal(size=(2, 2))
K = np.eye(2) + 0.3 * RNG.normal(size=(2, 2))
V = np.array([[0.4, 0.3], [-0.2, 0.1]])
X0 = RNG.normal(size=(5, 2))
TIGHT = af.AdaptiveSolver(rtol=1e-11, atol=1e-12, max_steps=2048)


def test_jit_of_solve_is_simulate():
    m = af.Attention(Q, K, V)
    final = jax.jit(lambda x: af.solve(m, x, 1.5, frame="original", solver=TIGHT).ys[-1])
    ref = af.simulate(m, X0, 1.5, frame="original", rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.asarray(final(X0)), np.asarray(ref.x[-1]), rtol=1e-9)
    sol = af.solve(m, jnp.asarray(X0), 1.5, ts=jnp.linspace(0, 1.5, 4), solver=TIGHT)
    assert int(sol.status) == af.Status.OK.code and bool(sol.ok)
    ref_r = af.simulate(m, X0, 1.5, ts=np.linspace(0, 1.5, 4), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(ref_r.z), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("frame", ["original", "rescaled"])
def test_layers_are_simulates_layers(frame):
    m = af.Attention(Q, K, V)
    sol = jax.jit(
        lambda x: af.solve(
            m, x, 2.0, ts=jnp.array([1.0, 2.0]), frame=frame, solver=af.LayerSolver(0.25)
        )
    )(jnp.asarray(X0))
    ref = af.simulate(m, X0, 2.0, ts=[1.0, 2.0], frame=frame, method="euler", dt=0.25)
    want = ref.x if frame == "original" else ref.z
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(want), rtol=1e-12, atol=1e-14)
    assert int(sol.num_steps) == 8


def _fd(f, a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[idx] = eps
        g[idx] = (f(a + e) - f(a - e)) / (2 * eps)
    return g


W = RNG.normal(size=(5, 2))


@pytest.mark.parametrize(
    "frame, solver",
    [
        ("original", TIGHT),
        pytest.param("rescaled", TIGHT, marks=pytest.mark.slow),
        ("original", af.LayerSolver(0.1)),
        ("rescaled", af.LayerSolver(0.1)),
    ],
    ids=["adaptive-original", "adaptive-rescaled", "layers-original", "layers-rescaled"],
)
def test_gradient_in_the_tokens_matches_finite_differences(frame, solver):
    m = af.Attention(Q, K, V)

    def loss(x):
        return jnp.sum(W * af.solve(m, x, 1.0, frame=frame, solver=solver).ys[-1])

    g = jax.jit(jax.grad(loss))(jnp.asarray(X0))
    loss_j = jax.jit(loss)  # one program for every finite difference
    fd = _fd(lambda a: float(loss_j(jnp.asarray(a))), X0)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "solver",
    [pytest.param(TIGHT, marks=pytest.mark.slow), af.LayerSolver(0.1)],
    ids=["adaptive", "layers"],
)
def test_gradient_in_the_weights_matches_finite_differences(solver):
    def loss_of(m):
        return jnp.sum(
            W * af.solve(m, jnp.asarray(X0), 1.0, frame="original", solver=solver).ys[-1]
        )

    m = af.Attention(Q, K, V, propagator="expm")
    g = eqx.filter_jit(eqx.filter_grad(loss_of))(m)
    loss_j = eqx.filter_jit(loss_of)  # one program for every finite difference
    for name in ("Q", "V"):

        def f(a, name=name):
            kw = {"Q": Q, "K": K, "V": V, name: a}
            return float(loss_j(af.Attention(kw["Q"], kw["K"], kw["V"], propagator="expm")))

        fd = _fd(f, {"Q": Q, "V": V}[name])
        np.testing.assert_allclose(np.asarray(getattr(g, name)), fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "solver",
    [pytest.param(TIGHT, marks=pytest.mark.slow), af.LayerSolver(0.1)],
    ids=["adaptive", "layers"],
)
def test_vmapped_gradients_equal_a_loop(solver):
    """An adaptive solve under vmap takes the steps of its slowest system; the gradients
    of each system must still be its own (RecursiveCheckpointAdjoint is exact there)."""
    m = af.Attention(Q, K, V)
    xs = jnp.asarray(np.stack([X0, 3.0 * X0, -0.5 * X0]))

    def loss(x):
        return jnp.sum(W * af.solve(m, x, 1.0, frame="original", solver=solver).ys[-1])

    batched = jax.jit(jax.vmap(jax.grad(loss)))(xs)
    grad = jax.jit(jax.grad(loss))
    looped = np.stack([np.asarray(grad(x)) for x in xs])
    np.testing.assert_allclose(np.asarray(batched), looped, rtol=1e-7, atol=1e-10)


def test_solve_reports_an_overflow_as_a_status_not_an_exception():
    m = af.Attention(np.eye(2), np.eye(2), 4.0 * np.eye(2))  # x grows 3x per layer
    sol = jax.jit(lambda x: af.solve(m, x, 200.0, frame="original", solver=af.LayerSolver(0.5)))(
        jnp.asarray(X0)
    )
    assert int(sol.status) == af.Status.OVERFLOW.code
    assert np.all(np.isfinite(np.asarray(sol.y_stop)))


def test_solve_refuses_bad_arguments_by_name():
    m = af.Attention(Q, K, V)
    with pytest.raises(ValueError, match="frame"):
        af.solve(m, X0, 1.0, frame="moon")
    with pytest.raises(ValueError, match="layernorm"):
        af.solve(m, X0, 1.0, frame="original", layernorm="pre")
    with pytest.raises(ValueError, match="x0"):
        af.solve(m, X0[None], 1.0)
    with pytest.raises(ValueError, match="whole number of layers"):
        af.solve(m, X0, 1.0, solver=af.LayerSolver(0.3))
    with pytest.raises(ValueError, match="method"):
        af.AdaptiveSolver(method="rk4")


def test_simulate_takes_the_solver_objects_and_refuses_them_beside_keywords():
    m = af.Attention(Q, K, V)
    obj = af.simulate(m, X0, 1.5, solver=af.AdaptiveSolver(rtol=1e-8, atol=1e-10, method="dopri5"))
    kw = af.simulate(m, X0, 1.5, method="dopri5", rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(np.asarray(obj.x), np.asarray(kw.x))
    assert obj.stats["num_steps"] == kw.stats["num_steps"]
    lay = af.simulate(m, X0, 2.0, frame="original", solver=af.LayerSolver(0.25))
    ref = af.simulate(m, X0, 2.0, frame="original", method="euler", dt=0.25)
    np.testing.assert_array_equal(np.asarray(lay.x), np.asarray(ref.x))
    assert lay.metadata()["run"]["solver"] == {"method": "euler", "dt": 0.25, "layers": 8}
    with pytest.raises(ValueError, match=r"leave method, rtol at the default"):
        af.simulate(m, X0, 1.0, solver=af.LayerSolver(0.5), method="euler", rtol=1e-3)
    with pytest.raises(ValueError, match="solver must be an attnflow solver object"):
        af.simulate(m, X0, 1.0, solver="tsit5")  # type: ignore[arg-type]


@pytest.mark.parametrize("layernorm", ["post", "pre", "peri", "ngpt", "mix", "scaled"])
def test_solve_runs_the_sphere_as_simulate_does(layernorm):
    """One engine: ``solve`` on the sphere with every layer-norm placement is simulate's
    run of the same layers, save for save."""
    m = af.Attention(Q, K, V)
    ts = np.array([0.0, 1.0, 2.0])
    sol = jax.jit(
        lambda x: af.solve(
            m, x, 2.0, ts=ts, frame="sphere", solver=af.LayerSolver(0.25), layernorm=layernorm
        )
    )(jnp.asarray(X0))
    ref = af.simulate(m, X0, 2.0, ts=ts, frame="sphere", method="euler", dt=0.25,
                      layernorm=layernorm)  # fmt: skip
    # the states are the layer-norm placements' own streams; their tokens are N(state)
    got = np.asarray(sol.ys) / np.linalg.norm(np.asarray(sol.ys), axis=-1, keepdims=True)
    np.testing.assert_allclose(got, np.asarray(ref.x), rtol=1e-12, atol=1e-13)
    assert int(sol.status) == 0 and int(sol.num_steps) == 8


def test_solve_runs_the_sphere_ode_and_the_authors_euler():
    m = af.Attention(Q, K, V)
    sol = af.solve(m, jnp.asarray(X0), 1.0, frame="sphere", solver=TIGHT)
    ref = af.simulate(m, X0, 1.0, frame="sphere", rtol=1e-11, atol=1e-12)
    x = np.asarray(sol.ys[-1]) / np.linalg.norm(np.asarray(sol.ys[-1]), axis=-1, keepdims=True)
    np.testing.assert_allclose(x, np.asarray(ref.x[-1]), rtol=1e-9, atol=1e-11)
    eul = af.solve(m, jnp.asarray(X0), 1.0, solver=af.EulerODESolver(0.125))
    ref_e = af.simulate(m, X0, 1.0, method="euler-ode", dt=0.125)
    np.testing.assert_allclose(np.asarray(eul.ys[-1]), np.asarray(ref_e.z[-1]), rtol=1e-12)
    # the authors' scheme by hand: z <- z + dt (P(e^{t_k V} z) z - z) V^T at t_k = k dt
    z = np.array(X0, np.float64)
    Vn = np.asarray(V, np.float64)
    from scipy.linalg import expm

    for k in range(8):
        x = z @ expm(k * 0.125 * Vn).T
        L = (x @ np.asarray(Q).T) @ (x @ np.asarray(K).T).T
        P = np.exp(L - L.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        z = z + 0.125 * (P @ z - z) @ Vn.T
    np.testing.assert_allclose(np.asarray(eul.ys[-1]), z, rtol=1e-11, atol=1e-12)


def test_one_layer_loop_for_solve_and_simulate():
    """``simulate``'s layers and ``solve``'s layers run the same loop: neither driver has
    a loop of its own, and the fixed-step solvers' loop is ``solvers.layer_loop``."""
    import importlib
    import inspect

    for name in ("simulate", "solve", "frames", "terms"):
        src = inspect.getsource(importlib.import_module(f"attnflow.dynamics.{name}"))
        loops = [ln for ln in src.splitlines() if "lax.scan(" in ln or "while_loop(" in ln]
        assert not loops, (name, loops)
    layers = inspect.getsource(importlib.import_module("attnflow.dynamics.solvers.layers"))
    assert layers.count("while_loop(") == 1


def test_statuses_tell_the_truth_about_inputs_solve_cannot_honour():
    m = af.Attention(Q, K, V)
    x0 = jnp.asarray(X0)
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="t1"):
            af.solve(m, x0, bad)
    with pytest.raises(ValueError, match="dt"):
        af.LayerSolver(float("inf"))
    with pytest.raises(ValueError, match="rtol"):
        af.AdaptiveSolver(rtol=float("inf"))
    with pytest.raises(ValueError, match="max_steps"):
        af.AdaptiveSolver(max_steps=10.5)  # type: ignore[arg-type]
    # concrete save times are checked at the door, by name
    with pytest.raises(ValueError, match="ts must lie within"):
        af.solve(m, x0, 1.0, ts=jnp.array([0.5, 2.0]))
    with pytest.raises(ValueError, match="multiples of dt"):
        af.solve(m, x0, 1.0, ts=jnp.array([0.3]), solver=af.LayerSolver(0.25))
    # traced ones the solve cannot honour give a failed status, never ok
    for solver in (TIGHT, af.LayerSolver(0.25)):
        run = jax.jit(lambda ts, s=solver: af.solve(m, x0, 1.0, ts=ts, solver=s).status)
        assert int(run(jnp.array([0.25, 1.0]))) == af.Status.OK.code
        for ts in ([0.5, 2.0], [1.0, 0.5], [0.3, 1.0] if solver is not TIGHT else [-0.5, 1.0]):
            assert int(run(jnp.asarray(ts))) == af.Status.FAILED.code, (solver, ts)


def test_user_error_checks_keep_the_process_mode_inside_attnflow_programs():
    """attnflow traces diffrax's own checks in its own mode (own_error_mode); the mode is
    restored for the user's checks right after."""
    from equinox import _errors

    before = _errors.EQX_ON_ERROR
    af.solve(af.Attention(Q, K, V), jnp.asarray(X0), 0.5, solver=TIGHT)
    assert before == _errors.EQX_ON_ERROR


def test_noise_refuses_every_option_it_would_drop():
    m = af.Attention(Q, K, V)
    noise = af.dynamics.Noise(0.1, seed=0)
    for option in (
        {"rtol": 1e-3},
        {"atol": 1e-3},
        {"max_steps": 10},
        {"shard": "tokens"},
    ):
        with pytest.raises(ValueError, match=next(iter(option))):
            af.simulate(m, X0, 1.0, frame="sphere", method="euler", dt=0.25, noise=noise,
                        **option)  # fmt: skip
    # the noisy layers run in the one layer loop, whose progress bar they share
    quiet = af.simulate(m, X0, 1.0, frame="sphere", method="euler", dt=0.25, noise=noise)
    shown = af.simulate(
        m, X0, 1.0, frame="sphere", method="euler", dt=0.25, noise=noise, progress=True
    )
    np.testing.assert_array_equal(np.asarray(shown.x), np.asarray(quiet.x))
