"""Pure functions of models and trajectories: the regime predicted from V's spectrum and
the one observed at the end of a run, the attention matrix's rank and leaders, softmax
dispersion. Analyses ask a trajectory for its attention and logits; they never run a
simulation of their own."""

from .dispersion import DispersionReport, dispersion, dispersion_scan
from .rank import RankTrack, boolean_distance, rank_of, track_rank
from .regimes import Observation, Regime, observe_limit, predict_regime, spectral_structure

__all__ = [
    "DispersionReport",
    "dispersion",
    "dispersion_scan",
    "RankTrack",
    "boolean_distance",
    "rank_of",
    "track_rank",
    "Observation",
    "Regime",
    "observe_limit",
    "predict_regime",
    "spectral_structure",
]
