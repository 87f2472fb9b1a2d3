"""Independent noise on every token (``attnflow.dynamics.TokenNoise``) through the one
engine: one step of each scheme against numpy with the run's own increments, the
Brownian motion on the sphere against its closed-form decay, ``solve`` against
``simulate``, gradients through a fixed path against central differences, and the
refusals."""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.dynamics import Noise, TokenNoise
from attnflow.dynamics.solvers import EulerMaruyamaSolver

D, N, B = 3, 6, 8


def _model() -> af.Attention:
    rng = np.random.default_rng(1)
    V = np.eye(D) + 0.5 * rng.normal(size=(D, D))
    return af.Attention(rng.normal(size=(D, D)), rng.normal(size=(D, D)), V, beta=1.0)


def _x0(b: int = B) -> np.ndarray:
    return np.random.default_rng(2).normal(size=(b, N, D))


def _unit(u: np.ndarray) -> np.ndarray:
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _field(model, x: np.ndarray) -> np.ndarray:
    """``F = P x V^T`` with the softmax written here."""
    Q, K, V = (np.asarray(a, np.float64) for a in (model.Q, model.K, model.V))
    L = float(model.beta) * (x @ Q.T) @ (x @ K.T).T
    P = np.exp(L - L.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return P @ x @ V.T


def test_token_noise_checks_its_arguments_by_name():
    assert TokenNoise(0.5, np.int64(3)) == TokenNoise(0.5, 3)  # pyright: ignore[reportArgumentType]
    assert TokenNoise(0).D == 0.0
    for bad in (-0.1, math.nan, math.inf, "1", True):
        with pytest.raises(ValueError, match="D must"):
            TokenNoise(bad)  # pyright: ignore[reportArgumentType]
    for seed in (-1, 2**31, 1.5, "0"):
        with pytest.raises(ValueError, match="seed"):
            TokenNoise(0.1, seed)  # pyright: ignore[reportArgumentType]


def test_one_step_of_each_scheme_against_numpy():
    """``N(x + dt F + sqrt(2 D) dB)`` and the Euler-Maruyama step
    ``N(x + dt (Proj F - D (d - 1) x) + sqrt(2 D) Proj dB)``, in numpy, with the run's
    first increment of system i's path."""
    model, x0, Dc, dt = _model(), _x0(), 0.3, 2**-6
    ts = np.array([0.0, dt])
    noise = TokenNoise(Dc, seed=5)
    kw: dict[str, Any] = dict(ts=ts, frame="sphere", dt=dt, noise=noise)
    layers = np.asarray(af.simulate(model, x0, 1.0, method="euler", **kw).x[:, 1])
    em = np.asarray(af.simulate(model, x0, 1.0, method="euler-maruyama", **kw).x[:, 1])
    for i in (0, 3, B - 1):
        x = _unit(x0[i])
        dB = np.asarray(noise.path(1.0, N, D, dt, system=i).evaluate(dt))
        F = _field(model, x)
        kick = math.sqrt(2 * Dc) * dB
        np.testing.assert_allclose(layers[i], _unit(x + dt * F + kick), rtol=0, atol=1e-12)

        def proj(v, x=x):
            return v - np.sum(x * v, axis=-1, keepdims=True) * x

        ref = _unit(x + dt * (proj(F) - Dc * (D - 1) * x) + proj(kick))
        np.testing.assert_allclose(em[i], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["euler", "euler-maruyama"])
@pytest.mark.parametrize("d", [2, 3])
def test_brownian_motion_on_the_sphere_decays_at_its_closed_form_rate(method, d):
    """With ``V = 0`` the field vanishes and every token is Brownian motion on
    ``S^{d-1}`` with generator ``D Delta``: ``E <x_t, x_0> = e^{-D (d - 1) t}`` (the
    first harmonics' eigenvalue ``d - 1``; a rate off by a factor 1.5 moves the mean by
    more than 0.1). 1,024 tokens, weak error O(dt)."""
    model = af.Attention(np.eye(d), np.eye(d), np.zeros((d, d)))
    Dc, t1, dt = 0.4, 1.0, 1 / 32
    x0 = np.random.default_rng(0).normal(size=(2, 512, d))
    traj = af.simulate(
        model, x0, t1, frame="sphere", method=method, dt=dt, noise=TokenNoise(Dc, seed=3)
    )
    x = np.asarray(traj.x)
    cos = np.sum(x[:, -1] * x[:, 0], axis=-1).ravel()
    want = math.exp(-Dc * (d - 1) * t1)
    se = cos.std(ddof=1) / math.sqrt(cos.size)
    assert abs(cos.mean() - want) < 4 * se + 0.01, (cos.mean(), want, se)
    assert np.max(np.abs(np.linalg.norm(x, axis=-1) - 1)) < 1e-12


def test_solve_runs_the_path_of_the_first_system_and_takes_gradients():
    """``solve(noise=...)`` is system 0 of ``simulate``; with the path fixed, the loss
    is smooth in the weights and the token start, and ``eqx.filter_grad`` through the
    noisy layers agrees with central differences."""
    model, x0, dt = _model(), _x0(2), 0.125
    noise = TokenNoise(0.2, seed=4)
    traj = af.simulate(model, x0, 1.0, frame="sphere", method="euler", dt=dt, noise=noise)
    for solver in (af.LayerSolver(dt), EulerMaruyamaSolver(dt)):
        sol = af.solve(model, jnp.asarray(x0[0]), 1.0, frame="sphere", solver=solver, noise=noise)
        assert int(sol.status) == 0
        if isinstance(solver, af.LayerSolver):
            np.testing.assert_allclose(
                np.asarray(sol.ys[-1]), np.asarray(traj.x[0, -1]), atol=1e-13
            )
        target = np.random.default_rng(7).normal(size=(N, D))

        @eqx.filter_jit
        def loss(m, solver=solver, target=target):
            s = af.solve(m, jnp.asarray(x0[0]), 1.0, frame="sphere", solver=solver, noise=noise)
            return jnp.sum(s.ys[-1] * target)

        grad = eqx.filter_grad(loss)(model)
        for name in ("V", "Q"):
            for idx in ((0, 1), (2, 0)):
                h = 1e-6
                plus = eqx.tree_at(
                    lambda m, n=name: getattr(m, n), model, getattr(model, name).at[idx].add(h)
                )
                minus = eqx.tree_at(
                    lambda m, n=name: getattr(m, n), model, getattr(model, name).at[idx].add(-h)
                )
                fd = (float(loss(plus)) - float(loss(minus))) / (2 * h)
                got = float(getattr(grad, name)[idx])
                assert abs(got - fd) < 1e-6 * max(1.0, abs(fd)), (name, idx, got, fd)


def test_any_model_takes_token_noise_and_refusals_name_the_argument():
    I = np.eye(D)
    multi = af.MultiHeadAttention(np.stack([I, I]), np.stack([I, I]), np.stack([I, -I]))
    x0 = _x0(2)
    traj = af.simulate(
        multi, x0, 0.5, frame="sphere", method="euler", dt=0.125, noise=TokenNoise(0.1)
    )
    assert traj.ok and traj.solver["noise"]["kind"] == "token"
    with pytest.raises(ValueError, match="one attention head"):
        af.simulate(multi, x0, 0.5, frame="sphere", method="euler", dt=0.125, noise=Noise(0.1))
    model = _model()
    cases: list[tuple[dict[str, Any], str]] = [
        (dict(frame="original", method="euler", dt=0.125), "frame='sphere'"),
        (dict(frame="sphere", method="adaptive"), "euler-maruyama"),
        (dict(frame="sphere", method="euler-ode", dt=0.125), "euler-maruyama"),
        (dict(frame="sphere", method="euler", dt=0.125, layernorm="pre"), "layernorm='post'"),
        (dict(frame="sphere", method="euler", dt=0.125, devices="all"), "devices"),
    ]
    for kw, what in cases:
        with pytest.raises(ValueError, match=what):
            af.simulate(model, x0, 0.5, noise=TokenNoise(0.1), **kw)
    # the value noise reads the head's attention average: the dense field serves it, the
    # circle field is refused by name (in both doors); token noise takes the circle field
    circle = af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=2.0)
    on_circle = np.random.default_rng(3).normal(size=(1100, 2))
    kw: dict[str, Any] = dict(frame="sphere", method="euler", dt=0.25)
    with pytest.raises(ValueError, match="field='circle' cannot serve Noise"):
        af.simulate(circle, on_circle, 0.5, noise=Noise(0.1), field="circle", **kw)
    with pytest.raises(ValueError, match="field='circle' cannot serve Noise"):
        af.solve(circle, jnp.asarray(on_circle), 0.5, frame="sphere",
                 solver=af.LayerSolver(0.25), noise=Noise(0.1), field="circle")  # fmt: skip
    assert af.simulate(circle, on_circle, 0.5, noise=Noise(0.1), **kw).solver["field"] == "dense"
    token = af.simulate(circle, on_circle, 0.5, noise=TokenNoise(0.1), **kw)
    assert token.solver["field"] == "circle"
    with pytest.raises(ValueError, match="give noise"):
        af.simulate(model, x0, 0.5, frame="sphere", method="euler-maruyama", dt=0.125)
    x = jnp.asarray(x0[0])
    with pytest.raises(ValueError, match="fixed steps"):
        af.solve(model, x, 0.5, frame="sphere", noise=TokenNoise(0.1))
    with pytest.raises(ValueError, match="on the sphere"):
        af.solve(
            model, x, 0.5, frame="original", solver=af.LayerSolver(0.125), noise=TokenNoise(0.1)
        )
    with pytest.raises(ValueError, match="noise must be"):
        af.solve(model, x, 0.5, frame="sphere", solver=af.LayerSolver(0.125), noise=0.1)  # pyright: ignore[reportArgumentType]


