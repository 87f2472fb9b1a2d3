"""Solvers: objects that own their loop.

A solver is an equinox module whose options are its fields. ``solve`` (one system, the
compiled core that ``jit``, ``vmap`` and ``grad`` go through) and ``simulate`` (the host
driver: a batch, devices, stacked weights, progress) call the same object; neither
driver branches on what kind of solver it holds. A new solver is one class here.

The contract (``AbstractSolver``):

``plan(t1, ts, *, chunk, cost)``
    Host checks of the times and options before any work (``ValueError`` naming the
    argument); returns what ``run`` needs to know statically (``None`` for none).
``check_frame(frame, dtype)``
    Host check that the solver can run in the frame (the discrete rescaling needs
    ``I + dt V`` invertible).
``integrate(frame, y0, ts, t1)``
    One system ``y0`` ``(n, d)`` in the frame's state, traceable and differentiable:
    a ``Solution``.
``run(frame, y0, ts, t1, plan, ...)``
    A batch ``y0`` ``(b, n, d)`` (one model, or stacked weights: system i with model i),
    on one device or sharded over ``devices``: a ``Run`` of host arrays.
``discretisation()``, ``info(plan)``
    How the saved states relate the frames (``terms.Continuous`` or ``terms.Layers``),
    and the solver's record in the trajectory's metadata.

The solvers: ``AdaptiveSolver`` (diffrax, with the overflow event),
``LayerSolver(dt)`` (residual layers with the exact discrete rescaling) and
``EulerODESolver(dt)`` (the clustering paper's forward Euler on the frame's ODE) and
``EulerMaruyamaSolver(dt)`` (its stochastic twin: Euler-Maruyama on the SDE of a noise
object). The fixed-step solvers share the one layer loop of the package
(``layer_loop``): a batch of systems advanced together, each stopping (its state kept)
when its logits would leave the float range; ``solve`` runs it on a batch of one.

Noise (``attnflow.dynamics.noise``) is handed to ``integrate`` and ``run`` beside the
frame: ``check_noise(noise, frame)`` refuses it by name where the solver cannot run it
(the adaptive solver always; the layers off the post-layer-norm sphere), and the
fixed-step solvers wrap their term in ``terms.NoisyTerm``, which carries each system's
Brownian path through the same loop.
"""

from __future__ import annotations

from typing import Any

from ... import _checks
from ._base import (
    FIXED,
    ICOEFF,
    LOG_MARGIN,
    MAX_STEPS_LIMIT,
    PCOEFF,
    SOLVERS,
    STOCHASTIC,
    AbstractSolver,
    Run,
    Solution,
    log_limit,
    status_code,
)
from .adaptive import AdaptiveSolver, adaptive_solve
from .layers import EulerMaruyamaSolver, EulerODESolver, LayerSolver, layer_loop

__all__ = [
    "AbstractSolver",
    "AdaptiveSolver",
    "LayerSolver",
    "EulerODESolver",
    "EulerMaruyamaSolver",
    "Solution",
    "Run",
    "SOLVERS",
    "FIXED",
    "STOCHASTIC",
    "MAX_STEPS_LIMIT",
    "LOG_MARGIN",
    "PCOEFF",
    "ICOEFF",
    "make_solver",
    "adaptive_solve",
    "layer_loop",
    "log_limit",
    "status_code",
]


def make_solver(
    method: str = "adaptive",
    dt: Any = None,
    rtol: Any = 1e-6,
    atol: Any = 1e-9,
    max_steps: Any = 100_000,
) -> AbstractSolver:
    """The solver object of ``simulate``'s keyword spellings (``method="euler",
    dt=0.1``): the thin front that builds it, each argument checked by name."""
    _checks.choice("method", method, (*SOLVERS, *FIXED, *STOCHASTIC))
    if method in (*FIXED, *STOCHASTIC):
        if dt is None:
            raise ValueError(f"dt is required for method={method!r}: the layer step, e.g. dt=0.1.")
        dtf = _checks.positive("dt", dt)
        fixed = {"euler": LayerSolver, "euler-ode": EulerODESolver}
        return fixed.get(method, EulerMaruyamaSolver)(dtf)
    r = _checks.number("rtol", rtol, lo=0.0, hi=1.0, hi_open=True)
    a = _checks.number("atol", atol, lo=0.0)
    steps = _checks.integer("max_steps", max_steps, lo=1, hi=MAX_STEPS_LIMIT)
    return AdaptiveSolver(rtol=r, atol=a, max_steps=steps, method=method)
