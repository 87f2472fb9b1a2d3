"""Trajectory files: ``metadata``, ``save``, ``load`` and ``to_xarray`` of a
``Trajectory`` (its methods of those names call these).

Contract: ``save`` writes one ``.npz`` atomically (temporary name, then rename) holding
plain arrays (``ts``, ``x``, ``z``, ``reached``), the solver's own state and coordinates,
the model's arrays (``model.<name>``, each once) and a JSON ``metadata`` string;
``load`` reads it back bit for bit and rebuilds the model through its registered family
(``AbstractModel.family``). Keys a caller adds to the metadata never replace the run's
own (``ValueError``). Format ``FORMAT_VERSION``; files of other formats are refused by
name.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._meta import run_metadata
from .base import AbstractModel
from .frames import Continuous, Layers

if TYPE_CHECKING:
    from .trajectory import Trajectory

__all__ = ["FORMAT_VERSION", "metadata", "save", "load", "to_xarray", "model_family"]

# The version of the file layout written by ``save``.
FORMAT_VERSION = 1


def model_family(name: str) -> type[AbstractModel]:
    """The model class registered as ``name`` (``AbstractModel.family``)."""
    from . import isotropic as _isotropic  # noqa: F401  (defines the built-in families)
    from . import model as _models  # noqa: F401
    from . import transformer as _transformer  # noqa: F401
    from .base import family_class

    try:
        return family_class(name)
    except ValueError as exc:
        raise ValueError(f"in the saved run: {exc}") from None


def metadata(self: Trajectory, **extra) -> dict:
    """``Trajectory.metadata``: the run's JSON-ready description plus ``extra`` keys,
    which never replace the run's own (``ValueError``)."""
    m = self.model
    if self.stacked:
        raise ValueError(
            "the weights were stacked (one model per system): save or describe one "
            "system at a time, traj.system(i).save(path)."
        )
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
    clash = sorted(set(extra) & set(meta))
    if clash:
        raise ValueError(
            f"metadata keys {clash} are the run's own (they describe how it was "
            f"computed); give your own keys other names (e.g. 'note', 'seed')."
        )
    meta.update(extra)
    return meta


def save(self: Trajectory, path, **extra) -> Path:
    """``Trajectory.save``: write the run to an atomic ``.npz`` (see the method)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"path {str(path)!r} is a directory; give a file name such "
            f"as {str(path / 'run.npz')!r}."
        )
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    meta = metadata(self, **extra)  # before any file is touched: fails early
    m = self.model
    arrays = {
        "ts": np.asarray(self.ts),
        "x": np.asarray(self.x),
        "reached": np.asarray(self.reached),
        "state": np.asarray(self._y),
        "t_stop": np.asarray(self.t_stop),
    }
    if self.has_z:
        arrays["z"] = np.asarray(self.z)
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
            payload: dict[str, Any] = {"metadata": json.dumps(meta), **arrays}
            np.savez_compressed(fh, **payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(cls: type[Trajectory], path) -> Trajectory:
    """``Trajectory.load``: read a run written by ``save``, bit for bit (see the method)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file written by Trajectory.save (an .npz).")
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
    if state.dtype == np.float64 and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            f"{str(path)!r} holds a float64 run and JAX's x64 mode is off, so it would "
            f"be rounded to float32; enable it first: "
            f"jax.config.update('jax_enable_x64', True)."
        )
    info = meta["trajectory"]
    family = model_family(meta.get("family", ""))
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


def to_xarray(self: Trajectory):
    """``Trajectory.to_xarray``: the states as an ``xarray.Dataset`` (see the method)."""
    try:
        import xarray as xr
    except ImportError:
        raise ImportError("to_xarray needs xarray: pip install 'attnflow[xarray]'.") from None
    dims = ("system", "time", "token", "coord") if self.batched else ("time", "token", "coord")
    sys_dims = ("system",) if self.batched else ()
    reached = self.reached if self.batched else np.asarray(self.reached)
    data_vars = {
        "x": (dims, np.asarray(self.x)),
        "reached": (sys_dims + ("time",), np.asarray(reached)),
        "t_stop": (sys_dims, np.asarray(self.t_stop if self.batched else self.t_stop[0])),
    }
    if self.has_z:
        data_vars["z"] = (dims, np.asarray(self.z))
    meta = metadata(self)
    attrs = {
        k: (v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v))
        for k, v in meta.items()
    }
    coords = {"time": np.asarray(self.ts)}
    if self.batched:
        coords["system"] = np.arange(len(self.statuses))
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)
