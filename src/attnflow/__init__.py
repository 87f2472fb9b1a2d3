"""attnflow: self-attention as an interacting particle system, in JAX.

Tokens are particles, layers are time. The public names are re-exported here; the code
is layered, each layer importing only from the ones before it:

``dynamics``  kernels, models, frames, ``simulate``, ``Trajectory``
``analysis``  ``predict_regime``, ``observe_limit``, ``track_rank``, ``dispersion``
``studies``   sweeps, the Ginibre study, heads of trained transformers
``io``        named and file matrices
``plotting``, ``cli``, ``experiments``   figures, movies, the ``attnflow`` command
"""

import sys as _sys

from ._meta import attnflow_version as _attnflow_version

__version__ = _attnflow_version()
from .analysis import (
    DispersionReport,
    Label,
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
    IsotropicAttention,
    MultiHeadAttention,
    Propagator,
    SimulationError,
    Status,
    Trajectory,
    kernels,
    simulate,
)
from .dynamics.kernels import KERNELS
from .dynamics.stack import stack, unstack
from .io import matrices
from .studies import GinibreEstimate, HeadsAnalysis, analyze_heads, ginibre_fraction, sweep

# The modules that the public API names as ``attnflow.<module>`` stay importable under
# those names (``from attnflow.sweep import run``, ``import attnflow.matrices``).
for _name, _module in (("kernels", kernels), ("matrices", matrices), ("sweep", sweep)):
    _sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module, _sys

__all__ = [
    "__version__",
    "Attention",
    "Block",
    "FeedForward",
    "IsotropicAttention",
    "MultiHeadAttention",
    "Propagator",
    "SOLVERS",
    "SimulationError",
    "Status",
    "Trajectory",
    "simulate",
    "stack",
    "unstack",
    "KERNELS",
    "kernels",
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
]
