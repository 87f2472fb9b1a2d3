"""Tests run in float64 with explicit rank promotion (tests set the flags, never the library)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax

jax.config.update("jax_enable_x64", True)
# as diffrax's tests do: an implicit rank promotion (a (d,) array meeting an (n, d) one
# without an explicit axis) is an error, so broadcasting is always written out
jax.config.update("jax_numpy_rank_promotion", "raise")
