"""Does the spectral classification survive real layer normalisation?

The four regimes' value matrices and the paper's ones (``attnflow.matrices``), Q = K = I,
n = 20 tokens uniform in [-5, 5]^d, under five normalisations side by side:

``rescaled``  z = e^{-tV} x, adaptive (the theory's frame): ``observe_limit``'s label.
``sphere``    SA on the sphere, dx_i/dt = Proj_{x_i}(sum_j P_ij V x_j), adaptive.
``post``      post-LN layers x <- N(x + dt F(x)), dt = 0.1.
``pre``       pre-LN layers y <- y + dt F(N(y)) (tokens N(y)).
``peri``      peri-LN layers y <- y + dt N(F(N(y))) (tokens N(y)).

For the sphere modes the classification vocabulary (polytope, hyperplanes, subspace,
origin) does not apply: those are statements about the rescaled frame (boundaries of
hulls, levels of a linear functional, the origin) and a normalised token has norm 1, so
"origin" cannot happen and a hull boundary is not a sphere notion. Reported instead: the
number of clusters (``count_clusters``, threshold 0.999) at the end, its median over the
systems, the clustered-pair fraction, and whether the count still changed over the last
fifth of the run.

Writes fig_sphere_regimes.{png,pdf} (the table as a figure), fig_sphere_regimes.md
(the same table in markdown, written again by ``--redraw``) and the sidecar.

Run:  python -m attnflow.experiments.fig_sphere_regimes [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_sphere_regimes"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 14, "full": 43}
SEED, N, DT, THRESHOLD = 0, 20, 0.1, 0.999
CASES = (
    ("identity", 2),
    ("paper-2d", 2),
    ("paranormal", 3),
    ("neg-identity", 2),
    ("paper-3d-re-neg", 3),
    ("paper-3d-re-pos", 3),
    ("paper-codim", 3),
)
MODES = ("rescaled", "sphere", "post", "pre", "peri")


def _majority(labels: list[str]) -> str:
    vals, counts = np.unique(np.asarray(labels), return_counts=True)
    return str(vals[np.argmax(counts)])


HEADER = ["V", "predicted", "rescaled (observed)", "sphere SA", "post-LN", "pre-LN", "peri-LN"]


def _setup(quick: bool) -> tuple[tuple[tuple[str, int], ...], float, int]:
    """``(cases, t1, systems)`` of a run."""
    return (CASES[:2], 2.0, 2) if quick else (CASES, 12.0, 16)


def compute(quick: bool) -> F.Data:
    """Run every case in every mode.

    Args:
        quick: the small version (the first two cases, T = 2, 2 systems).

    Returns:
        the sidecar: one run per case and ``table``, one row per case with a cell per
        mode (the label of ``observe_limit`` for ``rescaled``; cluster counts, clustered
        fraction and whether the count settled for the sphere modes). No arrays: the
        figure is the table.
    """
    H.setup()
    import attnflow as af

    cases, t1, systems = _setup(quick)
    ts = np.linspace(0.0, t1, 11)
    rng = np.random.default_rng(SEED)
    runs, table = [], []
    for name, d in cases:
        V = af.matrices.named(name, d)
        I = np.eye(d)
        model = af.Attention(I, I, V)
        predicted = str(af.predict_regime(model).label)
        x0 = rng.uniform(-5, 5, (systems, N, d))
        row = {"V": name, "d": d, "predicted": predicted}
        for mode in MODES:
            if mode == "rescaled":
                # standard coordinates (expm): the modal conversion of a batch does not
                # broadcast on this main (Propagator.modal_scale), see docs/sphere.md
                std = af.Attention(I, I, V, propagator="expm")
                traj = af.simulate(std, x0, t1, ts=ts)
                labels = [str(af.observe_limit(traj, system=s).label) for s in range(systems)]
                cell = {"label": _majority(labels), "labels": labels, "status": str(traj.status)}
            else:
                kw = {} if mode == "sphere" else {"method": "euler", "dt": DT, "layernorm": mode}
                traj = af.simulate(model, x0, t1, ts=ts, frame="sphere", **kw)
                counts = af.count_clusters(traj, threshold=THRESHOLD)
                frac = af.clustered_fraction(traj, threshold=THRESHOLD)
                settled = counts[:, -1] == counts[:, -3]
                cell = {
                    "clusters": counts[:, -1].tolist(),
                    "clusters_median": float(np.median(counts[:, -1])),
                    "clustered_fraction_mean": round(float(frac[:, -1].mean()), 4),
                    "settled_fraction": round(float(settled.mean()), 3),
                    "status": str(traj.status),
                }
            row[mode] = cell
        table.append(row)
        runs.append(
            dict(
                name=name,
                seed=SEED,
                n=N,
                d=d,
                t1=t1,
                Q="identity",
                K="identity",
                V=V,
                solver={"adaptive": "Tsit5 (rescaled, sphere)", "layers": {"dt": DT}},
                tolerances={"rtol": 1e-6, "atol": 1e-9},
                systems=systems,
                row=row,
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_sphere_regimes",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note="one numpy default_rng(SEED) stream draws the starts of every case in order",
        table=table,
    )
    return F.Data(sidecar=side, result={"table": table})


def cells(table: list[dict]) -> list[list[str]]:
    """The text of the table's body, one line per case (below ``HEADER``)."""
    out = []
    for row in table:
        line = [f"{row['V']} (d={row['d']})", row["predicted"], row["rescaled"]["label"]]
        for mode in MODES[1:]:
            c = row[mode]
            line.append(f"{c['clusters_median']:g} cl., frac {c['clustered_fraction_mean']:.2f}")
        out.append(line)
    return out


def draw(data: F.Data) -> dict[str, Figure]:
    """The table as a figure, from ``compute``'s data (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    _, t1, systems = _setup(data.quick)
    body = cells(data.sidecar["table"])
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.28 * len(body)))
    ax.axis("off")
    tab = ax.table(cellText=body, colLabels=HEADER, loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(6)
    tab.auto_set_column_width(col=list(range(len(HEADER))))  # every cell's text fits
    tab.scale(1, 1.3)
    ax.set_title(
        f"Limit geometries side by side (n = {N}, Q = K = I, T = {t1:g}, {systems} systems; "
        "sphere modes: median cluster count, mean clustered fraction)",
        fontsize=7,
    )
    return {NAME: fig}


class _WithMarkdown(F.FigureScript):
    """Also writes the table as markdown, ``NAME.md``, listed after the PNG and PDF."""

    def _draw(self, data: F.Data, out: Path) -> list[Path]:
        figures = super()._draw(data, out)
        md = out / f"{NAME}.md"
        from attnflow.io.files import write_text

        write_text(md, H.markdown_table(HEADER, cells(data.sidecar["table"])) + "\n")
        return [*figures, md]


make = _WithMarkdown(NAME, compute, draw, rc=H.small_text(7), tight=True)

if __name__ == "__main__":
    H.main(make, __doc__)
