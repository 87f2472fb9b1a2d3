"""Tier A of the long-context study: one head asked for a needle that may be absent.

Contract. ``NeedleConfig`` is everything that determines a trained model (checked on
construction; ``key()`` hashes it). ``sample_needles`` draws ``sets`` sets of ``n``
items from a JAX key, int32 whatever the x64 mode: item ``j`` is a pair (key symbol
``k_j`` of ``config.keys``, value symbol ``v_j`` of ``config.values``); the query is a
key symbol ``q``; with probability 1/2 it is *present*, ``k_j = q`` for exactly one
uniform position ``j*`` (the answer is ``v_{j*}``), else *absent*, ``k_j != q`` for
every ``j`` (the answer is NULL, the class ``config.values``). The other keys are
uniform over the ``keys - 1`` symbols other than ``q``; the values are uniform.

``NeedleModel``: learned embedding tables ``E_k`` (``keys x w``) and ``E_v``
(``values x w``), ``u = E_k[q]`` (the query's own state), one head of size ``w``:
``q = W_q u``, ``k_j = W_k E_k[k_j]``, ``v_j = W_v E_v[v_j]``, logits
``L_j = s beta <q, k_j>`` of the kernel's prepared queries and keys (``prepare``;
``beta = 1/sqrt(w)``; ``s`` is ``logit_scale``, 1 in training), weights
``P = kernel.weights(L)`` (attnflow's kernel object, whose parameters, the QK-norm gains
``wq``, ``wk``, the sink logit ``b``, ssmax's ``s``, are trainable leaves of the model),
an optional sigmoid output gate of the query's own state,
``g = sigmoid(W_g u + b_g)`` (``GatedAttention``'s gate: element-wise ``W_g`` ``(w, w)``
or head-wise ``(1, w)``), the residual ``h = u + W_o (g * sum_j P_j v_j)`` and a readout
MLP to ``values + 1`` classes. Keys and values depend on the symbol only, so the
prepared keys are formed once per symbol and gathered, and the values summed per class:
the same numbers as forming them per item, ``O(keys w + n)`` work per set.

``train`` (optax AdamW with a warm-up and cosine decay, decay on the matrices only,
early stopping on a fixed validation set at ``n_train``, a checkpoint every
``checkpoint_every`` steps from which an interrupted run resumes bit for bit) and
``load_or_train`` (a finished model reused through the checks of
``_retrieval_model``'s files) follow the max-retrieval study. ``evaluate`` reads
``sequences`` fresh sets at one length and returns an ``AttentionReadout`` of shape
``(1, 1, m)``; the logits it records are those the kernel exponentiates (ssmax's
``s log(n) L``), so the softmax bounds apply to them. Arithmetic is float32.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ..dynamics import kernels as _kernels
from . import _training
from ._readout import AttentionReadout

VARIANTS = ("softmax", "qknorm", "qknorm+sink", "qknorm+gate", "qknorm+sink+gate", "ssmax")
_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class NeedleConfig:
    """Everything that determines a trained Tier-A model (its hash names the folder).

    Attributes:
        variant: one of ``VARIANTS``.
        seed: initialisation and training-data seed.
        keys: key symbols; values: value classes (NULL is one more class).
        width: embedding width and head size ``w``; hidden, depth: the readout MLP.
        gate: ``"element"`` (one gate per channel) or ``"head"`` (one per query).
        n_train: items per set in training; batch: sets per step.
        lr: AdamW's peak learning rate; weight_decay: its decay (matrices only).
        warmup, max_steps: the schedule (linear warm-up, cosine decay to ``lr / 100``).
        eval_every, patience, min_delta, val_sets: early stopping on the validation
            loss (``val_sets`` sets at ``n_train``, a fixed seed): an evaluation
            improves when the loss falls below ``(1 - min_delta)`` times the best;
            training stops after ``patience`` evaluations without improvement, but
            not before ``min_steps`` (a model may sit on its initial plateau, always
            answering NULL, for a thousand steps before it learns to retrieve).
        checkpoint_every: steps between checkpoints.
    """

    variant: str = "softmax"
    seed: int = 0
    keys: int = 512
    values: int = 16
    width: int = 32
    hidden: int = 64
    depth: int = 1
    gate: str = "element"
    n_train: int = 64
    batch: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 100
    max_steps: int = 4000
    eval_every: int = 100
    patience: int = 6
    min_steps: int = 2000
    min_delta: float = 0.01
    val_sets: int = 2048
    checkpoint_every: int = 500

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}; got {self.variant!r}.")
        if self.gate not in ("element", "head"):
            raise ValueError(f"gate must be 'element' or 'head'; got {self.gate!r}.")
        least: dict[str, int] = dict.fromkeys(
            ("keys", "values", "width", "hidden", "n_train", "batch"), 2
        )
        least.update(dict.fromkeys(("depth", "max_steps", "eval_every", "patience"), 1))
        least.update(val_sets=1, checkpoint_every=1, min_steps=1, warmup=0, seed=0)
        for name, lo in least.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be a whole number >= {lo}; got {v!r}.")
        for name, positive in (("lr", True), ("weight_decay", False), ("min_delta", False)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (positive and v == 0):
                raise ValueError(
                    f"{name} must be a finite number {'> 0' if positive else '>= 0'}; got {v!r}."
                )

    @classmethod
    def quick(cls, variant: str, seed: int = 0) -> NeedleConfig:
        """A tiny configuration that trains in seconds (for tests and ``--quick``)."""
        return cls(
            variant=variant,
            seed=seed,
            keys=64,
            values=8,
            width=16,
            hidden=32,
            batch=32,
            n_train=16,
            max_steps=300,
            eval_every=50,
            patience=4,
            val_sets=256,
            checkpoint_every=100,
            warmup=20,
            lr=1e-2,
            min_steps=300,
        )

    @property
    def kernel_name(self) -> str:
        """The attnflow kernel of the variant."""
        base = self.variant.replace("+gate", "")
        return {"qknorm+sink": "qknorm_sink"}.get(base, base)

    @property
    def gated(self) -> bool:
        """Whether the head has an output gate."""
        return self.variant.endswith("+gate")

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def key(self) -> str:
        """``<variant>-<first 12 hex digits of the SHA-256 of to_dict()>``."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return f"{self.variant}-{hashlib.sha256(blob).hexdigest()[:12]}"


