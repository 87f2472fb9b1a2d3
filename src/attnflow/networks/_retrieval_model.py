"""The max-retrieval task and its network, for ``attnflow.studies.retrieval`` (whose
module docstring states the task, the architecture and the training choices).

Contract: ``RetrievalConfig`` is everything that determines a trained model (checked on
construction; ``key()`` hashes it); ``sample_sets`` draws sets of items, query scalars
and targets from a JAX key, in float32 and int32 whatever the x64 mode;
``RetrievalModel`` holds the item, query and output MLPs and one head's weights;
``head_weights`` (one set) and ``head_from_embeddings`` (from embeddings already
computed) give the head's weights over the items, its pre-kernel logits and its output,
through attnflow's kernel registry, the same code as ``simulate``. All of them but
``head_from_embeddings`` are importable from ``attnflow.studies.retrieval``.
``load_finished`` reads a finished model's files (``model.eqx``, ``train.json``,
written by ``_training.finish``; the checks ``retrieval``'s docstring states): a damaged
or malformed file is one ``ValueError`` naming it, every array checked against the
model before it is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..dynamics import kernels as _kernels
from . import _training

CLASSES = 10
# kernels that are evaluated on a model trained with another kernel
EVAL_ONLY = {"adaptive": "softmax"}


@dataclasses.dataclass(frozen=True)
class RetrievalConfig:
    """Everything that determines a trained model (its hash names the saved files).

    Attributes:
        kernel: the attention kernel it is trained with (``attnflow.KERNELS``).
        width: MLP width and head size.
        depth: hidden layers per MLP.
        n_train: set size in training.
        batch: sets per step.
        lr: Adam's peak learning rate.
        schedule: ``"cosine"`` (a linear warm-up over ``warmup`` steps, then a cosine
            decay to ``lr / 100`` at ``max_steps``) or ``"constant"``.
        warmup: warm-up steps of the cosine schedule.
        max_steps: at most this many steps.
        eval_every: steps between validation accuracies.
        patience: validations without improvement before stopping.
        min_delta: an improvement must exceed this (accuracy, a fraction).
        val_sets: validation sets (n = n_train, fixed seed).
        checkpoint_every: steps between checkpoints.
        seed: model initialisation and data seed.
        kernel_params: the kernel's parameters (``{"lam": 0.2}`` for differential).
    """

    kernel: str = "softmax"
    width: int = 128
    depth: int = 2
    n_train: int = 16
    batch: int = 128
    lr: float = 1e-3
    schedule: str = "cosine"
    warmup: int = 100
    max_steps: int = 5000
    eval_every: int = 250
    patience: int = 8
    min_delta: float = 1e-3
    val_sets: int = 2048
    checkpoint_every: int = 500
    seed: int = 0
    kernel_params: tuple = ()

    def __post_init__(self):
        _kernels.get(self.kernel)
        params = self.kernel_params
        if isinstance(params, Mapping):  # {"lam": 0.2}, as to_dict writes it
            params = tuple(sorted(params.items()))
        ok = isinstance(params, (tuple, list)) and all(
            isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in params
        )
        if not ok:
            raise ValueError(
                f"kernel_params must be a mapping of names to numbers (or their pairs); "
                f"got {self.kernel_params!r}."
            )
        object.__setattr__(self, "kernel_params", tuple((str(k), v) for k, v in params))
        if self.kernel in EVAL_ONLY:
            raise ValueError(
                f"kernel {self.kernel!r} is applied at evaluation to the "
                f"{EVAL_ONLY[self.kernel]!r}-trained model, not trained."
            )
        for name in (
            "width",
            "depth",
            "n_train",
            "batch",
            "max_steps",
            "eval_every",
            "patience",
            "val_sets",
            "checkpoint_every",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {v!r}.")
        for name in ("warmup", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a whole number >= 0; got {v!r}.")
        for name, lo_open in (("lr", True), ("min_delta", False)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (lo_open and v == 0):
                bound = "> 0" if lo_open else ">= 0"
                raise ValueError(f"{name} must be a finite number {bound}; got {v!r}.")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant'; got {self.schedule!r}.")
        if self.kernel == "differential" and self.width % 2:
            raise ValueError(f"width must be even for 'differential'; got {self.width}.")

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (``kernel_params`` as a dict)."""
        d = dataclasses.asdict(self)
        d["kernel_params"] = dict(self.kernel_params)
        return d

    def key(self) -> str:
        """``<kernel>-<first 12 hex digits of the SHA-256 of to_dict()>``: the model's folder."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return f"{self.kernel}-{hashlib.sha256(blob).hexdigest()[:12]}"


# -------------------------------------------------------------------------- data
def sample_sets(
    key: Array, sets: int, n: int
) -> tuple[Float[Array, "b n 11"], Float[Array, "b 1"], Int[Array, " b"], Int[Array, " b"]]:
    """``sets`` random sets of ``n`` items: ``(items, query scalars, targets, argmax)``.

    Items ``[p_j, onehot(c_j)]`` with ``p ~ U(0, 1)``, ``c ~ U{0..9}``; the query scalar is
    ``U(0, 1)``; the target is the class of the item of largest priority (``argmax``)."""
    kp, kc, ks = jax.random.split(key, 3)
    p = jax.random.uniform(kp, (sets, n), jnp.float32)
    # int32 whatever the x64 mode: the sets (and so every number) do not depend on it
    c = jax.random.randint(kc, (sets, n), 0, CLASSES, dtype=jnp.int32)
    items = jnp.concatenate([p[..., None], jax.nn.one_hot(c, CLASSES, dtype=jnp.float32)], axis=-1)
    top = jnp.argmax(p, axis=-1)
    target = jnp.take_along_axis(c, top[:, None], axis=-1)[:, 0]
    return items, jax.random.uniform(ks, (sets, 1), jnp.float32), target, top


# ------------------------------------------------------------------------- model
class RetrievalModel(eqx.Module):
    """Item and query MLPs, one attention head from attnflow's kernel registry, an output
    MLP to 10 class logits (see the module docstring)."""

    item_mlp: eqx.nn.MLP
    query_mlp: eqx.nn.MLP
    out_mlp: eqx.nn.MLP
    Wq: Array
    Wk: Array
    Wv: Array
    kernel_params: dict
    kernel: str = eqx.field(static=True)

    def __init__(self, config: RetrievalConfig, key: Array):
        w, dp = config.width, config.depth
        k1, k2, k3, k4, k5, k6 = jax.random.split(key, 6)
        act = jax.nn.gelu
        self.item_mlp = eqx.nn.MLP(1 + CLASSES, w, w, dp, activation=act, key=k1, dtype=jnp.float32)
        self.query_mlp = eqx.nn.MLP(1, w, w, dp, activation=act, key=k2, dtype=jnp.float32)
        self.out_mlp = eqx.nn.MLP(w, CLASSES, w, dp, activation=act, key=k3, dtype=jnp.float32)
        s = 1.0 / math.sqrt(w)
        self.Wq = s * jax.random.normal(k4, (w, w), jnp.float32)
        self.Wk = s * jax.random.normal(k5, (w, w), jnp.float32)
        self.Wv = s * jax.random.normal(k6, (w, w), jnp.float32)
        self.kernel = config.kernel
        params = _kernels.kernel_params(config.kernel, dict(config.kernel_params))
        self.kernel_params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}

    def embed(self, items: Array, query: Array) -> tuple[Array, Array]:
        """Item embeddings ``(n, w)`` and the query token's embedding ``(w,)``."""
        return jax.vmap(self.item_mlp)(items), self.query_mlp(query)


