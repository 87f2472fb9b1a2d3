"""The rescaled frame ``z = e^{-tV} x``: standard coordinates (``Rescaled``), V's real
modal coordinates (``ModalRescaled``) and any model with a rescaling matrix
(``GenericRescaled``)."""

from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax.core as jax_core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from ..._precision import mm
from ..base import AbstractAttentionSystem, AbstractModel
from ._base import AbstractFrame

__all__ = [
    "AbstractRescaled",
    "Rescaled",
    "ModalRescaled",
    "GenericRescaled",
    "singular_layer_step",
    "rescalable",
]


def rescalable(model: AbstractModel) -> Any:
    prop = getattr(model, "propagator", None)
    if prop is None:
        raise ValueError(
            f"the rescaled frame z = e^(-tV) x needs an attention system with one "
            f"value matrix V; {type(model).__name__} has none: use frame='original'."
        )
    return prop


def _row_stochastic(model: AbstractAttentionSystem) -> None:
    if not model.rows_sum_to_one:
        raise ValueError(
            f"{model.attention_kind} is not row-stochastic (its rows need not sum to "
            f"1), and the rescaled frame dz_i/dt = sum_j P_ij V (z_j - z_i) assumes "
            f"they do; use frame='original' with {model.attention_kind}."
        )


class AbstractRescaled(AbstractFrame):
    """``z = e^{-tV} x``: ``dz/dt = (P z - z) V^T`` with ``P`` taken at ``x = e^{tV} z``
    (the theory's frame, which replaces layer normalisation). Concrete: ``Rescaled``
    (standard coordinates), ``ModalRescaled`` (V's real modal coordinates) and
    ``GenericRescaled`` (any other model with a rescaling matrix)."""

    model: eqx.AbstractVar[AbstractModel]
    name: ClassVar[str] = "rescaled"

    def tokens(self, y: Array, scale: Any) -> Array:
        """The tokens ``x`` that the state ``y`` stands for: ``x = y M^T`` (``scale`` the
        ``(d, d)`` flow matrix ``M``)."""
        return mm(y, scale.T)

    def check_layer_step(self, dt: float, dtype: Any) -> None:
        """``I + dt V`` must be invertible in ``dtype`` (the discrete rescaling
        ``z^k = (I + dt V)^{-k} x^k``)."""
        V = self.model.propagator.V
        if isinstance(V, jax_core.Tracer):  # checked where V is concrete (simulate's door)
            return
        why = singular_layer_step(V, dt, dtype)
        if why is not None:
            raise ValueError(
                f"{why}: the discrete rescaling does not exist. Use frame='original' or another dt."
            )

    def continuous_scale(self, t: Any) -> Any:
        return self.model.propagator(t)

    def continuous_factor(self) -> Any:
        return self.model.propagator.V

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        del term, k
        return Rk

    def layer_factor(self, term: Any, R: Any) -> Any:
        return term.inverse_factor(R, self.model.propagator.V)


