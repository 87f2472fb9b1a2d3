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

Run:  python -m attnflow.experiments.fig_sphere_regimes [--quick] [--out figures]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from attnflow.experiments import _plotting as H

NAME = "fig_sphere_regimes"
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


@H.styled(H.small_text(7))
def make(out_dir: Path, quick: bool = False) -> dict:
    """Run every case in every mode, draw the table and write the sidecar (+ markdown)."""
    plt = H.setup()
    import attnflow as af

    t_start = time.perf_counter()
    cases = CASES[:2] if quick else CASES
    t1, systems = (2.0, 2) if quick else (12.0, 16)
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

    # the table as a figure
    header = ["V", "predicted", "rescaled (observed)", "sphere SA", "post-LN", "pre-LN", "peri-LN"]
    cells = []
    for row in table:
        line = [f"{row['V']} (d={row['d']})", row["predicted"], row["rescaled"]["label"]]
        for mode in MODES[1:]:
            c = row[mode]
            line.append(f"{c['clusters_median']:g} cl., frac {c['clustered_fraction_mean']:.2f}")
        cells.append(line)
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.28 * len(cells)))
    ax.axis("off")
    tab = ax.table(cellText=cells, colLabels=header, loc="center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(6)
    tab.scale(1, 1.3)
    ax.set_title(
        f"Limit geometries side by side (n = {N}, Q = K = I, T = {t1:g}, {systems} systems; "
        "sphere modes: median cluster count, mean clustered fraction)",
        fontsize=7,
    )
    figures = H.save(fig, out_dir, NAME, quick, tight=True)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(line) + " |" for line in cells]
    md_path = Path(out_dir) / f"{NAME}.md"
    md_path.write_text("\n".join(md) + "\n")
    out = H.finish(
        out_dir,
        NAME,
        script="attnflow.experiments.fig_sphere_regimes",
        quick=quick,
        runs=runs,
        figures=[*figures, md_path],
        t_start=t_start,
        table=table,
    )
    return {**out, "table": table}


if __name__ == "__main__":
    H.main(make, __doc__)
