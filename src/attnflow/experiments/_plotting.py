"""Shared helpers of the figure scripts: style, saving, sidecar JSON, command line.

Thin on purpose: simulation is ``attnflow.plotting.simulate_tokens`` (over
``attnflow.simulate``), analyses are the package's (``spectral_structure``,
``observe_limit``, ``predict_regime``), drawing helpers are ``attnflow.plotting``. What is
here is bookkeeping and the figures' common layout: every figure writes PNG + PDF and a
sidecar JSON holding every parameter (seed, n, d, t1, Q, K, V, solver, tolerances, x64,
versions); wall times go to the runner's index, not the sidecar.

Not a figure script (the runner only runs ``fig_*.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.io.files import temporary_name, write_atomic, write_text

if TYPE_CHECKING:
    from types import ModuleType

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from mpl_toolkits.mplot3d import Axes3D

    from attnflow.dynamics.trajectory import Trajectory

Make = Callable[..., dict[str, Any]]
"""A script's ``make(out_dir, quick=False, **kw) -> {"figures": [...], ...}``."""

# Keys every sidecar of these scripts has (tests check them).
REQUIRED_KEYS = (
    "script",
    "quick",
    "seed",
    "n",
    "d",
    "t1",
    "Q",
    "K",
    "V",
    "solver",
    "tolerances",
    "x64",
    "versions",
    "figures",
    "runs",
)

DPI_FULL, DPI_QUICK = 200, 90