def head_weights(
    model: RetrievalModel, items: Float[Array, "n 11"], query: Float[Array, " 1"], kernel: str
) -> tuple[Array, Array, Array]:
    """The head on one set: ``(weights over the items (n,), pre-kernel logits, values)``.

    The weights are ``attnflow.kernels.weights(kernel, L)`` of the logits
    ``L = beta <q, k_j>`` of the kernel's prepared queries and keys (``prepare_tokens``,
    ``prepare``), exactly as in ``Attention``; ``beta = 1/sqrt(head size)``. The products
    are regrouped so that no key (where the kernel maps keys linearly) and no value is
    formed per item: ``<W_q u, W_k e_j> = <W_k^T W_q u, e_j>`` and
    ``sum_j P_j W_v e_j = W_v sum_j P_j e_j`` (the same numbers up to float32 rounding,
    half the work per item)."""
    return head_from_embeddings(model, *model.embed(items, query), kernel)


def head_from_embeddings(
    model: RetrievalModel, e: Array, u: Array, kernel: str
) -> tuple[Array, Array, Array]:
    """``head_weights`` from the item embeddings ``e`` ``(n, w)`` and the query's ``u``."""
    p = model.Wq.shape[0]
    beta = jnp.asarray(1.0 / math.sqrt(p), e.dtype)
    et = _kernels.prepare_tokens(kernel, e)
    ut = _kernels.prepare_tokens(kernel, u[None, :])
    q = ut @ model.Wq.T
    if kernel == "selective":
        # causal sequence [items..., query]: every item is a query too; read the last row
        k = et @ model.Wk.T
        qs = jnp.concatenate([et @ model.Wq.T, q], axis=0)
        ks = jnp.concatenate([k, ut @ model.Wk.T], axis=0)
        L = _kernels.logits(qs, ks, beta)
        P = _kernels.weights(kernel, L, model.kernel_params)[-1]
        v = jnp.concatenate([e, u[None, :]], axis=0) @ model.Wv.T
        return P[:-1], L[-1, :-1], v.T @ P
    if type(_kernels.get(kernel)).prepare is _kernels.AbstractKernel.prepare:
        # <q, W_k e_j> = <W_k^T q, e_j>: the keys are never formed (n p^2 fewer products)
        L = (beta * (q @ model.Wk)) @ et.T
    elif kernel == "differential":
        # the same for each half: [<q1, K1 e_j> | <q2, K2 e_j>]
        h = p // 2
        qk = jnp.concatenate([q[:, :h] @ model.Wk[:h], q[:, h:] @ model.Wk[h:]], axis=0)
        L = (beta * qk @ et.T).reshape(1, -1)
    else:  # a nonlinear map of the keys (qknorm, linear): keys formed
        qq, kk = _kernels.prepare(kernel, q, et @ model.Wk.T)
        L = _kernels.logits(qq, kk, beta)
    P = _kernels.weights(kernel, L, model.kernel_params)[0]
    # sum_j P_j W_v e_j = W_v (sum_j P_j e_j): the values are never formed either
    return P, L[0], (P @ e) @ model.Wv.T


