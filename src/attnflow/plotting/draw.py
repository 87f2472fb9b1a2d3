"""Drawing the particle system: house style, hulls, level sets, GIF movies.

Presentation only: every number drawn here comes from ``attnflow.simulate`` and the
analyses (``spectral_structure``, ``observe_limit``); this module adds geometry for
drawing (convex hulls, the section of a hyperplane with a box) and matplotlib code.
matplotlib is imported lazily, inside the functions, so ``import attnflow`` never needs
it; mathtext only (no LaTeX installation). Nothing here switches matplotlib's backend or
changes its global rcParams: styles apply for the duration of a call
(``matplotlib.rc_context``) and movies are drawn on a ``matplotlib.figure.Figure`` of
their own, without pyplot, so a notebook's backend and settings stay as they were.

Main entry points:

``STYLE`` / ``use_style()``   rc parameters readable at paper size (8 pt text);
                              ``with use_style(): ...`` applies them inside the block.
``simulate_tokens(V, ...)``   the authors' tokens, weights and step (n tokens uniform in
                              [-scale, scale]^d, Q = K = I, dt = 0.1) with attnflow's
                              discrete transformer, which is not the authors' scheme
                              (see its docstring).
``MOVIE_CASES``               named cases for ``attnflow animate`` (polytope,
                              hyperplanes, their 3-d versions, origin).
``animate(traj, path, ...)``  a GIF of the tokens moving (matplotlib's PillowWriter: no
                              ffmpeg needed).
``movie(case, path, ...)``    ``simulate_tokens`` + ``animate`` for a named case.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np

from ..studies.setups import MOVIE_CASES, case_matrix, simulate_tokens

__all__ = [
    "STYLE",
    "use_style",
    "hull_vertices",
    "hull_measure",
    "draw_hull",
    "box_section",
    "draw_level",
    "draw_trajectories",
    "data_box",
    "edge_on_view",
    "LABEL_COLORS",
    "animate",
    "movie",
]

# Readable at paper size: a 6.5 in wide figure with 8 pt text.
STYLE = {
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

# Colours of the regime labels (predict_regime / observe_limit vocabulary).
LABEL_COLORS = {
    "polytope": "#4477aa",
    "hyperplanes": "#66ccee",
    "subspace": "#228833",
    "origin": "#ccbb44",
    "unclassified": "#dddddd",
    "not-converged": "#ffffff",
}


def use_style(rc: dict | None = None, **overrides):
    """``STYLE`` (updated by ``rc`` and ``overrides``) as a context manager.

    ``with use_style(): ...`` sets the rc parameters inside the block and restores the
    previous ones on exit (it is ``matplotlib.rc_context``); nothing changes globally.

    Args:
        rc: rc parameters to add or override, e.g. ``{"font.size": 9}``.
        overrides: more of them, for names that are Python identifiers.
    """
    import matplotlib

    return matplotlib.rc_context({**STYLE, **(rc or {}), **overrides})


# -------------------------------------------------------------------- geometry
def hull_vertices(points) -> np.ndarray:
    """Indices of the convex-hull vertices of ``points`` ``(k, 2)``, in counter-clockwise
    order (for 2-d); all indices when the points are degenerate (fewer than 3 distinct,
    or collinear: then the two extreme points)."""
    pts = np.asarray(points, dtype=np.float64)
    k = pts.shape[0]
    if k <= 2:
        return np.arange(k)
    from scipy.spatial import ConvexHull, QhullError

    try:
        return ConvexHull(pts).vertices
    except (QhullError, ValueError):
        c = pts - pts.mean(axis=0)
        u = np.linalg.svd(c, full_matrices=False)[2][0]
        s = c @ u
        return np.array([int(np.argmin(s)), int(np.argmax(s))])


def hull_measure(points) -> float:
    """Area (2-d) or volume (3-d) of the convex hull of ``points``; 0 when degenerate."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[0] <= pts.shape[1]:
        return 0.0
    from scipy.spatial import ConvexHull, QhullError

    try:
        return float(ConvexHull(pts).volume)
    except (QhullError, ValueError):
        return 0.0