# -------------------------------------------------------------------------- data
def sample_needles(
    key: Array, sets: int, n: int, keys: int, values: int
) -> tuple[
    Int[Array, "b n"],
    Int[Array, "b n"],
    Int[Array, " b"],
    Bool[Array, " b"],
    Int[Array, " b"],
    Int[Array, " b"],
]:
    """``sets`` sets of ``n`` items: ``(item keys, item values, query, present, position
    of the needle (0 where absent), target)``, the target ``values`` (NULL) where absent.

    Examples:
        >>> import jax
        >>> k, v, q, present, pos, target = sample_needles(jax.random.key(0), 4, 8, 10, 3)
        >>> [int(x) for x in (k == q[:, None]).sum(1)] == [int(x) for x in present]
        True
    """
    kq, kp, kk, kv, kj = jax.random.split(key, 5)
    query = jax.random.randint(kq, (sets,), 0, keys, dtype=jnp.int32)
    present = jax.random.bernoulli(kp, jnp.asarray(0.5, _F32), (sets,))  # x64-free
    r = jax.random.randint(kk, (sets, n), 0, keys - 1, dtype=jnp.int32)
    item_keys = r + (r >= query[:, None]).astype(jnp.int32)  # uniform over the others
    item_values = jax.random.randint(kv, (sets, n), 0, values, dtype=jnp.int32)
    pos = jax.random.randint(kj, (sets,), 0, n, dtype=jnp.int32)
    needle = present[:, None] & (jnp.arange(n, dtype=jnp.int32)[None, :] == pos[:, None])
    item_keys = jnp.where(needle, query[:, None], item_keys)
    picked = jnp.take_along_axis(item_values, pos[:, None], axis=1)[:, 0]
    target = jnp.where(present, picked, jnp.int32(values))
    return item_keys, item_values, query, present, jnp.where(present, pos, 0), target


# ------------------------------------------------------------------------- model
def _kernel(config: NeedleConfig) -> _kernels.AbstractKernel:
    ones = jnp.ones((config.width,), _F32)
    name = config.kernel_name
    if name == "qknorm":
        return _kernels.QKNorm(wq=ones, wk=ones)
    if name == "qknorm_sink":
        return _kernels.QKNormSink(wq=ones, wk=ones, b=jnp.asarray(0.0, _F32))
    if name == "ssmax":
        # s log(n_train) = 1: at the training length it starts as softmax
        return _kernels.SSMax(s=jnp.asarray(1.0 / math.log(config.n_train), _F32))
    return _kernels.Softmax()


