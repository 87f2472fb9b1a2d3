"""Sweeps: sampling studies that shard over devices and machines and survive faults.

``attnflow.sweep`` is the public face of ``attnflow.studies.sweep``, where the code and
its full description live: every name of that module's ``__all__`` is re-exported here
(so ``import attnflow.sweep`` and ``from attnflow.sweep import ...`` work as the
attribute ``attnflow.sweep`` does), and any other name is read from it on access.
Assigning to a name here does not change ``attnflow.studies.sweep``.
"""

import typing as _typing

from .studies import sweep as _target
from .studies.sweep import *  # noqa: F403
from .studies.sweep import __all__ as __all__


def __getattr__(name: str) -> _typing.Any:
    if name.startswith("__"):  # a module's own dunders are never borrowed
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_target, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
