"""The result of a simulation: saved states in both frames, status and statistics."""

from __future__ import annotations

import dataclasses
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .. import _checks
from .._precision import einsum
from .frames import AbstractFrame, normalize_rows, singular_layer_step
from .status import BY_CODE, STATUS_CODES, SimulationError, Status, advice
from .terms import AbstractTime, Continuous, Layers

__all__ = ["Trajectory", "SimulationError", "Status", "STATUS_CODES"]


def _file():  # the trajectory files (the io layer), imported when a method needs them
    from ..io import trajectory_file

    return trajectory_file


@eqx.filter_jit
def _logit_rows(model, xs):
    """``model.logits`` of each system's tokens ``xs`` ``(b, n, d)``."""
    return jax.vmap(model.logits)(xs)


@eqx.filter_jit
def _attention_rows(model, xs):
    """``model.attention`` of each system's tokens ``xs`` ``(b, n, d)``, compiled once per
    shape (eagerly, every primitive of the kernel would compile on its own)."""
    return jax.vmap(model.attention)(xs)


@eqx.filter_jit
def _stacked_rows(method: str, model, xs):
    """``model.<method>`` of each system's tokens ``xs`` ``(b, n, d)`` with its own model
    (a stacked model: system i with model i)."""
    return eqx.filter_vmap(lambda m, x: getattr(m, method)(x))(model, xs)


def _unstack(model, i: int):
    from .stack import unstack

    return unstack(model, i)


