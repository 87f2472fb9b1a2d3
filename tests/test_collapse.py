"""Rank collapse by mask (Wu, Ajorlou, Wang, Jegelka and Jadbabaie 2024): the distance to
consensus against numpy, its exponential decay under pure masked attention for masks
whose graph is quasi-strongly connected, and none for one that is not."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow import masks
from attnflow.analysis import consensus_distance

X0 = np.random.default_rng(6).normal(size=(8, 3))


def test_consensus_distance_against_numpy():
    x = np.random.default_rng(1).normal(size=(2, 4, 5, 3))
    want = np.array(
        [[np.linalg.norm(x[b, k] - x[b, k].mean(0)) for k in range(4)] for b in range(2)]
    )
    np.testing.assert_allclose(consensus_distance(x), want, rtol=1e-13)
    with pytest.raises(ValueError, match="tokens of shape"):
        consensus_distance(np.zeros((3, 2)))


def _mu(mask, layers=60, beta=0.5):
    eye = np.eye(3)
    m = af.Attention(eye, eye, eye, beta=beta, mask=mask)
    tr = af.simulate(
        m,
        X0,
        float(layers),
        method="euler",
        dt=1.0,
        frame="original",
        residual=False,
        ts=np.arange(layers + 1.0),
    )
    return consensus_distance(tr)


@pytest.mark.parametrize(
    "mask",
    [None, masks.Causal(), masks.Window(1), masks.SinkWindow(1, 1), masks.ALiBi(0.5)],
    ids=["full", "causal", "window-1", "sinkwindow", "alibi"],
)
def test_pure_masked_attention_collapses_exponentially(mask):
    """x <- P x (no skip connection, V = I): every one of these graphs is quasi-strongly
    connected (token 0 reaches all), so mu falls geometrically: by 40% or more every 10
    layers once past the first ten (mu itself need not fall at every layer: P is
    row-stochastic, not doubly stochastic; the spread of each coordinate does)."""
    mu = _mu(mask)
    assert np.all(mu[20::10] <= 0.6 * mu[10:-10:10])
    x = np.asarray(
        af.simulate(
            af.Attention(np.eye(3), np.eye(3), np.eye(3), beta=0.5, mask=mask),
            X0,
            20.0,
            method="euler",
            dt=1.0,
            frame="original",
            residual=False,
            ts=np.arange(21.0),
        ).x
    )
    spread = x.max(axis=1) - x.min(axis=1)  # (m, d): convex combinations never widen it
    assert np.all(spread[1:] <= spread[:-1] + 1e-12)


def test_a_local_mask_slows_the_collapse():
    """Wu et al.: local masks slow rank collapse: a window of 1 against the full mask and
    the sink-plus-window mask, over 30 layers."""
    full, window, sink = _mu(None, 30), _mu(masks.Window(1), 30), _mu(masks.SinkWindow(1, 1), 30)
    assert window[-1] > 100 * full[-1] and window[-1] > 100 * sink[-1]


def test_a_mask_that_is_not_connected_keeps_its_distance():
    """Window(0): each token sees itself only (P = I), so nothing moves."""
    eye = np.eye(3)
    m = af.Attention(eye, eye, eye, mask=masks.Window(0))
    tr = af.simulate(
        m, X0, 10.0, method="euler", dt=1.0, frame="original", residual=False, ts=np.arange(11.0)
    )
    np.testing.assert_allclose(consensus_distance(tr), consensus_distance(X0[None])[0], rtol=1e-14)
