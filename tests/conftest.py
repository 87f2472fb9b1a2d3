"""Tests run in float64 with strict rank and dtype promotion (tests set them, not the library)."""

import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

# The compilation cache inside the run: one directory per run, made by the controlling
# process and inherited by the xdist workers through the environment (the same programs
# compile in several workers), never the user's own cache (the command line enables the
# cache by default). The controller removes it when the run ends.
_OWNER = "ATTNFLOW_TEST_CACHE_OWNER"
if _OWNER not in os.environ:
    os.environ[_OWNER] = str(os.getpid())
    os.environ["ATTNFLOW_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnflow-test-cache-")
_CACHE = os.environ["ATTNFLOW_CACHE_DIR"]

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
from attnflow import _cache  # noqa: E402

_cache.enable_compilation_cache()
# as diffrax's tests do: an implicit rank promotion (a (d,) array meeting an (n, d) one
# without an explicit axis) and an implicit dtype promotion (int32 times float64, float32
# meeting float64) are errors, so broadcasting and casts are always written out
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


import importlib.util  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def no_minilm(monkeypatch):
    """The MiniLM checkpoint package looks absent (as on a fresh machine), whether or not
    it is installed: scripts that need it must skip cleanly."""
    from attnflow.io import checkpoints

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == checkpoints.MINILM_PACKAGE else real(name, *a),
    )


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(_OWNER) == str(os.getpid()):  # the controller, after the workers
        shutil.rmtree(_CACHE, ignore_errors=True)
