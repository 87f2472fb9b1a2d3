"""Run metadata: the versions and precision every saved result records.

Below every layer (it imports no module of attnflow), so the dynamics, the sweeps, the
figure runner and the scripts all record the same fields.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

__all__ = ["attnflow_version", "run_metadata"]


def attnflow_version() -> str:
    """The installed attnflow version (``"0+unknown"`` for a source tree never installed)."""
    try:
        return version("attnflow")
    except PackageNotFoundError:
        return "0+unknown"


def run_metadata() -> dict:
    """Versions and precision of this process, for saved results: attnflow, jax,
    jaxlib, diffrax, equinox, numpy, scipy, Python, whether x64 is on, the JAX backend."""
    import diffrax
    import equinox
    import jax
    import numpy as np
    import scipy

    return {
        "attnflow": attnflow_version(),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "diffrax": diffrax.__version__,
        "equinox": equinox.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "x64": bool(jax.config.read("jax_enable_x64")),
        "backend": jax.default_backend(),
    }
