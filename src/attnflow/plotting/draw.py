"""Drawing the particle system: house style, convex hulls, level sets, GIF movies.

Presentation only: every number drawn comes from ``attnflow.simulate`` and the analyses;
the geometry a drawing needs (convex-hull vertices, the section of a hyperplane with a
box, bounding boxes, the edge-on camera) is computed in ``_geometry`` (numpy and scipy
only; its names are importable from here) and this module makes the matplotlib calls.
The same function draws on 2-d axes (lines) and on 3-d axes (translucent faces), and
``color`` means the same on both.

matplotlib is imported inside the functions, so ``import attnflow`` never needs it;
mathtext only (no LaTeX installation). Nothing here switches matplotlib's backend or
changes its global rcParams: ``use_style`` applies the house style inside a ``with``
block, and movies are drawn on a ``matplotlib.figure.Figure`` of their own, without
pyplot, so a notebook's backend and settings stay as they were. What the movies simulate
(``simulate_tokens``, ``MOVIE_CASES``) is in ``attnflow.studies.setups``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Float, Int

from .. import _checks
from ..analysis.regimes import Label
from ..studies.setups import MOVIE_CASES, case_matrix, simulate_tokens
from ._geometry import box_section, data_box, edge_on_view, hull_vertices

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D
    from mpl_toolkits.mplot3d import Axes3D
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    from ..dynamics.trajectory import Trajectory

__all__ = [
    "STYLE",
    "use_style",
    "hull_vertices",
    "hull_measure",
    "draw_hull",
    "box_section",
    "draw_level",
    "draw_levels",
    "draw_trajectories",
    "data_box",
    "set_box",
    "edge_on_view",
    "LABEL_COLORS",
    "animate",
    "movie",
]

STYLE: dict[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.titlesize": 9,
    "lines.linewidth": 1.0,
    "axes.linewidth": 0.6,
    "text.usetex": False,
    "mathtext.fontset": "dejavusans",
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.03,
}
"""rc parameters readable at paper size: a 6.5 in wide figure with 8 pt text."""

LABEL_COLORS: dict[str, str] = {
    Label.POLYTOPE: "#4477aa",
    Label.HYPERPLANES: "#66ccee",
    Label.SUBSPACE: "#228833",
    Label.ORIGIN: "#ccbb44",
    Label.UNCLASSIFIED: "#dddddd",
    Label.NOT_CONVERGED: "#ffffff",
}
"""Colours of the regime labels (the ``predict_regime`` / ``observe_limit`` vocabulary)."""


def use_style(
    rc: Mapping[str, Any] | None = None, **overrides: Any
) -> AbstractContextManager[None]:
    """``STYLE``, updated by ``rc`` and ``overrides``, as a context manager.

    ``with use_style(): ...`` sets the rc parameters inside the block and restores the
    previous ones on exit (it is ``matplotlib.rc_context``); nothing changes globally.

    Args:
        rc: rc parameters to add or override, e.g. ``{"font.size": 9}``.
        **overrides: more of them, for names that are Python identifiers.

    Returns:
        The context manager.
    """
    import matplotlib

    # the stub wants a dict keyed by the literal rc names; any rc name (str) is accepted
    return matplotlib.rc_context({**STYLE, **(rc or {}), **overrides})  # pyright: ignore[reportArgumentType]


# ----------------------------------------------------------------------- hulls
def _closed_hull(points: Float[np.ndarray, "k 2"]) -> Float[np.ndarray, "h+1 2"]:
    """The hull of planar points as a closed polygon (first vertex repeated last)."""
    idx = hull_vertices(points)
    return points[np.append(idx, idx[0])]


def hull_measure(points: Float[npt.ArrayLike, "k d"]) -> float:
    """Area (d = 2) or volume (d = 3) of the convex hull of ``points``.

    Args:
        points: the points.

    Returns:
        The measure; 0 for degenerate points (no more points than dimensions, or all on
        a line or plane).
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[0] <= pts.shape[1]:
        return 0.0
    from scipy.spatial import ConvexHull, QhullError

    try:
        return float(ConvexHull(pts).volume)
    except (QhullError, ValueError):
        return 0.0


