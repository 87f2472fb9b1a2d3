"""XLA's deterministic ops on a GPU for the figure runs: the flag, the environment a
figure worker starts with, and the same for scripts run in the runner's own process.

Reductions and scatters in a fixed order: a figure made twice on a GPU is the same file.
A GPU option: the CPU ignores it. A setting the user made either way is kept.
"""

from __future__ import annotations

import os

__all__ = ["DETERMINISTIC_FLAG", "worker_env", "deterministic_here"]

# XLA's deterministic ops on a GPU (reductions and scatters in a fixed order): a figure
# made twice on a GPU is the same file. A GPU option: the CPU ignores it.
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def _with_deterministic_ops(flags: str) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with ``DETERMINISTIC_FLAG`` added, unless
    they set ``--xla_gpu_deterministic_ops`` either way already."""
    words = flags.split()
    if any(w.startswith("--xla_gpu_deterministic_ops") for w in words):
        return flags
    return " ".join([*words, DETERMINISTIC_FLAG])


def worker_env() -> dict[str, str]:
    """The variables a figure worker starts with beyond the pool's own: ``XLA_FLAGS``,
    this process's flags with XLA's deterministic GPU ops."""
    return {"XLA_FLAGS": _with_deterministic_ops(os.environ.get("XLA_FLAGS", ""))}


def deterministic_here() -> None:
    """Deterministic GPU ops for scripts run in this process: added to ``XLA_FLAGS``
    when JAX has not started its backends (afterwards XLA no longer reads them)."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        os.environ.update(worker_env())
