"""Layer-norm placements as speed regulation (Karagodin, Ge, Polyanskiy and Rigollet 2025):
the sphere's layers of every placement against the equiangular model integrated by scipy,
their rates near one cluster against the closed forms, and Mix-LN and LayerNorm scaling
against plain numpy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import attnflow as af
from attnflow.analysis import asymptotic_rate, equiangular_layernorm
from attnflow.dynamics import frames
from attnflow.studies.sphere import phase_diagram

N, BETA, T1 = 8, 1.0, 20.0
TS = np.arange(0.0, T1 + 1e-9, 1.0)
MODEL = af.Attention(np.eye(N), np.eye(N), np.eye(N))


def _gap(ln: str, dt: float) -> np.ndarray:
    """``1 - gamma`` of the layers at ``TS`` (n = d orthogonal tokens)."""
    traj = af.simulate(
        MODEL, np.eye(N), T1, ts=TS, frame="sphere", method="euler", dt=dt, layernorm=ln
    )
    assert traj.status == "ok"
    x = np.asarray(traj.x, np.float64)
    G = np.einsum("mid,mjd->mij", x, x)
    off = ~np.eye(N, dtype=bool)
    spread = np.ptp(G[:, off], axis=1)
    assert np.all(spread < 1e-12), "the tokens left the equiangular configuration"
    return 1.0 - G[:, 0, 1]


def _reference(ln: str, dt: float) -> np.ndarray:
    kw = {}
    if ln == "mix":
        kw["t_switch"] = round(frames.MIX_POST_FRACTION * T1 / dt) * dt
    if ln == "scaled":
        kw["dt"] = dt
    return equiangular_layernorm(N, BETA, TS, ln, **kw).gap


@pytest.mark.parametrize("ln", frames.LAYERNORMS)
def test_layers_converge_to_the_equiangular_model_at_first_order(ln):
    errors = []
    for dt in (0.02, 0.01):
        got, want = _gap(ln, dt), _reference(ln, dt)
        keep = want > 1e-8  # post-LN reaches one cluster to rounding: relative error moot
        assert keep.sum() >= 5
        errors.append(np.max(np.abs(got[keep] / want[keep] - 1.0)))
    # relative error of 1 - gamma: O(dt), halving with the step
    assert errors[1] < 0.12, errors
    assert 1.7 < errors[0] / errors[1] < 2.3, errors


@pytest.mark.parametrize("ln", ["post", "ngpt", "pre", "peri", "mix"])
def test_rates_near_one_cluster_match_the_closed_forms(ln):
    gap = _gap(ln, 0.01)
    kind, rate = asymptotic_rate(ln)
    if kind == "exp":
        window = (TS >= 4) & (TS <= 8) if ln == "post" else (TS >= 14)
        slope = -np.polyfit(TS[window], np.log(gap[window]), 1)[0]
    else:
        window = TS >= 14
        # mix: pre-LN's stream starts again from norm 1 at the switch (t = 5)
        start = frames.MIX_POST_FRACTION * T1 - 1.0 if ln == "mix" else 0.0
        slope = -np.polyfit(np.log(TS[window] - start), np.log(gap[window]), 1)[0]
    # the layers' rate differs from the flow's by O(dt), the power laws by the offset of
    # r ~ t + const over the window (a few per cent at t ~ 17)
    assert slope == pytest.approx(rate, rel=0.05), (ln, slope, rate)


def test_scaled_layernorm_decays_like_one_over_t_eventually():
    # far beyond any run: the equiangular system itself (float64, DOP853)
    ts = np.array([0.0, 1e4, 2e4, 4e4])
    gap = equiangular_layernorm(N, BETA, ts, "scaled", dt=0.01).gap
    slope = -np.polyfit(np.log(ts[1:]), np.log(gap[1:]), 1)[0]
    assert slope == pytest.approx(asymptotic_rate("scaled")[1], rel=0.05)


def test_post_equals_the_equiangular_curve_of_the_sphere_flow():
    ts = np.linspace(0, 6, 13)
    got = equiangular_layernorm(N, BETA, ts, "post").gamma
    np.testing.assert_allclose(got, af.equiangular_curve(N, BETA, ts), rtol=1e-9, atol=1e-12)


def _normalize(u: np.ndarray) -> np.ndarray:
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _field(x: np.ndarray, A: np.ndarray, V: np.ndarray) -> np.ndarray:
    L = x @ A @ x.T
    P = np.exp(L - L.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return P @ x @ V.T


def test_mix_and_scaled_layers_against_numpy():
    rng = np.random.default_rng(3)
    n, d, dt, layers = 5, 3, 0.1, 8
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    model = af.Attention(Q, K, V)
    x0 = rng.normal(size=(n, d))
    A = Q.T @ K
    for ln in ("mix", "scaled"):
        traj = af.simulate(
            model, x0, layers * dt, frame="sphere", method="euler", dt=dt, layernorm=ln
        )
        y = _normalize(x0)
        for k in range(layers):
            if ln == "mix" and k < round(0.25 * layers):
                y = _normalize(y + dt * _field(y, A, V))
            else:
                depth = 1.0 if ln == "mix" else np.sqrt(k + 1)
                y = y + dt * _field(_normalize(y) / depth, A, V)
        np.testing.assert_allclose(np.asarray(traj.x[-1]), _normalize(y), rtol=1e-12, atol=1e-13)
        assert traj.solver["layernorm"] == ln
    assert traj.solver.get("post_layers") is None  # recorded for mix only
    mix = af.simulate(
        model, x0, layers * dt, frame="sphere", method="euler", dt=dt, layernorm="mix"
    )
    assert mix.solver["post_layers"] == 2


def test_pure_attention_with_layernorm_against_numpy():
    rng = np.random.default_rng(4)
    n, d = 6, 4
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    x0 = rng.normal(size=(n, d))
    traj = af.simulate(
        af.Attention(Q, K, V), x0, 3.0, frame="sphere", method="euler", dt=1.0, residual=False
    )
    y = _normalize(x0)
    for _ in range(3):
        y = _normalize(_field(y, Q.T @ K, V))
    np.testing.assert_allclose(np.asarray(traj.x[-1]), y, rtol=1e-12, atol=1e-13)
    assert not traj.has_z


def test_bad_placements_are_refused_by_name():
    with pytest.raises(ValueError, match="residual=False.*'post'"):
        af.simulate(
            MODEL,
            np.eye(N),
            1.0,
            frame="sphere",
            method="euler",
            dt=1.0,
            residual=False,
            layernorm="pre",
        )
    with pytest.raises(ValueError, match="residual=False"):
        af.simulate(MODEL, np.eye(N), 1.0, frame="rescaled", method="euler", dt=1.0, residual=False)
    with pytest.raises(ValueError, match="t_switch"):
        equiangular_layernorm(N, BETA, TS, "mix")
    with pytest.raises(ValueError, match="dt"):
        equiangular_layernorm(N, BETA, TS, "post", dt=0.1)
    with pytest.raises(ValueError, match="layernorm"):
        asymptotic_rate("middle")
    with pytest.raises(ValueError, match="depth"):
        phase_diagram([1.0], n=4, d=2, systems=2, t1=1.0, dt=0.5, layernorm="mix")


def test_the_analysis_uses_the_dynamics_constants():
    from attnflow.analysis import normalization

    assert normalization.NGPT_ALPHA == frames.NGPT_ALPHA
    assert normalization.PLACEMENTS == frames.LAYERNORMS
    assert jax.config.jax_enable_x64


def test_fig_normalization_quick(tmp_path):
    import json

    from attnflow.experiments import fig_normalization as F

    out = F.make(tmp_path, quick=True)
    assert out["figures"]
    side = json.loads((tmp_path / "fig_normalization.json").read_text())
    runs = {r["layernorm"]: r for r in side["runs"]}
    assert set(runs) == set(frames.LAYERNORMS)
    for ln in ("post", "ngpt", "peri", "mix"):  # dt = 0.05: the rates to a few per cent
        assert runs[ln]["fitted_rate"] == pytest.approx(runs[ln]["closed_form"]["rate"], rel=0.1)
    assert runs["scaled"]["reduced_rate_at_1e4"] == pytest.approx(1.0, rel=0.1)
    assert all(r["largest_spread_of_inner_products"] < 1e-12 for r in runs.values())
    assert "| peri | t^(-2) |" in (tmp_path / "fig_normalization.md").read_text()
