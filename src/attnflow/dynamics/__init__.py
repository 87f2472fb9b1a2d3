"""The particle system itself: attention kernels, models, frames, the solver and its result.

This layer imports nothing from the layers above it (``analysis``, ``studies``, ``io``,
``plotting``, ``cli``); ``tests/test_layers.py`` checks it.
"""

from .gated import GatedAttention
from .isotropic import IsotropicAttention
from .model import Attention
from .noise import AbstractNoise, Noise, TokenNoise
from .propagator import FlowCache, Propagator, fresh
from .simulate import SOLVERS, simulate
from .stochastic import noisy_layer, simulate_noisy
from .trajectory import SimulationError, Status, Trajectory
from .transformer import Block, FeedForward, MultiHeadAttention

__all__ = [
    "Attention",
    "Block",
    "FeedForward",
    "GatedAttention",
    "IsotropicAttention",
    "MultiHeadAttention",
    "AbstractNoise",
    "Noise",
    "TokenNoise",
    "Propagator",
    "FlowCache",
    "fresh",
    "SOLVERS",
    "SimulationError",
    "Status",
    "Trajectory",
    "noisy_layer",
    "simulate",
    "simulate_noisy",
]
