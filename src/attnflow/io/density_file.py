"""Density files: the ``.npz`` format of a ``DensityTrajectory`` (the mean-field solve).

Contract. ``save(traj, path)`` writes the saved ``q`` (``(m, N)``), the save times and a
JSON ``meta`` string (format name and version, the model's ``describe()``, status,
``t_stop``, step count, ``tail_tol`` and a SHA-256 of the arrays) atomically: a temporary
name, then a rename. ``load(cls, path)`` reads it back bit for bit, refuses a file of
another format or a newer version (advising an upgrade) and a file whose arrays do not
match their hash, naming the file. ``DensityTrajectory.save`` and ``.load`` are this
module's face (imported when called, so that the dynamics never load ``io``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .. import _checks
from .files import arrays_sha256, temporary_name, write_atomic

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
    """Read a file written by ``save`` into ``cls`` (``DensityTrajectory``), hash checked."""
    from ..dynamics.meanfield import CircleMeanField

    try:
        with np.load(Path(path), allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            arrays = {"ts": f["ts"], "q": f["q"]}
    except (KeyError, ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a mean-field density file ({exc}).") from None
    known = isinstance(meta, dict) and meta.get("format") == FORMAT
    if not known or meta.get("version", 99) > VERSION:
        got = meta if not isinstance(meta, dict) else (meta.get("format"), meta.get("version"))
        raise ValueError(
            f"{path} is not a density file this attnflow reads (format, version: {got!r}); "
            "upgrade attnflow."
        )
    if arrays_sha256(arrays) != meta.get("sha256"):
        raise ValueError(f"{path} is corrupted: its arrays do not match their hash.")
    m = meta["model"]
    model = CircleMeanField(m["beta"], m["kernel"], modes=m["modes"])
    return cls(
        model,
        arrays["ts"],
        arrays["q"],
        meta["status"],
        meta["t_stop"],
        meta["num_steps"],
        meta["tail_tol"],
    )
