"""The stochastic transformer (``attnflow.dynamics.stochastic``) and the two-token
analysis (``attnflow.analysis.noise``): the layers and the Euler-Maruyama scheme against
plain-numpy references, the deterministic layers, each other and a fine reference path;
the inner product's SDE against one-step moments of the layers; the antipodal exponent
and outcome probabilities against simulated pairs."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.noise import (
    antipodal_exponent,
    antipodal_fraction,
    antipodal_probability,
    antipodal_threshold,
    collapse_exponent,
    rho_sde,
)
from attnflow.dynamics import Noise, noisy_layer, simulate_noisy

D, N, B = 3, 6, 16  # the shared set-up (one compiled solve per method)


def _model() -> af.Attention:
    rng = np.random.default_rng(1)
    V = np.eye(D) + 0.5 * rng.normal(size=(D, D))
    return af.Attention(rng.normal(size=(D, D)), rng.normal(size=(D, D)), V, beta=1.0)


def _x0(b: int = B) -> np.ndarray:
    return np.random.default_rng(2).normal(size=(b, N, D))


def _numpy_parts(model, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``m = P x`` and ``F = m V^T`` with the softmax computed here, in numpy."""
    Q, K, V = (np.asarray(a, np.float64) for a in (model.Q, model.K, model.V))
    L = float(model.beta) * (x @ Q.T) @ (x @ K.T).T
    P = np.exp(L - L.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    m = P @ x
    return m, m @ V.T


def _unit(u: np.ndarray) -> np.ndarray:
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


# ----------------------------------------------------------------- arguments
def test_noise_checks_its_arguments_by_name():
    assert Noise(0.5, np.int64(3)) == Noise(0.5, 3)  # pyright: ignore[reportArgumentType]
    assert Noise(0, 0).sigma == 0.0
    for sigma in (-0.1, math.nan, math.inf, "1", [1.0], True):
        with pytest.raises(ValueError, match="sigma"):
            Noise(sigma, 0)  # pyright: ignore[reportArgumentType]
    for seed in (-1, 1.5, True, "3", 2**31):
        with pytest.raises(ValueError, match="seed"):
            Noise(1.0, seed)  # pyright: ignore[reportArgumentType]


def test_refusals_name_what_is_wrong():
    model, noise, x0 = _model(), Noise(1.0, 0), _x0(1)[0]
    I = np.eye(D)
    multi = af.MultiHeadAttention(np.stack([I, I]), np.stack([I, I]), np.stack([I, I]))
    cases = [
        (multi, "one attention head"),
        (af.Block(model), "one attention head"),
        (af.Attention(np.stack([I, I]), np.stack([I, I]), np.stack([I, I])), "stacked"),
        (af.GatedAttention(model, np.zeros((1, D))), "one attention head"),
        ("model", "attnflow model"),
    ]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            simulate_noisy(bad, x0, 1.0, noise=noise, dt=0.5)  # pyright: ignore[reportArgumentType]
    for kw, msg in [
        (dict(dt=0.0), "dt"),
        (dict(dt=-0.1), "dt"),
        (dict(dt=math.nan), "dt"),
        (dict(dt=0.3), "dt"),  # 1.0 is not a whole number of layers of 0.3
        (dict(dt=0.25, ts=[0.0, 0.3]), "ts"),
        (dict(dt=0.25, method="milstein"), "method"),
        (dict(dt=0.25, noise=0.5), "noise"),
    ]:
        args = {"noise": noise, **kw}
        with pytest.raises(ValueError, match=msg):
            simulate_noisy(model, x0, 1.0, **args)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="x0"):
        simulate_noisy(model, np.zeros((0, D)), 1.0, noise=noise, dt=0.5)
    with pytest.raises(ValueError, match="zero"):
        simulate_noisy(model, np.zeros((4, D)), 1.0, noise=noise, dt=0.5)


