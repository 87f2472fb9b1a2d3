"""Dynamic metastability on the sphere: plateaus of the cluster count and of the energy.

Geshkovski, Koubbi, Polyanskiy and Rigollet (2024): from generic starts at large beta
the tokens form a few clusters quickly (time ~ beta) and these persist for times
exponentially long in beta before they merge; the rescaled energy follows a staircase.

Set-up: n = 32 tokens on the circle (d = 2), Q = K = V = I, SA (softmax) on the sphere,
the adaptive solver (Tsit5, rtol 1e-8) to t = 1e5 (quick: 1e3), saved on a log grid.
Starts: (a) uniform random (4 systems), (b) four well-separated groups of 8 tokens at
angles 0, 1.4, 3.0 and 4.5 rad (jitter 0.02 rad). Measured: the cluster count
(``count_clusters``, threshold 0.9999) and ``2 beta E_beta / e^beta``
(``interaction_energy``; ``1/k`` for k tight, well-separated, equal clusters) against
log t; the plateaus (maximal runs of saves with a constant count) and the adaptive
solver's step count, against the ``t / dt`` layers fixed steps of dt = 0.1 would need.

Run:  python -m attnflow.experiments.fig_metastability [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_metastability"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 9, "full": 31}
SEED, N, D, THRESHOLD, RTOL, ATOL = 0, 32, 2, 0.9999, 1e-8, 1e-10
GROUP_ANGLES = (0.0, 1.4, 3.0, 4.5)


def plateaus(ts: np.ndarray, counts: np.ndarray) -> list[dict]:
    """Maximal runs of saves with the same cluster count: ``{"clusters", "t_start",
    "t_end"}`` (``t_end`` the last save of the run)."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        out.append({"clusters": int(counts[i]), "t_start": float(ts[i]), "t_end": float(ts[j])})
        i = j + 1
    return out


def grouped_start(rng: np.random.Generator) -> np.ndarray:
    """Four groups of N / 4 tokens at ``GROUP_ANGLES``, jitter 0.02 rad."""
    ang = np.repeat(np.asarray(GROUP_ANGLES), N // len(GROUP_ANGLES))
    ang = ang + 0.02 * rng.standard_normal(ang.size)
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1)


def compute(quick: bool) -> F.Data:
    """Run every beta and start to ``t1`` (adaptive); the cluster counts and energies.

    Args:
        quick: the small version (beta = 9, t to 50, two random starts, 20 saves).

    Returns:
        the sidecar (every run's counts, energies rounded to 6 digits, plateaus, step
        counts) and, for ``draw``, the save times ``ts`` and per run ``i`` (the sidecar's
        ``runs[i]``) ``r{i}_counts`` and the unrounded ``r{i}_energy``, ``(systems, saves)``.
    """
    H.setup()
    import attnflow as af

    betas = (9.0,) if quick else (9.0, 12.0)
    t1 = 50.0 if quick else 1e5
    ts = np.concatenate([[0.0], np.logspace(-1, math.log10(t1), 20 if quick else 140)])
    rng = np.random.default_rng(SEED)
    starts = {
        "random": rng.standard_normal((2 if quick else 4, N, D)),
        "separated": grouped_start(rng)[None],
    }
    runs, arrays = [], {"ts": ts}
    I = np.eye(D)
    for beta in betas:
        model = af.Attention(I, I, I, beta=beta)
        for kind, x0 in starts.items():
            traj = af.simulate(model, x0, t1, ts=ts, frame="sphere", rtol=RTOL, atol=ATOL)
            counts = af.count_clusters(traj, threshold=THRESHOLD)  # (b, m)
            energy = 2 * beta * af.interaction_energy(traj, beta) / math.exp(beta)
            steps = np.asarray(traj.stats["num_steps"]).tolist()
            arrays[f"r{len(runs)}_counts"] = counts
            arrays[f"r{len(runs)}_energy"] = energy
            runs.append(
                dict(
                    name=f"beta={beta:g}, {kind}",
                    seed=SEED,
                    n=N,
                    d=D,
                    t1=t1,
                    Q="identity",
                    K="identity",
                    V="identity",
                    beta=beta,
                    start=kind,
                    solver=traj.solver,
                    tolerances={"rtol": RTOL, "atol": ATOL},
                    status=str(traj.status),
                    ts=ts,
                    clusters=counts,
                    energy_2beta_over_ebeta=energy.round(6),
                    plateaus=[plateaus(ts, c) for c in counts],
                    adaptive_steps=steps,
                    fixed_layers_needed_at_dt_0_1=int(round(t1 / 0.1)),
                )
            )
    side = H.sidecar(
        script="attnflow.experiments.fig_metastability",
        quick=quick,
        runs=runs,
        seeds=[SEED],
        seeds_note=(
            "one numpy default_rng(SEED) stream draws, in order, the random starts and the "
            "jitter of the grouped start"
        ),
        theorem="[S] metastability: clusters persist for times exponentially long in beta.",
    )
    final = {r["name"]: r["clusters"][..., -1] for r in runs}
    return F.Data(sidecar=side, arrays=arrays, result={"final_clusters": final})


def draw(data: F.Data) -> dict[str, Figure]:
    """The staircases of the cluster count and of the energy, one column per beta, from
    ``compute``'s data (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    a, runs = data.arrays, data.sidecar["runs"]
    ts = a["ts"]
    betas = list(dict.fromkeys(r["beta"] for r in runs))
    fig, axes = plt.subplots(2, len(betas), figsize=(6.5, 3.8), squeeze=False, sharex=True)
    for col, beta in enumerate(betas):
        ax_c, ax_e = axes[0, col], axes[1, col]
        for i, run in enumerate(runs):
            if run["beta"] != beta:
                continue
            kind, counts, energy = run["start"], a[f"r{i}_counts"], a[f"r{i}_energy"]
            style = "-" if kind == "random" else "--"
            for s in range(counts.shape[0]):
                colour = f"C{s}" if kind == "random" else "k"
                ax_c.semilogx(
                    ts[1:], counts[s, 1:], style, color=colour, lw=0.9, drawstyle="steps-post"
                )
                ax_e.semilogx(ts[1:], energy[s, 1:], style, color=colour, lw=0.9)
        ax_c.set_title(f"beta = {beta:g} (solid: random, dashed: 4 groups)", pad=3)
        ax_c.set_ylabel("clusters")
        ax_c.set_yscale("log", base=2)
        ax_e.set_ylabel(r"$2\beta E_\beta / e^\beta$")
        ax_e.set_xlabel("$t$")
        for k in (1, 2, 3, 4):
            ax_e.axhline(1 / k, color="0.7", lw=0.5, ls=":")
    H.headline(
        fig,
        "Metastability: clusters form fast, then merge after exponentially long plateaus",
        f"n = {N}, d = {D}, Q = K = V = I, SA on the sphere, adaptive (Tsit5, rtol {RTOL:g}), "
        f"threshold {THRESHOLD}",
        sub_y=0.94,
    )
    fig.subplots_adjust(top=0.85, bottom=0.1, left=0.09, right=0.98, hspace=0.25, wspace=0.25)
    H.panel_letters(axes.ravel())
    return {NAME: fig}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
