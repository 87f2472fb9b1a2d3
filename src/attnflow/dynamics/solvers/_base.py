"""The solver contract and what the solvers share: the overflow guard, the status
codes, ``Solution`` (one system) and ``Run`` (a batch). See ``attnflow.dynamics.solvers``."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ..status import Status
from ..terms import AbstractTime

__all__ = [
    "AbstractSolver",
    "Solution",
    "Run",
    "SOLVERS",
    "SOLVER_CLASSES",
    "FIXED",
    "STOCHASTIC",
    "MAX_STEPS_LIMIT",
    "LOG_MARGIN",
    "PCOEFF",
    "ICOEFF",
    "log_limit",
    "status_code",
    "own_error_mode",
    "bad_times",
]


# simulate's adaptive ``method`` names -> the name of the diffrax solver class
SOLVER_CLASSES = {
    "adaptive": "Tsit5",
    "tsit5": "Tsit5",
    "dopri5": "Dopri5",
    "dopri8": "Dopri8",
    "bosh3": "Bosh3",
    "heun": "Heun",
}


class _Solvers(Mapping[str, Any]):
    """name -> diffrax solver class, read from diffrax on first use: importing attnflow
    does not import diffrax (a sixth of a warm command's start-up), a solve does."""

    _names: ClassVar[dict[str, str]] = SOLVER_CLASSES

    def __getitem__(self, name: str) -> Any:
        import diffrax

        return getattr(diffrax, self._names[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: diffrax.{v}" for k, v in self._names.items()) + "}"


# name -> diffrax solver class (adaptive, with an embedded error estimate); simulate's
# ``method`` names, "adaptive" being Tsit5
SOLVERS: Mapping[str, Any] = _Solvers()
# the fixed-step methods of ``simulate`` (one step of ``dt`` per layer)
FIXED = ("euler", "euler-ode")
# the fixed-step method that needs noise (``simulate(..., noise=...)``)
STOCHASTIC = ("euler-maruyama",)
# diffrax counts steps in 32-bit integers.
MAX_STEPS_LIMIT = 2**31 - 1

# Logits are stopped this far (in log) below the largest finite float.
LOG_MARGIN = 4.0
# Step-size control: the classical I controller (diffrax's defaults pcoeff=0, icoeff=1;
# scipy's RK45 does the same). A PI controller (0.3, 0.3) took 9% fewer steps on the
# n = 1024, d = 64 benchmark, but made a batched solve and the same systems solved one
# by one take different steps (accept/reject decisions at an error ratio ~1 flip on
# the rounding of batched matmuls), so it is not the default.
PCOEFF, ICOEFF = 0.0, 1.0


def log_limit(dtype: Any) -> float:
    """The overflow guard's threshold: ``log(finfo(dtype).max) - LOG_MARGIN``."""
    # numpy's log in the dtype itself (float32: 84.72283935546875 - 4), as always
    return float(np.log(np.finfo(np.dtype(dtype)).max)) - LOG_MARGIN


@contextlib.contextmanager
def own_error_mode(mode: str = "nan") -> Iterator[None]:
    """Equinox's runtime checks traced inside this block (diffrax's checks of the save
    times and the first step) run as ``mode`` instead of the process's
    ``EQX_ON_ERROR``: attnflow checks those conditions itself (on the host at the door,
    or into the status of a traced solve), and a program without equinox's host
    callback can be kept in the compilation cache. Only attnflow's own traces are
    affected; the user's ``eqx.error_if`` keeps the process's mode. Equinox reads the
    mode from a module attribute when a check is traced; without it this does nothing."""
    try:
        from equinox import _errors
    except ImportError:  # pragma: no cover - equinox's layout changed
        yield
        return
    old = getattr(_errors, "EQX_ON_ERROR", None)
    if old is None:  # pragma: no cover
        yield
        return
    setattr(_errors, "EQX_ON_ERROR", mode)  # noqa: B010 (a module's private setting)
    try:
        yield
    finally:
        setattr(_errors, "EQX_ON_ERROR", old)  # noqa: B010


def bad_times(ts: Array, t1: Any, dt: Any = None) -> Array:
    """Whether the save times ``ts`` cannot be honoured (traced): not sorted, outside
    ``[0, t1]``, or, with ``dt``, not on the layer grid ``k dt``; a ``solve`` with such
    times reports ``Status.FAILED`` instead of mislabelled states."""
    tol = 1e-9 * jnp.maximum(1.0, jnp.abs(t1))
    bad = jnp.any(ts[1:] < ts[:-1]) | jnp.any(ts < -tol) | jnp.any(ts > t1 + tol)
    bad = bad | ~jnp.all(jnp.isfinite(ts))
    if dt is not None:
        bad = bad | jnp.any(jnp.abs(jnp.round(ts / dt) * dt - ts) > tol)
    return bad


def status_code(result: Any, y_stop: Array) -> Array:
    """The ``Status`` code of a diffrax solve: ok, overflow (the guard's event, finite
    state) or nonfinite (the event, non-finite state), max_steps, failed."""
    import diffrax

    finite = jnp.all(jnp.isfinite(y_stop))
    return jnp.where(
        result == diffrax.RESULTS.successful,
        Status.OK.code,
        jnp.where(
            result == diffrax.RESULTS.event_occurred,
            jnp.where(finite, Status.OVERFLOW.code, Status.NONFINITE.code),
            jnp.where(
                result == diffrax.RESULTS.max_steps_reached,
                Status.MAX_STEPS.code,
                Status.FAILED.code,
            ),
        ),
    )


class Solution(eqx.Module):
    """The result of ``solve``.

    Attributes:
        ts: ``(m,)`` the saved times.
        ys: ``(m, n, d)`` the states at ``ts`` in the integrated frame (after a stop,
            the saves past it hold the last state reached for layers, and diffrax's
            fill value ``inf`` for the adaptive solver).
        status: ``()`` int, the code of ``attnflow.Status`` (0 ok).
        t_stop: ``()`` the time where the solve stopped (``t1`` when it succeeded).
        y_stop: ``(n, d)`` the state there.
        num_steps: ``()`` int, the steps (layers) taken.
        num_accepted_steps, num_rejected_steps: ``()`` int, the steps accepted and
            rejected by the step-size controller (layers: all accepted).
    """

    ts: Float[Array, " m"]
    ys: Float[Array, "m n d"]
    status: Int[Array, ""]
    t_stop: Float[Array, ""]
    y_stop: Float[Array, "n d"]
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]

    @property
    def ok(self) -> Array:
        """Whether the solve reached ``t1`` (status ok)."""
        return self.status == Status.OK.code


@dataclasses.dataclass(frozen=True)
class Run:
    """What ``AbstractSolver.run`` hands ``simulate``: host arrays of a batch ``b``.

    ``ys`` ``(b, m, n, d)`` the saves; ``reached`` ``(b, m)`` which saves each system
    reached; ``t_stop`` ``(b,)``, ``y_stop`` ``(b, n, d)`` where each stopped;
    ``codes`` ``(b,)`` status codes; ``stats`` per-system step counts; ``to_x`` the flow
    ``R^k`` the layer loop carried at each save (standard coordinates), or ``None``."""

    ys: Any
    reached: np.ndarray
    t_stop: np.ndarray
    y_stop: Any
    codes: np.ndarray
    stats: dict
    to_x: Any = None


class AbstractSolver(eqx.Module):
    """What ``solve`` and ``simulate`` call (see the module docstring). Every concrete
    solver is final."""

    name: ClassVar[str]

    @property
    def step_size(self) -> float | None:
        """The fixed step (a layer) of a fixed-step solver; ``None`` for adaptive ones."""
        return None

    def plan(self, t1: float, ts: np.ndarray, *, chunk: Any = None, cost: Any = None) -> Any:
        """Host checks of the times and of ``simulate``'s ordering options; what ``run``
        needs statically."""
        del t1, ts, chunk, cost

    def check_frame(self, frame: Any, dtype: Any) -> None:
        """``ValueError`` naming the argument when the solver cannot run in ``frame``."""
        del frame, dtype

    def check_noise(self, noise: Any, frame: Any) -> None:
        """``ValueError`` naming the argument when the solver cannot run ``noise`` (a noise
        object of ``attnflow.dynamics.noise``, or ``None``) in ``frame``. Only the
        fixed-step solvers run noise."""
        del frame
        if noise is not None:
            raise ValueError(
                f"noise needs fixed steps: method='euler' (the stochastic layers, "
                f"LayerSolver(dt)) or 'euler-maruyama' (the SDE, EulerMaruyamaSolver(dt)); "
                f"got the {self.name} solver."
            )

    @abc.abstractmethod
    def discretisation(self) -> AbstractTime:
        """How the frames are related at the saved states."""

    @abc.abstractmethod
    def info(self, plan: Any) -> dict:
        """The solver's record in ``traj.solver``."""

    @abc.abstractmethod
    def integrate(
        self, frame: Any, y0: Array, ts: Array, t1: float, *, noise: Any = None
    ) -> Solution:
        """One system, traceable and differentiable (with ``noise``: the path of system 0)."""

    @abc.abstractmethod
    def run(
        self,
        frame: Any,
        y0: Array,
        ts: np.ndarray,
        t1: float,
        plan: Any,
        *,
        devices: Any = None,
        stacked: bool = False,
        chunk: int | None = None,
        cost: Any = None,
        progress: bool = False,
        noise: Any = None,
    ) -> Run:
        """A batch ``y0`` ``(b, n, d)``, on one device or sharded over ``devices``; with
        ``noise``, system ``i`` follows the path of key ``noise.key(i)``."""