# ------------------------------------------------------- the schemes themselves
@pytest.mark.parametrize("method", ["layers", "euler-maruyama"])
def test_tokens_stay_on_the_sphere(method, tmp_path):
    ts = np.array([0.0, 1.0])
    traj = simulate_noisy(_model(), _x0(), 1.0, noise=Noise(1.5, 4), dt=2**-7, ts=ts, method=method)
    assert traj.ok and traj.frame == "sphere" and traj.x.shape == (B, 2, N, D)
    norms = np.linalg.norm(np.asarray(traj.x), axis=-1)
    assert np.max(np.abs(norms - 1)) < 1e-12
    # the tokens moved (sigma = 1.5 over one unit of time)
    assert np.min(np.linalg.norm(np.asarray(traj.x[:, 1] - traj.x[:, 0]), axis=-1)) > 1e-3
    # the noise is recorded with the run and lands in the saved file
    noise = traj.metadata()["run"]["solver"]["noise"]
    engine = {"layers": "euler", "euler-maruyama": "euler-maruyama"}[method]
    assert (noise["sigma"], noise["seed"], traj.solver["method"]) == (1.5, 4, engine)
    back = af.Trajectory.load(traj.save(tmp_path / "run"))
    assert back.saved_metadata is not None
    assert back.saved_metadata["run"]["solver"]["noise"]["seed"] == 4
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))


def test_sigma_zero_is_the_deterministic_sphere_layers():
    model, x0, dt = _model(), _x0(), 2**-7
    ts = np.array([0.0, 1.0])
    det = af.simulate(model, x0, 1.0, ts=ts, frame="sphere", method="euler", dt=dt)
    got = simulate_noisy(model, x0, 1.0, ts=ts, noise=Noise(0.0, 0), dt=dt)
    np.testing.assert_allclose(np.asarray(got.x), np.asarray(det.x), rtol=0, atol=1e-14)


def test_one_step_of_each_scheme_against_numpy():
    """Layer and Euler-Maruyama step from the module docstring's formulas, written here
    in numpy (softmax included), with the run's own first Brownian increment."""
    model, x0, sigma, dt = _model(), _x0(), 0.8, 2**-7
    ts = np.array([0.0, dt])
    noise = Noise(sigma, 5)
    layers = np.asarray(simulate_noisy(model, x0, 1.0, noise=noise, dt=dt, ts=ts).x[:, 1])
    em = simulate_noisy(model, x0, 1.0, noise=noise, dt=dt, ts=ts, method="euler-maruyama")
    em = np.asarray(em.x[:, 1])
    c = (D - 1) / (2 * D)
    for i in (0, 7, B - 1):
        x = _unit(x0[i])
        dW = np.asarray(noise.path(1.0, D, dt, system=i).evaluate(0.0, dt)) / math.sqrt(D)
        m, F = _numpy_parts(model, x)
        ref_layer = _unit(x + dt * F + sigma * m @ dW.T)
        np.testing.assert_allclose(layers[i], ref_layer, rtol=0, atol=1e-12)

        def proj(v, x=x):
            return v - np.sum(x * v, axis=-1, keepdims=True) * x

        mm = np.sum(m * m, axis=-1, keepdims=True)
        ref_em = _unit(x + dt * (proj(F) - c * sigma**2 * mm * x) + sigma * proj(m @ dW.T))
        np.testing.assert_allclose(em[i], ref_em, rtol=0, atol=1e-12)
    # noisy_layer alone, any increment
    dW = np.random.default_rng(3).normal(size=(D, D)) * math.sqrt(0.1 / D)
    x = _unit(x0[0])
    m, F = _numpy_parts(model, x)
    got = np.asarray(noisy_layer(model, x, 0.1, sigma=2.0, dW=dW))
    np.testing.assert_allclose(got, _unit(x + 0.1 * F + 2.0 * m @ dW.T), rtol=0, atol=1e-12)


def test_each_system_has_its_own_path():
    model, x0, noise = _model(), _x0(), Noise(1.0, 9)
    x0[1] = x0[0]  # the same start, another path
    ts = np.array([0.0, 1.0])
    batch = np.asarray(simulate_noisy(model, x0, 1.0, noise=noise, dt=2**-7, ts=ts).x)
    one = np.asarray(simulate_noisy(model, x0[0], 1.0, noise=noise, dt=2**-7, ts=ts).x)
    np.testing.assert_allclose(one, batch[0], rtol=0, atol=1e-14)  # one system = system 0
    assert np.max(np.abs(batch[1, -1] - batch[0, -1])) > 1e-2


