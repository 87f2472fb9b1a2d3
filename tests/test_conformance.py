"""The conformance suite, built on the public kit (``attnflow.testing``): ``check_kernel``
over every kernel of the package (and kernel objects with parameters), ``check_mask`` over
every mask (and a user's mask defined in ``families.py``), ``check_model`` over every
family of ``families.FAMILY_CASES`` (the package's own and two defined outside it). The
kit holds each against plain numpy built from its declared pieces: the attention and the
field, every number an analysis derives, save and load, stacking, each analysis served or
refused by name and, for a few in the default suite and every one under ``-m slow``, the
gradients of every array leaf in every frame served. It must also fail: a family whose
rows do not sum to one while it says they do, one whose field disagrees with its
attention, one whose gradient is wrong, a kernel and a mask whose declared facts lie."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from families import (
    FAMILY_CASES,
    KERNEL_OBJECTS,
    MASKS,
    BandAttention,
    SinkhornAttention,
    sinkhorn_numpy,
)

import attnflow as af
from attnflow import kernels as K
from attnflow.dynamics.base import AbstractAttentionSystem, AbstractModel
from attnflow.masks import AbstractMask
from attnflow.testing import check_kernel, check_mask, check_model

N, T1 = 6, 0.5
TS = np.linspace(0.0, T1, 4)
# the families whose gradients the default suite checks in every frame they serve (a
# head with a leaf in its mask, several heads, a feed-forward term, an external family)
GRADIENTS = {"MultiHeadAttention-alibi-per-head", "Block-feedforward", "SinkhornAttention"}


def _x0(d: int) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(N, d))


def _kernel_id(k) -> str:
    return k.describe() if k.params() else k.name


@pytest.mark.parametrize("kernel", KERNEL_OBJECTS, ids=_kernel_id)
def test_kit_on_every_kernel(kernel):
    check_kernel(kernel, gradients=kernel.name == "softmax" and not kernel.params())


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_kit_on_every_mask(mask):
    check_mask(mask, gradients=mask.name == "alibi")


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.name)
def test_kit_on_every_family(case):
    model = case.build()
    check_model(model, _x0(model.d), gradients=case.name in GRADIENTS)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNEL_OBJECTS, ids=_kernel_id)
def test_kit_on_every_kernel_with_gradients(kernel):
    check_kernel(kernel)


@pytest.mark.slow
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_kit_on_every_mask_with_gradients(mask):
    check_mask(mask)


@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.name)
def test_kit_on_every_family_with_gradients(case):
    model = case.build()
    check_model(model, _x0(model.d))


def test_the_external_family_against_numpy():
    model = SinkhornAttention(np.eye(2), np.eye(2), np.eye(2), beta=1.3, iters=5)
    x = _x0(2)
    L = np.asarray(model.logits(x))
    np.testing.assert_allclose(1.3 * x @ x.T, L, rtol=1e-13)
    np.testing.assert_allclose(
        np.asarray(model.attention(x)), sinkhorn_numpy(L, model.iters), rtol=1e-12
    )


# ---------------------------------------------------------------- the kit must fail
class _WrongRows(SinkhornAttention):
    """Declares rows summing to one and weighs 0.9 of them."""

    family = "test-wrong-rows"

    def weights(self, q, k):
        return 0.9 * super().weights(q, k)


class _WrongField(SinkhornAttention):
    """A field that is not value_map(P x): it adds a drift the attention does not have."""

    family = "test-wrong-field"

    def vector_field(self, x):
        return super().vector_field(x) + 1e-3 * x


@jax.custom_jvp
def _doubled_tangent(P):
    return P


@_doubled_tangent.defjvp
def _doubled_tangent_jvp(primals, tangents):
    return primals[0], 2.0 * tangents[0]  # the wrong rule: the derivative is the identity


class _WrongGradient(SinkhornAttention):
    """Right weights, a wrong derivative of them (custom_jvp with a wrong rule)."""

    family = "test-wrong-gradient"

    def weights(self, q, k):
        return _doubled_tangent(super().weights(q, k))


def test_the_kit_fails_a_family_whose_rows_do_not_sum_to_one():
    with pytest.raises(AssertionError, match=r"rows_sum_to_one: declared True, but row 0"):
        check_model(_WrongRows(np.eye(2), np.eye(2), np.eye(2)), _x0(2), gradients=False)


def test_the_kit_fails_a_family_whose_field_disagrees_with_its_attention():
    with pytest.raises(AssertionError, match=r"vector_field against sum_h P_h x V_h\^T"):
        check_model(_WrongField(np.eye(2), np.eye(2), np.eye(2)), _x0(2), gradients=False)


def test_the_kit_fails_a_family_whose_gradient_is_wrong():
    model = _WrongGradient(np.eye(2), np.eye(2), 0.5 * np.eye(2))
    with pytest.raises(AssertionError, match=r"gradient of .* in frame 'original'"):
        check_model(model, _x0(2), frames=("original",))


def test_the_kit_fails_facts_that_lie():
    class Leaky(K.Softmax):  # declares rows summing to one, leaks 1 % of each row
        name: ClassVar[str] = "test-leaky"

        def weights(self, L):
            return 0.99 * super().weights(L)

    with pytest.raises(AssertionError, match=r"row_stochastic.*declared True"):
        check_kernel(Leaky())

    class Tilted(AbstractMask):  # biases the logits and says it does not
        name: ClassVar[str] = "test-tilted"

        def keep(self, rows, cols):
            return jnp.ones((rows.shape[0], cols.shape[0]), bool)

        def bias(self, rows, cols):
            return 0.1 * (cols[None, :] - rows[:, None]).astype(float)

        def describe(self) -> list:
            return ["test-tilted"]

    with pytest.raises(AssertionError, match=r"positional.*declare positional = True"):
        check_mask(Tilted())

    class Unregistered(AbstractMask):  # no name: runs with it would not load
        def keep(self, rows, cols):
            return jnp.ones((rows.shape[0], cols.shape[0]), bool)

        def describe(self) -> list:
            return ["unregistered"]

    with pytest.raises(AssertionError, match="not registered under its name"):
        check_mask(Unregistered())

    class Dropping(BandAttention):  # weighs the band |i - j| <= 1, declares the diagonal
        family = "test-dropping"

        def kept_keys(self, x, rows=None):
            n = x.shape[-2]
            rows = jnp.arange(n) if rows is None else rows
            return rows[:, None] == jnp.arange(n)[None, :]

    with pytest.raises(AssertionError, match="a key that kept_keys declares dropped"):
        check_model(Dropping(np.eye(2), np.eye(2), np.eye(2)), _x0(2), gradients=False)


def test_the_kit_asks_for_float64_and_tokens_by_name():
    with pytest.raises(ValueError, match="x must be finite tokens"):
        check_model(af.Attention(np.eye(2), np.eye(2), np.eye(2)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="model must be an attnflow model"):
        check_model(np.eye(2), _x0(2))


# ------------------------------------------------------------ the frames, long runs
def _rescaled_serves(model: AbstractModel) -> bool:
    if model.propagator is None:
        return False
    return not isinstance(model, AbstractAttentionSystem) or model.rows_sum_to_one


@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.name)
def test_family_in_both_frames(case):
    """The adaptive solver and the Euler layers: the rescaled frame's tokens are the
    original frame's."""
    model = case.build()
    x0 = _x0(model.d)
    ode = af.simulate(model, x0, T1, ts=TS, frame="original", rtol=1e-10, atol=1e-10)
    assert ode.status == "ok", ode.status
    eul = af.simulate(model, x0, T1, frame="original", method="euler", dt=0.125)
    assert eul.status == "ok"
    if _rescaled_serves(model):
        res = af.simulate(model, x0, T1, ts=TS, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(res.x), np.asarray(ode.x), rtol=1e-6, atol=1e-8)
        res_e = af.simulate(model, x0, T1, method="euler", dt=0.125)
        np.testing.assert_allclose(
            np.asarray(res_e.x)[-1], np.asarray(eul.x)[-1], rtol=1e-9, atol=1e-12
        )
    else:
        with pytest.raises(ValueError, match="frame='original'|propagator|value matrix"):
            af.simulate(model, x0, T1, ts=TS)


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