def test_a_noisy_run_saves_and_loads(tmp_path):
    model = af.IsotropicAttention(2, beta=2.0)
    x0 = np.random.default_rng(0).normal(size=(16, 2))
    traj = af.simulate(
        model, x0, 1.0, frame="sphere", method="euler", dt=0.125, noise=TokenNoise(0.2, 1)
    )
    back = af.Trajectory.load(traj.save(tmp_path / "run"))
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
    assert back.saved_metadata is not None
    rec = back.saved_metadata["run"]["solver"]["noise"]
    assert (rec["kind"], rec["D"], rec["seed"]) == ("token", 0.2, 1)
    assert jax.config.read("jax_enable_x64")


@pytest.mark.slow  # about a minute on the shared 2-core machine
def test_fig_token_noise_quick(tmp_path):
    """The figure's quick run: far below the critical noise both starts cluster (r well
    above the uniform floor), far above it on the continuous side both are near the
    floor; every cell records its seeds and D_c is predict_noise_threshold's."""
    import json

    from attnflow.experiments import fig_token_noise as F

    F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_token_noise.json").read_text())
    assert side["seeds"] and side["n"] == 1024
    for p in side["betas"]:
        assert p["D_c"] == pytest.approx(af.predict_noise_threshold(p["beta"], d=2).noise)
        low = p["ratios"].index(min(p["ratios"]))
        for start in ("uniform", "cluster"):
            assert p["starts"][start]["mean"][low] > 10 * p["uniform_floor"], (p["beta"], start)
    cont = side["betas"][0]
    assert cont["continuous"]
    high = cont["ratios"].index(max(cont["ratios"]))
    for start in ("uniform", "cluster"):
        assert cont["starts"][start]["mean"][high] < 4 * cont["uniform_floor"]


