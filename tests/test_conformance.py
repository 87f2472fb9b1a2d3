"""The conformance suite: every family and kernel of ``families.CASES`` (the package's own
and a family defined outside it) through simulate in every frame and method, save/load,
``track_rank``, ``dispersion``, ``observe_limit`` and ``predict_regime``. What an analysis
reports of the attention must be the model's own attention to rounding; what it cannot
serve it refuses naming the method the family lacks."""

from __future__ import annotations

import numpy as np
import pytest
from families import CASES, SinkhornAttention, reference, sinkhorn_numpy

import attnflow as af
from attnflow.dynamics.base import AbstractAttentionSystem, AbstractModel

N, T1 = 6, 0.5
TS = np.linspace(0.0, T1, 4)


def _x0(d: int) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(N, d))


def _rescaled_serves(model: AbstractModel) -> bool:
    if model.propagator is None:
        return False
    return not isinstance(model, AbstractAttentionSystem) or model.rows_sum_to_one


def _head_attention(model, x, h=None) -> np.ndarray:
    return np.asarray(model.head(h).attention(x), np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_family_in_layers_in_both_frames(case):
    """The Euler layers: the rescaled frame's layers are the original frame's, rescaled
    (the default suite runs the adaptive solver in both frames)."""
    model = case.build()
    x0 = _x0(model.d)
    eul = af.simulate(model, x0, T1, frame="original", method="euler", dt=0.125)
    assert eul.status == "ok"
    if _rescaled_serves(model):
        res_e = af.simulate(model, x0, T1, method="euler", dt=0.125)
        np.testing.assert_allclose(
            np.asarray(res_e.x)[-1], np.asarray(eul.x)[-1], rtol=1e-9, atol=1e-12
        )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_family_through_every_frame_and_analysis(case, tmp_path):
    model = case.build()
    x0 = _x0(model.d)

    # ---- simulate: the original frame
    ode = af.simulate(model, x0, T1, ts=TS, frame="original", rtol=1e-10, atol=1e-10)
    assert ode.status == "ok", ode.status
    assert np.all(np.isfinite(np.asarray(ode.x)))

    # ---- the rescaled frame: the same tokens, or refused by name
    if _rescaled_serves(model):
        res = af.simulate(model, x0, T1, ts=TS, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(res.x), np.asarray(ode.x), rtol=1e-6, atol=1e-8)
    else:
        with pytest.raises(ValueError, match="frame='original'|propagator|value matrix"):
            af.simulate(model, x0, T1, ts=TS)
        res = None

    # ---- save and load: the same family, model and states
    path = tmp_path / "run.npz"
    ode.save(path)
    back = af.Trajectory.load(path)
    assert type(back.model) is type(model)
    assert back.model.describe() == model.describe()
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(ode.x))

    # ---- the model against what it reduces to
    ref = reference(model)
    if ref is not None:
        np.testing.assert_allclose(
            np.asarray(model.vector_field(x0)),
            np.asarray(ref.vector_field(x0)),
            rtol=1e-12,
            atol=1e-14,
        )
    if isinstance(model, SinkhornAttention):
        L = np.asarray(model.logits(x0))
        np.testing.assert_allclose(
            np.asarray(model.attention(x0)), sinkhorn_numpy(L, model.iters), rtol=1e-12
        )

    xs = np.asarray(ode.x)
    heads = model.num_heads
    # ---- track_rank: the column masses and leaders of the model's own attention
    if heads == 0:
        with pytest.raises(ValueError, match=r"head\(h\)"):
            af.track_rank(ode)
        with pytest.raises(ValueError, match=r"head\(h\)"):
            af.dispersion(ode, k=-1)
    else:
        h = None if heads == 1 else heads - 1
        if heads > 1:
            with pytest.raises(ValueError, match="head=0"):
                af.track_rank(ode)
        rt = af.track_rank(ode, head=h)
        for k in range(len(TS)):
            P = _head_attention(model, xs[k], h)
            np.testing.assert_array_equal(rt.attends_to[k], np.argmax(P, axis=-1))
        np.testing.assert_allclose(rt.column_mass, P.sum(0), rtol=1e-10, atol=1e-13)
        # ---- dispersion: the rows of the model's own attention
        rep = af.dispersion(ode, k=-1, head=h)
        P = _head_attention(model, xs[-1], h)
        np.testing.assert_allclose(rep.max, P.max(-1), rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(rep.row_sum, P.sum(-1), rtol=1e-10, atol=1e-13)
        rep2 = af.dispersion(model, x=xs[-1], rows=[0, 2], head=h)
        np.testing.assert_allclose(rep2.max, P.max(-1)[[0, 2]], rtol=1e-10, atol=1e-13)

    # ---- observe_limit: a measurement in the rescaled frame, or refused by name
    if model.propagator is None:
        with pytest.raises(ValueError, match="propagator"):
            af.observe_limit(ode)
    else:
        obs = af.observe_limit(res if res is not None else ode)
        assert isinstance(obs.label, af.Label)

    # ---- predict_regime: a theorem only for one head of plain softmax attention, with
    # nothing beyond it (no feed-forward term, no gate)
    reg = af.predict_regime(model)
    alone = heads == 1 and model.pure_attention and not model.beyond_attention
    one = model.head() if alone else None
    if one is not None and one.plain_softmax:
        Qm, Km = one.query_key_maps()
        assert reg.label == af.predict_regime(Qm, Km, one.value_matrix()).label
    else:
        assert reg.label == af.Label.UNCLASSIFIED, reg
        assert reg.theorem is None and reg.reason


def test_masked_and_other_kernels_are_not_given_a_theorem():
    I2 = np.eye(2)
    reg = af.predict_regime(af.Attention(I2, I2, I2, mask="causal"))
    assert reg.label == af.Label.UNCLASSIFIED and "mask" in reg.reason
    reg = af.predict_regime(af.Attention(I2, I2, I2, kernel="sigmoid"))
    assert reg.label == af.Label.UNCLASSIFIED and "sigmoid" in reg.reason
    assert af.predict_regime(af.Attention(I2, I2, I2)).label == af.Label.POLYTOPE


def test_a_family_without_a_registered_name_is_refused_on_load(tmp_path):
    class Unnamed(SinkhornAttention):  # a subclass that forgot its family name
        def describe(self) -> dict:
            return {**super().describe(), "family": "Unnamed"}

    m = Unnamed(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(m, _x0(2), 0.2, frame="original")
    traj.save(tmp_path / "u.npz")
    with pytest.raises(ValueError, match="family = "):
        af.Trajectory.load(tmp_path / "u.npz")