def draw_hull(ax, points, *, fill: bool = False, **kw):
    """Draw the convex hull of ``points`` (2-d: a polygon; 3-d axes: translucent faces)."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.shape[1] == 2:
        idx = hull_vertices(pts)
        poly = pts[np.append(idx, idx[0])]
        if fill:
            return ax.fill(poly[:, 0], poly[:, 1], **kw)
        return ax.plot(poly[:, 0], poly[:, 1], **kw)
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection
    from scipy.spatial import ConvexHull, QhullError

    try:
        hull = ConvexHull(pts)
    except (QhullError, ValueError):
        return None
    faces = [pts[s] for s in hull.simplices]
    kw.setdefault("alpha", 0.15)
    coll = Poly3DCollection(faces, **kw)
    ax.add_collection3d(coll)
    return coll


def box_section(phi, c: float, lo, hi) -> np.ndarray | None:
    """The section of the hyperplane ``{z : phi . z = c}`` with the box ``[lo, hi]``.

    2-d: the two end points of a segment; 3-d: the vertices of a convex polygon, in
    order. None if the hyperplane misses the box."""
    phi = np.asarray(phi, dtype=np.float64)
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    d = phi.shape[0]
    corners = np.array(list(itertools.product(*zip(lo, hi))))
    pts = []
    for i, j in itertools.combinations(range(len(corners)), 2):
        a, b = corners[i], corners[j]
        if np.count_nonzero(a != b) != 1:
            continue
        fa, fb = phi @ a - c, phi @ b - c
        if fa == fb:
            continue
        s = fa / (fa - fb)
        if 0.0 <= s <= 1.0:
            pts.append(a + s * (b - a))
    if len(pts) < 2:
        return None
    pts = np.unique(np.round(np.array(pts), 12), axis=0)
    if len(pts) < 2:
        return None
    if d == 2:
        u = np.array([-phi[1], phi[0]])
        s = pts @ u
        return pts[[int(np.argmin(s)), int(np.argmax(s))]]
    # order the polygon's vertices by angle in the plane
    m = pts.mean(axis=0)
    n = phi / np.linalg.norm(phi)
    e1 = np.linalg.svd(np.eye(3) - np.outer(n, n))[0][:, 0]
    e2 = np.cross(n, e1)
    ang = np.arctan2((pts - m) @ e2, (pts - m) @ e1)
    return pts[np.argsort(ang)]


def draw_level(ax, phi, c: float, lo, hi, **kw):
    """Draw ``{phi . z = c}`` within the box ``[lo, hi]``: a line (2-d) or a translucent
    plane (3-d axes)."""
    sec = box_section(phi, c, lo, hi)
    if sec is None:
        return None
    if len(phi) == 2:
        return ax.plot(sec[:, 0], sec[:, 1], **kw)
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    kw.setdefault("alpha", 0.18)
    coll = Poly3DCollection([sec], **kw)
    ax.add_collection3d(coll)
    return coll


def draw_trajectories(
    ax,
    z,
    *,
    color="0.55",
    lw: float = 0.6,
    alpha: float = 0.8,
    start: bool = True,
    end: bool = True,
    end_color="k",
    ms: float = 3.5,
    colors=None,
):
    """Draw token paths ``z`` ``(m, n, d)`` (d = 2 or 3) with start (open) and end
    (filled) markers; ``colors`` one colour per token overrides ``color``."""
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


def data_box(z, pad: float = 0.06):
    """``(lo, hi)``: the bounding box of the finite points of ``z`` ``(..., d)``, padded
    by ``pad`` times its extent on each side."""
    pts = np.asarray(z).reshape(-1, np.asarray(z).shape[-1])
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    span = np.maximum(hi - lo, 1e-12)
    return lo - pad * span, hi + pad * span


# ---------------------------------------------------------------------- movies
def _frame_indices(ts, frames: int) -> np.ndarray:
    """Saved-time indices for ``frames`` frames, denser early (times ~ (j/F)^2 t1),
    where the tokens move fastest; always the first and last save."""
    ts = np.asarray(ts, dtype=np.float64)
    target = ts[0] + (ts[-1] - ts[0]) * np.linspace(0.0, 1.0, frames) ** 2
    idx = np.searchsorted(ts, target).clip(0, len(ts) - 1)
    idx[0], idx[-1] = 0, len(ts) - 1
    return np.unique(idx)


def edge_on_view(phi, lo, hi) -> tuple[float, float]:
    """``(elev, azim)`` of a horizontal camera looking along the planes ``{phi . z = c}``
    (they then appear edge-on, as lines), in matplotlib's box-normalised 3-d axes."""
    span = np.maximum(np.asarray(hi) - np.asarray(lo), 1e-12)
    p = np.asarray(phi, dtype=np.float64) * span  # the normal in normalised coordinates
    v = np.cross(p, [0.0, 0.0, 1.0])
    if np.linalg.norm(v) < 1e-12 * np.linalg.norm(p):
        return 0.0, -60.0
    return 0.0, float(np.degrees(np.arctan2(v[1], v[0])))


