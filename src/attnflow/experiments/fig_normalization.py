"""Layer norm as speed regulation: how fast each placement contracts the tokens.

Karagodin, Ge, Polyanskiy and Rigollet (2025, "Normalization in attention dynamics") read
every placement of the layer norm as a speed on the post-LN flow of tokens on the sphere.
In the equiangular model (n = d orthogonal tokens, Q = K = V = I, beta = 1) the tokens stay
equiangular, <x_i, x_j> = gamma(t), and each placement reduces to a system of two numbers,
gamma and the stream norm r (``attnflow.analysis.equiangular_layernorm``). Near one cluster
1 - gamma decays like e^{-2t} (post), e^{-2 alpha t} (nGPT, alpha = 0.2), t^{-2} (pre, peri,
Mix-LN: the stream grows linearly and slows the tokens) and t^{-1} (LayerNorm scaling).

Set-up: n = d = 32, the sphere's layers of each placement (Euler layers, dt = 0.01, to
T = 40: 4,000 layers; quick: dt = 0.05 to T = 20), float64; the equiangular systems
integrated by scipy (DOP853, rtol 1e-12) at the same dt (LayerNorm scaling's depth is
t / dt) and the same Mix-LN switch (after a quarter of the layers).
Panels: (a) 1 - gamma against t (log scale), layers solid and the reduced systems dashed;
(b) the same against t on log-log axes with the closed-form power laws; table: the rate
fitted on the last quarter of each run against its closed form, and the time each
placement takes to reach 1 - gamma = 10^-2.

Run:  python -m attnflow.experiments.fig_normalization [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_normalization"
SECONDS = {"quick": 4, "full": 9}
N, BETA = 32, 1.0
PLACEMENTS = ("post", "ngpt", "peri", "pre", "mix", "scaled")
LABELS = {
    "post": "post-LN",
    "ngpt": "nGPT",
    "peri": "peri-LN",
    "pre": "pre-LN",
    "mix": "Mix-LN",
    "scaled": r"LN scaling $1/\sqrt{\ell}$",
}


def _setup(quick: bool) -> tuple[float, float]:
    """``(dt, T)``."""
    return (0.05, 20.0) if quick else (0.01, 40.0)


def _fit(ts: np.ndarray, gap: np.ndarray, kind: str, start: float) -> float:
    """The decay rate of ``gap`` on the last quarter of the run where it is resolved."""
    late = (ts >= 0.75 * ts[-1]) & (gap > 1e-11)
    if kind == "exp":
        resolved = (gap > 1e-11) & (ts > 0)
        if late.sum() < 3:  # post-LN reaches one cluster to rounding early: its tail
            late = resolved & (ts >= 0.5 * ts[resolved][-1])
        return float(-np.polyfit(ts[late], np.log(gap[late]), 1)[0])
    return float(-np.polyfit(np.log(ts[late] - start), np.log(gap[late]), 1)[0])


def _first_below(ts: np.ndarray, gap: np.ndarray, level: float) -> float | None:
    below = np.nonzero(gap <= level)[0]
    return float(ts[below[0]]) if below.size else None


def compute(quick: bool) -> F.Data:
    """The layers of every placement and their equiangular systems."""
    H.setup()
    import attnflow as af
    from attnflow.analysis import asymptotic_rate, equiangular_layernorm
    from attnflow.dynamics.frames import MIX_POST_FRACTION, mix_post_layers

    dt, T = _setup(quick)
    ts = np.round(np.arange(0.0, T + 1e-9, 0.25), 10)
    model = af.Attention(np.eye(N), np.eye(N), np.eye(N), beta=BETA)
    off = ~np.eye(N, dtype=bool)
    runs, arrays = [], {"ts": ts}
    for ln in PLACEMENTS:
        traj = af.simulate(
            model, np.eye(N), T, ts=ts, frame="sphere", method="euler", dt=dt, layernorm=ln
        )
        traj.raise_for_status()
        x = np.asarray(traj.x, np.float64)
        G = np.einsum("mid,mjd->mij", x, x)[:, off]
        gap = 1.0 - G.mean(axis=1)
        kw: dict = {}
        t_switch = 0.0
        if ln == "mix":
            t_switch = mix_post_layers(T, dt) * dt
            kw["t_switch"] = t_switch
        if ln == "scaled":
            kw["dt"] = dt
        ref = equiangular_layernorm(N, BETA, ts, ln, **kw)
        kind, rate = asymptotic_rate(ln)
        # pre-LN's stream starts from norm 1 at Mix-LN's switch: its power law is in
        # the time since (plus the 1 it starts from)
        start = t_switch - 1.0 if ln == "mix" else 0.0
        resolved = (ref.gamma < 1 - 1e-8) & (ts > 0)
        far = None  # the power laws far beyond the run, on the reduced system itself
        if kind == "power":
            t_far = np.array([1e4, 2e4, 4e4])
            g_far = equiangular_layernorm(N, BETA, t_far, ln, **kw).gap
            far = float(-np.polyfit(np.log(t_far - start), np.log(g_far), 1)[0])
        runs.append(
            dict(
                layernorm=ln,
                closed_form={"kind": kind, "rate": rate},
                fitted_rate=_fit(ts, gap, kind, start),
                reduced_rate_at_1e4=far,
                largest_spread_of_inner_products=float(np.max(np.ptp(G, axis=1))),
                largest_relative_gap_to_reduced_system=float(
                    np.max(np.abs(gap[resolved] / ref.gap[resolved] - 1))
                ),
                time_to_gap_1e_2=_first_below(ts, gap, 1e-2),
                gap_T=float(gap[-1]),
                stream_norm_T=float(ref.r[-1]),
            )
        )
        arrays[f"{ln}_gap"] = gap
        arrays[f"{ln}_ref"] = ref.gap
    side = H.sidecar(
        script=f"attnflow.experiments.{NAME}",
        quick=quick,
        n=N,
        d=N,
        beta=BETA,
        dt=dt,
        t1=T,
        layers=int(round(T / dt)),
        mix_post_fraction=MIX_POST_FRACTION,
        start="n = d pairwise orthogonal tokens (the identity matrix)",
        weights="Q = K = V = I",
        runs=runs,
        seeds=[],
        seeds_note="deterministic: n = d orthogonal tokens, no random draw",
    )
    result = {r["layernorm"]: r["fitted_rate"] for r in runs}
    return F.Data(sidecar=side, arrays=arrays, result={"fitted_rates": result})


def _table(data: F.Data) -> str:
    rows = [
        "| placement | closed form near one cluster | fitted (last quarter) | "
        "reduced system, t = 1e4 to 4e4 | t at 1 - gamma = 1e-2 | "
        "largest relative gap to the reduced system |",
        "|---|---|---|---|---|---|",
    ]
    for r in data.sidecar["runs"]:
        cf = r["closed_form"]
        law = f"e^(-{cf['rate']:g} t)" if cf["kind"] == "exp" else f"t^(-{cf['rate']:g})"
        t = r["time_to_gap_1e_2"]
        far = r["reduced_rate_at_1e4"]
        rows.append(
            f"| {r['layernorm']} | {law} | {r['fitted_rate']:.3f} | "
            f"{'-' if far is None else f'{far:.3f}'} | "
            f"{'-' if t is None else f'{t:g}'} | "
            f"{r['largest_relative_gap_to_reduced_system']:.2e} |"
        )
    s = data.sidecar
    return (
        f"# Layer-norm placements in the equiangular model (n = d = {s['n']}, "
        f"beta = {s['beta']:g}, dt = {s['dt']:g}, T = {s['t1']:g})\n\n" + "\n".join(rows) + "\n"
    )


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Two panels and the table, from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    a = data.arrays
    ts = a["ts"]
    s = ts > 0
    fig, axes = plt.subplots(1, 2, figsize=(6.5, 3.0))
    for k, r in enumerate(data.sidecar["runs"]):
        ln = r["layernorm"]
        color = f"C{k}"
        for ax in axes:
            # post-LN and Mix-LN coincide up to the switch: post drawn wide beneath
            wide = ln == "post"
            ax.plot(
                ts[s],
                a[f"{ln}_gap"][s],
                color=color,
                lw=3.0 if wide else 1.4,
                alpha=0.55 if wide else 1.0,
                label=LABELS[ln],
            )
            ax.plot(ts[s], a[f"{ln}_ref"][s], color="k", lw=0.6, ls="--")
    ax = axes[0]
    ax.set_yscale("log")
    ax.set_ylim(1e-12, 1.5)
    ax.set_xlabel("$t$ (layers $\\times\\, dt$)", labelpad=1)
    ax.set_ylabel(r"$1-\gamma$", labelpad=1)
    ax.set_title("exponential: post-LN, nGPT", pad=3)
    H.panel_label(ax, "a")
    ax = axes[1]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, 1.5)
    t_ref = ts[ts >= 4]
    for p, y0, lab in ((2, 0.3, r"$t^{-2}$"), (1, 4.0, r"$t^{-1}$")):
        ax.plot(t_ref, y0 * (t_ref / t_ref[0]) ** -p / t_ref[0] ** 0, "k:", lw=0.8)
        ax.text(t_ref[-1], y0 * (t_ref[-1] / t_ref[0]) ** -p, lab, fontsize=7, va="bottom")
    ax.set_xlabel("$t$", labelpad=1)
    ax.set_title("power laws: the stream grows", pad=3)
    H.panel_label(ax, "b")
    # below both panels, off the data: the placements are the same in both
    fig.legend(
        *ax.get_legend_handles_labels(),
        fontsize=6,
        loc="lower center",
        frameon=False,
        ncol=6,
        bbox_to_anchor=(0.5, 0.0),
    )
    sd = data.sidecar
    H.headline(
        fig,
        r"layer norm as speed: $1-\gamma$ of $n=d=32$ equiangular tokens, $Q=K=V=I$, $\beta=1$",
        rf"solid: Euler layers ($dt={sd['dt']:g}$); dashed: the reduced system of each "
        rf"placement (scipy)",
        sub_y=0.925,
    )
    fig.subplots_adjust(left=0.09, right=0.94, bottom=0.25, top=0.8, wspace=0.28)
    return {NAME: fig, f"{NAME}.md": _table(data)}


make = F.figure(NAME, compute, draw, tight=False)

if __name__ == "__main__":
    H.main(make, __doc__)
