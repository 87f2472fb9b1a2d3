"""What happened to a solve: the ``Status`` vocabulary, the integer codes the compiled
solves return, and ``SimulationError`` with advice on what to change.

Codes are fixed: 0 ok, 1 overflow, 2 max_steps, 3 nonfinite, 4 failed.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Status", "STATUS_CODES", "CODES", "BY_CODE", "SimulationError", "advice"]


class Status(enum.StrEnum):
    """What happened to a system (and whether an array of it is representable).

    Members are strings (``Status.OK == "ok"``), so code written against the plain
    strings keeps working and JSON output is unchanged."""

    OK = "ok"  # reached t1
    OVERFLOW = "overflow"  # the logits (or a converted frame) left the float range
    MAX_STEPS = "max_steps"  # the adaptive solver used max_steps steps before t1
    NONFINITE = "nonfinite"  # a non-finite state appeared (reported, never hidden)
    FAILED = "failed"  # any other solver failure

    @property
    def code(self) -> int:
        """The integer the compiled solve returns for this status."""
        return CODES[self]


CODES = {
    Status.OK: 0,
    Status.OVERFLOW: 1,
    Status.MAX_STEPS: 2,
    Status.NONFINITE: 3,
    Status.FAILED: 4,
}
BY_CODE = {c: s for s, c in CODES.items()}
# The vocabulary as plain strings, in code order (kept for older callers).
STATUS_CODES = tuple(str(BY_CODE[c]) for c in range(len(BY_CODE)))


class SimulationError(RuntimeError):
    """A simulation did not reach ``t1``; the message says what to change."""


def advice(code: str, dtype, solver: dict, t_stop: float, t1: float) -> str:
    """What to change after a solve that stopped with ``code`` at ``t_stop``."""
    x64 = np.dtype(dtype) == np.float64
    where = f"at t = {t_stop:.6g} of t1 = {t1:.6g}"
    if code == "overflow":
        if x64:
            fix = "use a smaller t1 (the logits grow like e^{2 Re(lambda_max) t})"
        else:
            fix = (
                "use x64 (jax.config.update('jax_enable_x64', True), or --x64 on the "
                "command line) or a smaller t1"
            )
        return f"the attention logits left the {np.dtype(dtype).name} range {where}; {fix}."
    if code == "max_steps":
        return (
            f"the adaptive solver used max_steps = {solver.get('max_steps')} steps "
            f"{where}; raise max_steps, loosen rtol/atol, or use method='euler' with "
            f"a layer step dt (large logits make attention switch sharply and force "
            f"small steps)."
        )
    if code == "nonfinite":
        return f"a non-finite state appeared {where}; use x64, tighter tolerances or a smaller t1."
    if code == "failed":
        return f"the solver failed {where}; try x64, other tolerances or method='euler'."
    return "ok"
