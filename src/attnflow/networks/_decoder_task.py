"""The recall task and the configuration of the long-context decoder, for
``attnflow.networks._decoder`` (whose module docstring states the model, the training
and the readout).

Contract. ``DecoderConfig`` is everything that determines a trained decoder (checked on
construction; ``key()`` hashes it; ``quick`` is a tiny one for tests). ``sample_batch``
draws ``b`` sequences of one length from a JAX key, in int32 whatever the x64 mode, and
returns a ``RecallBatch``.

The task (multi-query associative recall with absent keys). Token ids, for ``K`` keys,
``V`` values and ``F`` fillers: ``BOS = 0``, ``NULL = 1`` (the answer of an absent key;
never an input), keys ``2 .. K + 1``, values ``K + 2 .. K + V + 1``, fillers
``K + V + 2 .. K + V + F + 1``; the vocabulary has ``K + V + F + 2`` tokens. A sequence
of length ``n`` is

    BOS | context of C = n - 1 - q tokens | q query tokens

- the context holds ``P = pairs`` key-value pairs, each a key token immediately followed
  by its value token, at uniformly random non-overlapping places (a uniform subset of
  ``P`` of the ``C - P`` units "filler or pair", so that every placement is equally
  likely); the ``P`` keys are distinct (a uniform draw without replacement), each value
  uniform over the ``V`` values (values may repeat); every other context token is a
  filler, uniform over the ``F`` fillers;
- the ``q = queries`` query tokens are keys: exactly ``q / 2`` are keys of the context
  (distinct, a uniform subset of the ``P`` pairs) and ``q / 2`` are keys that occur
  nowhere in the sequence (distinct, uniform among the ``K - P`` unused keys), in a
  uniformly random order;
- the answer of a query is read from the model's output at the query's own position
  (the answer rows are the last ``q`` positions): the value of its pair, or ``NULL``
  for an absent key. Answers are never fed back as input; the loss is on the answers
  only.

``needle`` is the position of the value token of the queried pair (the token whose
state holds the key at lag one: where a retrieving head has to look), ``-1`` for an
absent key. Reading at another length changes only ``C``: the pairs and the queries stay,
the filler grows.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

__all__ = [
    "VARIANTS",
    "ALL_VARIANTS",
    "BOS",
    "NULL",
    "DecoderConfig",
    "RecallBatch",
    "sample_batch",
    "variant_parts",
]

#: The variants of the study: QK norm off and on, with no extra, a learned sink, an
#: output gate, or both.
VARIANTS: tuple[str, ...] = ("plain", "qknorm", "qknorm+sink", "qknorm+gate", "qknorm+sink+gate")
#: Every variant a configuration accepts (the study's and the controls without QK norm).
ALL_VARIANTS: tuple[str, ...] = (*VARIANTS, "sink", "gate", "sink+gate")

BOS = 0
NULL = 1


def variant_parts(variant: str) -> tuple[bool, bool, bool]:
    """``(qknorm, sink, gate)`` of a variant name (``ValueError`` naming the variants)."""
    if variant not in ALL_VARIANTS:
        raise ValueError(f"variant must be one of {ALL_VARIANTS}; got {variant!r}.")
    parts = set(variant.split("+"))
    return "qknorm" in parts, "sink" in parts, "gate" in parts


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Everything that determines a trained decoder (its hash names the saved files).

    Attributes:
        variant: the attention (``ALL_VARIANTS``): ``"plain"`` softmax, ``"qknorm"``
            (per-head QK norm with learned gains), ``+sink`` (a learned sink logit per
            head), ``+gate`` (a head-wise sigmoid output gate).
        seed: initialisation and data seed.
        d_model, heads, layers: width, heads per layer (head size ``d_model / heads``),
            layers.
        conv_width: taps of the causal depthwise convolution of each layer.
        mlp_width: hidden units of each MLP.
        train_length: sequence length in training (and of the validation set).
        pairs, queries: key-value pairs and queries per sequence (``queries`` even: half
            present, half absent).
        keys, values, fillers: the sizes of the three token vocabularies.
        batch: sequences per step.
        lr: AdamW's peak learning rate (linear warm-up over ``warmup`` steps, cosine
            decay to ``lr / 100`` at ``max_steps``).
        weight_decay: AdamW's decoupled weight decay of the matrices (embedding,
            projections, MLP, gate weights); gains, convolutions, sink logits and biases
            are not decayed.
        clip: the global gradient norm is clipped to this.
        max_steps: at most this many steps.
        eval_every: steps between validation accuracies.
        patience: stop after this many validations without an improvement of more
            than ``min_delta`` (``None``: never; the default is a fixed budget).
        min_delta: the accuracy (a fraction) an improvement must exceed; the kept model
            is the latest whose validation accuracy is within ``min_delta`` of the best.
        stop_accuracy: stop as soon as the validation accuracy reaches this (``None``:
            never).
        val_sequences: validation sequences (length ``train_length``, fixed seed).
        checkpoint_every: steps between checkpoints.
    """

    variant: str = "plain"
    seed: int = 0
    d_model: int = 64
    heads: int = 2
    layers: int = 2
    conv_width: int = 4
    mlp_width: int = 256
    train_length: int = 64
    pairs: int = 8
    queries: int = 8
    keys: int = 32
    values: int = 32
    fillers: int = 16
    batch: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.1
    clip: float = 1.0
    warmup: int = 100
    max_steps: int = 1500
    eval_every: int = 250
    patience: int | None = None
    min_delta: float = 1e-3
    stop_accuracy: float | None = None
    val_sequences: int = 512
    checkpoint_every: int = 250

    def __post_init__(self):
        variant_parts(self.variant)
        positive = (
            "d_model",
            "heads",
            "layers",
            "conv_width",
            "mlp_width",
            "train_length",
            "pairs",
            "queries",
            "keys",
            "values",
            "fillers",
            "batch",
            "max_steps",
            "eval_every",
            "val_sequences",
            "checkpoint_every",
        )
        for name in positive:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1; got {v!r}.")
        if self.patience is not None and (
            isinstance(self.patience, bool)
            or not isinstance(self.patience, int)
            or self.patience < 1
        ):
            raise ValueError(
                f"patience must be None or a whole number >= 1; got {self.patience!r}."
            )
        for name in ("warmup", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a whole number >= 0; got {v!r}.")
        for name, lo_open in (("lr", True), ("clip", True), ("weight_decay", False)):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (lo_open and v == 0):
                raise ValueError(
                    f"{name} must be a finite number {'>' if lo_open else '>='} 0; got {v!r}."
                )
        for name in ("min_delta", "stop_accuracy"):
            v = getattr(self, name)
            if v is None and name == "stop_accuracy":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name} must be a number in [0, 1]; got {v!r}.")
        if self.d_model % self.heads:
            raise ValueError(f"heads = {self.heads} must divide d_model = {self.d_model}.")
        if self.queries % 2:
            raise ValueError(
                f"queries must be even (half present, half absent); got {self.queries}."
            )
        if self.queries // 2 > self.pairs:
            raise ValueError(
                f"queries / 2 = {self.queries // 2} present queries need as many pairs; "
                f"got pairs = {self.pairs}."
            )
        if self.keys < self.pairs + self.queries // 2:
            raise ValueError(
                f"keys must be at least pairs + queries / 2 = {self.pairs + self.queries // 2} "
                f"(the absent keys are keys unused by the pairs); got {self.keys}."
            )
        self.min_length(self.train_length, "train_length")

    # ------------------------------------------------------------------ derived
    @property
    def vocab(self) -> int:
        """Tokens: BOS, NULL, keys, values, fillers."""
        return 2 + self.keys + self.values + self.fillers

    @property
    def head_size(self) -> int:
        return self.d_model // self.heads

    @property
    def parts(self) -> tuple[bool, bool, bool]:
        """``(qknorm, sink, gate)``."""
        return variant_parts(self.variant)

    def min_length(self, length: int, name: str = "length") -> int:
        """``length`` if a sequence of it holds BOS, the pairs (at least one filler among
        them) and the queries; else a ``ValueError`` naming ``name``."""
        need = 2 + 2 * self.pairs + self.queries
        if isinstance(length, bool) or not isinstance(length, int) or length < need:
            raise ValueError(
                f"{name} must be a whole number >= {need} (BOS, {self.pairs} pairs, a "
                f"filler and {self.queries} queries); got {length!r}."
            )
        return length

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def key(self) -> str:
        """``<variant>-<first 12 hex digits of the SHA-256 of to_dict()>``: the folder."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return f"{self.variant}-{hashlib.sha256(blob).hexdigest()[:12]}"

    @classmethod
    def quick(cls, variant: str, seed: int = 0) -> DecoderConfig:
        """A tiny configuration that trains in seconds (tests): width 32, length 24,
        3 pairs, 4 queries, 8 keys and values, at most 400 steps, stopping at a
        validation accuracy of 0.99."""
        return cls(
            variant=variant,
            seed=seed,
            d_model=32,
            heads=2,
            layers=2,
            mlp_width=64,
            train_length=24,
            pairs=3,
            queries=4,
            keys=8,
            values=8,
            fillers=4,
            batch=32,
            lr=1e-2,
            warmup=20,
            max_steps=400,
            eval_every=50,
            stop_accuracy=0.99,
            val_sequences=128,
            checkpoint_every=50,
        )


class RecallBatch(NamedTuple):
    """``b`` sequences of length ``n`` with ``q`` queries (``sample_batch``).

    Attributes:
        tokens: ``(b, n)`` int32 token ids; the last ``q`` are the queries.
        targets: ``(b, q)`` int32 answers (a value token, or ``NULL``).
        present: ``(b, q)`` whether the queried key occurs in the context.
        needle: ``(b, q)`` int32 position of the queried pair's value token; ``-1`` for
            an absent key.
    """

    tokens: Int[Array, "b n"]
    targets: Int[Array, "b q"]
    present: Bool[Array, "b q"]
    needle: Int[Array, "b q"]


def _arange(n: int) -> Array:
    return jnp.arange(n, dtype=jnp.int32)


def sample_batch(key: Array, config: DecoderConfig, sequences: int, length: int) -> RecallBatch:
    """``sequences`` random sequences of ``length`` tokens (see the module docstring).

    Every number is int32, and the draw does not depend on JAX's x64 mode (one compiled
    program per configuration, number and length)."""
    config.min_length(length)
    return _sample(key, config, sequences, length)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _sample(key: Array, config: DecoderConfig, sequences: int, length: int) -> RecallBatch:
    P, q, K = config.pairs, config.queries, config.keys
    key0, val0, fill0 = 2, 2 + K, 2 + K + config.values
    C = length - 1 - q

    def one(k):
        kp, kk, kv, kf, kq, ko = jax.random.split(k, 6)
        units = jax.random.permutation(kp, _arange(C - P))[:P]
        slots = jnp.sort(units) + _arange(P)  # context positions of the keys
        perm = jax.random.permutation(kk, _arange(K))
        pair_keys, absent = perm[:P], perm[P : P + q // 2]
        vals = jax.random.randint(kv, (P,), 0, config.values, dtype=jnp.int32)
        ctx = jax.random.randint(kf, (C,), 0, config.fillers, dtype=jnp.int32) + fill0
        ctx = ctx.at[slots].set(pair_keys + key0).at[slots + 1].set(vals + val0)
        which = jax.random.permutation(kq, _arange(P))[: q // 2]
        half = jnp.ones((q // 2,), jnp.int32)
        qkeys = jnp.concatenate([pair_keys[which], absent]) + key0
        targets = jnp.concatenate([vals[which] + val0, NULL * half])
        present = jnp.concatenate([half, 0 * half]) == 1
        needle = jnp.concatenate([slots[which] + 2, -half])  # + BOS, + the key
        order = jax.random.permutation(ko, _arange(q))
        tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32) + BOS, ctx, qkeys[order]])
        return RecallBatch(tokens, targets[order], present[order], needle[order])

    return jax.vmap(one)(jax.random.split(key, sequences))
