"""Density files: the ``.npz`` format of a ``DensityTrajectory`` (the mean-field solve).

Contract. ``save(traj, path)`` writes the saved ``q`` (``(m, N)``), the save times and a
JSON ``meta`` string (format name and version, the model's ``describe()``, status,
``t_stop``, step count, ``tail_tol`` and a SHA-256 of the arrays) atomically: a temporary
name, then a rename. ``load(cls, path)`` reads it back bit for bit, refuses a file of
another format or a newer version (advising an upgrade), a file whose arrays do not
match their hash, and a damaged or malformed one (its arrays read by ``files.read_npz``,
every declared size checked first; each metadata field checked for its kind), each with
one ``ValueError`` naming the file. ``DensityTrajectory.save`` and ``.load`` are this
module's face (imported when called, so that the dynamics never load ``io``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import _checks
from .files import (
    BadFile,
    arrays_sha256,
    json_field,
    json_object,
    read_npz,
    temporary_name,
    write_atomic,
)

FORMAT = "attnflow-density"
VERSION = 1


def save(traj: Any, path: Any) -> Path:
    """Write ``traj`` (a ``DensityTrajectory``) to ``path`` (``.npz``); return the path."""
    p = _checks.output_file("path", path, suffix=".npz")
    arrays = {"ts": np.asarray(traj.ts), "q": np.asarray(traj.q)}
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "model": traj.model.describe(),
        "status": str(traj.status),
        "t_stop": traj.t_stop,
        "num_steps": traj.num_steps,
        "tail_tol": traj.tail_tol,
        "sha256": arrays_sha256(arrays),
    }
    text = np.array(json.dumps(meta))
    write_atomic(
        p, lambda f: np.savez(f, meta=text, ts=arrays["ts"], q=arrays["q"]), temporary_name(p)
    )
    return p


def load(cls: Any, path: Any) -> Any:
    """Read a file written by ``save`` into ``cls`` (``DensityTrajectory``), hash checked.

    Raises:
        ValueError: naming the file: it cannot be read (damaged, truncated, a declared
            size that does not fit), it is not a density file or of a newer version
            (upgrade attnflow), its arrays do not match their hash, or a field of its
            metadata is missing or of the wrong kind.
    """
    from ..dynamics.meanfield import UNRESOLVED, CircleMeanField
    from ..dynamics.status import STATUS_CODES

    p = Path(path)
    fix = "solve again and save the result"
    arrays = read_npz(p, kind="a mean-field density file", fix=fix)
    lacking = [k for k in ("meta", "ts", "q") if k not in arrays]
    if lacking:
        raise BadFile(
            p, f"it has no {', '.join(lacking)} array", kind="a mean-field density file", fix=fix
        )
    try:
        meta = json_object(arrays.pop("meta"))
    except ValueError as exc:
        raise BadFile(p, str(exc), kind="a mean-field density file", fix=fix) from None
    version = meta.get("version")
    if meta.get("format") != FORMAT or isinstance(version, bool) or not isinstance(version, int):
        got = (meta.get("format"), version)
        raise ValueError(
            f"{path} is not a density file this attnflow reads (format, version: {got!r}); "
            "it was not written by DensityTrajectory.save."
        )
    if version > VERSION:
        raise ValueError(
            f"{path} has density file format version {version}, newer than this attnflow "
            f"reads ({VERSION}); upgrade attnflow (pip install --upgrade attnflow)."
        )
    if arrays_sha256(arrays) != meta.get("sha256"):
        raise ValueError(f"{path} is corrupted: its arrays do not match their hash.")
    try:
        m = json_field(meta, "model", dict)
        family = m.get("family", "circle-mean-field")
        if family != "circle-mean-field":
            raise ValueError(f"its model is of the family {family!r}, not 'circle-mean-field'")
        model = CircleMeanField(
            json_field(m, "beta", float, "model"),
            json_field(m, "kernel", str, "model"),
            modes=json_field(m, "modes", int, "model"),
            # files written before the Laplacian have no diffusion: the noiseless equation
            diffusion=json_field(m, "diffusion", float, "model") if "diffusion" in m else 0.0,
        )
        status = json_field(meta, "status", str)
        if status not in (*STATUS_CODES, UNRESOLVED):
            raise ValueError(f"its status {status!r} is none that a solve reports")
        ts, q = arrays["ts"], arrays["q"]
        if ts.ndim != 1 or q.shape != (ts.size, model.grid_size) or ts.dtype.kind != "f":
            raise ValueError(
                f"its arrays ts {ts.shape} and q {q.shape} are not (m,) times and (m, "
                f"{model.grid_size}) values on the model's grid"
            )
        t_stop = json_field(meta, "t_stop", float)
        num_steps = json_field(meta, "num_steps", int)
        tail_tol = json_field(meta, "tail_tol", float)
        if not (t_stop >= 0 and num_steps >= 0 and tail_tol > 0 and math.isfinite(t_stop)):
            raise ValueError(
                f"its t_stop {t_stop!r}, num_steps {num_steps!r} or tail_tol {tail_tol!r} "
                f"is negative or not finite"
            )
    except ValueError as exc:
        raise BadFile(p, str(exc), kind="a mean-field density file", fix=fix) from None
    return cls(model, ts, q, status, t_stop, num_steps, tail_tol)
