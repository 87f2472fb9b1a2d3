"""Host values placed without a compiled program: the same arrays as jnp.asarray, bit for
bit, and placed as jnp.asarray places them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow._host import put
from attnflow.dynamics import propagator as P

CASES = [
    (np.array([1.0, 1 / 3, 2.0**-149, 1e-45, 3.4e38, 1e39, -1e39]), np.float32),
    (np.array([1.0, 1 / 3, np.pi, -2.5e-310]), np.float64),
    (np.arange(6).reshape(2, 3), np.float32),
    (np.arange(6, dtype=np.int64), None),
    (2.5, np.float32),
    (0.1, np.float64),
    (3, None),
    (np.array([True, False]), None),
]


@pytest.mark.parametrize(("value", "dtype"), CASES)
def test_put_equals_jnp_asarray_bit_for_bit(value, dtype):
    with np.errstate(over="ignore"):
        want = jnp.asarray(value, dtype=dtype)
        got = put(value, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    # bit for bit, the overflow to inf and the float32 subnormals included
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    assert not got.committed and not want.committed


def test_put_keeps_a_jax_array_where_it_is():
    dev = jax.devices()[-1]
    a = jax.device_put(jnp.arange(4.0), dev)
    b = put(a, np.float32)
    assert b.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(b), np.arange(4.0, dtype=np.float32))


def test_put_in_a_trace_casts_there():
    f = jax.jit(lambda x: put(x, np.float32) * 2)
    assert f(jnp.float64(1.5) if jax.config.read("jax_enable_x64") else 1.5).dtype == jnp.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("complex_", [False, True])
def test_unbits_on_the_host_equals_the_traced_unbits(dtype, complex_):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 4)) + (1j * rng.normal(size=(3, 4)) if complex_ else 0)
    b = P._bits(a, dtype)
    host = P._unbits(b, complex_)
    traced = jax.jit(lambda bb: P._unbits(bb, complex_))(b)
    assert host.dtype == traced.dtype
    assert np.asarray(host).tobytes() == np.asarray(traced).tobytes()
    cast = a.astype(np.complex64 if dtype == np.float32 else np.complex128) if complex_ else a
    np.testing.assert_array_equal(np.asarray(host), cast.astype(host.dtype))


def test_unbits_stays_on_the_device_of_placed_bits():
    dev = jax.devices()[-1]
    b = jax.device_put(P._bits(np.eye(2), np.float64), dev)
    assert P._unbits(b).devices() == {dev}
    assert not P._unbits(P._bits(np.eye(2), np.float64)).committed


def test_unbits_of_bits_split_over_devices_stays_split():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < 2:
        pytest.skip("needs two devices (the suite forces two host devices)")
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    split = NamedSharding(mesh, PartitionSpec("x"))
    a = np.random.default_rng(1).normal(size=(4, 3))
    b = jax.device_put(P._bits(a, np.float64), split)
    out = P._unbits(b)
    assert out.sharding.is_equivalent_to(split, out.ndim)
    np.testing.assert_array_equal(np.asarray(out), a)