def setup() -> ModuleType:
    """x64 on (scripts may flip it, the library never does). Returns ``matplotlib.pyplot``.

    The backend is left alone: ``attnflow figures`` may run the scripts in the caller's
    process (a notebook's backend stays), its worker processes select Agg, and so does
    ``main`` when a script runs on its own. The style is applied by ``styled``."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib.pyplot as plt

    return plt


def use_agg() -> None:
    """Select the Agg backend: for a script run on its own (``main``), which owns its
    process."""
    import matplotlib

    matplotlib.use("Agg")


@contextlib.contextmanager
def figure_context(rc: Mapping[str, Any]) -> Iterator[ModuleType]:
    """x64 on (``setup``) and the rc parameters ``rc`` for the duration of the block
    only: ``attnflow figures`` may run several scripts in one process, so no script may
    change another's rcParams, and x64 returns to its previous setting on exit. Yields
    ``matplotlib.pyplot``."""
    import jax
    import matplotlib

    x64 = bool(jax.config.read("jax_enable_x64"))
    try:
        plt = setup()
        # the stub wants a dict keyed by the literal rc names; any rc name is accepted
        with matplotlib.rc_context(dict(rc)):  # pyright: ignore[reportArgumentType]
            yield plt
    finally:
        jax.config.update("jax_enable_x64", x64)


def small_text(size: float) -> dict[str, Any]:
    """rc parameters of the dense multi-panel figures: ``size``-pt text, no LaTeX."""
    return {
        "font.size": size,
        "axes.titlesize": size,
        "text.usetex": False,
        "mathtext.fontset": "dejavusans",
    }


def styled(rc: Mapping[str, Any] | None = None) -> Callable[[Make], Make]:
    """Decorator for a script's ``make``: runs it inside ``figure_context(rc)`` (default
    the house style, ``attnflow.plotting.STYLE``) with ``out_dir`` as a ``Path``."""

    def decorate(make: Make) -> Make:
        @functools.wraps(make)
        def wrapper(out_dir: str | os.PathLike[str], quick: bool = False, **kw: Any):
            from attnflow.plotting import STYLE

            with figure_context(STYLE if rc is None else rc):
                return make(Path(out_dir), quick=quick, **kw)

        return wrapper

    return decorate


def add_axes3d(fig: Figure, rect: tuple[float, float, float, float]) -> Axes3D:
    """3-d axes at ``rect`` (left, bottom, width, height) of ``fig``."""
    from mpl_toolkits.mplot3d import Axes3D

    ax = fig.add_axes(rect, projection="3d")
    assert isinstance(ax, Axes3D)
    return ax


def headline(
    fig: Figure,
    title: str,
    subtitle: str,
    *,
    sub_y: float,
    y: float = 0.995,
    size: float = 9,
    sub_size: float = 7,
    title_kw: Mapping[str, Any] | None = None,
    **sub_kw: Any,
) -> None:
    """The title line and the grey line of set-up details at the top of a figure.

    Args:
        fig: the figure.
        title: the first line (``size`` pt).
        subtitle: the details (``sub_size`` pt, grey).
        sub_y: height of the details' top, in figure coordinates.
        y: height of the title's top.
        size: font size of the title.
        sub_size: font size of the details.
        title_kw: more text properties of the title.
        **sub_kw: more text properties of the details.
    """
    fig.text(0.5, y, title, ha="center", va="top", fontsize=size, **(title_kw or {}))
    fig.text(0.5, sub_y, subtitle, ha="center", va="top", fontsize=sub_size, color="0.3", **sub_kw)


def save(
    fig: Figure,
    out_dir: str | os.PathLike[str],
    stem: str,
    quick: bool = False,
    tight: bool = False,
) -> list[Path]:
    """Write ``stem.png`` and ``stem.pdf`` into ``out_dir``; close the figure.

    ``quick``: the low-resolution PNG of quick runs. ``tight``: crop to the drawn
    content (``bbox_inches="tight"``). The house style's typography (sentence case,
    symbols in mathtext: ``attnflow.experiments._style.tidy``) is applied first."""
    import matplotlib.pyplot as plt

    from attnflow.experiments._style import tidy

    tidy(fig)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        p = out_dir / f"{stem}.{ext}"

        def writer(f, ext=ext) -> None:
            fig.savefig(
                f,
                format=ext,
                dpi=(DPI_QUICK if quick else DPI_FULL) if ext == "png" else None,
                bbox_inches="tight" if tight else None,
                # no creation date: a rerun of unchanged code writes the same bytes
                metadata={"CreationDate": None} if ext == "pdf" else None,
            )

        write_atomic(p, writer, temporary_name(p))  # whole or not at all
        paths.append(p)
    plt.close(fig)
    return paths


def jsonable(obj: Any) -> Any:
    """numpy / jax values (and containers of them) as plain JSON types."""
    from attnflow.io.serialize import to_jsonable

    return to_jsonable(obj)


def write_json(
    out_dir: str | os.PathLike[str], stem: str, data: Any, *, compact: bool = False
) -> Path:
    """Write ``data`` (plain JSON types) as ``stem.json`` into ``out_dir`` (created).

    ``compact``: every innermost list of numbers on one line (matrix rows, vectors).
    Returns the path. Non-finite floats must already be strings (``jsonable``): a bare
    NaN or Infinity is not JSON, and is refused here.

    A file already there that holds the same record but for the build that made it
    (``"attnflow_build"`` keys, at any depth: ``_meta.build_version``, which names the
    commit) is left as it is: it says which build first made these numbers, and a rerun
    of another commit that changes nothing rewrites nothing."""
    text = json.dumps(data, indent=1, allow_nan=False)
    if compact:
        text = _compact_numbers(text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    if _same_but_build(path, json.loads(text)):
        return path
    return write_text(path, text + "\n")


BUILD_KEY = "attnflow_build"


def _without_build(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_build(v) for k, v in obj.items() if k != BUILD_KEY}
    if isinstance(obj, list):
        return [_without_build(v) for v in obj]
    return obj


def _same_but_build(path: Path, data: Any) -> bool:
    """Whether the JSON file ``path`` holds ``data`` but for its ``BUILD_KEY`` entries."""
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return _without_build(before) == _without_build(data)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A markdown table: one header row, a rule, one line per row (cells ``str()``-ed)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _collapse(runs: list[dict], key: str) -> Any:
    """One value if every run has the same ``key``, else ``{run name: value}``."""
    vals = [r.get(key) for r in runs]
    first = json.dumps(jsonable(vals[0]), sort_keys=True)
    if all(json.dumps(jsonable(v), sort_keys=True) == first for v in vals):
        return vals[0]
    return {r.get("name", str(i)): r.get(key) for i, r in enumerate(runs)}


def sidecar(
    *,
    script: str,
    quick: bool,
    runs: list[dict],
    figures: Sequence[str | os.PathLike[str]] = (),
    seeds: Any = None,
    seeds_note: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The sidecar of a figure as a dict: every parameter of every run, and versions.

    ``runs``: one dict per simulation (``simulate_tokens``'s params plus a ``name`` and
    whatever was measured). The top-level keys ``seed, n, d, t1, Q, K, V, solver,
    tolerances`` hold the common value, or ``{run name: value}`` where runs differ.
    ``seeds``: every seed the figure used (a list, or a count of random starts drawn
    from one stated generator), stated once by the script and written right after
    ``seed``; ``seeds_note`` says how they are used (``seeds=[]`` with, e.g.,
    ``seeds_note="deterministic: ..."`` for a figure without randomness).
    ``tests/test_figure_seeds.py`` checks that every committed sidecar has ``seeds``.
    ``figures`` may be left for later: ``_figure.figure`` fills it in once the figure is
    drawn (and keeps wall times out of the sidecar: ``_figure.split_timings``).
    ``extra``: more keys, after ``runs``.
    """
    from attnflow._meta import run_metadata

    versions = run_metadata()
    side: dict[str, Any] = {"script": script, "quick": bool(quick)}
    for key in ("seed", "n", "d", "t1", "Q", "K", "V", "solver", "tolerances"):
        side[key] = _collapse(runs, key) if runs else None
        if key == "seed" and seeds is not None:
            side["seeds"] = seeds
            if seeds_note is not None:
                side["seeds_note"] = seeds_note
    side.update(
        x64=versions["x64"],
        versions=versions,
        figures=[str(p) for p in figures],
        runs=runs,
    )
    side.update(extra)
    return side


