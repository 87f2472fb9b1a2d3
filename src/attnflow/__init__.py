"""attnflow: self-attention as an interacting particle system, in JAX.

Tokens are particles, layers are time. The public names are re-exported here.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("attnflow")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
del PackageNotFoundError, _version

from . import matrices
from .dispersion import DispersionReport, dispersion, dispersion_scan
from .ginibre import GinibreEstimate, ginibre_fraction
from .heads import HeadsAnalysis, analyze_heads  # safetensors/tokenizers load lazily
from .kernels import KERNELS
from .model import Attention
from .propagator import Propagator
from .regimes import Observation, Regime, observe_limit, predict_regime, spectral_structure
from .rank import RankTrack, boolean_distance, rank_of, track_rank
from .simulate import SOLVERS, simulate
from .trajectory import SimulationError, Trajectory

__all__ = [
    "DispersionReport", "dispersion", "dispersion_scan",
    "GinibreEstimate", "ginibre_fraction",
    "HeadsAnalysis", "analyze_heads",
    "Attention",
    "KERNELS",
    "Observation",
    "Regime",
    "observe_limit",
    "predict_regime",
    "spectral_structure",
    "Propagator",
    "RankTrack",
    "SOLVERS",
    "SimulationError",
    "Trajectory",
    "boolean_distance",
    "rank_of",
    "simulate",
    "track_rank",
]
