"""Trajectory files: what ``Trajectory.save`` writes and ``Trajectory.load`` reads, the
run's ``metadata`` and ``to_xarray`` (the four methods of ``Trajectory`` call these).

Contract:

- ``save`` writes one ``.npz`` atomically (a temporary name, then a rename) holding plain
  arrays (``ts``, ``x``, ``z``, ``reached``), the solver's own ``state`` and its
  coordinates, ``t_stop``, ``x0``, the layer maps ``to_x`` where the frames need them,
  the statistics held as arrays (``stats.<name>``), the model's arrays
  (``model.<name>``: ``model.arrays()``) and a JSON string ``metadata``.
- The metadata (format ``FORMAT``, version ``FORMAT_VERSION``) is nested:
  ``{"format", "format_version", "saved", "run": {...}, "model": {...}, "extra": {...}}``.
  ``saved`` says when (UTC, ISO 8601) and by which command line (``sys.argv``) the file
  was written; ``run`` says how the run was computed (``RUN_KEYS``: frame, coordinates,
  solver and its settings, t1, statuses, where each system stopped, sizes, dtype,
  statistics, simulate's wall time, versions); ``model`` is ``model.describe()``;
  ``extra`` holds the caller's own keys, which can never replace the run's. Each of the
  model's arrays is stored once: where the description repeats an array of one or more
  dimensions (the weights), the file holds a reference
  ``{"array": "model.<name>", "shape", "dtype"}`` in its place.
- ``load`` reads version 2 and the files of attnflow 0.1.0 (version 1: the metadata
  flat, ``"format": 1``), every array bit for bit, and rebuilds the model through its
  registered family (``AbstractModel.family``) from ``describe()`` and ``arrays()``
  exactly as they were. A file carries the SHA-256 of its metadata and arrays
  (``sha256``, beside them; files written before it existed have none): a file whose
  content does not match is refused, naming it, and so is one whose states are not
  finite at saves its statuses call ok; a malformed file (damaged, truncated, a field
  of the wrong kind) is one ``ValueError`` naming it, and its arrays are read by
  ``files.read_npz``, which checks every declared size before reading.
  ``traj.saved_metadata`` is the nested metadata with the
  references resolved (the weights as lists again): for a version-2 file it equals
  ``traj.metadata(**extra)`` of the run that was saved, with ``saved`` beside it (files
  written before ``saved`` and ``wall_seconds`` existed lack them). A file of a newer version is
  refused with the version and the upgrade to make.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._meta import netcdf_attrs, run_metadata
from ..dynamics.base import AbstractModel, family_class
from ..dynamics.trajectory import Continuous, Layers  # the time discretisations
from .files import arrays_sha256, read_npz, temporary_name, write_atomic

if TYPE_CHECKING:
    from ..dynamics.trajectory import Trajectory

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "READS",
    "RUN_KEYS",
    "load",
    "metadata",
    "model_family",
    "save",
    "to_xarray",
]

FORMAT = "attnflow.trajectory"  # the "format" of a file written by save
FORMAT_VERSION = 2  # the layout save writes
READS = (1, 2)  # the layouts load reads: 1 is that of attnflow 0.1.0
# The keys of metadata()["run"]: how the run was computed.
RUN_KEYS = (
    "frame",
    "coords",
    "solver",
    "t1",
    "status",
    "statuses",
    "t_stop",
    "n",
    "d",
    "batch",
    "dtype",
    "stats",
    "wall_seconds",
    "versions",
)
_REF_KEYS = {"array", "shape", "dtype"}


def model_family(name: str) -> type[AbstractModel]:
    """The model class registered as ``name`` (``AbstractModel.family``)."""
    from ..dynamics import isotropic as _isotropic  # noqa: F401  (the built-in families)
    from ..dynamics import model as _models  # noqa: F401
    from ..dynamics import transformer as _transformer  # noqa: F401

    try:
        return family_class(name)
    except ValueError as exc:
        raise ValueError(f"in the saved run: {exc}") from None


# ------------------------------------------------------------------ metadata
def metadata(traj: Trajectory, **extra: Any) -> dict:
    """``Trajectory.metadata``: ``{"run": ..., "model": ..., "extra": extra}``.

    Args:
        traj: one run (one system or a batch; not stacked weights).
        **extra: the caller's keys (seed, command, ...), kept apart in ``"extra"``.

    Returns:
        The nested, JSON-ready description; ``"model"`` is ``traj.model.describe()``,
        weights included.
    """
    if traj.stacked:
        raise ValueError(
            "the weights were stacked (one model per system): save or describe one "
            "system at a time, traj.system(i).save(path)."
        )
    run = {
        "frame": traj.frame,
        "coords": traj.coords,
        "solver": traj.solver,
        "t1": traj.t1,
        "status": traj.status,
        "statuses": list(traj.statuses),
        "t_stop": [float(t) for t in traj.t_stop],
        "n": traj.n,
        "d": traj.d,
        "batch": len(traj.statuses) if traj.batched else None,
        "dtype": np.dtype(traj._y.dtype).name,
        "stats": {k: np.asarray(v).tolist() for k, v in traj.stats.items()},
        "wall_seconds": traj.wall_seconds,
        "versions": run_metadata(),
    }
    return {"run": run, "model": traj.model.describe(), "extra": dict(extra)}


def _references(description: Any, arrays: dict[str, np.ndarray], prefix: str = "") -> Any:
    """``description`` with each entry that repeats one of the model's arrays (one or
    more dimensions, same values) replaced by a reference to ``model.<name>``."""
    if not isinstance(description, dict):
        return description
    out = {}
    for key, value in description.items():
        path = f"{prefix}{key}"
        arr = arrays.get(path)
        if arr is not None and arr.ndim >= 1 and _same_values(value, arr):
            out[key] = {"array": f"model.{path}", "shape": list(arr.shape), "dtype": arr.dtype.name}
        else:
            out[key] = _references(value, arrays, f"{path}.")
    return out


def _same_values(value: Any, arr: np.ndarray) -> bool:
    try:
        listed = np.asarray(value)
    except (ValueError, TypeError):  # ragged or not numbers
        return False
    return listed.shape == arr.shape and arr.tolist() == listed.tolist()


def _resolved(description: Any, data: dict[str, np.ndarray]) -> Any:
    """Inverse of ``_references``: each reference replaced by its array as lists."""
    if isinstance(description, list):
        return [_resolved(v, data) for v in description]
    if not isinstance(description, dict):
        return description
    if set(description) == _REF_KEYS and isinstance(description["array"], str):
        name = description["array"]
        if name not in data:
            raise ValueError(
                f"its metadata refers to the array {name!r}, which it does not hold "
                f"(damaged); re-save the run."
            )
        return data[name].tolist()
    return {k: _resolved(v, data) for k, v in description.items()}


# ---------------------------------------------------------------------- save
def save(traj: Trajectory, path: str | os.PathLike, **extra: Any) -> Path:
    """``Trajectory.save``: write the run to an atomic ``.npz`` (see the method).

    Args:
        traj: the run.
        path: the file; ``.npz`` is appended when it has another suffix or none.
        **extra: JSON-serialisable keys of the caller, stored in ``metadata["extra"]``.

    Returns:
        The path written.

    Example:
        >>> path = traj.save("runs/a.npz", seed=3)  # doctest: +SKIP
        >>> Trajectory.load(path).saved_metadata["extra"]  # doctest: +SKIP
        {'seed': 3}
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"path {str(path)!r} is a directory; give a file name such "
            f"as {str(path / 'run.npz')!r}."
        )
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    meta = metadata(traj, **extra)  # before any file is touched: fails early
    model_arrays = {k: np.asarray(v) for k, v in traj.model.arrays().items()}
    arrays = {
        "ts": np.asarray(traj.ts),
        "x": np.asarray(traj.x),
        "reached": np.asarray(traj.reached),
        "state": np.asarray(traj._y),  # (b, m, n, d), b = 1 for one system
        "t_stop": np.asarray(traj.t_stop),
    }
    if traj.has_z:
        arrays["z"] = np.asarray(traj.z)
    arrays.update({f"model.{k}": v for k, v in model_arrays.items()})
    if traj._to_x is not None:  # the layer maps R^k, when they cannot be recomputed
        arrays["to_x"] = np.asarray(traj._to_x)
    if traj.x0 is not None:
        arrays["x0"] = np.asarray(traj.x0)
    for k, v in traj.stats.items():
        if not _python_number(v):  # Python numbers come back from the JSON record
            arrays[f"stats.{k}"] = np.asarray(v)
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        # when, and by which command line, the file was written
        "saved": {
            "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": [str(a) for a in sys.argv],
        },
        "run": meta["run"],
        "model": _references(meta["model"], model_arrays),
        "extra": meta["extra"],
    }
    try:
        text = json.dumps(record)
    except TypeError as exc:
        bad = [k for k, v in extra.items() if not _jsonable(v)]
        raise ValueError(
            f"metadata keys {bad or sorted(extra)} cannot be written as JSON ({exc}); "
            f"pass numbers, strings, lists or dicts of them (e.g. x.tolist())."
        ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"metadata": np.asarray(text), **arrays}
    payload["sha256"] = np.asarray(arrays_sha256(payload))

    def writer(fh):
        np.savez_compressed(fh, **payload)

    # a temporary file with the mode of any new file, then a rename
    write_atomic(path, writer, temporary_name(path))
    return path