class Rescaled(AbstractRescaled):
    """The rescaled frame of an attention system with one value matrix, whose rows sum
    to one, in standard coordinates: the state is ``z``."""

    model: AbstractAttentionSystem  # pyright: ignore[reportIncompatibleVariableOverride]
    state_is_rescaled: ClassVar[bool] = True

    def __init__(self, model: AbstractAttentionSystem):
        rescalable(model)
        _row_stochastic(model)
        self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]

    def queries_keys(self, y: Array, scale: Any) -> tuple[Array, Array]:
        """Queries and keys of the tokens ``x`` that the state ``y`` stands for."""
        return self.model.queries_keys(self.tokens(y, scale))

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return mm(u, factor.T)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return y + mm(dt * u, factor.T)

    def log_bound(self, y: Array, scale: Any) -> Array:
        """The model's logit bound, or ``log max |x|`` where larger: the tokens
        ``x = e^{tV} z`` leave the float range before the logits do when attention does
        not read them (Q = 0 or K = 0), and a solve would otherwise stall there on
        ``0 * inf``. A NaN token counts as beyond the range."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_bound(*self.model.queries_keys(x)), x)


class ModalRescaled(AbstractRescaled):
    """The rescaled frame in V's real modal coordinates (a diagonalisable V, tokens not
    normalised before Q and K): the state is ``w = T^{-1} z``, and every power of V acts
    mode by mode, exactly."""

    model: AbstractAttentionSystem  # pyright: ignore[reportIncompatibleVariableOverride]
    QT: Array  # Q T and K T: queries and keys straight from modal coordinates
    KT: Array
    coords: ClassVar[str] = "modal"
    modal: ClassVar[bool] = True

    def __init__(self, model: AbstractAttentionSystem):
        prop = rescalable(model)
        _row_stochastic(model)
        if model.normalizes_tokens:
            raise ValueError(
                f"{model.attention_kind} normalises the tokens x before Q and K, which "
                f"modal coordinates do not hold: use coords='standard'."
            )
        if not prop.has_modal:
            raise ValueError("modal coordinates need a diagonalisable V (propagator eig/eigh).")
        self.model = model  # pyright: ignore[reportIncompatibleVariableOverride]
        Q, K = model.query_key_maps()
        self.QT = mm(Q, prop.T)
        self.KT = mm(K, prop.T)

    def initial_state(self, x0: Array) -> Array:
        return self.model.propagator.to_modal(x0)

    def tokens(self, y: Array, scale: Any) -> Array:
        """The modal coordinates ``T^{-1} x`` of the tokens that the state ``y`` stands
        for (``scale`` the per-mode factors (re, im))."""
        return self.model.propagator.modal_scale(y, *scale)

    def continuous_scale(self, t: Any) -> Any:
        return self.model.propagator.exp_multipliers(t)

    def continuous_factor(self) -> Any:
        prop = self.model.propagator
        return prop.mu_re, prop.mu_im

    def layer_scale(self, term: Any, k: Any, Rk: Any) -> Any:
        del Rk
        return term.power_multipliers(self.model.propagator, k)

    def layer_factor(self, term: Any, R: Any) -> Any:
        del R
        return term.modal_factor

    def queries_keys(self, y: Array, scale: Any) -> tuple[Array, Array]:
        """Queries and keys of the tokens ``x`` that the state ``y`` stands for."""
        x = self.tokens(y, scale)
        return mm(x, self.QT.T), mm(x, self.KT.T)

    def field(self, y: Array, scale: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return self.model.propagator.modal_scale(u, *factor)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        u = self.model.weigh(*self.queries_keys(y, scale), y) - y
        return y + dt * self.model.propagator.modal_scale(u, *factor)

    def log_bound(self, y: Array, scale: Any) -> Array:
        """As ``Rescaled.log_bound``, from the modal state."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_bound(mm(x, self.QT.T), mm(x, self.KT.T)), x)


class GenericRescaled(AbstractRescaled):
    """The rescaled frame of any other model with a ``propagator`` (a rescaling matrix
    ``W``: multi-head attention, a transformer block), in standard coordinates: from
    ``dx/dt = F(x)`` and ``x = e^{tW} z``, ``dz/dt = e^{-tW} (F(x) - W x)
    = e^{-tW} F(x) - W z``; one layer ``x' = layer(x)`` is ``z' = R^{-(k+1)} x'`` with
    ``R = I + dt W`` and ``R^{-1} = I - dt R^{-1} W``."""

    model: AbstractModel
    state_is_rescaled: ClassVar[bool] = True

    def __init__(self, model: AbstractModel):
        rescalable(model)
        self.model = model

    def _pull_back(self, u: Array, scale: Array) -> Array:
        """Rows ``u`` mapped by ``scale^{-1}`` (``u scale^{-T}``)."""
        return jnp.linalg.solve(scale, u.T).T

    def field(self, y: Array, scale: Any, factor: Any) -> Array:  # scale e^{tW}, factor W
        return self._pull_back(self.model.vector_field(mm(y, scale.T)), scale) - mm(y, factor.T)

    def step(self, y: Array, scale: Any, dt: Any, factor: Any) -> Array:
        x = mm(y, scale.T)  # scale R^k, factor R^{-1} W
        u = y + self._pull_back(self.model.layer(x, dt) - x, scale)  # R^{-k} x^{k+1}
        return u - dt * mm(u, factor.T)  # R^{-1} = I - dt R^{-1} W

    def log_bound(self, y: Array, scale: Any) -> Array:
        """As ``Rescaled.log_bound``, with the model's own logit bound."""
        x = self.tokens(y, scale)
        return _with_size(self.model.log_logit_bound(x), x)


def _with_size(bound: Array, x: Array) -> Array:
    """``bound``, or ``log max |x|`` where larger (a NaN token counts as beyond range)."""
    size = jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x)))
    return jnp.maximum(bound, jnp.log(size))


def singular_layer_step(V: Any, dt: float, dtype: Any) -> str | None:
    """Why layers of step ``dt`` have no discrete rescaling ``z^k = R^{-k} x^k``:
    ``R = I + dt V`` (each of a stack of ``V``) is singular in ``dtype``; else None."""
    V = np.asarray(V, np.float64)
    R = np.eye(V.shape[-1]) + dt * V
    if np.max(np.linalg.cond(R)) > 1.0 / np.finfo(np.dtype(dtype)).eps:
        return f"I + dt V is singular for dt = {dt} (V has an eigenvalue near {-1 / dt:g})"
    return None
