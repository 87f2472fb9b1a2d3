"""What a trained retrieval model's attention shows on one evaluation set at one length.

Contract. ``AttentionReadout`` holds, for ``m`` queries read at one length, whether each
answer was right, whether its key was present, and per layer ``l``, head ``h`` and query
the statistics of the query's answer row (the attention row from which the answer is
read): arrays ``(L, H, m)`` for a model of ``L`` layers of ``H`` heads (one head:
``(1, 1, m)``). Every array is finite; a statistic that does not apply is given its
neutral value and masked by ``present``:

- ``entropy``: ``-sum_j P_j log P_j`` in nats over the visible keys and, when the kernel
  has one, the learned sink column (its mass counts as one more outcome);
- ``visible``: the number of keys the row sees (``(m,)``), for the entropy over
  ``log(visible)``;
- ``first_mass``: the weight on the first visible token (a decoder's BOS; 0 for a set);
- ``sink_mass``: the learned sink column's share (0 where the kernel has none);
- ``needle_mass``: the weight on the key that matches the query (present queries; 0 for
  absent ones, masked by ``present``);
- ``logit_spread``: largest minus smallest logit over the visible keys;
- ``needle_gap``: the needle's logit minus the largest other visible logit (present
  queries; 0 for absent ones);
- ``gate``: the mean of the row's output gate over its channels (1 where no gate).

``arrays()`` and ``from_arrays`` convert to and from a dict of numpy arrays (for ``.npz``
files); ``check()`` raises a ``ValueError`` naming the first field of a wrong shape or
with a non-finite entry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["AttentionReadout", "ROW_FIELDS"]

ROW_FIELDS = (
    "entropy",
    "first_mass",
    "sink_mass",
    "needle_mass",
    "logit_spread",
    "needle_gap",
    "gate",
)


@dataclasses.dataclass(frozen=True)
class AttentionReadout:
    """Answers and answer-row statistics of ``m`` queries at one ``length`` (see the
    module docstring for each field)."""

    length: int
    correct: np.ndarray
    present: np.ndarray
    visible: np.ndarray
    entropy: np.ndarray
    first_mass: np.ndarray
    sink_mass: np.ndarray
    needle_mass: np.ndarray
    logit_spread: np.ndarray
    needle_gap: np.ndarray
    gate: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(L, H, m)``: layers, heads, queries."""
        return tuple(np.shape(self.entropy))  # type: ignore[return-value]

    def check(self) -> AttentionReadout:
        """This readout, after checking every field's shape and finiteness."""
        m = np.shape(self.correct)
        if len(m) != 1:
            raise ValueError(f"correct must be one flag per query (m,); got shape {m}.")
        for name in ("present", "visible"):
            if np.shape(getattr(self, name)) != m:
                raise ValueError(
                    f"{name} must have the shape of correct {m}; "
                    f"got {np.shape(getattr(self, name))}."
                )
        shape = np.shape(self.entropy)
        if len(shape) != 3 or shape[2] != m[0]:
            raise ValueError(f"entropy must be (layers, heads, {m[0]}); got shape {shape}.")
        for name in ROW_FIELDS:
            value = np.asarray(getattr(self, name))
            if value.shape != shape:
                raise ValueError(f"{name} must have the shape {shape}; got {value.shape}.")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{name} has a non-finite entry: every statistic is finite.")
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """The fields as numpy arrays (``length`` as a 0-d array)."""
        out = {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return out

    @classmethod
    def from_arrays(cls, arrays: Any) -> AttentionReadout:
        """The readout of ``arrays()`` (or of an ``.npz`` file's mapping), checked."""
        fields: dict[str, Any] = {
            f.name: np.asarray(arrays[f.name]) for f in dataclasses.fields(cls)
        }
        fields["length"] = int(fields["length"])
        return cls(**fields).check()