class NeedleModel(eqx.Module):
    """Embeddings, one head with attnflow's kernel object, an optional output gate and a
    readout MLP (see the module docstring)."""

    key_embed: Array
    value_embed: Array
    Wq: Array
    Wk: Array
    Wv: Array
    Wo: Array
    Wg: Array | None
    bg: Array | None
    kernel: _kernels.AbstractKernel
    readout: eqx.nn.MLP
    values: int = eqx.field(static=True)

    def __init__(self, config: NeedleConfig, key: Array):
        w = config.width
        ks = jax.random.split(key, 8)
        self.key_embed = jax.random.normal(ks[0], (config.keys, w), _F32)
        self.value_embed = jax.random.normal(ks[1], (config.values, w), _F32)
        s = 1.0 / math.sqrt(w)
        self.Wq, self.Wk, self.Wv, self.Wo = (
            s * jax.random.normal(k, (w, w), _F32) for k in ks[2:6]
        )
        if config.gated:
            rows = w if config.gate == "element" else 1
            self.Wg = s * jax.random.normal(ks[6], (rows, w), _F32)
            self.bg = jnp.zeros((rows,), _F32)
        else:
            self.Wg = self.bg = None
        self.kernel = _kernel(config)
        self.readout = eqx.nn.MLP(
            w,
            config.values + 1,
            config.hidden,
            config.depth,
            activation=jax.nn.gelu,
            key=ks[7],
            dtype=_F32,
        )
        self.values = config.values

    def gate(self, u: Array) -> Array:
        """``sigmoid(u W_g^T + b_g)`` of the query states ``u`` ``(b, w)`` (ones without
        a gate)."""
        if self.Wg is None or self.bg is None:
            return jnp.ones((u.shape[0], 1), u.dtype)
        return jax.nn.sigmoid(u @ self.Wg.T + self.bg[None, :])


def head(
    model: NeedleModel, item_keys: Array, item_values: Array, query: Array, logit_scale: Any = 1.0
) -> tuple[Array, Array, Array, Array]:
    """The head on a batch of sets: ``(class logits (b, C), weights P (b, n), effective
    logits (b, n), gate (b, g))``; the effective logits are what the kernel exponentiates
    (``s log(n) L`` for ssmax)."""
    w = model.Wq.shape[0]
    n = item_keys.shape[1]
    u = model.key_embed[query]
    qq, kk = model.kernel.prepare(u @ model.Wq.T, model.key_embed @ model.Wk.T)
    beta = jnp.asarray(logit_scale, _F32) / jnp.asarray(math.sqrt(w), _F32)
    table = beta * (qq @ kk.T)  # (b, keys): every symbol's logit, gathered per item
    L = jnp.take_along_axis(table, item_keys, axis=1)
    P = model.kernel.weights(L)
    per_class = jax.vmap(lambda p, v: jax.ops.segment_sum(p, v, model.values))(P, item_values)
    o = per_class @ (model.value_embed @ model.Wv.T)
    g = model.gate(u)
    h = u + (g * o) @ model.Wo.T
    eff = L
    if isinstance(model.kernel, _kernels.SSMax):
        eff = (model.kernel.s.astype(_F32) * jnp.asarray(math.log(n), _F32)) * L
    return jax.vmap(model.readout)(h), P, eff, g


def _loss(model, batch):
    keys, vals, query, _, _, target = batch
    logits, _, _, _ = head(model, keys, vals, query)
    lp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(lp, target[:, None], axis=-1))


# ---------------------------------------------------------------------- training
def _optimizer(config: NeedleConfig):
    import optax

    lr = optax.warmup_cosine_decay_schedule(
        0.0,
        config.lr,
        min(config.warmup, config.max_steps - 1),
        config.max_steps,
        end_value=config.lr / 100,
    )

    def decayed(params):  # the matrices and tables; not gains, biases, b, s
        return jax.tree.map(lambda x: x.ndim >= 2, params)

    return optax.adamw(lr, weight_decay=config.weight_decay, mask=decayed)


def _template(config: NeedleConfig):
    model = NeedleModel(config, jax.random.key(config.seed))
    return model, _optimizer(config).init(eqx.filter(model, eqx.is_array))


