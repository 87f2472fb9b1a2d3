"""Gated attention (Qiu et al. 2025, G1): the field against a numpy reference, element-wise
and head-wise; the gate's independence of the number of keys; what the analyses do with
it; saved forms and errors."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af

RNG = np.random.default_rng(8)
D = 3
Q, K, V = np.eye(D) + 0.3 * RNG.normal(size=(3, D, D))
X = RNG.normal(size=(7, D))


def softmax_rows(L):
    E = np.exp(L - L.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def sigmoid(u):
    return 1 / (1 + np.exp(-u))


@pytest.mark.parametrize("rows", [D, 1], ids=["element", "head"])
def test_gated_field_and_layer_against_numpy(rows):
    Wg, bg = RNG.normal(size=(rows, D)), RNG.normal(size=rows)
    head = af.Attention(Q, K, V, beta=0.7)
    g = af.GatedAttention(head, Wg, bg)
    assert g.kind == ("element" if rows == D else "head")
    gate = sigmoid(X @ Wg.T + bg)
    P = softmax_rows(0.7 * (X @ Q.T) @ (X @ K.T).T)
    field = gate * (P @ X @ V.T)
    np.testing.assert_allclose(np.asarray(g.gate(X)), gate, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g.vector_field(X)), field, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g.layer(X, 0.1)), X + 0.1 * field, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g.attention(X)), P, rtol=1e-12)  # P is the head's
    # Euler layers of the simulator against numpy
    tr = af.simulate(g, X, 0.5, frame="original", method="euler", dt=0.1)
    x = X.copy()
    for _ in range(5):
        x = x + 0.1 * sigmoid(x @ Wg.T + bg) * (
            softmax_rows(0.7 * (x @ Q.T) @ (x @ K.T).T) @ x @ V.T
        )
    np.testing.assert_allclose(np.asarray(tr.x[-1]), x, rtol=1e-12)


def test_the_gate_does_not_depend_on_the_number_of_keys():
    """A needle's softmax share falls like 1/(1 + (n-1) e^{-g}); the gate of a query is
    the same whatever the context around it."""
    Wg = RNG.normal(size=(1, D))
    g = af.GatedAttention(af.Attention(Q, K, V), Wg)
    q = X[:1]
    for n in (4, 64, 1024):
        ctx = np.concatenate([q, RNG.normal(size=(n - 1, D))])
        assert float(np.asarray(g.gate(ctx))[0, 0]) == pytest.approx(
            float(sigmoid(q @ Wg.T)[0, 0]), rel=1e-14
        )


def test_analyses_serve_or_refuse_the_gate_by_name(tmp_path):
    g = af.GatedAttention(af.Attention(Q, K, V), RNG.normal(size=(D, D)))
    with pytest.raises(ValueError, match="frame='original'|propagator|rescal"):
        af.simulate(g, X, 0.5)
    sph = af.simulate(g, X, 0.5, frame="sphere")
    assert sph.ok
    reg = af.predict_regime(g)
    assert reg.label.name.lower().startswith("unclass") or "gate" in reg.reason
    assert "sigmoid output gate" in reg.reason
    tr = af.simulate(g, X, 0.5, frame="original")
    rep = af.dispersion(tr, k=-1)
    np.testing.assert_allclose(
        rep.max, np.asarray(g.attention(np.asarray(tr.x[-1]))).max(axis=1), rtol=1e-12
    )
    tr.save(tmp_path / "g.npz")
    back = af.Trajectory.load(tmp_path / "g.npz").model
    assert isinstance(back, af.GatedAttention) and back.describe() == g.describe()
    np.testing.assert_array_equal(np.asarray(back.Wg), np.asarray(g.Wg))


def test_bad_gates_name_the_argument():
    head = af.Attention(Q, K, V)
    with pytest.raises(ValueError, match=r"Wg must be \(3, 3\).*or \(1, 3\)"):
        af.GatedAttention(head, np.zeros((2, D)))
    with pytest.raises(ValueError, match=r"bg must have shape \(3,\)"):
        af.GatedAttention(head, np.zeros((D, D)), np.zeros(2))
    with pytest.raises(ValueError, match="one-head attention model"):
        af.GatedAttention(
            af.MultiHeadAttention(np.stack([Q, K]), np.stack([K, Q]), np.stack([V, V])),
            np.zeros((1, D)),
        )
