"""Rank collapse as a distance to consensus (Wu, Ajorlou, Wang, Jegelka and Jadbabaie
2024): ``mu(X) = ||X - 1 xbar^T||_F``, ``xbar`` the mean token, at every saved time.

Contract. ``consensus_distance`` reads the tokens of a trajectory (or an array
``(m, n, d)`` / ``(b, m, n, d)``) and returns ``mu`` per saved time, float64 numpy. Pure
masked attention (``simulate(..., residual=False)``, ``x <- P x`` for ``V = I``) drives
``mu`` to 0 exponentially whenever the mask's graph is quasi-strongly connected (a token
every other one reaches); a mask whose graph is not (``Window(0)``: each token sees only
itself) leaves it where it is. Nothing is simulated here.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from jaxtyping import Float

__all__ = ["consensus_distance"]


def consensus_distance(traj: Any) -> Float[np.ndarray, "*b m"]:
    """``mu(X) = ||X - 1 xbar^T||_F`` of the tokens at every saved time.

    Args:
        traj: a ``Trajectory`` (its tokens ``x``) or tokens ``(m, n, d)`` or
            ``(b, m, n, d)``.

    Returns:
        ``(m,)`` or ``(b, m)`` distances.

    Examples:
        >>> import numpy as np
        >>> from attnflow.analysis import consensus_distance
        >>> x = np.array([[[1.0, 0.0], [-1.0, 0.0]], [[0.5, 0.5], [0.5, 0.5]]])
        >>> consensus_distance(x).round(4).tolist()  # two saves of two tokens
        [1.4142, 0.0]
    """
    x = np.asarray(_tokens_of(traj), np.float64)
    if x.ndim not in (3, 4) or x.shape[-2] < 1:
        raise ValueError(
            f"traj must be a Trajectory or tokens of shape (m, n, d) or (b, m, n, d); got "
            f"shape {x.shape}."
        )
    centred = x - x.mean(axis=-2, keepdims=True)
    return np.sqrt(np.sum(centred * centred, axis=(-2, -1)))


def _tokens_of(traj: Any) -> Any:
    """The tokens ``x`` of a ``Trajectory``, or ``traj`` itself (an array); a
    trajectory exists only once the dynamics are imported, so an array needs no JAX."""
    mod = sys.modules.get("attnflow.dynamics.trajectory")
    return traj.x if mod is not None and isinstance(traj, mod.Trajectory) else traj
