"""Pure functions of models and trajectories: the regime predicted from V's spectrum
(``regimes``) and the one observed at the end of a run (``observe``), the attention
matrix's rank and leaders (``rank``), softmax dispersion (``dispersion``), clusters and
energies of tokens on the sphere (``sphere``). Analyses ask a
trajectory for its attention and logits; they never run a simulation of their own."""

from .dispersion import DispersionReport, dispersion, dispersion_scan
from .observe import Observation, observe_limit
from .rank import RankTrack, boolean_distance, rank_of, track_rank
from .regimes import (
    LABELS,
    Label,
    LeadingEigenvalue,
    Regime,
    leading_eigenvalue,
    predict_regime,
    spectral_structure,
)
from .sphere import (
    clustered_fraction,
    count_clusters,
    equiangular_curve,
    equiangular_time,
    interaction_energy,
    wendel_probability,
)

__all__ = [
    "DispersionReport",
    "dispersion",
    "dispersion_scan",
    "RankTrack",
    "boolean_distance",
    "rank_of",
    "track_rank",
    "Label",
    "LABELS",
    "LeadingEigenvalue",
    "leading_eigenvalue",
    "Observation",
    "Regime",
    "observe_limit",
    "predict_regime",
    "spectral_structure",
    "clustered_fraction",
    "count_clusters",
    "interaction_energy",
    "equiangular_curve",
    "equiangular_time",
    "wendel_probability",
]