def animate(
    traj,
    path,
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
) -> dict:
    """Write a GIF of the tokens moving.

    Args:
        traj: a ``Trajectory`` with many saved times (every layer is best); tokens in
            d = 2 or 3. For a batch, ``system`` picks one.
        path: the ``.gif`` file to write (folders are created).
        frames: number of frames (saved times, denser early where the motion is fast;
            at most the number of saves).
        fps: frames per second.
        dpi, size: resolution and side in inches.
        frame: ``"rescaled"`` (``traj.z``, the theory's picture) or ``"original"``
            (``traj.x``); default the frame that was integrated.
        draw: ``"hull"`` (the current convex hull; the final one dashed), ``"levels"``
            (the lines or planes ``{phi_1^*(z) = c}`` for ``c`` in the current
            ``{min, 0, max}`` of ``phi_1^*(z_i)``; in 3-d the camera turns until the
            planes are seen edge-on), or ``"none"``.
        title: a line above the picture (the time is added below it).
        trail: how many saved times each token's tail spans.

    Returns:
        ``{"path", "frames", "fps", "seconds", "bytes"}``.
    """
    import matplotlib
    from matplotlib.animation import FuncAnimation, PillowWriter
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..analysis.regimes import spectral_structure

    t_start = time.perf_counter()
    frame = frame or traj.frame
    if frame not in ("rescaled", "original"):
        raise ValueError(f"frame must be 'rescaled' or 'original'; got {frame!r}.")
    Y = np.asarray(traj.z if frame == "rescaled" else traj.x, dtype=np.float64)
    ts = np.asarray(traj.ts, dtype=np.float64)
    if traj.batched:
        keep = np.asarray(traj.reached[system])
        Y, ts = Y[system][keep], ts[keep]
    m, n, d = Y.shape
    if d not in (2, 3):
        raise ValueError(f"animate draws tokens in d = 2 or 3; got d = {d}.")
    if draw not in ("hull", "levels", "none"):
        raise ValueError(f"draw must be 'hull', 'levels' or 'none'; got {draw!r}.")
    if frames < 2 or m < 2:
        raise ValueError(
            f"need at least 2 frames and 2 saved times; got frames = {frames}, {m} saves."
        )
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
    with matplotlib.rc_context({**STYLE, "savefig.bbox": None}):
        # a Figure of its own on an Agg canvas: no pyplot, so no backend to switch and
        # nothing registered with (or shown by) pyplot
        fig = Figure(figsize=(size, size), dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(111, projection="3d" if d == 3 else None)
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
        ax.set_xlabel(f"${label}_1$")
        ax.set_ylabel(f"${label}_2$")
        if d == 3:
            ax.set_zlim(lo[2], hi[2])
            ax.set_zlabel(f"${label}_3$")
            elev0, azim0 = 22.0, -60.0
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
            draw_hull(ax, Y[-1], facecolor="C3", edgecolor="C3", alpha=0.12, lw=0.4)
        polys = []

        def update(j):
            k = idx[j]
            k0 = max(0, k - trail)
            for i, ln in enumerate(trails):
                seg = Y[k0 : k + 1, i]
                if d == 2:
                    ln.set_data(seg[:, 0], seg[:, 1])
                else:
                    ln.set_data_3d(seg[:, 0], seg[:, 1], seg[:, 2])
            if d == 2:
                dots.set_data(Y[k, :, 0], Y[k, :, 1])
            else:
                dots.set_data_3d(Y[k, :, 0], Y[k, :, 1], Y[k, :, 2])
            if draw == "hull" and d == 2:
                hv = hull_vertices(Y[k])
                poly = Y[k][np.append(hv, hv[0])]
                lines2d[0].set_data(poly[:, 0], poly[:, 1])
            elif draw == "levels":
                p = Y[k] @ phi
                levels = (p.min(), 0.0, p.max())
                if d == 2:
                    for ln, c in zip(lines2d, levels):
                        sec = box_section(phi, c, lo, hi)
                        ln.set_data(*(([], []) if sec is None else (sec[:, 0], sec[:, 1])))
                else:
                    while polys:
                        polys.pop().remove()
                    for c in levels:
                        coll = draw_level(
                            ax, phi, c, lo, hi, facecolor="C3", edgecolor="C3", alpha=0.12, lw=0.4
                        )
                        if coll is not None:
                            polys.append(coll)
            if d == 3:
                s = j / max(len(idx) - 1, 1)
                ax.view_init(elev=elev0 + (elev1 - elev0) * s, azim=azim0 + (azim1 - azim0) * s)
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
    path,
    *,
    n: int = 20,
    seed: int = 0,
    t1: float | None = None,
    dt: float = 0.1,
    frames: int = 60,
    fps: int = 12,
    dpi: int = 90,
) -> dict:
    """Simulate a named case of ``MOVIE_CASES`` and write its GIF (``animate``).

    Returns ``animate``'s dict with the simulation parameters under ``"params"``."""
    if case not in MOVIE_CASES:
        raise ValueError(f"unknown case {case!r}; known: {', '.join(MOVIE_CASES)}.")
    c = MOVIE_CASES[case]
    t1 = c["t1"] if t1 is None else float(t1)
    traj, params = simulate_tokens(case_matrix(c), n=n, seed=seed, t1=t1, dt=dt, frame=c["frame"])
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
