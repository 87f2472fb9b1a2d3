"""What a sweep is: its spec (``Sweep``), the kernel's contract, the results.

Contract: a ``Sweep`` is validated when it is made (a callable kernel, a
JSON-serialisable config, integer ``size >= 1``, ``seed >= 0``, ``shard_size >= 1``,
``align >= 1``) and frozen; its *identity* (``IDENTITY``: name, config, size, seed,
shard_size) is what two runs must share to write into one directory, and its manifest
records that identity, a digest of it that every shard file carries, the kernel's name
and the versions. Shard ``k`` always covers samples ``shard_range(k)``, and job ``i`` of
``N`` always runs the same contiguous slice of the shards (``shard_slice``), whatever
machine runs it. ``check_output`` enforces the kernel's output contract: a non-empty
dict of numeric or boolean arrays named by identifiers, each with ``stop - start`` rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Shaped

from ... import _checks
from ..._meta import netcdf_attrs, run_metadata

__all__ = [
    "IDENTITY",
    "RunReport",
    "Sweep",
    "SweepData",
    "check_output",
    "parse_shard",
    "shard_slice",
]

# Identity of a sweep on disk: a directory holds shards of exactly one of these.
IDENTITY = ("name", "config", "size", "seed", "shard_size")


def identity_digest(identity: Mapping) -> str:
    """The first 16 hex digits of the SHA-256 of a sweep's identity (``IDENTITY``'s
    fields, as JSON with sorted keys): the digest its manifest and every shard record."""
    ident = {k: identity[k] for k in IDENTITY}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def parse_shard(text: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """Parse ``"i/N"`` (0 <= i < N) into ``(i, N)``; ``None`` stays ``None``."""
    if text is None:
        return None
    if isinstance(text, tuple):
        if len(text) != 2:
            raise ValueError(f"shard must be two integers (i, N); got {text!r}.")
        i = _checks.integer("shard i", text[0])
        n = _checks.integer("shard N", text[1])
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if not m:
            raise ValueError(
                f"shard must look like 'i/N' with 0 <= i < N (e.g. '0/4'); got {text!r}."
            )
        i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise ValueError(
            f"shard i/N needs N >= 1 and 0 <= i < N (job i of N counts from 0); got {i}/{n}."
        )
    return i, n


def shard_slice(n_shards: int, shard: str | tuple[int, int] | None) -> range:
    """The shard numbers that job ``i`` of ``N`` runs: the ``i``-th of ``N`` contiguous,
    nearly equal slices of ``range(n_shards)`` (all of them when ``shard`` is None)."""
    parsed = parse_shard(shard)
    if parsed is None:
        return range(n_shards)
    i, n = parsed
    return range(i * n_shards // n, (i + 1) * n_shards // n)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sampling study: ``size`` samples of ``kernel`` under ``config`` and ``seed``.

    Args:
        name: a short label (``"ginibre"``), recorded in the manifest and the progress bar.
        kernel: ``kernel(config, start, stop, seed) -> dict[str, np.ndarray]``, each array
            of shape ``(stop - start, ...)``; row ``i`` must depend only on
            ``(config, seed, start + i)``. With ``workers > 1`` it must be importable
            (a module-level function), since it is sent to worker processes.
        config: the kernel's parameters, a JSON-serialisable mapping (ints, floats,
            strings, lists); part of the sweep's identity on disk.
        size: the number of samples, >= 1.
        seed: an integer >= 0.
        shard_size: samples per shard file, >= 1 (the unit of resumption on disk).
        align: in-memory chunks start at multiples of this (e.g. the kernel's block of
            samples per random stream); an efficiency hint only, never a correctness one.
        unit: the progress bar's unit name.
    """

    name: str
    kernel: Callable[[Mapping, int, int, int], Mapping[str, np.ndarray]]
    config: Mapping[str, Any]
    size: int
    seed: int = 0
    shard_size: int = 1024
    align: int = 1
    unit: str = "sample"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Sweep name must be a non-empty string; got {self.name!r}.")
        if not callable(self.kernel):
            raise ValueError("Sweep kernel must be callable as kernel(config, start, stop, seed).")
        if not isinstance(self.config, Mapping):
            raise ValueError(f"Sweep config must be a mapping; got {type(self.config)}.")
        try:
            json.dumps(dict(self.config), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"Sweep config must be JSON-serialisable (ints, floats, strings, lists): {exc}"
            ) from None
        object.__setattr__(self, "size", _checks.integer("size", self.size, lo=1))
        object.__setattr__(self, "seed", _checks.integer("seed", self.seed, lo=0))
        object.__setattr__(self, "shard_size", _checks.integer("shard_size", self.shard_size, lo=1))
        object.__setattr__(self, "align", _checks.integer("align", self.align, lo=1))

    @property
    def n_shards(self) -> int:
        """The number of shard files: ``ceil(size / shard_size)``."""
        return -(-self.size // self.shard_size)

    def shard_range(self, k: int) -> tuple[int, int]:
        """The global index range ``[start, stop)`` of shard number ``k``."""
        start = k * self.shard_size
        return start, min(start + self.shard_size, self.size)

    def identity(self) -> dict:
        """The fields that must match for two runs to share a directory."""
        return {
            "name": self.name,
            "config": json.loads(json.dumps(dict(self.config), sort_keys=True)),
            "size": self.size,
            "seed": self.seed,
            "shard_size": self.shard_size,
        }

    def manifest(self) -> dict:
        """The manifest written into a run's directory: the identity, its digest (which
        every shard records), the shard count, the kernel's name and versions."""
        ident = self.identity()
        digest = identity_digest(ident)
        kern = (
            f"{getattr(self.kernel, '__module__', '?')}.{getattr(self.kernel, '__qualname__', '?')}"
        )
        return {
            **ident,
            "digest": digest,
            "n_shards": self.n_shards,
            "kernel": kern,
            "versions": run_metadata(),
        }


@dataclasses.dataclass
class SweepData:
    """The merged result of a sweep: ``arrays[name]`` has shape ``(size, ...)``, row ``i``
    being sample ``i``; ``manifest`` is the sweep's manifest dict."""

    arrays: dict[str, Shaped[np.ndarray, "size ..."]]
    manifest: dict

    def __getitem__(self, name: str) -> Shaped[np.ndarray, "size ..."]:
        return self.arrays[name]

    @property
    def size(self) -> int:
        return int(self.manifest["size"])

    def to_xarray(self):
        """The merged arrays as an ``xarray.Dataset``: one variable per array, its first
        dimension ``sample`` (coordinate ``0 .. size - 1``, the global sample index) and
        its others ``<name>_0``, ``<name>_1``, ...; the manifest's numbers and strings as
        attributes and its other entries (``config``, ``versions``) as JSON strings, so
        that ``to_netcdf`` writes it and ``json.loads(ds.attrs["config"])`` gives the
        config back. Needs ``pip install "attnflow[xarray]"``.

        Example:
            >>> import numpy as np
            >>> from attnflow.studies.sweep import SweepData
            >>> data = SweepData({"label": np.array([0, 2, 1])}, {"name": "demo", "size": 3})
            >>> ds = data.to_xarray()
            >>> ds["label"].sel(sample=1).item()
            2
        """
        try:
            import xarray as xr
        except ImportError:
            raise ImportError("to_xarray needs xarray: pip install 'attnflow[xarray]'.") from None
        data_vars = {}
        for name, arr in self.arrays.items():
            a = np.asarray(arr)
            data_vars[name] = (("sample", *(f"{name}_{k}" for k in range(a.ndim - 1))), a)
        attrs = netcdf_attrs(self.manifest)
        return xr.Dataset(data_vars, coords={"sample": np.arange(self.size)}, attrs=attrs)


@dataclasses.dataclass
class RunReport:
    """What ``run`` did in ``out_dir``.

    Attributes:
        out_dir: the shard directory.
        n_shards: shards of the whole sweep.
        selected: shard numbers of this job (all, slice i of N, or the explicit list).
        computed: shards this run computed (bad files found on disk included).
        skipped: shards already on disk and verified when the run started.
        complete: whether every shard of the sweep (all jobs) is on disk now.
        missing: shards of the sweep not on disk now.
        seconds: wall time of the run.
        others: shards that another run (process or host) computed meanwhile.
        busy: shards still being computed by another run when this one returned
            (only with ``wait=False``).
        bad: the shard files that failed verification and were recomputed, each
            ``"name: reason"``.
    """

    out_dir: Path
    n_shards: int
    selected: list[int]
    computed: list[int]
    skipped: list[int]
    complete: bool
    missing: int
    seconds: float
    others: list[int] = dataclasses.field(default_factory=list)
    busy: list[int] = dataclasses.field(default_factory=list)
    bad: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "out_dir": str(self.out_dir),
            "n_shards": self.n_shards,
            "selected": list(self.selected),
            "computed": list(self.computed),
            "skipped": list(self.skipped),
            "complete": self.complete,
            "missing": self.missing,
            "seconds": self.seconds,
            "others": list(self.others),
            "busy": list(self.busy),
            "bad": list(self.bad),
        }


def check_output(out: Any, start: int, stop: int, name: str) -> dict[str, np.ndarray]:
    if not isinstance(out, Mapping) or not out:
        raise ValueError(
            f"the kernel of sweep {name!r} must return a non-empty dict of "
            f"arrays; got {type(out).__name__}."
        )
    res = {}
    for k, v in out.items():
        if not isinstance(k, str) or not k.isidentifier() or k.startswith("__"):
            raise ValueError(
                f"sweep {name!r}: array names must be identifiers not "
                f"starting with '__'; got {k!r}."
            )
        a = np.asarray(v)
        if a.ndim < 1 or a.shape[0] != stop - start:
            raise ValueError(
                f"sweep {name!r}: kernel array {k!r} has shape {a.shape}; its "
                f"leading axis must be stop - start = {stop - start}."
            )
        if a.dtype == object:
            raise ValueError(
                f"sweep {name!r}: kernel array {k!r} has dtype object; "
                f"return numeric or boolean arrays."
            )
        res[k] = a
    return res