@eqx.filter_jit
def _convert_program(disc: AbstractTime, prop, modal: bool, ts, to_x, y, to_original: bool):
    """``disc.convert`` as one compiled program (a warm start reads one program from the
    compilation cache, not one per operation)."""
    return disc.convert(prop, modal, ts, to_x, y, to_original)


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """Saved states of one system or a batch, in both frames.

    Attributes:
        ts: ``(m,)`` saved times. For one system that stopped early, only the times
            reached, followed by the time where it stopped.
        frame: the frame that was integrated, ``"rescaled"``, ``"original"`` or
            ``"sphere"``.
        model: the ``Attention`` it came from.
        stats: ``num_steps``, ``num_accepted_steps``, ``num_rejected_steps`` (per system).
        solver: the method and its settings.
        statuses: one status code per system (see ``attnflow.simulate``).
        reached: ``(m,)`` or ``(b, m)``: which saves were reached. In a batch, states of
            saves that a failed system never reached are NaN, and said so by ``status``.
        t_stop: where each system stopped (``t1`` when it succeeded).
        t1: the requested final time.
        x0: the initial tokens as integrated (cast to the working dtype), ``(n, d)`` or
            ``(b, n, d)``.
        discretisation: ``Continuous()`` (an ODE solver) or ``Layers(dt)`` (the discrete
            transformer); with ``frame``, how the two frames are related at each save.
        saved_metadata: for a trajectory read by ``Trajectory.load``, the metadata
            stored with it (seed, command, versions, ...); ``None`` otherwise.

    ``z`` and ``x`` are the states in the rescaled and original frames, ``(m, n, d)`` or
    ``(b, m, n, d)``; the frame that was not integrated is computed on first access
    (``x = e^{tV} z``, or ``x^k = (I + dt V)^k z^k`` for the discrete transformer).
    For ``frame == "sphere"`` both are the tokens on the unit sphere, ``N(state)``
    (``N(u) = u / |u|`` per token, exact to rounding): layer normalisation takes the
    place of the rescaling, so ``z = x``; ``state`` is what the solver holds (the free
    residual stream for the ``"pre"``, ``"peri"``, ``"mix"`` and ``"scaled"`` layer
    norms).
    """

    ts: Array
    frame: str
    model: Any
    stats: dict
    solver: dict
    statuses: tuple
    reached: np.ndarray
    t_stop: np.ndarray
    t1: float
    batched: bool
    coords: str  # "standard", or "modal": the rescaled state is w = T^{-1} z
    _y: Array  # (b, m, n, d), the integrated state
    _to_x: Array | None  # (b?, m, d, d) maps z -> x, when not computable from ts
    x0: Array | None = None  # the initial tokens as integrated, (n, d) or (b, n, d)
    discretisation: AbstractTime = Continuous()  # or Layers(dt): the discrete transformer
    saved_metadata: dict | None = None  # what Trajectory.load read from the file
    wall_seconds: float | None = None  # simulate's wall time, compile included
    frame_object: Any = None  # the frame object that ran (rebuilt on demand after load)

    # ------------------------------------------------------------- construction
    @classmethod
    def _from_solve(
        cls,
        *,
        model,
        frame,
        coords,
        ts_requested,
        ys,
        reached,
        t_stop,
        y_stop,
        codes,
        stats,
        batched,
        to_x,
        solver,
        t1,
        x0=None,
        discretisation=None,
        frame_object=None,
    ):
        disc = Continuous() if discretisation is None else discretisation
        codes = np.asarray(codes).reshape(-1)
        statuses = tuple(BY_CODE[int(c)] for c in codes)
        reached = np.asarray(reached, bool)
        ys = jnp.asarray(ys)
        t_stop = np.asarray(t_stop, np.float64).reshape(-1)
        dtype = ys.dtype
        ts = jnp.asarray(ts_requested, dtype=dtype)
        if batched:
            mask = jnp.asarray(reached)[:, :, None, None]
            ys = jnp.where(mask, ys, jnp.nan)
            to = None if to_x is None else jnp.asarray(to_x, dtype)
            return cls(
                ts=ts,
                frame=frame,
                model=model,
                stats=stats,
                solver=solver,
                statuses=statuses,
                reached=reached,
                t_stop=t_stop,
                t1=t1,
                batched=True,
                coords=coords,
                _y=ys,
                _to_x=to,
                x0=x0,
                discretisation=disc,
                frame_object=frame_object,
            )
        # One system: keep what was reached, then the state where it stopped.
        r = reached[0]
        keep = np.flatnonzero(r)
        # (1, m, n, d); every save reached (the usual case): the solve's own array
        y = ys if keep.size == r.size and ys.shape[0] == 1 else ys[0][keep][None]
        tk = np.asarray(ts_requested)[keep]
        to = None if to_x is None else np.asarray(to_x)[keep]
        ok = statuses[0] == "ok"
        ts_stop = float(t_stop[0])
        if not ok and (tk.size == 0 or ts_stop > tk[-1] * (1 + 1e-12)):
            y = jnp.concatenate([y, jnp.asarray(y_stop)[0][None, None].astype(dtype)], axis=1)
            tk = np.append(tk, ts_stop)
            if to is not None:
                assert isinstance(disc, Layers)  # the maps R^k come from the layer loop
                Rk = disc.maps64(model.propagator, [ts_stop], +1)
                to = np.concatenate([to, Rk], axis=0)
            r = np.ones(tk.shape, bool)
        else:
            r = np.ones(tk.shape, bool)
        stats1 = {k: (v[0] if np.ndim(v) else v) for k, v in stats.items()}
        return cls(
            ts=jnp.asarray(tk, dtype),
            frame=frame,
            model=model,
            stats=stats1,
            solver=solver,
            statuses=statuses,
            reached=r,
            t_stop=t_stop,
            t1=t1,
            batched=False,
            coords=coords,
            _y=y,
            _to_x=None if to is None else jnp.asarray(to, dtype),
            x0=x0,
            discretisation=disc,
            frame_object=frame_object,
        )

    # ------------------------------------------------------------------- frame
    @cached_property
    def frame_of(self) -> AbstractFrame:
        """The frame object that ran (``attnflow.dynamics.frames``): the one ``simulate``
        used, or, for a trajectory read from a file or one system of a stacked batch,
        the same frame built again from the model and the run's settings. The
        trajectory reads its facts (what the state is) and converts through it."""
        if self.frame_object is not None:
            return self.frame_object
        from .frames import frame_maker

        solver = self.solver
        make = frame_maker(
            self.frame,
            solver.get("layernorm", "post"),
            t1=self.t1,
            dt=solver.get("dt"),
            residual=bool(solver.get("residual", True)),
            coords=self.coords if self.frame == "rescaled" else None,
        )
        return eqx.filter_vmap(make)(self.model) if self.stacked else make(self.model)

    # ------------------------------------------------------------------- status
    @property
    def status(self) -> str:
        """``"ok"`` or the failure code; for a batch, the first failure code found,
        with how many systems failed (``"overflow (3 of 64)"``)."""
        bad = [s for s in self.statuses if s != "ok"]
        if not bad:
            return "ok"
        if not self.batched:
            return bad[0]
        return f"{bad[0]} ({len(bad)} of {len(self.statuses)})"

    @property
    def ok(self) -> bool:
        return all(s == "ok" for s in self.statuses)

    def raise_for_status(self) -> Trajectory:
        """Raise ``SimulationError`` saying what to change if any system failed."""
        if self.ok:
            return self
        msgs = []
        for i, s in enumerate(self.statuses):
            if s != "ok":
                prefix = f"system {i}: " if self.batched else ""
                msgs.append(
                    prefix + advice(s, self._y.dtype, self.solver, float(self.t_stop[i]), self.t1)
                )
                if len(msgs) >= 3:
                    break
        more = sum(s != "ok" for s in self.statuses) - len(msgs)
        tail = f" (and {more} more systems)" if more > 0 else ""
        raise SimulationError("; ".join(msgs) + tail)

    # ------------------------------------------------------------------- states
    def _convert(self, y, to_original: bool):
        """The frame that was not integrated, from the states ``y`` ``(b, m, n, d)``."""
        return _convert_program(
            self.discretisation,
            self.model.propagator,
            self.frame_of.modal,
            self.ts,
            self._to_x,
            y,
            to_original,
        )

    def _convert64(self, y: np.ndarray, to_original: bool) -> np.ndarray:
        """``_convert`` in float64 and overflow-safe (``AbstractTime.convert64``)."""
        return self.discretisation.convert64(
            self.model.propagator, self.frame_of.modal, self.ts, self._to_x, y, to_original
        )

    def _checked(self, name: str, A: Array, to_original: bool) -> Array:
        """``A``, the frame ``name`` converted from the state, with every save where the
        conversion left the float range recomputed overflow-safe: entries beyond the
        range are +-inf, never NaN. Records where it happened for ``status_of``."""
        state_ok = np.all(np.isfinite(np.asarray(self._y)), axis=-1)  # (b, m, n)
        bad = ~np.all(np.isfinite(np.asarray(A)), axis=-1) & state_ok
        if not bad.any():
            return A
        out = np.array(A)
        for b, j in sorted({(int(b), int(j)) for b, j, _ in np.argwhere(bad)}):
            sl = np.asarray(self._y)[b : b + 1, j : j + 1]
            to_x = self._to_x
            if to_x is not None and self.stacked:
                to_x = to_x[b]
            one = dataclasses.replace(
                self,
                model=self._model_of(b),
                ts=self.ts[j : j + 1],
                _to_x=None if to_x is None else to_x[j : j + 1],
            )
            fixed = one._convert64(sl, to_original)[0, 0]
            with np.errstate(over="ignore"):
                out[b, j] = fixed.astype(out.dtype)
        t_first = float(np.asarray(self.ts)[np.argwhere(bad)[:, 1].min()])
        self._overflowed[name] = t_first
        warnings.warn(
            f"traj.{name} leaves the {np.dtype(out.dtype).name} range from t = "
            f"{t_first:.6g} on (e^(tV) over- or underflows there); those entries are "
            f"+-inf. traj.status_of({name!r}) says so; use x64 or a smaller t1 to "
            f"represent them.",
            RuntimeWarning,
            stacklevel=5,
        )
        return jnp.asarray(out)

    @cached_property
    def _overflowed(self) -> dict:
        return {}

    @property
    def has_z(self) -> bool:
        """Whether the rescaled frame exists for this model (it needs one value matrix,
        and the skip connection: not after ``residual=False``)."""
        if self.solver.get("residual", True) is False:
            return False
        if not self.frame_of.state_is_tokens:
            return True
        return self.model.propagator is not None and self._singular_layer_map is None

    @cached_property
    def _singular_layer_map(self) -> str | None:
        """Why ``z^k = R^{-k} x^k`` does not exist for a layer run in the original frame
        (``R = I + dt V`` singular in the working precision), else None."""
        dt = self.solver.get("dt")
        if self.solver.get("method") != "euler" or dt is None:
            return None
        return singular_layer_step(self.model.propagator.V, float(dt), self._y.dtype)

    @property
    def stacked(self) -> bool:
        """Whether the systems ran with stacked weights (system i with model i of
        ``traj.model``, an ``attnflow.stack``); ``traj.system(i)`` has model i alone."""
        return getattr(self.model, "stack_size", None) is not None

    def _model_of(self, i: int):
        """The model of system ``i`` (model ``i`` of stacked weights)."""
        return _unstack(self.model, i) if self.stacked else self.model

    def _convert_any(self, y, to_original: bool):
        """``_convert``, per system with its own model when the weights are stacked."""
        if not self.stacked:
            return self._convert(y, to_original)

        def one(model, yi, to_x):
            view = dataclasses.replace(self, model=model, _to_x=to_x)
            return view._convert(yi[None], to_original)[0]

        return eqx.filter_vmap(one)(self.model, y, self._to_x)

    @cached_property
    def _host(self) -> dict:
        """Host copies of the batch's arrays (and of the stacked model's leaves), made
        once, so that ``system(i)`` slices numpy arrays instead of dispatching a device
        gather per array and system."""
        names = ("_z", "_x") if self.has_z else ("_x",)
        out: dict[str, Any] = {k: np.asarray(getattr(self, k)) for k in names}
        out["_y"] = np.asarray(self._y)
        out["ts"] = np.asarray(self.ts)
        out["_to_x"] = None if self._to_x is None else np.asarray(self._to_x)
        out["x0"] = None if self.x0 is None else np.asarray(self.x0)
        if self.stacked:
            dyn, static = eqx.partition(self.model, eqx.is_array)
            out["model"] = (jax.tree_util.tree_map(np.asarray, dyn), static)
        return out

    def system(self, i: int) -> Trajectory:
        """System ``i`` of a batch as a trajectory of its own (with its own model when
        the weights were stacked): the saves it reached, its status and statistics."""
        if not self.batched:
            raise ValueError("system(i) selects one system of a batch; this is one system.")
        i = _checks.index("i", i, len(self.statuses), what="systems")
        host = self._host  # both frames converted once for the whole batch (vmapped)
        keep = np.flatnonzero(np.asarray(self.reached[i]))
        to_x = host["_to_x"]
        if to_x is not None:
            to_x = jnp.asarray((to_x[i] if self.stacked else to_x)[keep])
        model = self.model
        if self.stacked:
            dyn, static = host["model"]
            model = eqx.combine(jax.tree_util.tree_map(lambda a: a[i], dyn), static)
        one = dataclasses.replace(
            self,
            ts=jnp.asarray(host["ts"][keep]),
            model=model,
            stats={k: (np.asarray(v)[i] if np.ndim(v) else v) for k, v in self.stats.items()},
            statuses=(self.statuses[i],),
            reached=np.ones(keep.shape, bool),
            t_stop=np.asarray(self.t_stop)[i : i + 1],
            batched=False,
            _y=jnp.asarray(host["_y"][i : i + 1][:, keep]),
            _to_x=to_x,
            x0=None if host["x0"] is None else jnp.asarray(host["x0"][i]),
            # one model of a stack: its frame is built again from it when asked for
            frame_object=None if self.stacked else self.frame_object,
        )
        for name in ("_z", "_x") if self.has_z else ("_x",):
            one.__dict__[name] = jnp.asarray(host[name][i : i + 1][:, keep])
        for name, t in self._overflowed.items():
            one._overflowed[name] = t
        return one

    @cached_property
    def _z(self) -> Array:
        fr = self.frame_of
        if fr.state_is_rescaled:
            return self._y
        if fr.on_sphere:  # layer normalisation in place of e^{-tV}: z = x
            return self._x
        if not self.has_z:
            if self.solver.get("residual", True) is False:
                why = "the layers had no skip connection (residual=False)"
            elif self.model.propagator is None:
                why = f"{type(self.model).__name__} has no value matrix V"
            else:
                why = self._singular_layer_map
            raise ValueError(
                f"{why}, so the rescaled frame z = e^(-tV) x is not defined; use traj.x."
            )
        return self._checked("z", self._convert_any(self._y, False), False)

    @cached_property
    def _x(self) -> Array:
        fr = self.frame_of
        if fr.state_is_tokens:
            return self._y
        if fr.on_sphere:
            return normalize_rows(self._y)
        return self._checked("x", self._convert_any(self._y, True), True)

    def status_of(self, name: str) -> Status:
        """Whether the array ``traj.<name>`` (``"z"``, ``"x"`` or ``"state"``) is
        representable: ``Status.OVERFLOW`` when the frame that was not integrated leaves
        the float range at some saved time (its entries there are +-inf), else the status
        of the solve (``"ok"``, or the first failure)."""
        _checks.choice("name", name, ("z", "x", "state"))
        if name != "state":
            getattr(self, f"_{name}")  # materialise (and check) the frame
            if name in self._overflowed:
                return Status.OVERFLOW
        bad = [s for s in self.statuses if s != Status.OK]
        return Status(bad[0]) if bad else Status.OK

    @property
    def z(self) -> Float[Array, "*b m n d"]:
        """Rescaled-frame states ``(m, n, d)`` or ``(b, m, n, d)``."""
        return self._z if self.batched else self._z[0]

    @property
    def x(self) -> Float[Array, "*b m n d"]:
        """Original-frame states ``(m, n, d)`` or ``(b, m, n, d)``."""
        return self._x if self.batched else self._x[0]

    @property
    def state(self) -> Float[Array, "*b m n d"]:
        """The integrated state exactly as the solver holds it, ``(m, n, d)`` or
        ``(b, m, n, d)``: the tokens ``x`` (original frame), ``z`` (rescaled frame,
        ``coords == "standard"``) or ``w = T^{-1} z`` (``coords == "modal"``: the real
        modal basis of V, ``T = traj.model.propagator.T``).

        In modal coordinates each column is one mode of V and carries no rounding from
        the others; ``z = w T^T`` mixes them. When coordinates along negative
        eigenvalues diverge (to ~1e20, say), the rounding of that product swamps the
        bounded ones, so a measurement of a bounded mode (a level ``phi_1*(z)``, a
        frozen coordinate) is exact here and not in ``z``."""
        return self._y if self.batched else self._y[0]

    def project(
        self, P: Float[ArrayLike, "k d"], *, system: int | None = None
    ) -> Float[Array, "*b m n k"]:
        """``z @ P.T`` for a ``(k, d)`` matrix ``P`` of linear functionals of the
        rescaled-frame tokens, ``(m, n, k)`` (or ``(b, m, n, k)``), computed from the
        solver's state without mixing modes. ``system``: one system of a batch only.

        In modal coordinates ``z @ P.T = w @ (P T).T``; the entries of ``P T`` below
        ``sqrt(eps)`` of the largest in their row are rounding (for instance a left
        eigenvector against the other modes' right eigenvectors, zero in exact
        arithmetic) and are dropped, so a diverging mode that ``P`` annihilates
        contributes nothing."""
        P = np.asarray(P)
        if np.iscomplexobj(P):
            if np.any(np.imag(P) != 0):
                raise ValueError(
                    "P must be real (linear functionals of real tokens); for "
                    "a complex eigenvector project its real and imaginary "
                    "parts."
                )
            P = np.real(P)
        P = np.atleast_2d(np.asarray(P, np.float64))
        if P.shape[-1] != self.d:
            raise ValueError(
                f"P must have {self.d} columns (one per coordinate); got shape {P.shape}."
            )
        if system is not None and not self.batched:
            raise ValueError(
                "system= selects one system of a batch; this trajectory holds one system."
            )
        if system is not None:
            system = _checks.index("system", system, len(self.statuses), what="systems")
        if self.stacked and self.frame_of.modal:
            if system is None:
                raise ValueError(
                    "the weights were stacked (one modal basis per system): project one "
                    "system at a time, traj.project(P, system=i)."
                )
            return self.system(system).project(P)
        if not self.frame_of.modal:
            y = self.z if system is None else self.z[system]
        else:
            y = self.state if system is None else self._y[system]
            P = P @ np.asarray(self.model.propagator.T, np.float64)
            big = np.abs(P).max(axis=-1, keepdims=True, initial=0.0)
            P = np.where(np.abs(P) > np.sqrt(np.finfo(np.float64).eps) * big, P, 0.0)
        return einsum("...nd,kd->...nk", y, jnp.asarray(P, self._y.dtype))

    @property
    def n(self) -> int:
        return self._y.shape[-2]

    @property
    def d(self) -> int:
        return self._y.shape[-1]

    def attention(self, k: int = -1) -> Float[Array, "*b n n"]:
        """The attention matrix ``P`` at saved index ``k``: ``(n, n)`` or ``(b, n, n)``;
        one per head for a ``MultiHeadAttention`` (or a ``Block`` of one), ``(h, n, n)``
        or ``(b, h, n, n)`` (``model.attention`` of the tokens ``traj.x[k]``)."""
        k = _checks.index("k", k, self._y.shape[1], what="saved times")
        if self.stacked:
            P = _stacked_rows("attention", self.model, self._x[:, k])
        else:
            P = _attention_rows(self.model, self._x[:, k])
        return P if self.batched else P[0]

    def logits(self, k: int = -1) -> Float[Array, "*b n n"]:
        """The pre-kernel logits at saved index ``k``: ``(n, n)`` or ``(b, n, n)``
        (per head, ``(h, n, n)``, for a multi-head model; never masked)."""
        k = _checks.index("k", k, self._y.shape[1], what="saved times")
        if self.stacked:
            L = _stacked_rows("logits", self.model, self._x[:, k])
        else:
            L = _logit_rows(self.model, self._x[:, k])
        return L if self.batched else L[0]

    # --------------------------------------------------------------- saving
    def metadata(self, **extra) -> dict:
        """Everything needed to reproduce and judge this run, JSON-serialisable, nested as
        ``{"run", "model": model.describe(), "extra"}`` (``extra`` never replaces the run)."""
        return _file().metadata(self, **extra)

    def save(self, path, **extra) -> Path:
        """Write the run to an ``.npz`` file that ``Trajectory.load`` reads back bit for bit.

        It holds ``ts``, ``z``, ``x`` and ``reached`` (plain arrays for any reader), the
        solver's state and coordinates, ``x0``, where each system stopped, the model's
        weights and kernel parameters (each array once), the statistics and a JSON
        ``metadata`` string (``Trajectory.metadata``: solver, tolerances, status,
        versions, x64, the model, and ``extra`` keys such as the seed). Missing parent
        folders are created; ``.npz`` is appended to another suffix or none; a temporary
        name, then a rename: a crash never leaves half a file.

        Returns:
            The path written.
        """
        return _file().save(self, path, **extra)

    @classmethod
    def load(cls, path) -> Trajectory:
        """Read a run written by ``Trajectory.save`` (this version or 0.1.0): every array,
        the batch, statuses, statistics, metadata (``traj.saved_metadata``, nested) come
        back bit for bit; a float64 run needs x64 on, else it raises (to enable it:
        ``jax.config.update("jax_enable_x64", True)``)."""
        return _file().load(cls, path)

    def to_xarray(self):
        """The states as an ``xarray.Dataset``: ``z``, ``x`` with dims ``(system, time, token,
        coord)`` (``system`` for a batch only), times as ``time``, ``reached``, ``t_stop``,
        the metadata as attributes (the run's keys, ``model``, ``extra``; nested values as
        JSON strings, for ``to_netcdf``). Needs ``pip install "attnflow[xarray]"``."""
        return _file().to_xarray(self)

    def __repr__(self) -> str:
        shape = tuple(self._y.shape) if self.batched else tuple(self._y.shape[1:])
        return (
            f"Trajectory(frame={self.frame!r}, shape={shape}, "
            f"t=[{float(self.ts[0]):.4g}, {float(self.ts[-1]):.4g}], "
            f"status={str(self.status)!r})"
        )
