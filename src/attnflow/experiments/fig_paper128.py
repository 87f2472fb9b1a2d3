"""Figure 7 -- the authors' 128-token, 128-dimension experiment (T = 15).

V = attnflow.matrices.paper_128(seed): symmetric, sparse random, every eigenvalue of
modulus <= 1 pushed to +-U(1, 2); spectrum in [-2.81, -1.01] and [1.00, 2.69] plus one
Perron eigenvalue 6.86 (seed 0). n = d = 128 tokens uniform in [-0.5, 0.5]^128, Q = K = I,
the discrete transformer (Euler, dt = 0.1, 150 layers; ``attnflow.plotting.simulate_tokens``,
not the authors' scheme), rescaled frame, float64 (float32 overflows). The coordinates
plotted are those of z_i along V's orthonormal eigenvectors, read from the solver's own
modal state (the rescaled frame is integrated in V's eigenbasis).

What it shows: the negative-eigenvalue coordinates diverge, the positive ones freeze at
their leader's value and the leading one converges to the two leaders' values -- the
opposite of the sign in the paper's text, whatever the scheme; projecting the
standard-basis traj.z onto the eigenvectors instead would swamp the positive coordinates
with the rounding of the diverging ones (panel d). Why, and the float64 ties past t ~ 7:
docs/figures.md, "The 128 x 128 experiment".

Panels: (a) mean +- std over tokens of representative coordinates (symlog), as the
authors plotted; (b) speed max_i |c_i(t + dt) - c_i(t)| / dt of every coordinate (log),
coloured by mu; (c) the leading coordinate of every token; (d) spread over tokens at T
against mu: modal state vs projection of traj.z. The runtime is printed and kept in the
runner's index (not in the figure or its sidecar: a rerun draws the same bytes).

Run:  python -m attnflow.experiments.fig_paper128 [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data: the mean and spread over tokens
of every coordinate, the leading coordinate of every token, the speeds); the numbers are
``compute``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_paper128"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 4, "full": 4}
SEED, T, DT, SCALE = 0, 15.0, 0.1, 0.5


def modal_coordinates(traj) -> tuple[np.ndarray, np.ndarray, str]:
    """``(c, mu, source)``: token coordinates ``(m, n, d)`` along V's eigenvectors, the
    eigenvalues ``mu`` (column order) and where they came from.

    The solver integrates the rescaled frame in V's real modal basis (``traj.coords ==
    "modal"``); that state is read directly (``traj.state``). Otherwise the
    coordinates are projected from ``traj.z``.
    """
    prop = traj.model.propagator
    mu = np.asarray(prop.mu_re, np.float64)
    if traj.coords == "modal" and traj.frame == "rescaled" and prop.method == "eigh":
        return np.asarray(traj.state, np.float64), mu, "solver modal state (traj.state)"
    T = np.asarray(prop.T, np.float64)
    return np.asarray(traj.z, np.float64) @ np.linalg.inv(T).T, mu, "projection of traj.z"


def compute(quick: bool) -> F.Data:
    """Run the experiment (printing its runtime); the modal coordinates' statistics."""
    H.setup()
    import attnflow.plotting as AP
    from attnflow.io.matrices import paper_128

    d = 32 if quick else 128
    V = paper_128(SEED, d=d)
    traj, params = AP.simulate_tokens(V, n=d, seed=SEED, t1=T, dt=DT, scale=SCALE)
    traj.raise_for_status()
    first = params["seconds"]
    # again, compiled: the run alone
    t0 = time.perf_counter()
    _again, _ = AP.simulate_tokens(V, n=d, seed=SEED, t1=T, dt=DT, scale=SCALE)
    np.asarray(_again.z)
    run_only = time.perf_counter() - t0
    del _again
    print(
        f"paper 128: n = d = {d}, {int(round(T / DT))} Euler layers, float64: "
        f"{first:.2f} s including JIT compilation, {run_only:.2f} s compiled run",
        flush=True,
    )

    c, mu, source = modal_coordinates(traj)
    ts = np.asarray(traj.ts)
    order = np.argsort(mu)
    c, mu = c[:, :, order], mu[order]
    lead = d - 1
    # (d) the same coordinates projected from the standard-basis z
    prop = traj.model.propagator
    Tm = np.asarray(prop.T, np.float64)[:, order]
    c_proj = np.asarray(traj.z, np.float64) @ Tm  # T orthogonal (V symmetric)
    std_T = c[-1].std(axis=0)
    std_T_proj = c_proj[-1].std(axis=0)
    speed = np.abs(np.diff(c, axis=0)).max(axis=1) / np.diff(ts)[:, None]  # (m-1, d)
    # attention: Boolean to leaders, then float64 ties
    picks = np.unique(np.rint(np.linspace(0, len(ts) - 1, 6 if quick else 16)).astype(int))
    rowmax_min, n_leaders = [], []
    for k in picks:
        P = np.asarray(traj.attention(int(k)))
        rowmax_min.append(float(P.max(axis=1).min()))
        n_leaders.append(int(len(np.unique(P.argmax(axis=1)))))
    boolean_at = [float(ts[k]) for k, r in zip(picks, rowmax_min) if r > 1 - 1e-12]
    leaders_final = np.unique(np.round(c[-1, :, lead], 9))
    neg = mu < 0
    pos = (mu > 0) & (np.arange(d) != lead)
    params.update(
        name="paper-128",
        V_eigenvalues=mu,
        seconds_first_call_with_compile=round(first, 3),
        seconds_compiled_run=round(run_only, 3),
        coordinates_from=source,
        std_over_tokens_at_T=std_T,
        std_over_tokens_at_T_projected_from_z=std_T_proj,
        negative_modes_std_at_T_range=[float(std_T[neg].min()), float(std_T[neg].max())],
        positive_modes_std_at_T_range=[float(std_T[pos].min()), float(std_T[pos].max())],
        positive_modes_final_speed_max=float(speed[-1, pos].max()),
        negative_modes_final_speed_min=float(speed[-1, neg].min()),
        leading_coordinate_final_values=leaders_final,
        attention_check={
            "t": ts[picks],
            "min_row_max": rowmax_min,
            "distinct_argmax": n_leaders,
            "boolean_at_t": boolean_at,
        },
        finding=(
            "negative-eigenvalue coordinates diverge, positive ones freeze at their "
            "leader's value, the leading one converges to the two leaders' values; "
            "the opposite of the sign in the paper's text. "
            "Projecting traj.z (standard basis) onto the eigenvectors swamps the "
            "positive coordinates with the rounding of the diverging ones."
        ),
    )

    params["V"] = V.tolist()
    side = H.sidecar(
        script="attnflow.experiments.fig_paper128",
        quick=quick,
        runs=[params],
        seeds=[SEED],
        seeds_note="V = paper_128(SEED, d); x0: numpy default_rng(SEED).uniform(-0.5, 0.5, (d, d))",
        V=f"attnflow.matrices.paper_128(seed={SEED}, d={d}); the matrix is runs[0].V",
        runtime_simulation_seconds={"first_call_with_compile": first, "compiled_run": run_only},
    )
    arrays = dict(
        ts=ts,
        mu=mu,
        # mean and std over tokens of every coordinate, the leading one of every token
        c_mean=np.stack([c[:, :, j].mean(axis=1) for j in range(d)], axis=1),
        c_std=np.stack([c[:, :, j].std(axis=1) for j in range(d)], axis=1),
        c_lead=c[:, :, lead],
        speed=speed,
        std_T=std_T,
        std_T_proj=std_T_proj,
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"runtime_seconds": first, "compiled_run_seconds": run_only},
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """The four panels, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    a = data.arrays
    ts, mu, speed, std_T, std_T_proj = (a[k] for k in ("ts", "mu", "speed", "std_T", "std_T_proj"))
    d = len(mu)
    lead = d - 1
    neg = mu < 0
    pos = (mu > 0) & (np.arange(d) != lead)
    leaders_final = data.sidecar["runs"][0]["leading_coordinate_final_values"]

    fig = plt.figure(figsize=(6.5, 4.9))
    cmap = plt.get_cmap("coolwarm")
    norm = Normalize(-mu[:-1].max(), mu[:-1].max())
    # (a) bands
    ax = fig.add_axes((0.08, 0.55, 0.38, 0.33))
    reps = [0, int(np.flatnonzero(neg)[-1]), int(np.flatnonzero(pos)[0]), lead - 1, lead]
    for j in reps:
        m, s = a["c_mean"][:, j], a["c_std"][:, j]
        col = "k" if j == lead else cmap(norm(mu[j]))
        ax.plot(ts, m, color=col, lw=1.0, label=rf"$\mu={mu[j]:.2f}$")
        ax.fill_between(ts, m - s, m + s, color=col, alpha=0.15, lw=0)
    ax.set_yscale("symlog", linthresh=1.0, linscale=2.0)
    ax.set_yticks([-1e20, -1e10, 0, 1e10, 1e20])
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_ylabel("coordinate along eigenvector\n(mean $\\pm$ std over tokens)")
    ax.legend(
        fontsize=5.5,
        ncol=2,
        loc="upper left",
        frameon=False,
        borderaxespad=0.1,
        handlelength=1.2,
        columnspacing=0.8,
    )
    ax.set_title("negative $\\mu$ diverge, positive freeze, leading converges", pad=3, fontsize=7)
    H.panel_label(ax, "a", x=-0.14)
    # (b) speed of every coordinate
    ax = fig.add_axes((0.58, 0.55, 0.34, 0.33))
    for j in range(d):
        col = "k" if j == lead else cmap(norm(mu[j]))
        ax.semilogy(ts[1:], speed[:, j], color=col, lw=0.5 if j != lead else 1.2, alpha=0.8)
    ax.set_ylim(max(speed[speed > 0].min(), 1e-18), speed.max() * 5)
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_ylabel(r"speed $\max_i|\Delta c_i|/\Delta t$")
    ax.set_title("every coordinate (black: leading)", pad=3, fontsize=7)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    cax = fig.add_axes((0.93, 0.55, 0.012, 0.33))
    cb = fig.colorbar(sm, cax=cax)
    cb.ax.set_title(r"$\mu$", fontsize=7, pad=2)
    H.part_of_panel(cax)  # the colour bar of (b)
    cb.ax.tick_params(labelsize=6)
    H.panel_label(ax, "b", x=-0.16)
    # (c) leading coordinate of every token
    ax = fig.add_axes((0.08, 0.08, 0.38, 0.33))
    ax.plot(ts, a["c_lead"], color="0.3", lw=0.4, alpha=0.7)
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_ylabel(rf"leading coordinate ($\mu={mu[lead]:.2f}$)")
    ax.set_title(
        f"converges to {len(leaders_final)} values (the two leaders')"
        if len(leaders_final) == 2
        else f"converges to {len(leaders_final)} values",
        pad=3,
        fontsize=7,
    )
    H.panel_label(ax, "c", x=-0.14)
    # (d) spread at T against mu
    ax = fig.add_axes((0.58, 0.08, 0.4, 0.33))
    ax.semilogy(
        mu,
        std_T_proj,
        "x",
        color="0.6",
        ms=3.5,
        mew=0.7,
        label="projecting traj.z (rounding artefact)",
    )
    ax.semilogy(mu, std_T, "o", color="C3", ms=2.5, label="solver's modal state (correct)")
    ax.set_xlabel(r"eigenvalue $\mu$", labelpad=1)
    ax.set_ylabel(f"std over tokens at $T={T:g}$")
    ax.legend(fontsize=5.5, loc="center right", frameon=False)
    ax.set_title("all coordinates at $T$", pad=3, fontsize=7)
    H.panel_label(ax, "d", x=-0.14)
    H.headline(
        fig,
        rf"The authors' $n=d={d}$ experiment ($T=15$): negative-$\mu$ "
        r"coordinates diverge, positive freeze, the leading one converges",
        rf"$V$ = paper_128(seed 0), $x_0$ uniform in $[-0.5,0.5]^{{{d}}}$, "
        rf"$Q=K=I$, Euler $dt=0.1$ (150 layers), float64",
        sub_y=0.953,
    )
    return {NAME: fig}


make = F.figure(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
