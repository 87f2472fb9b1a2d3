"""Compiled programs past the process's memory-map limit: ``release_compiled_programs``
drops JAX's in-memory caches, frees the regions, and a dropped program still computes."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow import _cache

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's"
)


def test_release_frees_the_regions_of_compiled_programs_and_they_still_compute():
    _cache.release_compiled_programs(limit=0)  # start from empty in-memory caches
    base = _cache.memory_regions()
    assert base is not None and base > 0
    programs = [jax.jit(lambda x, k=k: jnp.cumsum(x) * k) for k in range(40)]
    for k, f in enumerate(programs):
        f(jnp.arange(k + 2.0)).block_until_ready()  # 40 distinct shapes: 40 programs
    grown = _cache.memory_regions()
    assert grown is not None and grown > base + 40 * 5  # XLA:CPU maps ~20 per program
    assert not _cache.release_compiled_programs(limit=grown + 1)  # under the limit
    assert _cache.release_compiled_programs(limit=grown - 1)
    after = _cache.memory_regions()
    assert after is not None and after < base + (grown - base) // 4
    x = np.arange(7.0)
    np.testing.assert_allclose(np.asarray(programs[5](jnp.asarray(x))), np.cumsum(x) * 5)