def _python_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, (bool, np.generic))


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
    except TypeError:
        return False
    return True


# ---------------------------------------------------------------------- load
def _read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON metadata and the arrays of a file, checked to be a trajectory file."""
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file written by Trajectory.save (an .npz).")
    kind, fix = "a trajectory file", "re-save the run from its source"
    # What the file declares (the .npy headers, no data) and its metadata first: an
    # array larger than the run it records is refused before it is allocated.
    declared = read_npz(path, kind=kind, fix=fix, headers=True)
    if "metadata" in declared:
        head = read_npz(path, kind=kind, fix=fix, only=("metadata",))["metadata"]
        _check_declared_sizes(head, declared, path)
    data = read_npz(path, kind=kind, fix=fix)
    if "metadata" not in data or "state" not in data:
        raise ValueError(
            f"{str(path)!r} was not written by Trajectory.save of attnflow "
            f"(no metadata/state arrays); re-save the run."
        )
    record = data.pop("metadata")
    if record.ndim != 0 or record.dtype.kind != "U":
        raise ValueError(
            f"{str(path)!r} has metadata that is not JSON (an array of dtype "
            f"{record.dtype} and shape {record.shape}, not one text)."
        )
    text = str(record)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} has metadata that is not JSON ({exc}).") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{str(path)!r} has metadata that is not a JSON object.")
    meta["__text__"] = text  # for the hash, checked once the layout is known
    return meta, data


def _check_declared_sizes(record: np.ndarray, declared: dict, path: Path) -> None:
    """Refuse a file whose arrays declare more entries than the run of its metadata holds
    (``n`` tokens in ``d`` dimensions, ``batch`` systems, the saves its ``ts`` declares):
    checked on the ``.npy`` headers before any array is read. Files whose metadata is not
    a version-2 record are left to the checks after reading."""
    try:
        run = json.loads(str(record.item()))["run"]
        n, d, batch = run["n"], run["d"], run["batch"]
    except Exception:  # not this layout: the full read says what is wrong
        return
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
    if not (whole(n) and whole(d) and (batch is None or whole(batch))):
        return
    ts = declared.get("ts")
    if ts is None or len(ts[0]) != 1:
        return
    m, b = ts[0][0], batch or 1
    bound = {
        "ts": m,
        "state": b * m * n * d,
        "x": b * m * n * d,
        "z": b * m * n * d,
        "reached": b * m,
        "t_stop": b,
        "x0": b * n * d,
        "to_x": b * m * d * d,
    }
    for key, most in bound.items():
        if key not in declared:
            continue
        shape, dtype = declared[key]
        count = math.prod(shape)
        if count > most:
            raise ValueError(
                f"{str(path)!r} is not a trajectory file that can be loaded: its array "
                f"{key!r} declares shape {tuple(shape)} ({count * dtype.itemsize:,} bytes) "
                f"but its metadata records a run of {b} system(s), {m} saves, n = {n} "
                f"tokens in d = {d} (at most {most:,} entries); the file is damaged or "
                f"altered: re-save the run from its source."
            )


def _check_hash(meta: dict, data: dict, path: Path) -> None:
    """The file's SHA-256 (``save`` writes it beside the arrays) against its content;
    files written before it existed have none, but a file that records when it was saved
    (``saved``, which came later) must have one."""
    text = meta.pop("__text__")
    digest = data.pop("sha256", None)
    if digest is None and isinstance(meta.get("saved"), dict):
        raise ValueError(
            f"{str(path)!r} has lost the hash it was saved with (no sha256 array): the "
            f"file was altered or damaged after it was written; re-save the run from its "
            f"source."
        )
    if digest is not None and str(digest) != arrays_sha256({"metadata": np.asarray(text), **data}):
        raise ValueError(
            f"{str(path)!r} does not match the hash it was saved with: the file was "
            f"altered or damaged after it was written; re-save the run from its source."
        )


def _version(meta: dict, path: Path) -> int:
    """The layout of a file: 1 (attnflow 0.1.0) or 2; a clear error otherwise."""
    fmt = meta.get("format")
    if "format_version" not in meta and fmt == 1 and not isinstance(fmt, bool):
        return 1
    version = meta.get("format_version")
    if fmt != FORMAT or isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(
            f"{str(path)!r} is not a trajectory file this attnflow knows (format "
            f"{fmt!r}, version {version!r}; expected format {FORMAT!r}); it was not "
            f"written by Trajectory.save."
        )
    if version not in READS:
        raise ValueError(
            f"{str(path)!r} has trajectory file format version {version}, newer than "
            f"this attnflow reads (versions {', '.join(map(str, READS))}); upgrade "
            f"attnflow (pip install --upgrade attnflow) to load it."
        )
    return version


def _nested_v1(flat: dict, model: AbstractModel) -> dict:
    """The metadata of a version-1 file (flat: the run's keys, ``model.describe()`` and
    the caller's keys side by side) in the nested form of version 2."""
    described = set(model.describe())
    skip = {"format", "trajectory"}  # the layout's own keys
    return {
        "run": {k: flat[k] for k in RUN_KEYS if k in flat},
        "model": {k: v for k, v in flat.items() if k in described},
        "extra": {
            k: v
            for k, v in flat.items()
            if k not in described and k not in RUN_KEYS and k not in skip
        },
    }


def load(cls: type[Trajectory], path: str | os.PathLike) -> Trajectory:
    """``Trajectory.load``: read a run written by ``save``, bit for bit (see the method).

    Args:
        cls: ``Trajectory``.
        path: a file written by ``Trajectory.save`` (this version or 0.1.0).

    Returns:
        The run, with its metadata (nested) in ``saved_metadata``.
    """
    path = Path(path)
    meta, data = _read(path)
    version = _version(meta, path)
    _check_hash(meta, data, path)
    state = data.get("state")
    if state is not None and state.dtype == np.float64 and not jax.config.read("jax_enable_x64"):
        raise ValueError(
            f"{str(path)!r} holds a float64 run and JAX's x64 mode is off, so it would "
            f"be rounded to float32; enable it first: "
            f"jax.config.update('jax_enable_x64', True)."
        )
    try:
        traj = _build(cls, meta, data, version)
    except ValueError as exc:  # its message says what is wrong and what to do
        raise ValueError(f"{str(path)!r} cannot be loaded: {exc}") from None
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(
            f"{str(path)!r} is a malformed trajectory file: {type(exc).__name__}: {exc} "
            f"(a field of its metadata or an array is missing or of the wrong kind)."
        ) from None
    _check_finite(traj, data, path)
    return traj


def _check_finite(traj: Trajectory, data: dict, path: Path) -> None:
    """Refuse non-finite states at saves the statuses call ok (an altered file)."""
    ok = np.asarray([st == "ok" for st in traj.statuses], bool)
    reached = np.asarray(traj.reached, bool)
    state = np.asarray(data["state"])  # (b, m, ...), b = 1 for one system
    rows = reached if reached.ndim == 2 else reached[None]
    if state.ndim >= 2 and state.shape[:2] == rows.shape and ok.shape == rows.shape[:1]:
        live = state.reshape(rows.shape + (-1,))[rows & ok[:, None]]
        if live.size and not np.all(np.isfinite(live)):
            raise ValueError(
                f"{str(path)!r} holds non-finite states at saves its statuses call 'ok': "
                f"the file is inconsistent (altered or damaged); re-save the run."
            )


def _build(cls, meta: dict, data: dict, version: int):
    """The ``Trajectory`` of a read file (``load``'s body; its key errors become one
    error naming the file)."""
    state = data["state"]
    model_arrays = {k.removeprefix("model."): v for k, v in data.items() if k.startswith("model.")}
    if version == 1:  # describe() merged into the run's keys
        model = model_family(meta.get("family", "")).from_saved(meta, model_arrays)
        nested = _nested_v1(meta, model)
        python = set(meta["trajectory"].get("stats_python", ()))
        batched = bool(meta["trajectory"]["batched"])
    else:
        described = _resolved(meta["model"], data)
        model = model_family(described.get("family", "")).from_saved(described, model_arrays)
        nested = {"run": meta["run"], "model": described, "extra": meta["extra"]}
        if isinstance(meta.get("saved"), dict):  # when and how it was written
            nested["saved"] = meta["saved"]
        python = set()  # Python numbers are in the JSON record only
        batched = nested["run"]["batch"] is not None
    run = nested["run"]
    stats: dict[str, Any] = {}
    for name, value in run["stats"].items():
        arr = data.get(f"stats.{name}")
        if arr is None:
            stats[name] = value
        elif name in python:
            stats[name] = arr.item()
        else:
            stats[name] = arr[()] if arr.ndim == 0 else arr
    to_x = data.get("to_x")
    x0 = data.get("x0")
    solver = run["solver"]
    return cls(
        ts=jnp.asarray(data["ts"]),
        frame=run["frame"],
        model=model,
        stats=stats,
        solver=solver,
        statuses=tuple(run["statuses"]),
        reached=np.asarray(data["reached"], bool),
        t_stop=data["t_stop"],
        t1=float(run["t1"]),
        batched=batched,
        coords=run["coords"],
        _y=jnp.asarray(state),
        _to_x=None if to_x is None else jnp.asarray(to_x),
        x0=None if x0 is None else jnp.asarray(x0),
        saved_metadata={"format": FORMAT, "format_version": version, **nested},
        wall_seconds=_wall(run.get("wall_seconds")),
        discretisation=(
            Layers(float(solver["dt"])) if solver.get("method") == "euler" else Continuous()
        ),
    )


def _wall(value: Any) -> float | None:
    """The recorded wall time (None in files written before it, or if malformed)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value >= 0 else None


# ------------------------------------------------------------------- xarray
def to_xarray(traj: Trajectory):
    """``Trajectory.to_xarray``: the states as an ``xarray.Dataset`` (see the method).

    The attributes are the run's keys (``metadata()["run"]``: numbers and strings as
    they are, the rest as JSON strings) and two JSON strings, ``model`` (the model's
    description, weights included) and ``extra`` (empty here), so that the dataset can
    be written with ``to_netcdf`` and ``json.loads(ds.attrs["model"])`` gives the
    description back.
    """
    try:
        import xarray as xr
    except ImportError:
        raise ImportError("to_xarray needs xarray: pip install 'attnflow[xarray]'.") from None
    dims = ("system", "time", "token", "coord") if traj.batched else ("time", "token", "coord")
    sys_dims = ("system",) if traj.batched else ()
    data_vars = {
        "x": (dims, np.asarray(traj.x)),
        "reached": (sys_dims + ("time",), np.asarray(traj.reached)),
        "t_stop": (sys_dims, np.asarray(traj.t_stop if traj.batched else traj.t_stop[0])),
    }
    if traj.has_z:
        data_vars["z"] = (dims, np.asarray(traj.z))
    meta = metadata(traj)
    attrs: dict[str, Any] = netcdf_attrs(meta["run"])
    attrs["model"] = json.dumps(meta["model"])
    attrs["extra"] = json.dumps(meta["extra"])
    coords = {
        "time": np.asarray(traj.ts),
        "token": np.arange(traj.n),
        "coord": np.arange(traj.d),
    }
    if traj.batched:
        coords["system"] = np.arange(len(traj.statuses))
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)