def _slope(dts, errors) -> float:
    return float(np.polyfit(np.log(dts), np.log(errors), 1)[0])


def test_strong_convergence_on_one_path():
    """Sixteen systems, each on its own path, sigma = 1: the error at t = 1 (largest token
    distance, averaged over the systems) of Euler-Maruyama and of the layers at dt =
    2^-3 .. 2^-7 against Euler-Maruyama at 2^-11 on the same paths.

    Measured fitted slopes (noise seeds 0-7): 0.53-0.66 (EM) and 0.45-0.61 (layers), 0.66
    and 0.61 for seed 0; strong order 1/2 (the noise does not commute), the fit pulled up
    a little by the drift's O(dt) error. At sigma = 0.2 the same fit gives 1.01 and 1.01:
    there the drift's O(dt) error outweighs the noise's O(sigma^2 dt^(1/2)) one at these
    steps, a pre-asymptotic slope of 1, not a higher order."""
    model, x0, noise = _model(), _x0(), Noise(1.0, 0)
    ts = np.array([0.0, 1.0])

    def final(dt, method):
        traj = simulate_noisy(model, x0, 1.0, noise=noise, dt=dt, ts=ts, method=method)
        return np.asarray(traj.x[:, -1])

    ref = final(2.0**-11, "euler-maruyama")
    dts = 2.0 ** -np.arange(3, 8)
    err = {
        method: np.array(
            [np.linalg.norm(final(h, method) - ref, axis=-1).max(-1).mean() for h in dts]
        )
        for method in ("euler-maruyama", "layers")
    }
    for method, e in err.items():
        assert np.all(np.diff(e) < 0), (method, e)
        assert 0.35 < _slope(dts, e) < 0.75, (method, e, _slope(dts, e))
    # the layers at 2^-11 sit on the SDE's path too: order 1/2 puts them about a quarter
    # of their error at 2^-7 away (measured 0.0072 against 0.041)
    gap = np.linalg.norm(final(2.0**-11, "layers") - ref, axis=-1).max(-1).mean()
    assert gap < 0.4 * err["layers"][-1]