@functools.lru_cache(maxsize=32)
def _steps_fn(config: NeedleConfig) -> Callable:
    """One AdamW step per key (a fresh batch each), in one compiled ``lax.scan``."""
    import optax

    opt = _optimizer(config)

    @eqx.filter_jit
    def steps(model, opt_state, keys):
        params, static = eqx.partition(model, eqx.is_array)

        def one(carry, key):
            params, opt_state = carry
            batch = sample_needles(key, config.batch, config.n_train, config.keys, config.values)
            loss, grads = jax.value_and_grad(lambda p: _loss(eqx.combine(p, static), batch))(params)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(one, (params, opt_state), keys)
        return eqx.combine(params, static), opt_state, losses[-1]

    return steps


@eqx.filter_jit
def _right(model, keys, vals, query, target):
    logits, _, _, _ = head(model, keys, vals, query)
    lp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(lp, target[:, None], axis=-1)[:, 0]
    return jnp.argmax(logits, -1).astype(jnp.int32) == target, nll


def validation(model: NeedleModel, config: NeedleConfig) -> dict[str, float]:
    """Accuracy on the fixed validation sets at ``n_train`` (all, present, absent) and
    the cross-entropy ``loss``."""
    key = jax.random.key(config.seed + 1_000_003)
    keys, vals, query, present, _, target = sample_needles(
        key, config.val_sets, config.n_train, config.keys, config.values
    )
    right, nll = (np.asarray(a) for a in _right(model, keys, vals, query, target))
    pres = np.asarray(present)
    return dict(
        all=float(right.mean()),
        present=float(right[pres].mean()),
        absent=float(right[~pres].mean()),
        loss=float(np.mean(nll, dtype=np.float64)),
    )


def train(
    config: NeedleConfig, directory: Path, *, progress: bool = True, stop_after: int | None = None
) -> dict:
    """Train (or resume) the model of ``config`` into ``directory``; returns the record
    (also ``train.json``). ``stop_after`` stops, as a crash would, after that many steps
    of this call, leaving the checkpoint (for tests of resuming)."""

    def validate(state: dict, model: Any, loss: float) -> tuple[bool, dict[str, str]]:
        val = validation(model, config)
        state["history"].append([state["step"], loss, val["loss"], val["all"]])
        better = state["best"] < 0 or val["loss"] < state["best"] * (1 - config.min_delta)
        state["bad"] = 0 if better else state["bad"] + 1
        state["best"] = val["loss"] if better else state["best"]
        return better, dict(loss=f"{val['loss']:.2e}", val=f"{val['all']:.3f}")

    def running(state: dict) -> bool:
        patient = state["bad"] < config.patience or state["step"] < config.min_steps
        return state["step"] < config.max_steps and patient

    schedule = _training.Schedule(
        f"{config.variant} seed {config.seed}",
        config.max_steps,
        config.eval_every,
        config.checkpoint_every,
        config.seed,
        config.lr,
    )
    with jax.numpy_dtype_promotion("standard"):  # optax's step count meets floats
        run = _training.train_resumable(
            Path(directory),
            config.to_dict(),
            _template(config),
            schedule,
            _training.scanned(_steps_fn(config)),
            validate,
            running,
            progress=progress,
            stop_after=stop_after,
        )
        state, best = run.state, run.best
        if not run.finished:
            return dict(state, finished=False, resumed=run.resumed)
        if state["best"] < 0:
            state["best"], best = validation(run.model, config)["loss"], run.model
        final = validation(best, config)
    record = dict(
        state, finished=True, resumed=run.resumed, config=config.to_dict(), validation=final
    )
    return _training.finish(Path(directory), best, record)


_RECORD = {
    "step": int,
    "best": float,
    "history": list,
    "seconds": float,
    "finished": bool,
    "config": dict,
    "validation": dict,
    "model_sha256": str,
}


def load_finished(config: NeedleConfig, directory: Path) -> tuple[NeedleModel, dict]:
    """The finished model in ``directory`` and its record, every file checked (as the
    retrieval study's); a bad file is one ``ValueError`` naming it."""
    like = cast(Any, _template(config)[0])
    model, record = _training.read_finished(config.to_dict(), directory, like, _RECORD)
    return cast(NeedleModel, model), record


