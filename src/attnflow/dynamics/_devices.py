"""Running a solve on several devices: the batch axis sharded over a 1-D mesh.

``simulate(..., devices=[...])`` wraps its solve functions here, unchanged: the batch of
systems (and, for stacked weights, the model's leaves) is padded to a multiple of the
device count by repeating its first row (a valid system, so padding never creates a
failure), placed on a mesh ``("batch",)``, and each device runs the solve on its own
rows inside ``jax.shard_map``: its own adaptive ``while`` loop (diffrax with
``throw=False``), not one lock-step loop across devices. The padding is removed from the
results before they leave the compiled call. ``balanced_order`` deals systems sorted by
an estimated cost round-robin to the devices, so that each gets an even share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array

from .base import AbstractAttentionSystem, AbstractModel

__all__ = [
    "resolve_devices",
    "mesh_of",
    "run_sharded",
    "balanced_order",
    "SHARDS",
    "TokenSharded",
]

AXIS = "batch"
SHARDS = ("batch", "tokens")


def resolve_devices(devices: Any) -> list | None:
    """``devices`` as given to ``simulate``: ``None``, ``"all"`` or a sequence of JAX
    devices -> ``None`` or a list of distinct devices (``ValueError`` otherwise)."""
    if devices is None:
        return None
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(
                f"devices must be None, 'all' or a list of JAX devices (jax.devices()); "
                f"got {devices!r}."
            )
        return list(jax.local_devices())
    if isinstance(devices, jax.Device):
        devices = [devices]
    try:
        devs = list(devices)
    except TypeError:
        raise ValueError(
            f"devices must be None, 'all' or a list of JAX devices (jax.devices()); "
            f"got {devices!r}."
        ) from None
    if not devs:
        raise ValueError("devices is empty: give at least one device, or None, or 'all'.")
    for d in devs:
        if not isinstance(d, jax.Device):
            raise ValueError(
                f"devices must hold JAX devices (from jax.devices()); got {d!r} in the list."
            )
    if len({d.id for d in devs}) != len(devs):
        raise ValueError("devices lists a device twice; give each device once.")
    return devs


def mesh_of(devices: Sequence[Any], axis: str = AXIS) -> Mesh:
    """A 1-D mesh over ``devices`` with the one axis ``axis``."""
    return jax.make_mesh(
        (len(devices),), (axis,), axis_types=(AxisType.Auto,), devices=list(devices)
    )


def _pad_rows(a, total: int):
    b = a.shape[0]
    if total == b:
        return a
    return jnp.concatenate([a, jnp.repeat(a[:1], total - b, axis=0)], axis=0)


@eqx.filter_jit
def _sharded(fn, mesh, padded: int, frame, y0, args, batched_frame: bool, kwargs):
    b = y0.shape[0]
    dyn, static = eqx.partition(frame, eqx.is_array)
    if batched_frame:
        dyn = jax.tree_util.tree_map(lambda a: _pad_rows(a, padded), dyn)
    y0 = _pad_rows(y0, padded)
    spec = PartitionSpec(AXIS)
    rep = PartitionSpec()

    def local(dyn, y, args):
        return fn(eqx.combine(dyn, static), y, *args, **kwargs)

    batched, per_device = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec if batched_frame else rep, spec, rep),
        out_specs=(spec, spec),
        check_vma=False,
    )(dyn, y0, args)
    return jax.tree_util.tree_map(lambda a: a[:b], batched), per_device


def run_sharded(
    fn: Callable[..., tuple[Any, Any]],
    devices: Sequence[Any],
    frame: Any,
    y0: Any,
    *args: Any,
    batched_frame: bool = False,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """``fn(frame, y0_rows, *args, **kwargs)`` on every device for its rows of ``y0``.

    Args:
        fn: a solve on a batch: returns ``(batched, per_device)``, pytrees whose leaves
            have the local batch (``batched``) or one row per device (``per_device``) as
            their leading axis.
        devices: the devices of the mesh.
        frame: the frame (an equinox module), replicated, or with a leading batch axis
            on every array leaf (``batched_frame``: stacked weights), sharded like ``y0``.
        y0: ``(b, ...)`` the batch; padded to a multiple of ``len(devices)``.
        *args: arrays replicated on every device. **kwargs: static arguments of ``fn``.

    Returns:
        ``(batched, per_device)`` with the padding removed from ``batched`` (leading axis
        ``b``) and ``per_device`` of leading axis ``len(devices)``.
    """
    mesh = mesh_of(devices)
    D = len(devices)
    b = y0.shape[0]
    padded = -(-b // D) * D
    y0 = jax.device_put(y0, NamedSharding(mesh, PartitionSpec(AXIS))) if padded == b else y0
    return _sharded(fn, mesh, padded, frame, y0, args, batched_frame, kwargs)


def device_ids(devices: Sequence[Any] | None) -> list[int] | None:
    """The ids of ``devices`` (for the solver record), or None."""
    return None if devices is None else [int(d.id) for d in devices]


# ------------------------------------------------------------------ token sharding
TOKEN_AXIS = "tokens"


class TokenSharded(AbstractAttentionSystem):
    """An attention system whose ``weigh`` runs with its query rows sharded over a mesh
    ``("tokens",)``: each device takes ``n / D`` query rows (padded with zero rows to a
    multiple of ``D``) against every key and value (gathered: replicated on each
    device), through the model's own ``weigh`` (tiled for large ``n``), so every row is
    computed by the same operations as on one device. Memory per device
    ``O(n d + block n)``. Everything else is the model's own.

    The devices may belong to several processes (``jax.distributed``: each process runs
    the same ``simulate(..., devices=jax.devices(), shard="tokens")`` on the same
    tokens): the rows each device computes are gathered back onto every device after
    each evaluation, so every process holds the whole state and reads the whole
    trajectory (``docs/cluster.md``)."""

    inner: AbstractAttentionSystem
    mesh: Mesh = eqx.field(static=True)

    def __init__(self, inner: AbstractModel, devices: Sequence[Any]):
        if not isinstance(inner, AbstractAttentionSystem):
            raise ValueError(
                f"shard='tokens' needs an attention model (queries, keys and values); "
                f"{type(inner).__name__} is not one: use shard='batch'."
            )
        if getattr(inner, "mask", None) is not None:
            raise ValueError(
                "shard='tokens' does not take a masked model yet (the mask needs each "
                "device's row offset); use mask=None or devices=None."
            )
        self.inner = inner
        self.mesh = mesh_of(devices, TOKEN_AXIS)

    # the model's own facts and maps
    @property
    def propagator(self):  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.propagator

    @property
    def rows_sum_to_one(self) -> bool:
        return self.inner.rows_sum_to_one

    @property
    def normalizes_tokens(self) -> bool:
        return self.inner.normalizes_tokens

    @property
    def attention_kind(self) -> str:
        return self.inner.attention_kind

    def kept_keys(self, x: Array, rows: Array | None = None) -> Array:
        return self.inner.kept_keys(x, rows)

    @property
    def bilinear_logits(self) -> bool:
        return self.inner.bilinear_logits

    @property
    def positional(self) -> bool:
        return self.inner.positional

    def prepare_tokens(self, x):
        return self.inner.prepare_tokens(x)

    @property
    def beta(self):  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.inner.beta

    @property
    def d(self) -> int:
        return self.inner.d

    @property
    def dtype(self):
        return self.inner.dtype

    def query_key_maps(self):
        return self.inner.query_key_maps()

    def weights(self, q, k):
        return self.inner.weights(q, k)

    def logits_qk(self, q, k):
        return self.inner.logits_qk(q, k)

    def log_bound(self, q, k):
        return self.inner.log_bound(q, k)

    def value_map(self, u):
        return self.inner.value_map(u)

    def describe(self) -> dict:
        return self.inner.describe()

    def arrays(self) -> dict:
        return self.inner.arrays()

    @classmethod
    def from_saved(cls, description: dict, arrays: dict) -> AbstractModel:
        raise NotImplementedError("a token-sharded run saves its inner model")

    def weigh(self, q, k, values):
        """``P(q, k) @ values`` with the query rows sharded over the mesh."""
        D = self.mesh.size
        n = q.shape[0]
        pad = (-n) % D
        qp = jnp.pad(q, ((0, pad), (0, 0))) if pad else q
        rows, rep = PartitionSpec(TOKEN_AXIS), PartitionSpec()
        out = jax.shard_map(
            self.inner.weigh,
            mesh=self.mesh,
            in_specs=(rows, rep, rep),
            out_specs=rows,
            check_vma=False,
        )(qp, k, values)
        out = out[:n] if pad else out
        # every row back on every device: the next evaluation's keys and values need all
        # of them, and the state stays whole on each device, so that each process of a
        # multi-process run (jax.distributed) holds, and can read, the whole result
        return jax.lax.with_sharding_constraint(out, NamedSharding(self.mesh, rep))


def balanced_order(cost, n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """A permutation (with repeats, for padding) that sorts the systems by ``cost`` and
    deals them round-robin to ``n_devices`` equal contiguous blocks, and the position of
    each system in it (to put the results back in the given order)."""
    order = np.argsort(np.asarray(cost, np.float64), kind="stable")
    b = len(order)
    per = -(-b // n_devices)
    blocks = []
    for j in range(n_devices):
        blk = order[j::n_devices]
        if len(blk) == 0:
            blk = order[-1:]
        blocks.append(np.concatenate([blk, np.repeat(blk[-1:], per - len(blk))]))
    perm = np.concatenate(blocks)
    where = np.empty(b, np.int64)
    where[perm[::-1]] = np.arange(len(perm))[::-1]  # first occurrence of each system
    return perm, where