@pytest.mark.parametrize("kind", ["value", "token"])
def test_a_new_strength_or_seed_is_a_new_value_not_a_new_program(kind, monkeypatch):
    """The noise's strength and seed enter the compiled loop as values: a sweep over
    sigma (or D) and seeds traces the stochastic step once."""
    from attnflow.dynamics import Noise, TokenNoise
    from attnflow.dynamics.terms import NoisyTerm

    traces = []
    step = NoisyTerm.carry_step

    def counted(self, *args):
        traces.append(1)
        return step(self, *args)

    monkeypatch.setattr(NoisyTerm, "carry_step", counted)
    model = af.IsotropicAttention(3, beta=1.5)
    x0 = np.random.default_rng(5).normal(size=(2, 7, 3))
    make = Noise if kind == "value" else TokenNoise
    finals = []
    for i, level in enumerate((0.31, 0.62, 0.93)):
        traj = af.simulate(
            model, x0, 0.5, frame="sphere", method="euler", dt=0.125, noise=make(level, seed=i)
        )
        finals.append(np.asarray(traj.x[:, -1]))
        if i == 0:
            first = len(traces)
    assert first >= 1 and len(traces) == first
    assert not np.allclose(finals[0], finals[1]) and not np.allclose(finals[1], finals[2])
    # the same strength and seed again: the same numbers
    again = af.simulate(
        model, x0, 0.5, frame="sphere", method="euler", dt=0.125, noise=make(0.93, seed=2)
    )
    np.testing.assert_array_equal(np.asarray(again.x[:, -1]), finals[2])