def load_or_train(
    config: NeedleConfig, cache: Path, *, progress: bool = True, retrain: bool = False
) -> tuple[NeedleModel, dict, bool]:
    """The trained model of ``config`` from ``cache/<config.key()>`` (trained, or its
    interrupted training resumed, when no finished model is there): ``(model, record,
    reused)``."""
    directory = Path(cache) / config.key()
    if (directory / "train.json").exists() and not retrain:
        model, record = load_finished(config, directory)
        return model, record, True
    if retrain:
        _training.forget(directory)
    record = train(config, directory, progress=progress)
    model, _ = load_finished(config, directory)
    return model, record, False


# -------------------------------------------------------------------- evaluation
@eqx.filter_jit
def _read(model, keys, vals, query, present, pos, target, logit_scale):
    logits, P, L, g = head(model, keys, vals, query, logit_scale)
    right = jnp.argmax(logits, -1).astype(jnp.int32) == target
    if isinstance(model.kernel, _kernels.QKNormSink):
        sink = _kernels.sink_share(L, model.kernel.b.astype(_F32))
    else:
        sink = jnp.zeros(P.shape[:1], _F32)
    plogp = jnp.where(P > 0, P * jnp.log(jnp.where(P > 0, P, 1.0)), 0.0)
    slogs = jnp.where(sink > 0, sink * jnp.log(jnp.where(sink > 0, sink, 1.0)), 0.0)
    entropy = -jnp.sum(plogp, axis=-1) - slogs
    at = pos[:, None]
    needle = jnp.take_along_axis(P, at, axis=1)[:, 0]
    Lstar = jnp.take_along_axis(L, at, axis=1)[:, 0]
    others = jnp.where(jnp.arange(L.shape[1], dtype=jnp.int32)[None, :] == at, -jnp.inf, L)
    gap = Lstar - jnp.max(others, axis=-1)
    spread = jnp.max(L, axis=-1) - jnp.min(L, axis=-1)
    zero = jnp.zeros_like(needle)
    return (
        right,
        entropy,
        sink,
        jnp.where(present, needle, zero),
        spread,
        jnp.where(present, gap, zero),
        jnp.mean(g, axis=-1),
    )


def evaluate(
    model: NeedleModel,
    config: NeedleConfig,
    length: int,
    *,
    sequences: int,
    seed: int,
    logit_scale: float = 1.0,
    chunk_items: int = 1 << 20,
) -> AttentionReadout:
    """``sequences`` fresh sets of ``length`` items read with no parameter changed (the
    logits multiplied by ``logit_scale``): an ``AttentionReadout`` of shape ``(1, 1, m)``.

    Sets are drawn in chunks of ``chunk_items / length`` sets; chunk ``c`` from
    ``fold_in(key(seed + length), c)``, so the sets do not depend on the model.

    Example:
        >>> import jax
        >>> config = NeedleConfig.quick("qknorm+sink")
        >>> model = NeedleModel(config, jax.random.key(0))  # untrained
        >>> r = evaluate(model, config, 256, sequences=8, seed=0)
        >>> r.shape, bool((r.needle_mass <= 1).all()), bool((r.sink_mass > 0).all())
        ((1, 1, 8), True, True)
    """
    if length < 2 or sequences < 1:
        raise ValueError(f"length must be >= 2 and sequences >= 1; got {length}, {sequences}.")
    per = max(1, min(sequences, chunk_items // length))
    parts: list[tuple] = []
    done, c = 0, 0
    while done < sequences:
        b = min(per, sequences - done)
        key = jax.random.fold_in(jax.random.key(seed + length), c)
        keys, vals, query, present, pos, target = sample_needles(
            key, per, length, config.keys, config.values
        )
        out = _read(model, keys, vals, query, present, pos, target, jnp.asarray(logit_scale, _F32))
        parts.append(tuple(np.asarray(a)[:b] for a in (*out, present)))
        done, c = done + b, c + 1
    cols = [np.concatenate([p[i] for p in parts]) for i in range(8)]
    right, entropy, sink, needle, spread, gap, gate, present = cols
    m = len(right)

    def row(x):
        return np.asarray(x, np.float32).reshape(1, 1, m)

    return AttentionReadout(
        length=int(length),
        correct=right.astype(bool),
        present=present.astype(bool),
        visible=np.full(m, length, np.int64),
        entropy=row(entropy),
        first_mass=row(np.zeros(m)),
        sink_mass=row(sink),
        needle_mass=row(needle),
        logit_spread=row(spread),
        needle_gap=row(gap),
        gate=row(gate),
    ).check()
