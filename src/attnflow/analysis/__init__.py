"""Pure functions of models and trajectories: the regime predicted from V's spectrum
(``regimes``) and the one observed at the end of a run (``observe``), the attention
matrix's rank and leaders (``rank``), softmax dispersion (``dispersion``), clusters and
energies of tokens on the sphere (``sphere``), the linear modes of the mean-field
equation and the metastable cluster count they predict (``modes``), one layer at the
critical long-context scaling ``beta = gamma log n`` (``critical``), measures on the
circle, particles and mean-field densities alike (``density``), the kinetic
theory's lost-in-the-middle profile and its measurement on particles (``position``),
the hardmax limit's cells and Frank-Wolfe gaps (``hardmax``). Analyses ask a trajectory
for its attention and logits; they never run a simulation of their own."""

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

# Each public name and the submodule it lives in, imported on first use (``predict_regime``
# needs numpy only; ``rank`` and ``dispersion`` bring JAX and scipy).
_WHERE = {
    **dict.fromkeys(("DispersionReport", "dispersion", "dispersion_scan"), ".dispersion"),
    **dict.fromkeys(("Observation", "observe_limit"), ".observe"),
    **dict.fromkeys(("ModePrediction", "mode_rates", "predict_metastable"), ".modes"),
    **dict.fromkeys(("NoiseThreshold", "predict_noise_threshold"), ".noise_threshold"),
    **dict.fromkeys(
        ("CriticalLayer", "critical_gamma", "critical_layer", "simplex_tokens"), ".critical"
    ),
    **dict.fromkeys(
        (
            "CriticalSphere",
            "SphereExponent",
            "critical_beta_sphere",
            "critical_exponent_sphere",
            "largest_weight",
            "sphere_gaps",
        ),
        ".critical",
    ),
    **dict.fromkeys(
        (
            "RetrievalProfile",
            "lost_in_middle_profile",
            "lost_in_middle_threshold",
            "retrieval_profile",
        ),
        ".position",
    ),
    "consensus_distance": ".collapse",
    **dict.fromkeys(("HardmaxCells", "frank_wolfe_gap", "hardmax_cells"), ".hardmax"),
    **dict.fromkeys(
        (
            "antipodal_exponent",
            "antipodal_fraction",
            "antipodal_probability",
            "antipodal_threshold",
            "collapse_exponent",
            "rho_sde",
        ),
        ".noise",
    ),
    **dict.fromkeys(
        ("EquiangularNorm", "asymptotic_rate", "equiangular_layernorm"), ".normalization"
    ),
    **dict.fromkeys(("circle_wasserstein", "density_clusters", "fourier_modes"), ".density"),
    **dict.fromkeys(("RankTrack", "boolean_distance", "rank_of", "track_rank"), ".rank"),
    **dict.fromkeys(
        (
            "LABELS",
            "Label",
            "LeadingEigenvalue",
            "Regime",
            "leading_eigenvalue",
            "predict_regime",
            "spectral_structure",
        ),
        ".regimes",
    ),
    **dict.fromkeys(
        (
            "clustered_fraction",
            "count_clusters",
            "equiangular_curve",
            "equiangular_time",
            "interaction_energy",
            "renyi_centres",
            "wendel_probability",
        ),
        ".sphere",
    ),
}

if _typing.TYPE_CHECKING:
    from .collapse import consensus_distance
    from .critical import (
        CriticalLayer,
        CriticalSphere,
        SphereExponent,
        critical_beta_sphere,
        critical_exponent_sphere,
        critical_gamma,
        critical_layer,
        largest_weight,
        simplex_tokens,
        sphere_gaps,
    )
    from .density import circle_wasserstein, density_clusters, fourier_modes
    from .dispersion import DispersionReport, dispersion, dispersion_scan
    from .hardmax import HardmaxCells, frank_wolfe_gap, hardmax_cells
    from .modes import ModePrediction, mode_rates, predict_metastable
    from .noise import (
        antipodal_exponent,
        antipodal_fraction,
        antipodal_probability,
        antipodal_threshold,
        collapse_exponent,
        rho_sde,
    )
    from .noise_threshold import NoiseThreshold, predict_noise_threshold
    from .normalization import EquiangularNorm, asymptotic_rate, equiangular_layernorm
    from .observe import Observation, observe_limit
    from .position import (
        RetrievalProfile,
        lost_in_middle_profile,
        lost_in_middle_threshold,
        retrieval_profile,
    )
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
        renyi_centres,
        wendel_probability,
    )


class _Package(_types.ModuleType):
    """The package's own module class: the function ``dispersion`` shares its name with
    the submodule ``dispersion``, and importing a submodule binds it on its package;
    the function is bound instead, whoever imports the submodule first."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        if name == "dispersion" and isinstance(value, _types.ModuleType):
            value = value.dispersion
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> _typing.Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "ModePrediction",
    "mode_rates",
    "predict_metastable",
    "NoiseThreshold",
    "predict_noise_threshold",
    "CriticalLayer",
    "critical_gamma",
    "critical_layer",
    "simplex_tokens",
    "CriticalSphere",
    "SphereExponent",
    "critical_beta_sphere",
    "critical_exponent_sphere",
    "largest_weight",
    "sphere_gaps",
    "lost_in_middle_profile",
    "lost_in_middle_threshold",
    "retrieval_profile",
    "RetrievalProfile",
    "consensus_distance",
    "HardmaxCells",
    "hardmax_cells",
    "frank_wolfe_gap",
    "EquiangularNorm",
    "asymptotic_rate",
    "equiangular_layernorm",
    "antipodal_exponent",
    "antipodal_fraction",
    "antipodal_probability",
    "antipodal_threshold",
    "collapse_exponent",
    "rho_sde",
    "fourier_modes",
    "circle_wasserstein",
    "density_clusters",
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
    "renyi_centres",
]
