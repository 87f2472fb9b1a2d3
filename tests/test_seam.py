"""A new model family is one module: the worked example of docs/architecture.md.

``TokenwiseLinear`` (``dx_i/dt = A x_i``, no interaction) implements ``AbstractModel``
and nothing else; ``simulate``, the layer loop, ``Trajectory`` (save and load included)
and the overflow guard then work for it unchanged, and the numbers agree with the closed
forms ``e^{tA} x0`` and ``(I + dt A)^k x0``.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float
from scipy.linalg import expm

import attnflow as af
from attnflow.dynamics.base import AbstractModel


class TokenwiseLinear(AbstractModel):
    """``dx_i/dt = A x_i``: every token follows the same linear flow, alone."""

    A: Array
    propagator: None = None
    family = "TokenwiseLinear"  # registers the family for Trajectory.load

    def __init__(self, A):
        self.A = jnp.asarray(A)
        self.propagator = None

    @property
    def d(self) -> int:
        return self.A.shape[0]

    @property
    def dtype(self):
        return self.A.dtype

    def vector_field(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return x @ self.A.T

    def describe(self) -> dict:
        return {"family": "TokenwiseLinear", "A": np.asarray(self.A).tolist()}

    def arrays(self) -> dict:
        return {"A": self.A}

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> TokenwiseLinear:
        return cls(arrays["A"])


A = np.array([[-0.3, 1.0], [-1.0, -0.3]])
X0 = np.random.default_rng(0).uniform(-1, 1, (6, 2))


def test_a_new_family_runs_adaptive_against_the_closed_form():
    traj = af.simulate(
        TokenwiseLinear(A), X0, 3.0, ts=[0.0, 1.0, 3.0], frame="original", rtol=1e-10, atol=1e-12
    )
    assert traj.ok
    for j, t in enumerate([0.0, 1.0, 3.0]):
        np.testing.assert_allclose(np.asarray(traj.x[j]), X0 @ expm(t * A).T, rtol=1e-8, atol=1e-10)


def test_a_new_family_runs_as_layers_against_the_closed_form():
    traj = af.simulate(
        TokenwiseLinear(A), X0, 2.0, ts=[0.0, 2.0], frame="original", method="euler", dt=0.1
    )
    want = X0 @ np.linalg.matrix_power(np.eye(2) + 0.1 * A, 20).T
    np.testing.assert_allclose(np.asarray(traj.x[-1]), want, rtol=1e-13)


def test_a_new_family_without_a_value_matrix_is_refused_by_the_rescaled_frame():
    with pytest.raises(ValueError, match="rescaled frame .* needs an attention system"):
        af.simulate(TokenwiseLinear(A), X0, 1.0)


def test_a_new_family_saves_and_loads(tmp_path):
    traj = af.simulate(TokenwiseLinear(A), X0, 1.0, frame="original")
    back = af.Trajectory.load(traj.save(tmp_path / "lin.npz"))
    assert isinstance(back.model, TokenwiseLinear)
    np.testing.assert_array_equal(np.asarray(back.x), np.asarray(traj.x))
    assert back.saved_metadata["model"] == {"family": "TokenwiseLinear", "A": A.tolist()}


def test_attention_is_a_final_family_of_the_seam():
    from attnflow.dynamics.base import AbstractAttentionSystem

    m = af.Attention(np.eye(2), np.eye(2), A)
    assert isinstance(m, AbstractAttentionSystem) and isinstance(m, eqx.Module)
    x = jnp.asarray(X0)
    # the derived methods agree with each other and with a plain softmax
    L = np.asarray(X0 @ X0.T)
    P = np.exp(L - L.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(m.attention(x)), P, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(m.vector_field(x)), P @ X0 @ A.T, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(m.layer(x, 0.1)), X0 + 0.1 * P @ X0 @ A.T, rtol=1e-12)
