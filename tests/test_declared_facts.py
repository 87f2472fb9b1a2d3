"""Facts declared on the seam (the keys each row keeps, bilinear logits, positions) and the
numbers the analyses derive from them, against plain numpy (``reference.py``): the
dispersion cap, spread and entropy over the kept keys of each row, the hardmax cells'
refusal by name, and the heads study's labels under a layout's mask and positions."""

from __future__ import annotations

import numpy as np
import pytest
from families import BandAttention, SinkhornAttention
from reference import dispersion_rows, kernel_weights, mask_keep

import attnflow as af
from attnflow.analysis import hardmax_cells
from attnflow.dynamics.base import AbstractAttentionSystem

rng = np.random.default_rng(11)
Q = np.eye(2) + 0.3 * rng.normal(size=(2, 2))
K = np.eye(2) + 0.3 * rng.normal(size=(2, 2))
X = 1.5 * rng.normal(size=(8, 2))
BETA = 2.0


def _logits(x=X, beta=BETA):
    return beta * (x @ Q.T) @ (x @ K.T).T


@pytest.mark.parametrize("mask", [None, "causal", ("window", 1), ("sinkwindow", 1, 2)], ids=str)
def test_dispersion_counts_the_kept_keys_of_each_row(mask):
    """The cap 1/(1 + (n_i - 1) e^{-delta_i}), the spread and the normalised entropy over
    the n_i keys row i keeps, against numpy row by row; the bound holds on every row."""
    spelled = {None: None, "causal": "causal", ("window", 1): ("window", 1)}.get(
        mask, af.masks.SinkWindow(1, 2)
    )
    model = af.Attention(Q, K, np.eye(2), beta=BETA, mask=spelled)
    rep = af.dispersion(model, x=X)
    keep = mask_keep(mask, 8)
    P = kernel_weights("softmax", X, Q, K, BETA, mask=mask)
    ref = dispersion_rows(P, _logits(), keep)
    np.testing.assert_array_equal(rep.kept, ref["kept"])
    for key in ("max", "delta", "bound_tight", "entropy", "entropy_normalized"):
        np.testing.assert_allclose(getattr(rep, key), ref[key], rtol=1e-10, atol=1e-13)
    assert rep.bound_holds.all()
    if mask == "causal":
        assert rep.bound_tight[0] == 1.0 and rep.kept[0] == 1 and rep.max[0] == 1.0
        # counted over all 8 keys (what was reported before), 3 rows broke the bound
        n_all = 1.0 / (1.0 + 7.0 * np.exp(-ref["delta"]))
        assert np.sum(ref["max"] > n_all * (1 + 1e-9)) >= 1


def test_dispersion_of_a_matrix_keeps_the_finite_logits():
    L = np.where(np.tri(8, dtype=bool), _logits(), -np.inf)
    P = kernel_weights("softmax", X, Q, K, BETA, mask="causal")
    rep = af.dispersion(P, logits=L)
    ref = dispersion_rows(P, _logits(), np.tri(8, dtype=bool))
    np.testing.assert_allclose(rep.delta, ref["delta"], rtol=1e-12)
    np.testing.assert_allclose(rep.bound_tight, ref["bound_tight"], rtol=1e-12)
    assert rep.bound_holds.all() and rep.kept.tolist() == list(range(1, 9))


def test_a_family_masking_inside_its_weights_declares_its_kept_keys():
    """BandAttention keeps |i - j| <= 1 inside its own weights; its logits are unmasked.
    The spread is that of the kept logits (not of all n: that is far larger here)."""
    model = BandAttention(Q, K, np.eye(2), beta=BETA, w=1)
    rep = af.dispersion(model, x=X)
    keep = mask_keep(("window", 1), 8)
    P = kernel_weights("softmax", X, Q, K, BETA, mask=("window", 1))
    np.testing.assert_allclose(np.asarray(model.attention(X)), P, rtol=1e-12, atol=1e-15)
    ref = dispersion_rows(P, _logits(), keep)
    for key in ("delta", "bound_tight", "entropy_normalized"):
        np.testing.assert_allclose(getattr(rep, key), ref[key], rtol=1e-10, atol=1e-13)
    all_keys = _logits().max(1) - _logits().min(1)
    assert np.all(rep.delta <= all_keys) and np.any(rep.delta < 0.8 * all_keys)
    assert rep.bound_holds.all() and rep.kept.tolist() == [2] + [3] * 6 + [2]
    # the hardmax cells: the kept key of the largest logit
    cells = hardmax_cells(model, X)
    np.testing.assert_array_equal(cells.leader, np.argmax(np.where(keep, _logits(), -np.inf), 1))


