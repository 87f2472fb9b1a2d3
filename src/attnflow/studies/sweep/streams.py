"""Random streams of a sweep: one per sample or per fixed block, never one per shard.

Contract: a stream is a function of the sweep's seed and an integer key only (``rng``,
``Substreams``, ``sample_key``), never of the shard, chunk, worker, host or engine that
draws from it. A kernel that draws sample ``i`` from a stream keyed by ``i`` (or by
``i // block``, then slicing) therefore gives the same numbers for every split of the
index range, bit for bit; the layout of a study's keys (its tag, dimension, stream
number, block) is the study's own and is documented there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _checks

__all__ = ["Substreams", "rng", "sample_key"]


def rng(seed: int, *key: int) -> np.random.Generator:
    """The random stream of one sample (or one block of samples).

    Streams with different keys are statistically independent, and a sample's stream
    does not depend on which shard, chunk or worker computes it.

    Args:
        seed: the sweep's seed, an integer >= 0.
        *key: integers >= 0 naming the stream, e.g. ``(study_tag, d, stream, index)``.

    Returns:
        ``np.random.Generator(PCG64(SeedSequence([seed, *key])))``.
    """
    ints = [_checks.integer("seed", seed, lo=0)]
    for k in key:
        ints.append(_checks.integer("rng key", k, lo=0))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(ints)))


class Substreams:
    """Independent random streams for the samples of one block, cheap to look up.

    ``Substreams(seed, *key)[j]`` is a ``numpy.random.Generator`` on the PCG64 stream of
    ``SeedSequence([seed, *key])`` advanced by ``j * 2**64`` draws: one SeedSequence per
    block instead of one per sample (a look-up is a state reset and an ``advance``, about
    a microsecond). Streams ``2**64`` draws apart never overlap in practice. The returned
    generator is shared: it is valid until the next look-up.
    """

    def __init__(self, seed: int, *key: int):
        ints = [_checks.integer("seed", seed, lo=0)]
        ints += [_checks.integer("rng key", k, lo=0) for k in key]
        self._bg = np.random.PCG64(np.random.SeedSequence(ints))
        self._base = self._bg.state
        self._gen = np.random.Generator(self._bg)

    def __getitem__(self, j: int) -> np.random.Generator:
        j = _checks.integer("substream index", j, lo=0)
        self._bg.state = self._base
        if j:
            self._bg.advance(j << 64)
        return self._gen


def sample_key(seed: int, index: int) -> Any:
    """A ``jax.random`` key for sample ``index`` of a sweep seeded with ``seed``.

    ``fold_in(fold_in(key(seed), index >> 32), index & 0xffffffff)``, so indices beyond
    2**32 are fine; for JAX kernels that draw their randomness with ``jax.random``.
    """
    import jax

    index = _checks.integer("index", index, lo=0)
    k = jax.random.key(_checks.integer("seed", seed, lo=0))
    k = jax.random.fold_in(k, index >> 32)
    return jax.random.fold_in(k, index & 0xFFFFFFFF)