# ------------------------------------------------------------ two tokens: the theory
def test_closed_forms_agree_with_the_rho_sde():
    for beta, sigma, d in [(1.0, 1.0, 3), (2.0, 0.5, 5), (0.7, 2.0, 2), (3.0, 0.3, 40)]:
        h = 1e-6
        a0, _ = rho_sde(-1.0, beta, sigma, d)
        a1, b1 = rho_sde(-1.0 + h, beta, sigma, d)
        assert abs(a0) < 1e-15
        lam = (a1 - a0) / h - (b1 / h) ** 2 / 2
        assert abs(lam - antipodal_exponent(beta, sigma, d)) < 1e-4
        a1, b1 = rho_sde(1.0 - h, beta, sigma, d)
        assert abs(-a1 / h - (b1 / h) ** 2 / 2 - collapse_exponent(beta, sigma, d)) < 1e-4
        s2c = antipodal_threshold(beta, d)
        if math.isfinite(s2c):
            assert abs(antipodal_exponent(beta, math.sqrt(s2c), d)) < 1e-12
    # the threshold exists iff (d - 1) tanh(beta)^2 > d - 3
    assert antipodal_threshold(1.0, 5) < math.inf and antipodal_threshold(1.0, 6) == math.inf
    lam = antipodal_exponent(1.0, np.array([0.0, 1.0, 10.0]), 8)
    assert np.all(lam > 0) and np.all(np.diff(lam) > 0)  # d = 8: more noise repels more
    for bad in [dict(beta=0.0), dict(beta=math.nan), dict(sigma=-1.0), dict(d=1), dict(d=2.5)]:
        args = {"beta": 1.0, "sigma": 1.0, "d": 3, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            antipodal_exponent(**args)


def _pair(rho: float, d: int, rng) -> np.ndarray:
    """Two unit tokens in R^d with inner product rho, in a random plane."""
    e, _ = np.linalg.qr(rng.normal(size=(d, 2)))
    return np.stack([e[:, 0], rho * e[:, 0] + math.sqrt(1 - rho * rho) * e[:, 1]])


def test_rho_sde_matches_one_step_moments_of_the_layers():
    """Independent check of the derivation: one layer of step dt from a pair at rho, over
    20,000 antithetic pairs of increments (dW, -dW), gives a mean change a(rho) dt and a
    variance b(rho)^2 dt, to O(dt) and the sampling error."""
    d, beta, sigma, dt, k = 4, 1.0, 1.2, 1e-3, 20_000
    model = af.Attention(np.eye(d), np.eye(d), np.eye(d), beta=beta)
    rng = np.random.default_rng(0)
    dW = rng.normal(size=(k, d, d)) * math.sqrt(dt / d)
    step = jax.jit(jax.vmap(lambda x, w: noisy_layer(model, x, dt, sigma=sigma, dW=w), (None, 0)))
    for rho in (-0.9, -0.3, 0.4, 0.85):
        x = _pair(rho, d, rng)
        up, down = (np.asarray(step(x, s * dW)) for s in (1.0, -1.0))
        r_up = np.sum(up[:, 0] * up[:, 1], -1) - rho
        r_down = np.sum(down[:, 0] * down[:, 1], -1) - rho
        a, b = rho_sde(rho, beta, sigma, d)
        mean = (r_up + r_down) / 2
        se = mean.std() / math.sqrt(k)
        assert abs(mean.mean() / dt - a) < 4 * se / dt + 0.01 * abs(a) + 0.02, (rho, a)
        var = np.var(r_up) / dt
        assert abs(var / b**2 - 1) < 0.04, (rho, var, b**2)


BETA, PAIRS = 1.0, 128  # two tokens in d = 3: the threshold is sigma^2 = 1.233


def _pairs(x0, sigma2, t1, seed=1) -> np.ndarray:
    model = af.Attention(np.eye(3), np.eye(3), np.eye(3), beta=BETA)
    noise = Noise(math.sqrt(sigma2), seed)
    traj = simulate_noisy(model, x0, t1, noise=noise, dt=0.02, ts=np.array([0.0, t1]))
    assert traj.ok
    return np.asarray(traj.x)


def test_antipodal_outcomes_on_both_sides_of_the_threshold():
    """Pairs from uniform starts: below the threshold (sigma^2 = 0.3, lambda = +0.36) every
    pair collapses; above it (sigma^2 = 5, lambda = -1.46) the antipodal share is the
    scale-function prediction 0.163 (measured 0.203, 128 pairs; 0.18 with 256)."""
    x0 = np.random.default_rng(0).normal(size=(PAIRS, 2, 3))
    assert antipodal_threshold(BETA, 3) == pytest.approx(1.2331, abs=1e-4)
    for sigma2, predicted in [(0.3, 0.0), (5.0, antipodal_fraction(BETA, math.sqrt(5.0), 3))]:
        x = _pairs(x0, sigma2, 12.0)[:, -1]
        rho = np.sum(x[:, 0] * x[:, 1], -1)
        settled = np.mean(np.abs(rho) > 0.99)
        share = np.mean(rho < -0.99)
        assert settled > 0.9
        if predicted == 0.0:
            assert antipodal_exponent(BETA, math.sqrt(sigma2), 3) > 0 and share == 0.0
        else:
            assert antipodal_exponent(BETA, math.sqrt(sigma2), 3) < 0
            se = math.sqrt(predicted * (1 - predicted) / PAIRS)
            assert abs(share - predicted) < 3 * se, (share, predicted)
    # the probability from a given start: high near -1, small near 1
    p = antipodal_probability([-0.9, 0.0, 0.9], BETA, math.sqrt(5.0), 3)
    assert 0.4 < p[0] < 0.6 and p[2] < 0.01 and np.all(np.diff(p) < 0)


def test_lyapunov_exponent_monte_carlo():
    """Pairs started at u = 1 + rho = 1e-12 stay in the linear regime: the mean growth
    rate of log u over t1 estimates the antipodal exponent (stderr b / sqrt(t1 pairs))."""
    rng = np.random.default_rng(4)
    x0 = np.empty((PAIRS, 2, 3))
    for i in range(PAIRS):
        x0[i] = _pair(-1.0 + 1e-12, 3, rng)
    for sigma2, t1 in [(0.3, 8.0), (5.0, 4.0)]:
        x = _pairs(x0, sigma2, t1, seed=2)
        u = np.sum((x[:, :, 0] + x[:, :, 1]) ** 2, -1) / 2  # 1 + rho without cancellation
        rate = np.log(u[:, 1] / u[:, 0]) / t1
        lam = antipodal_exponent(BETA, math.sqrt(sigma2), 3)
        se = rate.std() / math.sqrt(PAIRS)
        assert np.max(u) < 1e-4  # still linear
        assert abs(rate.mean() - lam) < 4 * se + 0.05, (sigma2, rate.mean(), lam, se)


# ------------------------------------------------------------------------ figure
@pytest.mark.slow  # 9-15 s on the shared 2-core machine, most of it compiling
def test_fig_noise_quick(tmp_path):
    from attnflow.experiments import fig_noise as F

    res = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / f"{F.NAME}.json").read_text())
    assert (tmp_path / f"{F.NAME}.png").is_file()
    two = side["two_tokens"]
    lam = np.asarray(two["exponent"])  # (d, sigma^2)
    frac = np.asarray(two["antipodal_fraction"])
    # finite depth: near lambda = 0 pairs linger by the antipodal point (a log-normal
    # walk of drift lambda); away from it the sign of lambda decides
    assert np.any(lam > 0.2) and np.all(frac[lam > 0.2] == 0.0)
    assert np.any(lam < -0.3) and np.all(frac[lam < -0.3] > 0.0)
    # n = 16 tokens, beta = 3: without noise the mean <x_i, x_j> rises towards one
    # cluster; with sigma^2 = 1 every run splits into two antipodal clusters
    many = side["many_tokens"]
    cos, absolute = many["final_mean_cosine"], many["final_mean_abs_cosine"]
    assert cos["0"] - cos["1"] > 0.3
    assert absolute["1"] > 0.99 and many["runs_not_collapsed"]["1"] == 1.0
    assert res["figures"] and "| 3 | 1.233 |" in (tmp_path / f"{F.NAME}.md").read_text()