# ------------------------------------------------------------ finished models
_RECORD = {  # the fields of train.json and their kinds
    "step": int,
    "best": float,
    "bad": int,
    "history": list,
    "seconds": float,
    "finished": bool,
    "resumed": bool,
    "config": dict,
}


def _history_rows(record: dict) -> None:
    for row in record["history"]:  # [step, loss, validation accuracy]
        kinds = (int, (int, float), (int, float))
        if not (
            isinstance(row, list)
            and len(row) == 3
            and all(isinstance(v, k) and not isinstance(v, bool) for v, k in zip(row, kinds))
        ):
            raise ValueError(f"its history holds {row!r:.60}, not [step, loss, accuracy]")


def load_finished(config: Any, directory: Path, like: Any) -> tuple[Any, dict]:
    """The finished model in ``directory`` and its record, each file checked: the
    configuration it was trained with, the record's fields and history rows, the SHA-256
    of ``model.eqx`` (caches written before it was recorded have none) and the shape and
    dtype of every array, before it is read (``_training.read_finished``). A bad file is
    one ValueError naming it. ``config`` is a ``RetrievalConfig`` or any configuration
    with ``to_dict()`` whose record has these fields (the decoder's)."""
    return _training.read_finished(
        config.to_dict(), directory, like, _RECORD, check=_history_rows, hash_required=False
    )
