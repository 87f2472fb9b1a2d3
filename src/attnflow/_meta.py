"""Run metadata: the versions and precision every saved result records.

Below every layer (it imports no module of attnflow), so the dynamics, the sweeps, the
figure runner and the scripts all record the same fields.
"""

from __future__ import annotations

import json
import platform
from importlib.metadata import PackageNotFoundError, version

__all__ = ["attnflow_version", "run_metadata", "netcdf_attrs"]


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


def netcdf_attrs(record: dict) -> dict:
    """A record's entries as attributes of an ``xarray.Dataset`` that ``to_netcdf`` can
    write: strings, integers and floats as they are, anything else (booleans, None,
    lists, dicts) as JSON text."""
    return {
        k: v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v)
        for k, v in record.items()
    }
