"""Named weight matrices: the examples of the clustering paper and random ensembles.

``attnflow.matrices`` is the public face of ``attnflow.io.matrices``, where the code and
its full description live: every name of that module's ``__all__`` is re-exported here
(so ``import attnflow.matrices`` and ``from attnflow.matrices import ...`` work as the
attribute ``attnflow.matrices`` does), and any other name is read from it on access.
Assigning to a name here does not change ``attnflow.io.matrices``.
"""

import typing as _typing

from .io import matrices as _target
from .io.matrices import *  # noqa: F403
from .io.matrices import __all__ as __all__


def __getattr__(name: str) -> _typing.Any:
    if name.startswith("__"):  # a module's own dunders are never borrowed
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_target, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
