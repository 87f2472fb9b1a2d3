"""Tests run in float64: the library never flips the flag, the tests do."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax

jax.config.update("jax_enable_x64", True)