@pytest.mark.parametrize(
    ("build", "fact"),
    [
        (lambda: af.Attention(Q, K, np.eye(2), kernel="qknorm"), "bilinear_logits"),
        (lambda: af.Attention(Q, K, np.eye(2), kernel="linear"), "bilinear_logits"),
        (lambda: af.Attention(Q, K, np.eye(2), mask=af.masks.ALiBi(0.5)), "positional"),
        (lambda: af.Attention(Q, K, np.eye(2), mask=af.masks.RoPE(10.0)), "positional"),
        (lambda: af.Attention(Q, K, np.eye(2), kernel="prenorm"), "normalizes_tokens"),
    ],
    ids=["qknorm", "linear", "alibi", "rope", "prenorm"],
)
def test_hardmax_cells_refuse_by_the_declared_fact(build, fact):
    with pytest.raises(ValueError, match=rf"refuses model Attention .*{fact}"):
        hardmax_cells(build(), X)


def test_hardmax_cells_refuse_a_family_that_declares_nothing():
    class Undeclared(SinkhornAttention):  # a family that says nothing of its logits
        @property
        def bilinear_logits(self) -> bool:
            return AbstractAttentionSystem.bilinear_logits.fget(self)  # pyright: ignore

    with pytest.raises(ValueError, match="refuses model Undeclared .*bilinear_logits"):
        hardmax_cells(Undeclared(Q, K, np.eye(2)), X)
    cells = hardmax_cells(SinkhornAttention(Q, K, np.eye(2), beta=BETA), X)
    np.testing.assert_array_equal(cells.leader, np.argmax(_logits(), axis=1))
    np.testing.assert_allclose(
        cells.gap, (_logits().max(1) - np.diag(_logits())) / BETA, rtol=1e-12, atol=1e-14
    )


def test_declared_facts_of_the_kernel_family():
    I2 = np.eye(2)
    plain = af.Attention(I2, I2, I2)
    assert plain.bilinear_logits and not plain.positional
    assert not af.Attention(I2, I2, I2, kernel="qknorm").bilinear_logits
    rope = af.Attention(I2, I2, I2, mask=af.masks.RoPE(10.0, af.masks.Causal()))
    assert rope.positional and not rope.bilinear_logits
    sel = af.Attention(I2, I2, I2, kernel="selective", block=0)
    np.testing.assert_array_equal(np.asarray(sel.kept_keys(X)), np.tri(8, dtype=bool))
    np.testing.assert_array_equal(
        np.asarray(sel.kept_keys(X, np.array([2, 5]))), np.tri(8, dtype=bool)[[2, 5]]
    )
    # its weights vanish exactly where it declares the key dropped
    P = np.asarray(sel.attention(X))
    assert np.all(P[~np.tri(8, dtype=bool)] == 0.0)


def _heads_of(folder):
    from attnflow.io.layouts import load_heads
    from attnflow.studies.heads import analyze_heads

    return load_heads(folder), analyze_heads(folder)


def test_heads_study_labels_a_head_as_its_layout_runs_it(tmp_path):
    """A causal GPT-2 head and a causal RoPE Qwen3 head are never given a theorem's
    label: the study agrees with predict_regime(head.attention()) on every head."""
    from test_checkpoints_layouts import gpt2, llama

    for folder in (gpt2(tmp_path / "g")[0], llama(tmp_path / "q")[0]):
        heads, an = _heads_of(folder)
        for h, rep in zip(heads, an.heads, strict=True):
            want = af.predict_regime(h.attention())
            assert rep.label == want.label == af.Label.UNCLASSIFIED
            assert rep.theorem is None
            assert "position-free softmax" in rep.reason and "mask" in rep.reason
        assert an.counts[af.Label.UNCLASSIFIED] == len(heads)
