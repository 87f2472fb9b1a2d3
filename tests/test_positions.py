"""Positional masks (ALiBi, RoPE, StreamingLLM's sink-plus-window) against numpy
references of their formulas, RoPE's relative-position invariant, per-head slopes, the
saved forms and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow import masks

RNG = np.random.default_rng(4)
N, D = 7, 4
Q, K, V = np.eye(D) + 0.3 * RNG.normal(size=(3, D, D))
X = RNG.normal(size=(N, D))


def softmax_rows(L):
    L = L - L.max(axis=1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(axis=1, keepdims=True)


def rope_numpy(u, base):
    """Rotate the c-th 2-plane of row i by i * base^(-2c/p), written out plainly."""
    n, p = u.shape
    out = np.empty_like(u)
    for i in range(n):
        for c in range(p // 2):
            a = i * base ** (-2 * c / p)
            x, y = u[i, 2 * c], u[i, 2 * c + 1]
            out[i, 2 * c] = x * np.cos(a) - y * np.sin(a)
            out[i, 2 * c + 1] = x * np.sin(a) + y * np.cos(a)
    return out


def test_alibi_is_causal_softmax_times_a_distance_decay():
    beta, slope = 0.8, 0.35
    P = np.asarray(af.Attention(Q, K, V, beta=beta, mask=masks.ALiBi(slope)).attention(X))
    i, j = np.indices((N, N))
    L = beta * (X @ Q.T) @ (X @ K.T).T - slope * (i - j)
    ref = softmax_rows(np.where(j <= i, L, -np.inf))
    np.testing.assert_allclose(P, ref, rtol=1e-12, atol=1e-15)
    # the lost-in-the-middle weights e^{-(lambda / N)(i - j)}: a ratio of two keys
    Pn = np.asarray(af.Attention(Q, K, V, beta=beta, mask="causal").attention(X))
    np.testing.assert_allclose(P[6, 1] / P[6, 4], Pn[6, 1] / Pn[6, 4] * np.exp(-slope * 3))


def test_alibi_per_head_slopes_in_multihead_attention():
    slopes = masks.alibi_slopes(2)
    np.testing.assert_allclose(slopes, [2**-4, 2**-8])
    np.testing.assert_allclose(masks.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_allclose(masks.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    Qs, Ks, Vs = (np.stack([A, A.T]) for A in (Q, K, V))
    mh = af.MultiHeadAttention(Qs, Ks, Vs, mask=masks.ALiBi(slopes))
    P = np.asarray(mh.attention(X))
    for h in range(2):
        one = af.Attention(Qs[h], Ks[h], Vs[h], mask=masks.ALiBi(slopes[h]))
        np.testing.assert_allclose(P[h], np.asarray(one.attention(X)), rtol=1e-12)
        np.testing.assert_allclose(P[h], np.asarray(mh.head(h).attention(X)), rtol=1e-12)
    # the field: sum over heads of P_h x V_h^T
    field = sum(P[h] @ X @ Vs[h].T for h in range(2))
    np.testing.assert_allclose(np.asarray(mh.vector_field(X)), field, rtol=1e-12)
    with pytest.raises(ValueError, match="parameters for 3 heads; the model has 2"):
        af.MultiHeadAttention(Qs, Ks, Vs, mask=masks.ALiBi([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="one attention head takes one"):
        af.Attention(Q, K, V, mask=masks.ALiBi([0.1, 0.2]))


def test_rope_against_numpy_and_relative_positions():
    beta, base = 0.9, 50.0
    A = af.Attention(Q, K, V, beta=beta, mask=masks.RoPE(base))
    q, k = rope_numpy(X @ Q.T, base), rope_numpy(X @ K.T, base)
    P = softmax_rows(beta * q @ k.T)
    np.testing.assert_allclose(np.asarray(A.attention(X)), P, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(A.vector_field(X)), P @ X @ V.T, rtol=1e-12)
    # the same query and key at every position: the logits depend on j - i only
    same = np.tile(RNG.normal(size=(1, D)), (N, 1))
    Ls = np.asarray(A.logits(same))
    for off in range(-N + 1, N):
        diag = np.diagonal(Ls, offset=off)
        np.testing.assert_allclose(diag, diag[0], rtol=1e-12, atol=1e-14)
    assert np.ptp(np.diagonal(Ls, 0)) < 1e-12 and abs(Ls[0, 1] - Ls[0, 3]) > 1e-3
    # with a causal mask inside: the rotation and the mask
    C = af.Attention(Q, K, V, beta=beta, mask=masks.RoPE(base, masks.Causal()))
    i, j = np.indices((N, N))
    ref = softmax_rows(np.where(j <= i, beta * q @ k.T, -np.inf))
    np.testing.assert_allclose(np.asarray(C.attention(X)), ref, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="even"):
        af.Attention(Q[:3], K[:3], V, mask=masks.RoPE(), rectangular=True).attention(X)
    with pytest.raises(ValueError, match="base"):
        masks.RoPE(base=1.0)


def test_sinkwindow_keeps_the_sinks_and_a_causal_window():
    m = masks.SinkWindow(2, 1)
    keep = np.asarray(m.keep(np.arange(N), np.arange(N)))
    i, j = np.indices((N, N))
    np.testing.assert_array_equal(keep, (j <= i) & ((j < 2) | (i - j <= 1)))
    P = np.asarray(af.Attention(Q, K, V, mask=m).attention(X))
    assert np.all(P[~keep] == 0) and np.all(P[keep] > 0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-14)
    with pytest.raises(ValueError, match="sinks"):
        masks.SinkWindow(-1, 2)


@pytest.mark.parametrize(
    "mask",
    [
        masks.ALiBi(0.25),
        masks.ALiBi([0.5, 0.125]),
        masks.RoPE(100.0),
        masks.RoPE(10.0, masks.ALiBi(0.1)),
        masks.SinkWindow(1, 3),
    ],
    ids=lambda m: m.name,
)
def test_saved_forms_read_back(mask):
    back = masks.check_mask(mask.describe())
    assert type(back) is type(mask) and back.describe() == mask.describe()


def test_bad_slopes_name_the_argument():
    for bad in (-0.1, [[0.1]], np.nan, []):
        with pytest.raises(ValueError, match=r"ALiBi\(slopes\)"):
            masks.ALiBi(bad)
