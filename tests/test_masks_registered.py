"""Masks are registered like kernels and families: a user's mask, defined here outside the
package, registers by its class attribute ``name``; its saved form rebuilds it, and a run
with it saves and loads (the weights, the mask and the states equal)."""

from __future__ import annotations

import json
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest
from families import Stride

import attnflow as af
from attnflow.dynamics.kernels.masks import MASK_CLASSES
from attnflow.masks import AbstractMask, check_mask


def _stride_keep(n, s):
    return np.array([[i >= j and (i - j) % s == 0 for j in range(n)] for i in range(n)])


def test_a_users_mask_is_registered_and_its_saved_form_rebuilds_it():
    assert MASK_CLASSES["test-stride"] is Stride
    m = check_mask(json.loads(json.dumps(Stride(2).describe())))
    assert isinstance(m, Stride) and m.s == 2
    assert check_mask(("test-stride", 3)).s == 3  # pyright: ignore[reportOptionalMemberAccess]
    # the built-in ones through the same registry
    for mask in (
        af.masks.Causal(),
        af.masks.Window(2),
        af.masks.ALiBi(0.5),
        af.masks.RoPE(100.0, af.masks.Causal()),
        af.masks.SinkWindow(1, 2),
    ):
        back = check_mask(json.loads(json.dumps(mask.describe())))
        assert type(back) is type(mask) and back.describe() == mask.describe()
    with pytest.raises(ValueError, match="known: .*test-stride.*import it before"):
        check_mask(["no-such-mask", 1])
    with pytest.raises(ValueError, match="does not rebuild"):
        check_mask(["test-stride"])


def test_a_second_class_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="mask name 'causal' is taken by"):

        class Mine(AbstractMask):  # pyright: ignore[reportUnusedClass]
            name: ClassVar[str] = "causal"

            def keep(self, rows, cols):
                return cols[None, :] <= rows[:, None]

            def describe(self) -> list:
                return ["causal"]


def test_a_run_with_a_users_mask_saves_and_loads(tmp_path):
    rng = np.random.default_rng(5)
    Q, K = np.eye(2) + 0.2 * rng.normal(size=(2, 2)), np.eye(2) + 0.2 * rng.normal(size=(2, 2))
    V = np.array([[0.4, 0.1], [0.0, 0.2]])
    x0 = rng.normal(size=(7, 2))
    model = af.Attention(Q, K, V, mask=Stride(2))
    # the model's attention is numpy's softmax over the kept keys
    keep = _stride_keep(7, 2)
    L = (x0 @ Q.T) @ (x0 @ K.T).T
    P = np.where(keep, np.exp(L - np.where(keep, L, -np.inf).max(1, keepdims=True)), 0.0)
    P /= P.sum(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(model.attention(jnp.asarray(x0))), P, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(model.kept_keys(x0)), keep)
    traj = af.simulate(model, x0, 0.5, ts=np.linspace(0, 0.5, 3), frame="original")
    assert traj.ok
    traj.save(tmp_path / "stride.npz")
    back = af.Trajectory.load(tmp_path / "stride.npz")
    assert isinstance(back.model.mask, Stride) and back.model.mask.s == 2
    assert back.model.describe() == model.describe()
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
    np.testing.assert_array_equal(
        np.asarray(back.model.attention(jnp.asarray(x0))), np.asarray(model.attention(x0))
    )
    rep = af.dispersion(back, k=-1)
    np.testing.assert_array_equal(rep.kept, keep.sum(1))
    assert rep.bound_holds.all()
