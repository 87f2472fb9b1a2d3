"""The hardmax limit (Alcalde, Geshkovski and Ruiz-Balet 2025) in the particle system:
with Q^T K = I and V = I each token of the rescaled frame moves in a straight line to the
token of its largest logit, ``z_i(t) = z_j + e^{-t} (z_i(0) - z_j)``, the tokens that are
their own argmax (hull vertices) stay put, and softmax runs approach the hardmax run as
beta grows."""

from __future__ import annotations

import numpy as np

import attnflow as af

I2 = np.eye(2)
Z0 = np.random.default_rng(2).normal(size=(8, 2))
TS = np.linspace(0.0, 3.0, 7)


def test_tokens_move_straight_to_their_vertex():
    tr = af.simulate(
        af.Attention(I2, I2, I2, kernel="hardmax"), Z0, 3.0, ts=TS, rtol=1e-11, atol=1e-12
    )
    assert tr.status == "ok"
    z = np.asarray(tr.z)
    target = np.argmax(Z0 @ Z0.T, axis=1)
    fixed = target == np.arange(8)
    assert 0 < fixed.sum() < 8  # some vertices, some interior tokens
    for k, t in enumerate(TS):
        ref = Z0[target] + np.exp(-t) * (Z0 - Z0[target])
        # the closed form is valid while every token keeps its argmax along the path
        assert np.array_equal(np.argmax(ref @ ref.T, axis=1), target)
        np.testing.assert_allclose(z[k], ref, atol=1e-10)
        np.testing.assert_allclose(z[k][fixed], Z0[fixed], atol=1e-12)


def test_softmax_runs_approach_the_hardmax_run_as_beta_grows():
    ts = TS[:3]
    hard = np.asarray(
        af.simulate(
            af.Attention(I2, I2, I2, kernel="hardmax"), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
        ).z
    )
    errs = []
    for beta in (8.0, 16.0, 32.0):
        soft = af.simulate(
            af.Attention(I2, I2, I2, beta=beta), Z0, 1.0, ts=ts, rtol=1e-11, atol=1e-12
        )
        errs.append(np.abs(np.asarray(soft.z) - hard).max())
    # measured 1.2e-2, 4.4e-4, 5.6e-6: each doubling of beta gains more than the last
    assert errs[0] > 10 * errs[1] > 100 * errs[2] and errs[2] < 1e-4
