"""Studies built from the dynamics and the analyses: resumable sweeps (a shard-file
protocol that any executor can run), the Ginibre genericity study, the heads of trained
transformers, the sphere's phase diagram and staircase, and the studies that read trained
networks (layerwise geometry, token importance, max retrieval, long context). The
networks themselves, their tasks, training and checkpoints are ``attnflow.networks``.

The names below are loaded from their modules on first use, so importing one module of
the package (``attnflow.studies.sweep``, ``attnflow.studies.ginibre``) does not import
the others."""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .ginibre import GinibreEstimate, ginibre_fraction
    from .heads import HeadsAnalysis, analyze_heads

__all__ = ["GinibreEstimate", "ginibre_fraction", "HeadsAnalysis", "analyze_heads"]

_LAZY = {
    "GinibreEstimate": ".ginibre",
    "ginibre_fraction": ".ginibre",
    "HeadsAnalysis": ".heads",
    "analyze_heads": ".heads",
}


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
