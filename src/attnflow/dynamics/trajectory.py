"""The result of a simulation: saved states in both frames, status and statistics."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .. import _checks
from .._meta import run_metadata
from .base import AbstractModel
from .frames import AbstractTime, Continuous, Layers

__all__ = ["Trajectory", "SimulationError", "STATUS_CODES", "FORMAT_VERSION"]

STATUS_CODES = ("ok", "overflow", "max_steps", "nonfinite", "failed")

# Version of the ``.npz`` layout written by ``Trajectory.save`` (``metadata["format"]``).
FORMAT_VERSION = 1


@eqx.filter_jit
def _logit_rows(model, xs):
    """``model.logits`` of each system's tokens ``xs`` ``(b, n, d)``."""
    return jax.vmap(model.logits)(xs)


def _model_family(name: str) -> type[AbstractModel]:
    """The model class called ``name`` (a final subclass of ``AbstractModel``)."""
    from . import model as _models  # noqa: F401  (defines the built-in families)

    stack, seen = [AbstractModel], {}
    while stack:
        cls = stack.pop()
        seen[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    if name not in seen or name.startswith("Abstract"):
        raise ValueError(
            f"unknown model family {name!r} in the saved run; known: "
            f"{sorted(k for k in seen if not k.startswith('Abstract'))}."
        )
    return seen[name]


class SimulationError(RuntimeError):
    """A simulation did not reach ``t1``; the message says what to change."""


def _advice(code: str, dtype, solver: dict, t_stop: float, t1: float) -> str:
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


@eqx.filter_jit
def _attention_rows(model, xs):
    """``model.attention`` of each system's tokens ``xs`` ``(b, n, d)``, compiled once per
    shape (eagerly, every primitive of the kernel would compile on its own)."""
    return jax.vmap(model.attention)(xs)


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """Saved states of one system or a batch, in both frames.

    Attributes:
        ts: ``(m,)`` saved times. For one system that stopped early, only the times
            reached, followed by the time where it stopped.
        frame: the frame that was integrated, ``"rescaled"`` or ``"original"``.
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
    ):
        disc = Continuous() if discretisation is None else discretisation
        codes = np.asarray(codes).reshape(-1)
        statuses = tuple(STATUS_CODES[int(c)] for c in codes)
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
            )
        # One system: keep what was reached, then the state where it stopped.
        r = reached[0]
        keep = np.flatnonzero(r)
        y = ys[0][keep]
        tk = np.asarray(ts_requested)[keep]
        to = None if to_x is None else np.asarray(to_x)[keep]
        ok = statuses[0] == "ok"
        ts_stop = float(t_stop[0])
        if not ok and (tk.size == 0 or ts_stop > tk[-1] * (1 + 1e-12)):
            y = jnp.concatenate([y, jnp.asarray(y_stop)[0][None].astype(dtype)], axis=0)
            tk = np.append(tk, ts_stop)
            if to is not None:
                R = np.eye(model.d) + disc.dt * np.asarray(model.propagator.V, np.float64)
                k = int(round(ts_stop / disc.dt))
                to = np.concatenate([to, np.linalg.matrix_power(R, k)[None]], axis=0)
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
            _y=y[None],
            _to_x=None if to is None else jnp.asarray(to, dtype),
            x0=x0,
            discretisation=disc,
        )

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
                    prefix + _advice(s, self._y.dtype, self.solver, float(self.t_stop[i]), self.t1)
                )
                if len(msgs) >= 3:
                    break
        more = sum(s != "ok" for s in self.statuses) - len(msgs)
        tail = f" (and {more} more systems)" if more > 0 else ""
        raise SimulationError("; ".join(msgs) + tail)

    # ------------------------------------------------------------------- states
    def _maps(self) -> Array:
        """``(m, d, d)`` matrices M with ``x = z @ M.T`` (standard coordinates)."""
        if self._to_x is not None:
            return self._to_x
        return self.discretisation.maps(self.model.propagator, self.ts)

    def _multipliers(self, sign: int):
        """Per-mode factors of ``e^{+-t V}`` (or ``(I + dt V)^{+-k}``) at the saved times."""
        return self.discretisation.multipliers(self.model.propagator, self.ts, sign)

    def _modal_to_tokens(self, w, sign: int):
        """Modal rows ``w`` (b, m, n, d) -> tokens after the per-mode factors at each save."""
        prop = self.model.propagator
        re, im = self._multipliers(sign)  # (m, d) each
        scaled = prop.modal_scale(w, re[None, :, None, :], im[None, :, None, :])
        return prop.from_modal(scaled)

    def _convert(self, y, to_original: bool):
        prop = self.model.propagator
        if self.coords == "modal":  # rescaled frame, state w = T^{-1} z
            return self._modal_to_tokens(y, +1) if to_original else prop.from_modal(y)
        if to_original:
            return jnp.einsum("bmnd,med->bmne", y, self._maps())
        # original frame -> rescaled
        if prop.has_modal:
            return self._modal_to_tokens(prop.to_modal(y), -1)
        if self._to_x is None:  # continuous: e^{-tV} directly, no inversion
            Minv = jax.vmap(self.model.propagator)(-self.ts)
            return jnp.einsum("bmnd,med->bmne", y, Minv)
        sol = jnp.linalg.solve(self._maps()[None], jnp.swapaxes(y, -1, -2))
        return jnp.swapaxes(sol, -1, -2)

    @cached_property
    def _z(self) -> Array:
        if self.frame == "rescaled" and self.coords == "standard":
            return self._y
        return self._convert(self._y, False)

    @cached_property
    def _x(self) -> Array:
        return self._y if self.frame == "original" else self._convert(self._y, True)

    @property
    def z(self) -> Array:
        """Rescaled-frame states ``(m, n, d)`` or ``(b, m, n, d)``."""
        return self._z if self.batched else self._z[0]

    @property
    def x(self) -> Array:
        """Original-frame states ``(m, n, d)`` or ``(b, m, n, d)``."""
        return self._x if self.batched else self._x[0]

    @property
    def state(self) -> Array:
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

    def project(self, P, *, system: int | None = None) -> Array:
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
            if np.any(P.imag != 0):
                raise ValueError(
                    "P must be real (linear functionals of real tokens); for "
                    "a complex eigenvector project its real and imaginary "
                    "parts."
                )
            P = P.real
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
        if self.coords != "modal":
            y = self.z if system is None else self.z[system]
        else:
            y = self.state if system is None else self._y[system]
            P = P @ np.asarray(self.model.propagator.T, np.float64)
            big = np.abs(P).max(axis=-1, keepdims=True, initial=0.0)
            P = np.where(np.abs(P) > np.sqrt(np.finfo(np.float64).eps) * big, P, 0.0)
        return jnp.einsum("...nd,kd->...nk", y, jnp.asarray(P, self._y.dtype))

    @property
    def n(self) -> int:
        return self._y.shape[-2]

    @property
    def d(self) -> int:
        return self._y.shape[-1]

    def attention(self, k: int = -1) -> Array:
        """The attention matrix ``P`` at saved index ``k``: ``(n, n)`` or ``(b, n, n)``."""
        k = _checks.index("k", k, self._y.shape[1], what="saved times")
        P = _attention_rows(self.model, self._x[:, k])
        return P if self.batched else P[0]

    def logits(self, k: int = -1) -> Array:
        """The pre-kernel logits at saved index ``k``: ``(n, n)`` or ``(b, n, n)``."""
        k = _checks.index("k", k, self._y.shape[1], what="saved times")
        L = _logit_rows(self.model, self._x[:, k])
        return L if self.batched else L[0]

    # --------------------------------------------------------------- saving
    def metadata(self, **extra) -> dict:
        """Everything needed to reproduce and judge this run, JSON-serialisable."""
        m = self.model
        meta = {
            "frame": self.frame,
            "coords": self.coords,
            "solver": self.solver,
            "t1": self.t1,
            "status": self.status,
            "statuses": list(self.statuses),
            "t_stop": [float(t) for t in self.t_stop],
            "n": self.n,
            "d": self.d,
            "batch": len(self.statuses) if self.batched else None,
            "dtype": np.dtype(self._y.dtype).name,
            **m.describe(),  # the model family, its weights and settings
            "stats": {k: np.asarray(v).tolist() for k, v in self.stats.items()},
            "versions": run_metadata(),
        }
        meta.update(extra)
        return meta

    def save(self, path, **extra) -> Path:
        """Write the run to an ``.npz`` file that ``Trajectory.load`` reads back bit for bit.

        The file holds ``ts``, ``z``, ``x`` and ``reached`` (plain arrays for any reader),
        the solver's own state and coordinates, the initial tokens ``x0``, where each
        system stopped, the model's weights and kernel parameters, the statistics, and a
        JSON ``metadata`` string (``Trajectory.metadata``: solver, tolerances, status,
        seed and other ``extra`` keys, versions, x64). Missing parent folders are
        created; ``.npz`` is appended when ``path`` has another suffix or none. The file
        is written to a temporary name and renamed, so a crash never leaves half a file.

        Returns:
            The path written.
        """
        path = Path(path)
        if path.is_dir():
            raise ValueError(
                f"path {str(path)!r} is a directory; give a file name such "
                f"as {str(path / 'run.npz')!r}."
            )
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        meta = self.metadata(**extra)  # before any file is touched: fails early
        m = self.model
        arrays = {
            "ts": np.asarray(self.ts),
            "z": np.asarray(self.z),
            "x": np.asarray(self.x),
            "reached": np.asarray(self.reached),
            "state": np.asarray(self._y),
            "t_stop": np.asarray(self.t_stop),
        }
        arrays.update({f"model.{k}": np.asarray(v) for k, v in m.arrays().items()})
        if self._to_x is not None:
            arrays["to_x"] = np.asarray(self._to_x)
        if self.x0 is not None:
            arrays["x0"] = np.asarray(self.x0)
        for k, v in self.stats.items():
            arrays[f"stats.{k}"] = np.asarray(v)
        meta["format"] = FORMAT_VERSION
        meta["trajectory"] = {
            "batched": self.batched,
            "coords": self.coords,
            "t1": self.t1,
            "statuses": list(self.statuses),
            # statistics held as Python numbers (the rest are numpy values)
            "stats_python": [
                k
                for k, v in self.stats.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            ],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez_compressed(fh, metadata=json.dumps(meta), **arrays)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path) -> Trajectory:
        """Read a run written by ``Trajectory.save``: every array, the batch, the
        statuses, the statistics and the metadata come back bit for bit (the metadata is
        in ``traj.saved_metadata``).

        A run saved in float64 needs x64 on (``jax.config.update("jax_enable_x64",
        True)``) to be read back without rounding; loading it with x64 off raises."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(
                f"path {str(path)!r} is not a file written by Trajectory.save (an .npz)."
            )
        try:
            with np.load(path, allow_pickle=False) as f:
                data = {k: f[k] for k in f.files}
        except Exception as exc:
            raise ValueError(f"cannot read {str(path)!r} as an .npz file: {exc}") from None
        if "metadata" not in data or "state" not in data:
            raise ValueError(
                f"{str(path)!r} was not written by Trajectory.save of this "
                f"attnflow (no metadata/state arrays); re-save the run."
            )
        meta = json.loads(str(data.pop("metadata")))
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"{str(path)!r} has format {meta.get('format')!r}; this "
                f"attnflow reads format {FORMAT_VERSION}."
            )
        state = data["state"]
        if state.dtype == np.float64 and not jax.config.jax_enable_x64:
            raise ValueError(
                f"{str(path)!r} holds a float64 run and JAX's x64 mode is off, so it would "
                f"be rounded to float32; enable it first: "
                f"jax.config.update('jax_enable_x64', True)."
            )
        info = meta["trajectory"]
        family = _model_family(meta.get("family", ""))
        model = family.from_saved(
            meta, {k.removeprefix("model."): v for k, v in data.items() if k.startswith("model.")}
        )
        python = set(info.get("stats_python", ()))
        stats = {}
        for k, v in data.items():
            if k.startswith("stats."):
                name = k.removeprefix("stats.")
                stats[name] = v.item() if name in python else (v[()] if v.ndim == 0 else v)
        to_x = data.get("to_x")
        x0 = data.get("x0")
        traj = cls(
            ts=jnp.asarray(data["ts"]),
            frame=meta["frame"],
            model=model,
            stats=stats,
            solver=meta["solver"],
            statuses=tuple(info["statuses"]),
            reached=np.asarray(data["reached"], bool),
            t_stop=data["t_stop"],
            t1=float(info["t1"]),
            batched=bool(info["batched"]),
            coords=info["coords"],
            _y=jnp.asarray(state),
            _to_x=None if to_x is None else jnp.asarray(to_x),
            x0=None if x0 is None else jnp.asarray(x0),
            saved_metadata=meta,
            discretisation=(
                Layers(float(meta["solver"]["dt"]))
                if meta["solver"].get("method") == "euler"
                else Continuous()
            ),
        )
        return traj

    def to_xarray(self):
        """The states as an ``xarray.Dataset`` with data variables ``z`` and ``x``, dims
        ``(system, time, token, coord)`` (``system`` only for a batch), the saved times
        as the ``time`` coordinate, ``reached`` and ``t_stop`` per system, and the run's
        metadata as attributes (nested values as JSON strings, so the dataset can be
        written with ``to_netcdf``). Needs the ``xarray`` extra
        (``pip install "attnflow[xarray]"``)."""
        try:
            import xarray as xr
        except ImportError:
            raise ImportError("to_xarray needs xarray: pip install 'attnflow[xarray]'.") from None
        dims = ("system", "time", "token", "coord") if self.batched else ("time", "token", "coord")
        sys_dims = ("system",) if self.batched else ()
        reached = self.reached if self.batched else np.asarray(self.reached)
        data_vars = {
            "z": (dims, np.asarray(self.z)),
            "x": (dims, np.asarray(self.x)),
            "reached": (sys_dims + ("time",), np.asarray(reached)),
            "t_stop": (sys_dims, np.asarray(self.t_stop if self.batched else self.t_stop[0])),
        }
        meta = self.metadata()
        attrs = {
            k: (
                v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v)
            )
            for k, v in meta.items()
        }
        coords = {"time": np.asarray(self.ts)}
        if self.batched:
            coords["system"] = np.arange(len(self.statuses))
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def __repr__(self) -> str:
        shape = tuple(self._y.shape) if self.batched else tuple(self._y.shape[1:])
        return (
            f"Trajectory(frame={self.frame!r}, shape={shape}, "
            f"t=[{float(self.ts[0]):.4g}, {float(self.ts[-1]):.4g}], "
            f"status={self.status!r})"
        )
