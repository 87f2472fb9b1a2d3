"""attnflow: self-attention as an interacting particle system, in JAX.

Tokens are particles, layers are time. The public names are re-exported here; the code
is layered, each layer importing only from the ones before it:

``dynamics``  kernels, models, frames, ``simulate``, ``Trajectory``
``analysis``  ``predict_regime``, ``observe_limit``, ``track_rank``, ``dispersion``
``studies``   sweeps, the Ginibre study, heads of trained transformers
``io``        named and file matrices
``plotting``, ``cli``, ``experiments``   figures, movies, the ``attnflow`` command

``import attnflow`` is light: it imports neither JAX nor the numerical stack. Each public
name is loaded from its layer on first use (``attnflow.simulate`` imports the dynamics,
``attnflow.predict_regime`` the analysis); ``__version__`` needs none of them. The
modules the public API names as ``attnflow.<module>`` (``kernels``, ``masks``,
``matrices``, ``sweep``) are small face modules re-exporting their layer's module, so
``import attnflow.matrices`` and ``from attnflow.sweep import run`` work as attributes do.

``enable_compilation_cache()`` keeps JAX's compiled programs on disk across processes
(the command line turns it on by itself; see ``attnflow._cache``).
"""

import importlib as _importlib
import typing as _typing

from ._meta import attnflow_version as _attnflow_version

__version__ = _attnflow_version()

# Where each public name lives: the module imported on its first use.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "SOLVERS",
            "Attention",
            "Block",
            "FeedForward",
            "GatedAttention",
            "IsotropicAttention",
            "MultiHeadAttention",
            "Propagator",
            "SimulationError",
            "Status",
            "Trajectory",
            "simulate",
        ),
        ".dynamics",
    ),
    **dict.fromkeys(
        ("AbstractModel", "AbstractAttentionSystem", "AbstractKernelAttention"),
        ".dynamics.base",
    ),
    **dict.fromkeys(
        ("solve", "Solution", "AdaptiveSolver", "LayerSolver", "EulerODESolver"),
        ".dynamics.solve",
    ),
    "KERNELS": ".dynamics.kernels",
    **dict.fromkeys(
        ("CircleMeanField", "DensityTrajectory", "solve_density"), ".dynamics.meanfield"
    ),
    "stack": ".dynamics.stack",
    "unstack": ".dynamics.stack",
    **dict.fromkeys(
        (
            "DispersionReport",
            "Label",
            "Observation",
            "RankTrack",
            "Regime",
            "boolean_distance",
            "clustered_fraction",
            "count_clusters",
            "dispersion",
            "dispersion_scan",
            "equiangular_curve",
            "equiangular_time",
            "interaction_energy",
            "leading_eigenvalue",
            "observe_limit",
            "predict_regime",
            "rank_of",
            "spectral_structure",
            "track_rank",
            "wendel_probability",
            "ModePrediction",
            "predict_metastable",
            "NoiseThreshold",
            "predict_noise_threshold",
        ),
        ".analysis",
    ),
    **dict.fromkeys(("gaussian_closure", "GaussianClosure"), ".dynamics.gaussian"),
    **dict.fromkeys(
        ("GinibreEstimate", "HeadsAnalysis", "analyze_heads", "ginibre_fraction"), ".studies"
    ),
    **dict.fromkeys(("ForwardPass", "forward_pass"), ".networks.forward"),
    "enable_compilation_cache": "._cache",
}
# Public modules: the face modules attnflow/kernels.py, masks.py, matrices.py, sweep.py.
_FACES = ("kernels", "masks", "matrices", "sweep")

if _typing.TYPE_CHECKING:  # what a type checker and an editor see; nothing is imported at run time
    from . import kernels, masks, matrices, sweep
    from ._cache import enable_compilation_cache
    from .analysis import (
        DispersionReport,
        Label,
        ModePrediction,
        NoiseThreshold,
        Observation,
        RankTrack,
        Regime,
        boolean_distance,
        clustered_fraction,
        count_clusters,
        dispersion,
        dispersion_scan,
        equiangular_curve,
        equiangular_time,
        interaction_energy,
        leading_eigenvalue,
        observe_limit,
        predict_metastable,
        predict_noise_threshold,
        predict_regime,
        rank_of,
        spectral_structure,
        track_rank,
        wendel_probability,
    )
    from .dynamics import (
        SOLVERS,
        Attention,
        Block,
        FeedForward,
        GatedAttention,
        IsotropicAttention,
        MultiHeadAttention,
        Propagator,
        SimulationError,
        Status,
        Trajectory,
        simulate,
    )
    from .dynamics.base import AbstractAttentionSystem, AbstractKernelAttention, AbstractModel
    from .dynamics.gaussian import GaussianClosure, gaussian_closure
    from .dynamics.kernels import KERNELS
    from .dynamics.meanfield import CircleMeanField, DensityTrajectory, solve_density
    from .dynamics.solve import AdaptiveSolver, EulerODESolver, LayerSolver, Solution, solve
    from .dynamics.stack import stack, unstack
    from .networks.forward import ForwardPass, forward_pass
    from .studies import GinibreEstimate, HeadsAnalysis, analyze_heads, ginibre_fraction


def __getattr__(name: str) -> _typing.Any:
    """Load a public name (or a face module) from its layer on first use."""
    if name in _FACES:
        try:
            value: _typing.Any = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    elif name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "__version__",
    "Attention",
    "Block",
    "FeedForward",
    "GatedAttention",
    "IsotropicAttention",
    "MultiHeadAttention",
    "Propagator",
    "SOLVERS",
    "SimulationError",
    "Status",
    "Trajectory",
    "simulate",
    "solve",
    "Solution",
    "AdaptiveSolver",
    "LayerSolver",
    "EulerODESolver",
    "stack",
    "unstack",
    "KERNELS",
    "AbstractModel",
    "ModePrediction",
    "predict_metastable",
    "NoiseThreshold",
    "predict_noise_threshold",
    "gaussian_closure",
    "GaussianClosure",
    "CircleMeanField",
    "DensityTrajectory",
    "solve_density",
    "AbstractAttentionSystem",
    "AbstractKernelAttention",
    "kernels",
    "masks",
    "matrices",
    "sweep",
    "DispersionReport",
    "dispersion",
    "dispersion_scan",
    "Label",
    "Observation",
    "Regime",
    "leading_eigenvalue",
    "observe_limit",
    "predict_regime",
    "spectral_structure",
    "RankTrack",
    "boolean_distance",
    "rank_of",
    "track_rank",
    "clustered_fraction",
    "count_clusters",
    "interaction_energy",
    "equiangular_curve",
    "equiangular_time",
    "wendel_probability",
    "GinibreEstimate",
    "ginibre_fraction",
    "HeadsAnalysis",
    "analyze_heads",
    "ForwardPass",
    "forward_pass",
    "enable_compilation_cache",
]
