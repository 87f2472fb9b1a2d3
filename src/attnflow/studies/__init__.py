"""Studies built from the dynamics and the analyses: resumable sweeps (a shard-file
protocol that any executor can run), the Ginibre genericity study, the heads of trained
transformers."""

from .ginibre import GinibreEstimate, ginibre_fraction
from .heads import HeadsAnalysis, analyze_heads

__all__ = ["GinibreEstimate", "ginibre_fraction", "HeadsAnalysis", "analyze_heads"]
