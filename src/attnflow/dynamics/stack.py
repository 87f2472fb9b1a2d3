"""Many models of one family in one pytree: a leading batch axis on every weight.

``stack(models)`` returns a model of the same family whose array leaves are the models'
leaves stacked along a new leading axis; ``simulate`` then pairs system ``i`` of a batch
with model ``i`` (``jax.vmap`` over the model's leaves, sharded like any batch), so a
sweep over thousands of weight triples is one compiled call instead of a Python loop.
``unstack(model, i)`` takes model ``i`` back out. ``Attention(Q, K, V)`` with ``Q, K, V``
of shape ``(b, d, d)`` builds the heads one by one and stacks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from .base import AbstractModel

__all__ = ["stack", "unstack"]


def _stack_leaves(*leaves):
    # on the host: jnp.stack of b arrays compiles one b-operand concatenation per leaf
    # and per b (seconds for b = 256), numpy's costs microseconds
    out = np.stack([np.asarray(a) for a in leaves])
    return out if isinstance(leaves[0], np.ndarray) else jnp.asarray(out)


def stack(models: Sequence[AbstractModel]) -> AbstractModel:
    """Stack models of one family into one model with a leading batch axis.

    Args:
        models: a non-empty sequence of models of the same family, with the same
            settings (kernel, mask, block, propagator method), array shapes and dtypes:
            everything but the values of their weights.

    Returns:
        A model of the same family whose ``stack_size`` is ``len(models)``; its array
        leaves have shape ``(len(models), ...)``. Pass it to ``attnflow.simulate`` with
        a batch of ``len(models)`` systems (or one ``(n, d)`` start shared by all).

    Raises:
        ValueError: naming the first model that differs from the first one in anything
            but its weights' values, or a family that does not support stacking.
    """
    if isinstance(models, AbstractModel) or not isinstance(models, Sequence) or not models:
        raise ValueError("models must be a non-empty list of attnflow models.")
    first = models[0]
    if not isinstance(first, AbstractModel):
        raise ValueError(f"models[0] must be an attnflow model; got {type(first).__name__}.")
    if first.stack_size is not None:
        raise ValueError("models[0] is already stacked; stack unstacked models.")
    dyn0, static0 = eqx.partition(first, eqx.is_array)
    leaves0, tree0 = jax.tree_util.tree_flatten(dyn0)
    for i, m in enumerate(models[1:], 1):
        if type(m) is not type(first):
            raise ValueError(
                f"models[{i}] is a {type(m).__name__} and models[0] a "
                f"{type(first).__name__}: stack models of one family."
            )
        dyn, static = eqx.partition(m, eqx.is_array)
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        if tree != tree0 or not eqx.tree_equal(static, static0):
            where = _first_difference(first, m)
            raise ValueError(
                f"models[{i}] differs from models[0] in more than its weights' values: "
                f"its {where} differs; build every model with the same settings (for value "
                f"matrices of different kinds, propagator='expm', exact for every V)."
            )
        for a, b in zip(leaves, leaves0):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"models[{i}] has an array of shape {a.shape} ({a.dtype}) where "
                    f"models[0] has {b.shape} ({b.dtype}): stack models of one size and "
                    f"precision."
                )
    dyns = [eqx.partition(m, eqx.is_array)[0] for m in models]
    out = eqx.combine(jax.tree_util.tree_map(_stack_leaves, *dyns), static0)
    if out.stack_size != len(models):
        raise ValueError(f"{type(first).__name__} does not support stacked weights.")
    return out


def _first_difference(a: Any, b: Any) -> str:
    """The first field of two models of one family whose structure or settings differ
    (the kernel, the mask, the propagator's method, ...), named for a message."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        dx, sx = eqx.partition(x, eqx.is_array)
        dy, sy = eqx.partition(y, eqx.is_array)
        same_tree = jax.tree_util.tree_structure(dx) == jax.tree_util.tree_structure(dy)
        if not (same_tree and eqx.tree_equal(sx, sy)):
            show = {"flow": "propagator method", "kernel": "kernel", "mask": "mask"}
            name = show.get(f.name, f.name)
            if f.name == "flow":
                return f"{name} ({x.method!r} against {y.method!r})"
            if f.name == "kernel":
                return f"{name} ({x.name!r} against {y.name!r})"
            return name
    return "settings"


def unstack(model: AbstractModel, i: Any) -> AbstractModel:
    """Model ``i`` of a stacked model (its leaves' row ``i``)."""
    size = model.stack_size
    if size is None:
        raise ValueError("model is not stacked (attnflow.stack); there is nothing to unstack.")
    i = _checks.index("i", i, size, what="stacked models")  # 1.7 is not an index
    return jax.tree_util.tree_map(lambda a: a[i] if eqx.is_array(a) else a, model)