def test_simulate_takes_the_noise():
    import attnflow as af
    from attnflow.dynamics import Noise, simulate_noisy

    model = af.IsotropicAttention(3, beta=1.0)
    x0 = np.random.default_rng(0).normal(size=(8, 3))
    for method, scheme in (("euler", "layers"), ("euler-maruyama", "euler-maruyama")):
        got = af.simulate(
            model, x0, 1.0, frame="sphere", method=method, dt=0.125, noise=Noise(0.5, seed=1)
        )
        want = simulate_noisy(model, x0, 1.0, noise=Noise(0.5, seed=1), dt=0.125, method=scheme)
        np.testing.assert_array_equal(np.asarray(got.x), np.asarray(want.x))
        assert got.solver["noise"]["seed"] == 1 and got.solver["method"] == method
    post = af.simulate(
        model, x0, 1.0, frame="sphere", method="euler", dt=0.125, layernorm="post", noise=Noise(0.5)
    )
    assert post.status == "ok"
    for kw, what in (
        (dict(frame="rescaled", method="euler", dt=0.125), "frame='sphere'"),
        (dict(frame="sphere", method="tsit5"), "euler-maruyama"),
        (dict(frame="sphere", method="euler", dt=0.125, layernorm="pre"), "layernorm"),
        (dict(frame="sphere", method="euler", dt=0.125, chunk=2), "chunk"),
        (dict(frame="sphere", method="euler"), "dt is required"),
    ):
        with pytest.raises(ValueError, match=what):
            af.simulate(model, x0, 1.0, noise=Noise(0.5), **kw)
