"""Attention kernels: how the logits of one query row become attention weights.

``attnflow.kernels`` is the public face of ``attnflow.dynamics.kernels``, where the code
and its full description live: every name of that module's ``__all__`` is re-exported
here (so ``import attnflow.kernels`` and ``from attnflow.kernels import ...`` work as
the attribute ``attnflow.kernels`` does), and any other name is read from it on access.
Assigning to a name here does not change ``attnflow.dynamics.kernels``.
"""

import typing as _typing

from .dynamics import kernels as _target
from .dynamics.kernels import *  # noqa: F403
from .dynamics.kernels import __all__ as __all__


def __getattr__(name: str) -> _typing.Any:
    if name.startswith("__"):  # a module's own dunders are never borrowed
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_target, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