_NUMBER_LIST = re.compile(r"\[(?:\s*-?[0-9][0-9.eE+-]*\s*,)*\s*-?[0-9][0-9.eE+-]*\s*\]")


def _compact_numbers(text: str) -> str:
    """Put every innermost list of numbers on one line (matrix rows, vectors)."""
    return _NUMBER_LIST.sub(
        lambda m: "[" + ", ".join(v.strip() for v in m.group(0)[1:-1].split(",")) + "]", text
    )


def observation(traj: Trajectory, **kw: Any) -> dict[str, Any]:
    """``observe_limit`` as a small JSON-ready dict (label, clusters, reason)."""
    import attnflow as af

    obs = af.observe_limit(traj, **kw)
    return {"label": obs.label, "n_clusters": obs.n_clusters, "reason": obs.reason}


def prediction(V: Any, Q: Any = None, K: Any = None) -> dict[str, Any]:
    """``predict_regime`` as a small JSON-ready dict (label, theorem, reason, spectrum)."""
    import attnflow as af

    V = np.asarray(V, dtype=np.float64)
    d = V.shape[0]
    reg = af.predict_regime(np.eye(d) if Q is None else Q, np.eye(d) if K is None else K, V)
    return {
        "label": reg.label,
        "theorem": reg.theorem,
        "reason": reg.reason,
        "eigenvalues": reg.eigenvalues,
    }


def panel_label(ax: Axes, letter: str, *, x: float = -0.02, y: float = 1.02, **kw: Any) -> None:
    """A bold ``(a)``-style label at the top left of an axes (2-d or 3-d)."""
    from mpl_toolkits.mplot3d import Axes3D

    text = ax.text2D if isinstance(ax, Axes3D) else ax.text
    text(
        x,
        y,
        f"({letter})",
        transform=ax.transAxes,
        fontweight="bold",
        ha="right",
        va="bottom",
        **kw,
    )


