"""``attnflow.sweep``: the public face of ``attnflow.studies.sweep``.

Every name of ``attnflow.studies.sweep.__all__`` is re-exported here, so
``import attnflow.sweep`` and ``from attnflow.sweep import ...`` work as the attribute
``attnflow.sweep`` does; any other name is read from ``attnflow.studies.sweep`` on access.
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