def _face_edge(kw: dict[str, Any]) -> dict[str, Any]:
    """3-d faces: ``color`` is both the face and the edge colour."""
    if "color" not in kw:
        return kw
    rest = dict(kw)
    color = rest.pop("color")
    return {"facecolor": color, "edgecolor": color, **rest}


def _axes3d(ax: Axes, what: str) -> Axes3D:
    """``ax`` as 3-d axes, or a ValueError saying that ``what`` needs them."""
    from mpl_toolkits.mplot3d import Axes3D

    if not isinstance(ax, Axes3D):
        raise ValueError(f"{what} needs 3-d axes (projection='3d'); got {type(ax).__name__}.")
    return ax


def draw_hull(
    ax: Axes, points: Float[npt.ArrayLike, "k d"], *, fill: bool = False, **kw: Any
) -> Sequence[Artist] | Poly3DCollection | None:
    """Draw the convex hull of ``points``: a polygon (d = 2) or translucent faces (d = 3).

    Args:
        ax: the axes (3-d axes for d = 3).
        points: the points, d = 2 or 3.
        fill: d = 2: a filled polygon instead of its outline.
        **kw: matplotlib properties (``color`` colours the faces and edges in 3-d; the
            faces' ``alpha`` defaults to 0.15).

    Returns:
        The artists drawn; ``None`` for degenerate points in 3-d.
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[1] == 2:
        poly = _closed_hull(pts)
        if fill:
            return ax.fill(poly[:, 0], poly[:, 1], **kw)
        return ax.plot(poly[:, 0], poly[:, 1], **kw)
    ax3 = _axes3d(ax, "draw_hull of 3-d points")
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection
    from scipy.spatial import ConvexHull, QhullError

    try:
        hull = ConvexHull(pts)
    except (QhullError, ValueError):
        return None
    faces = [pts[s] for s in hull.simplices]
    kw = _face_edge(kw)
    kw.setdefault("alpha", 0.15)
    coll = Poly3DCollection(faces, **kw)
    ax3.add_collection3d(coll)
    return coll


# ---------------------------------------------------------------------- levels
def draw_level(
    ax: Axes,
    phi: Float[npt.ArrayLike, " d"],
    c: float,
    lo: Float[npt.ArrayLike, " d"],
    hi: Float[npt.ArrayLike, " d"],
    **kw: Any,
) -> Sequence[Artist] | Poly3DCollection | None:
    """Draw ``{phi . z = c}`` within the box ``[lo, hi]``: a line (d = 2) or a translucent
    plane (d = 3).

    Args:
        ax: the axes (3-d axes for d = 3).
        phi: normal of the hyperplane.
        c: its level.
        lo: the box's lower corner.
        hi: the box's upper corner.
        **kw: matplotlib properties (``color`` colours the face and edges in 3-d; the
            face's ``alpha`` defaults to 0.18).

    Returns:
        The artists drawn; ``None`` if the hyperplane misses the box.
    """
    sec = box_section(phi, c, lo, hi)
    if sec is None:
        return None
    if sec.shape[1] == 2:
        return ax.plot(sec[:, 0], sec[:, 1], **kw)
    ax3 = _axes3d(ax, "draw_level in 3-d")
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    kw = _face_edge(kw)
    kw.setdefault("alpha", 0.18)
    coll = Poly3DCollection([sec], **kw)
    ax3.add_collection3d(coll)
    return coll


def draw_levels(
    ax: Axes,
    phi: Float[npt.ArrayLike, " d"],
    levels: Iterable[float],
    lo: Float[npt.ArrayLike, " d"],
    hi: Float[npt.ArrayLike, " d"],
    *,
    zero: Mapping[str, Any] | None = None,
    **kw: Any,
) -> list[Sequence[Artist] | Poly3DCollection]:
    """Draw the parallel hyperplanes ``{phi . z = c}``, ``c`` in ``levels`` (``draw_level``
    for each), the one at ``c = 0`` styled apart if asked.

    Args:
        ax: the axes (3-d axes for d = 3).
        phi: normal of the hyperplanes.
        levels: their levels, e.g. ``(a, 0, b)``.
        lo: the box's lower corner.
        hi: the box's upper corner.
        zero: properties that replace ``kw``'s for the level 0 (e.g. ``{"ls": ":"}``).
        **kw: matplotlib properties of every level.

    Returns:
        The artists drawn, one entry per level that meets the box.
    """
    out = []
    for c in levels:
        drawn = draw_level(ax, phi, c, lo, hi, **{**kw, **(zero if zero and c == 0 else {})})
        if drawn is not None:
            out.append(drawn)
    return out


# ----------------------------------------------------------- paths and boxes
def draw_trajectories(
    ax: Axes,
    z: Float[npt.ArrayLike, "m n d"],
    *,
    color: Any = "0.55",
    lw: float = 0.6,
    alpha: float = 0.8,
    start: bool = True,
    end: bool = True,
    end_color: Any = "k",
    ms: float = 3.5,
    colors: Sequence[Any] | None = None,
) -> None:
    """Draw token paths with start (open) and end (filled) markers.

    Args:
        ax: the axes (3-d axes for d = 3).
        z: the tokens at the saved times, d = 2 or 3.
        color: colour of the paths.
        lw: line width of the paths.
        alpha: opacity of the paths.
        start: mark the first positions (open circles).
        end: mark the last positions (filled dots).
        end_color: colour of the end dots.
        ms: size of the end dots (the start circles are 0.7 of it).
        colors: one colour per token, overriding ``color``.
    """
    z = np.asarray(z)
    n, d = z.shape[1], z.shape[2]
    for i in range(n):
        c = color if colors is None else colors[i]
        ax.plot(*[z[:, i, k] for k in range(d)], color=c, lw=lw, alpha=alpha)
    if start:
        ax.plot(
            *[z[0, :, k] for k in range(d)],
            "o",
            ms=ms * 0.7,
            mfc="none",
            mec="0.35",
            mew=0.5,
            ls="none",
        )
    if end:
        ax.plot(*[z[-1, :, k] for k in range(d)], "o", ms=ms, color=end_color, ls="none")


def set_box(ax: Axes, lo: Float[npt.ArrayLike, " d"], hi: Float[npt.ArrayLike, " d"]) -> None:
    """Set the limits of ``ax`` to the box ``[lo, hi]`` (x and y; z too on 3-d axes).

    Args:
        ax: the axes.
        lo: the box's lower corner, d = 2 or 3.
        hi: the box's upper corner.
    """
    lo, hi = np.asarray(lo), np.asarray(hi)
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    if lo.shape[0] == 3:
        _axes3d(ax, "set_box in 3-d").set_zlim(lo[2], hi[2])


# ---------------------------------------------------------------------- movies
def _frame_indices(ts: Float[np.ndarray, " m"], frames: int) -> Int[np.ndarray, " f"]:
    """Saved-time indices for ``frames`` frames, denser early (times ~ (j/F)^2 t1),
    where the tokens move fastest; always the first and last save."""
    ts = np.asarray(ts, dtype=np.float64)
    target = ts[0] + (ts[-1] - ts[0]) * np.linspace(0.0, 1.0, frames) ** 2
    idx = np.searchsorted(ts, target).clip(0, len(ts) - 1)
    idx[0], idx[-1] = 0, len(ts) - 1
    return np.unique(idx)


def _set_points(line: Line2D, pts: Float[np.ndarray, "k d"]) -> None:
    """Move a line (2-d, or 3-d: mplot3d turns the lines it draws into ``Line3D``)."""
    from mpl_toolkits.mplot3d.art3d import Line3D

    if isinstance(line, Line3D):
        line.set_data_3d(pts[:, 0], pts[:, 1], pts[:, 2])
    else:
        line.set_data(pts[:, 0], pts[:, 1])


def animate(
    traj: Trajectory,
    path: str | os.PathLike[str],
    *,
    frames: int = 60,
    fps: int = 12,
    dpi: int = 90,
    frame: str | None = None,
    draw: str = "none",
    title: str = "",
    trail: int = 12,
    size: float = 4.0,
    system: int = 0,
) -> dict[str, Any]:
    """Write a GIF of the tokens moving.

    Args:
        traj: a ``Trajectory`` with many saved times (every layer is best); tokens in
            d = 2 or 3.
        path: the ``.gif`` file to write (folders are created).
        frames: number of frames (saved times, denser early where the motion is fast;
            at most the number of saves).
        fps: frames per second.
        dpi: resolution.
        frame: ``"rescaled"`` (``traj.z``, the theory's picture) or ``"original"``
            (``traj.x``); default the frame that was integrated.
        draw: ``"hull"`` (the current convex hull; the final one dashed), ``"levels"``
            (the lines or planes ``{phi_1^*(z) = c}`` for ``c`` in the current
            ``{min, 0, max}`` of ``phi_1^*(z_i)``; in 3-d the camera turns until the
            planes are seen edge-on), or ``"none"``.
        title: a line above the picture (the time is added below it).
        trail: how many saved times each token's tail spans.
        size: side of the picture, in inches.
        system: for a batch, which system to draw.

    Returns:
        ``{"path", "frames", "fps", "seconds", "bytes"}``.
    """
    import matplotlib
    from matplotlib.animation import FuncAnimation, PillowWriter
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..analysis.regimes import spectral_structure

    t_start = time.perf_counter()
    frame = _checks.choice("frame", frame or traj.frame, ("rescaled", "original"))
    draw = _checks.choice("draw", draw, ("hull", "levels", "none"))
    frames = _checks.integer("frames", frames, lo=2)
    Y = np.asarray(traj.z if frame == "rescaled" else traj.x, dtype=np.float64)
    ts = np.asarray(traj.ts, dtype=np.float64)
    if traj.batched:
        keep = np.asarray(traj.reached[system])
        Y, ts = Y[system][keep], ts[keep]
    m, n, d = Y.shape
    if d not in (2, 3):
        raise ValueError(f"animate draws tokens in d = 2 or 3; got d = {d}.")
    if m < 2:
        raise ValueError(f"need at least 2 saved times; got {m}.")
    idx = _frame_indices(ts, frames)
    phi = None
    if draw == "levels":
        st = spectral_structure(np.asarray(traj.model.V, np.float64))
        if st.phi1_left is None:
            raise ValueError(
                f"draw='levels' needs a simple leading eigenvalue (V's structure is {st.kind!r})."
            )
        phi = st.phi1_left
    lo, hi = data_box(Y)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    label = "z" if frame == "rescaled" else "x"
    # the stub wants a dict keyed by the literal rc names; any rc name (str) is accepted
    with matplotlib.rc_context({**STYLE, "savefig.bbox": None}):  # pyright: ignore[reportArgumentType]
        # a Figure of its own on an Agg canvas: no pyplot, so no backend to switch and
        # nothing registered with (or shown by) pyplot
        fig = Figure(figsize=(size, size), dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(111, projection="3d" if d == 3 else None)
        set_box(ax, lo, hi)
        ax.set_xlabel(f"${label}_1$")
        ax.set_ylabel(f"${label}_2$")
        elev0, azim0 = elev1, azim1 = 22.0, -60.0
        ax3 = _axes3d(ax, "animate") if d == 3 else None
        if ax3 is not None:
            ax3.set_zlabel(f"${label}_3$")
            elev1, azim1 = edge_on_view(phi, lo, hi) if phi is not None else (22.0, -20.0)
            if azim1 - azim0 > 180:
                azim1 -= 360
            elif azim1 - azim0 < -180:
                azim1 += 360
        else:
            ax.set_aspect("equal", adjustable="box")
            fig.subplots_adjust(left=0.14, right=0.97, bottom=0.1, top=0.88)
        trails = [ax.plot(*([[]] * d), color="0.5", lw=0.7)[0] for _ in range(n)]
        dots = ax.plot(*([[]] * d), "o", color="k", ms=3.5, ls="none")[0]
        title_artist = ax.set_title("", fontsize=7)
        lines2d = []
        if d == 2 and draw == "hull":
            draw_hull(ax, Y[-1], color="C3", lw=0.8, ls="--")
            lines2d = [ax.plot([], [], color="C0", lw=1.0)[0]]
        elif d == 2 and draw == "levels":
            lines2d = [ax.plot([], [], color="C3", lw=0.8, ls=ls)[0] for ls in ("-", ":", "-")]
        if d == 3 and draw == "hull":
            draw_hull(ax, Y[-1], color="C3", alpha=0.12, lw=0.4)
        polys = []

        def update(j):
            k = idx[j]
            k0 = max(0, k - trail)
            for i, ln in enumerate(trails):
                _set_points(ln, Y[k0 : k + 1, i])
            _set_points(dots, Y[k])
            if draw == "hull" and d == 2:
                poly = _closed_hull(Y[k])
                lines2d[0].set_data(poly[:, 0], poly[:, 1])
            elif draw == "levels" and phi is not None:
                p = Y[k] @ phi
                levels = (p.min(), 0.0, p.max())
                if d == 2:
                    for ln, c in zip(lines2d, levels):
                        sec = box_section(phi, c, lo, hi)
                        ln.set_data(*(([], []) if sec is None else (sec[:, 0], sec[:, 1])))
                else:
                    while polys:
                        polys.pop().remove()
                    polys.extend(
                        draw_levels(ax, phi, levels, lo, hi, color="C3", alpha=0.12, lw=0.4)
                    )
            if ax3 is not None:
                s = j / max(len(idx) - 1, 1)
                ax3.view_init(elev=elev0 + (elev1 - elev0) * s, azim=azim0 + (azim1 - azim0) * s)
            title_artist.set_text(f"{title}\n$t = {ts[k]:.1f}$")
            return []

        anim = FuncAnimation(fig, update, frames=len(idx), blit=False)
        anim.save(str(path), writer=PillowWriter(fps=fps), dpi=dpi)
    return {
        "path": str(path),
        "frames": int(len(idx)),
        "fps": int(fps),
        "seconds": round(time.perf_counter() - t_start, 2),
        "bytes": path.stat().st_size,
    }


def movie(
    case: str,
    path: str | os.PathLike[str],
    *,
    n: int = 20,
    seed: int = 0,
    t1: float | None = None,
    dt: float = 0.1,
    frames: int = 60,
    fps: int = 12,
    dpi: int = 90,
) -> dict[str, Any]:
    """Simulate a named case of ``MOVIE_CASES`` (``simulate_tokens``) and write its GIF
    (``animate``).

    Args:
        case: a key of ``MOVIE_CASES``.
        path: the ``.gif`` file to write.
        n: number of tokens.
        seed: seed of the tokens.
        t1: final time; default the case's.
        dt: layer step of the discrete transformer.
        frames: number of frames.
        fps: frames per second.
        dpi: resolution.

    Returns:
        ``animate``'s dict, with the simulation's parameters under ``"params"`` and the
        case under ``"case"``.
    """
    c = MOVIE_CASES[_checks.choice("case", case, MOVIE_CASES)]
    traj, params = simulate_tokens(
        case_matrix(c),
        n=n,
        seed=seed,
        t1=c["t1"] if t1 is None else float(t1),
        dt=dt,
        frame=c["frame"],
    )
    info = animate(
        traj,
        path,
        frames=frames,
        fps=fps,
        dpi=dpi,
        draw=c["draw"],
        title=c["title"],
        frame=c["frame"],
    )
    info["params"] = params
    info["case"] = case
    return info