def label_line(
    ax: Axes,
    x: Any,
    y: Any,
    text: str,
    *,
    at: float = 0.5,
    offset: tuple[float, float] = (4, 0),
    **kw: Any,
) -> None:
    """Name a curve where it is drawn instead of in a legend: ``text`` beside the point
    of ``(x, y)`` at the fraction ``at`` of its points, ``offset`` points away (6-pt
    text on a translucent white box; ``kw``: more text properties)."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    ok = np.flatnonzero(np.isfinite(xs) & np.isfinite(ys))
    if ok.size == 0:
        return
    i = ok[min(int(round(at * (ok.size - 1))), ok.size - 1)]
    style = {
        "fontsize": 6,
        "va": "center",
        "bbox": {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7},
    }
    ax.annotate(text, (xs[i], ys[i]), xytext=offset, textcoords="offset points", **{**style, **kw})


def panel_letters(groups: Iterable[Any], first: str = "a", **kw: Any) -> None:
    """Letter panels in order: each item of ``groups`` is one panel, an axes or a
    sequence of axes (a row of small multiples); the first axes of a group gets the
    letter (``panel_label``, ``kw``: its position), the others share it
    (``part_of_panel``)."""
    for k, group in enumerate(groups):
        axes = list(np.ravel(np.asarray(group, dtype=object)))
        panel_label(axes[0], chr(ord(first) + k), **kw)
        part_of_panel(*axes[1:])


def part_of_panel(*axes: Axes) -> None:
    """Mark ``axes`` as part of another axes' panel (small multiples of one panel, a
    marginal histogram): they share its letter and get none of their own
    (``_style``'s rule 1)."""
    from attnflow.experiments._style import PART_OF_PANEL

    for ax in axes:
        ax.set_gid(PART_OF_PANEL)


def axes3d(
    ax: Axes3D,
    labels: Sequence[str] = ("$z_1$", "$z_2$", "$z_3$"),
    pads: Sequence[float] = (-9, -9, -9),
    **label_kw: Any,
) -> None:
    """The 3-d panels' axes: three ticks per axis, tick labels pulled in, axis labels
    ``labels`` at ``labelpad`` ``pads`` (``label_kw``: e.g. ``fontsize``)."""
    from matplotlib.ticker import MaxNLocator

    for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
        axis.set_major_locator(MaxNLocator(3))
    ax.tick_params(pad=-3, labelsize=6)
    for setter, text, pad in zip((ax.set_xlabel, ax.set_ylabel, ax.set_zlabel), labels, pads):
        setter(text, labelpad=pad, **label_kw)


def movies(
    items: Iterable[tuple[Trajectory, str]],
    out_dir: str | os.PathLike[str],
    quick: bool,
    draw: str,
) -> list[str]:
    """GIFs of ``(trajectory, case)`` pairs into ``out_dir/movies/CASE.gif``, drawn as
    ``attnflow animate --case CASE`` draws them (``draw``: "hull" or "levels"); 48 frames
    at 90 dpi, or 4 at 60 dpi when ``quick``. Returns the paths."""
    import attnflow.plotting as AP

    paths = []
    for traj, case in items:
        info = AP.animate(
            traj,
            Path(out_dir) / "movies" / f"{case}.gif",
            frames=4 if quick else 48,
            dpi=60 if quick else 90,
            draw=draw,
            title=AP.MOVIE_CASES[case]["title"],
        )
        paths.append(info["path"])
    return paths


def main(
    make: Make,
    doc: str | None,
    argv: Sequence[str] | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Standalone use: ``python -m attnflow.experiments.fig_NAME [--quick] [--out
    figures] [--redraw]`` (the output folder is relative to the working directory;
    ``--redraw``, for a script registered with ``_figure.figure``: draw again from the
    data saved in it, computing nothing). Prints the files written, then
    ``report(result)`` if given."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().partition("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small version, for tests")
    ap.add_argument("--out", type=Path, default=Path("figures"), help="output folder")
    redraw = getattr(make, "redraw", None)
    if redraw is not None:
        ap.add_argument("--redraw", action="store_true", help="draw from the data saved in --out")
    args = ap.parse_args(argv)
    use_agg()
    if redraw is not None and args.redraw:
        res = redraw(args.out, quick=args.quick)
    else:
        setup()
        res = make(args.out, quick=args.quick)
    for p in res["figures"]:
        print(p)
    if "json" in res:
        print(res["json"])
    if report is not None:
        report(res)
    return res
