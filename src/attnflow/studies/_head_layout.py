"""A trained head's regime as its layout runs it, for ``attnflow.studies.heads``.

Contract: ``head_regime(hw, Q, K, V, rtol)`` is ``predict_regime(hw.attention())`` decided
on the (reduced, orthogonally equivalent) triple ``Q, K, V``: the theorems' label only for
a head of plain unmasked, position-free softmax (a BERT-style ``HeadWeights``, or a
``TrainedHead`` whose layout adds no mask, positions or kernel); a causal, rotary or
QK-normed head is unclassified, its reason naming what it computes and that the theorems
assume unmasked, position-free softmax; a head whose attention the package cannot build
(RoPE scaling, a layer-wide QK norm) is unclassified with that refusal as the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..analysis.regimes import Label, Regime, predict_regime
from ..io.checkpoints import HeadWeights
from ..io.trained_head import TrainedHead

__all__ = ["head_regime"]


def head_regime(hw: HeadWeights, Q: Any, K: Any, V: Any, rtol: float) -> Regime:
    """The regime of the head as its layout runs it (``predict_regime(hw.attention())``),
    from the (reduced) triple ``Q, K, V``: the theorems' label only for plain unmasked,
    position-free softmax; a head whose layout adds a mask, positions or another kernel
    is unclassified, its reason naming what it computes; a head whose attention the
    package cannot build (``attention_parts`` refuses: RoPE scaling, a layer-wide QK
    norm) is unclassified with that refusal as the reason."""
    from ..analysis.regimes import not_softmax_regime

    reg = predict_regime(Q, K, V, rtol=rtol)
    if not isinstance(hw, TrainedHead):
        return reg  # a BERT-style head: unmasked, position-free softmax
    try:
        parts = hw.attention_parts()
    except ValueError as exc:
        return dataclasses.replace(
            reg,
            label=Label.UNCLASSIFIED,
            theorem=None,
            reason=(
                f"{exc} No theorem of [E] covers this head as the layout runs it (the "
                f"theorems assume unmasked, position-free softmax attention)."
            ),
        )
    if parts.get("mask") is None and parts.get("kernel") is None:
        return reg
    import jax

    from ..dynamics.model import Attention

    dt = np.float64 if jax.config.read("jax_enable_x64") else np.float32
    one = Attention(
        *(np.asarray(a, dt) for a in (Q, K, V)),
        beta=float(hw.beta),
        rectangular=True,
        propagator="expm",
        **parts,
    )
    if one.plain_softmax:
        return reg
    return not_softmax_regime(one, reg.structure, rtol)
