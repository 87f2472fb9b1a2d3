"""Moved: the encoder's forward pass is ``attnflow.networks.encoder`` (trained networks
live in ``attnflow.networks``). This module re-exports its public names so that code
written against ``attnflow.studies.encoder`` keeps working."""

from ..networks.encoder import (
    EncoderOutput,
    EncoderWeights,
    encode,
    encoder_forward,
    gelu,
    load_encoder_weights,
    mean_pool,
    pool,
)

__all__ = [
    "EncoderOutput",
    "encoder_forward",
    "encode",
    "gelu",
    "mean_pool",
    "pool",
    "EncoderWeights",
    "load_encoder_weights",
]
