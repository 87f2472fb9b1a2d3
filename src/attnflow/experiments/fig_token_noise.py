"""Independent noise on every token: the uniform state's critical noise, and hysteresis.

Tokens on the circle (``Attention(I, I, I, beta)`` in ``d = 2``, softmax), each
with its own Brownian motion of diffusion ``D`` (``attnflow.dynamics.TokenNoise``; the
post-layer-norm layers ``x_i <- N(x_i + dt F_i + sqrt(2 D) dW_i)``). The mean field
linearised about the uniform state loses stability below
``D_c = I_1(beta) / (beta I_0(beta))`` (``attnflow.predict_noise_threshold``); the
transition is continuous for ``beta <= beta_* = 2.447`` and discontinuous above (Mun and
Rosenzweig, 2026). Two panels, ``beta = 1`` and ``beta = 6``: the order parameter
``r = |mean_i e^{i theta_i}|`` at the end of the run (averaged over its last quarter)
against ``D / D_c``, from a uniform start and from one cluster, every point the mean over
seeds with the spread across them, beside the mean-field equation with its Laplacian
(``CircleMeanField(beta, diffusion=D)``) from the same two kinds of start. Continuous
side: both starts meet on one curve that leaves 0 at ``D_c``. Discontinuous side: a
window above ``D_c`` where the cluster survives and the uniform state does too
(hysteresis).

What it does not show: finite ``n`` (1,024 tokens: a uniform state has ``r ~ n^{-1/2}``)
and finite time (``25 / D_c`` time units) blur both the threshold and the edge of the
hysteresis window.

Run:  python -m attnflow.experiments.fig_token_noise [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_token_noise"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 40, "full": 300}
# left out of a full ``attnflow figures`` run (run it with --only token_noise)
LONG = "five minutes of noisy runs of 1,024 tokens"
SEED = 0
BETAS = (1.0, 6.0)
STARTS = ("uniform", "cluster")
CLUSTER_WIDTH = 0.05  # the angles of the clustered start: N(0, CLUSTER_WIDTH^2)
PDE_KAPPA = 20.0  # the mean field's clustered start: rho0 ~ e^{kappa cos theta} ...
PDE_FLOOR = 0.01  # ... over this share of the uniform density


def _von_mises(theta: np.ndarray) -> np.ndarray:
    """The von Mises density of concentration ``PDE_KAPPA`` about 0."""
    from scipy.special import i0e

    return np.exp(PDE_KAPPA * (np.cos(theta) - 1.0)) / (2 * np.pi * i0e(PDE_KAPPA))


def _starts(n: int, seeds: int, rng: np.random.Generator) -> np.ndarray:
    """``(2 seeds, n, 2)``: ``seeds`` uniform starts, then ``seeds`` clustered ones."""
    uniform = rng.uniform(0.0, 2 * np.pi, (seeds, n))
    cluster = rng.normal(0.0, CLUSTER_WIDTH, (seeds, n))
    theta = np.concatenate([uniform, cluster])
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def _moments(x: np.ndarray) -> np.ndarray:
    """``|c_k|`` for ``k = 0, 1, 2`` of every system and save: ``(b, m, 3)`` from tokens
    ``(b, m, n, 2)`` on the circle (``attnflow.analysis.fourier_modes`` of their angles)."""
    from attnflow.analysis import fourier_modes

    return np.stack([np.abs(fourier_modes(np.arctan2(s[..., 1], s[..., 0]), 2)) for s in x])


def _mean_field(af, beta, D_c, ratios, ts, n, quick) -> dict:
    """``r = |c_1|`` of the mean-field density with the Laplacian (``CircleMeanField(beta,
    diffusion=D)``) averaged over the saves ``ts``, from the uniform density with a first
    mode of the particles' size ``sqrt(pi / 4 n)``, and from a von Mises cluster of
    concentration ``PDE_KAPPA`` over a uniform floor ``PDE_FLOOR`` (the square-root scheme
    needs the density away from 0), for every ``D = ratio D_c``."""
    eps = float(np.sqrt(np.pi / (4 * n)))
    out: dict = {start: [] for start in STARTS}
    out["status"] = []
    modes = 16 if quick else 32
    saves = np.concatenate([[0.0], ts])
    for ratio in ratios:
        model = af.CircleMeanField(beta, modes=modes, diffusion=ratio * D_c)
        starts = (
            lambda th: 1.0 + 2.0 * eps * np.cos(th),
            lambda th: (1 - PDE_FLOOR) * _von_mises(th) + PDE_FLOOR / (2 * np.pi),
        )
        for start, rho0 in zip(STARTS, starts, strict=True):
            sol = af.solve_density(model, rho0, float(ts[-1]), ts=saves)
            out[start].append(float(np.abs(sol.coefficients(kmax=1)[1:, 1]).mean()))
            out["status"].append(sol.status)
    return out


def compute(quick: bool) -> F.Data:
    """Simulate the noisy tokens at each ``D / D_c`` from both starts.

    Args:
        quick: 2 seeds, 4 ratios, a shorter run (full: 4 seeds, 9 ratios); 1,024 tokens,
            which the engine runs with the exact O(n K) circle field.

    Returns:
        the sidecar (per beta: ``D_c``, ``beta_*``, the ratios, and per start the mean,
        standard deviation, minimum and maximum of ``r`` over the seeds) and, for
        ``draw``, the same as arrays.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.dynamics import TokenNoise

    n, seeds = (1024, 2) if quick else (1024, 4)
    ratios = (0.6, 0.9, 1.1, 1.4) if quick else (0.5, 0.7, 0.85, 0.95, 1.05, 1.15, 1.3, 1.5, 1.8)
    horizon = 10.0 if quick else 25.0  # in units of 1 / D_c
    dt = 0.1
    rng = np.random.default_rng(SEED)
    x0 = _starts(n, seeds, rng)
    arrays: dict[str, np.ndarray] = {"ratios": np.asarray(ratios)}
    per_beta = []
    noise_seeds = []
    for b, beta in enumerate(BETAS):
        pred = af.predict_noise_threshold(beta, d=2)
        t1 = float(np.ceil(horizon / pred.noise / dt) * dt)
        ts = np.linspace(0.75 * t1, t1, 6)
        ts = np.round(ts / dt) * dt
        I2 = np.eye(2)
        model = af.Attention(I2, I2, I2, beta=beta)  # the circle field serves it
        r = np.zeros((len(ratios), 2 * seeds))
        r2 = np.zeros_like(r)
        field: dict = {}
        for j, ratio in enumerate(ratios):
            seed = SEED + 100 * b + j
            noise_seeds.append(seed)
            traj = af.simulate(
                model,
                x0,
                t1,
                ts=ts,
                frame="sphere",
                method="euler",
                dt=dt,
                noise=TokenNoise(ratio * pred.noise, seed=seed),
            )
            traj.raise_for_status()
            field = traj.solver["field"]
            x = np.asarray(traj.x)  # (2 seeds, m, n, 2)
            moments = _moments(x)
            r[j] = moments[..., 1].mean(axis=1)
            r2[j] = moments[..., 2].mean(axis=1)
        arrays[f"b{b}_r"] = r
        arrays[f"b{b}_r2"] = r2
        starts = {}
        for s, start in enumerate(STARTS):
            block = r[:, s * seeds : (s + 1) * seeds]
            starts[start] = dict(
                mean=block.mean(axis=1).tolist(),
                std=block.std(axis=1, ddof=1).tolist(),
                min=block.min(axis=1).tolist(),
                max=block.max(axis=1).tolist(),
                r2_mean=r2[:, s * seeds : (s + 1) * seeds].mean(axis=1).tolist(),
            )
        pde = _mean_field(af, beta, pred.noise, ratios, ts, n, quick)
        arrays[f"b{b}_pde"] = np.array([pde[start] for start in STARTS])
        gap = np.asarray(starts["cluster"]["mean"]) - np.asarray(starts["uniform"]["mean"])
        per_beta.append(
            dict(
                beta=beta,
                D_c=pred.noise,
                beta_star=pred.beta_star,
                continuous=pred.continuous,
                t1=t1,
                field=field,
                ratios=list(ratios),
                starts=starts,
                hysteresis_gap=gap.tolist(),
                uniform_floor=float(np.sqrt(np.pi / (4 * n))),
                mean_field={start: pde[start] for start in STARTS},
                mean_field_status=pde["status"],
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_token_noise",
        quick=quick,
        runs=[],
        seed=SEED,
        seeds=noise_seeds,
        seeds_note=(
            f"starts from numpy's default_rng({SEED}) ({seeds} uniform and {seeds} clustered "
            "per cell); TokenNoise seeds per (beta, ratio), system i of a batch on key "
            "fold_in(PRNGKey(seed), i)"
        ),
        n=n,
        d=2,
        Q="identity",
        K="identity",
        V="identity",
        kernel="softmax",
        solver=dict(method="euler", layernorm="post", dt=dt),
        systems_per_cell=2 * seeds,
        cluster_width=CLUSTER_WIDTH,
        order_parameter="|mean_i e^{i theta_i}|, averaged over the last quarter of the run",
        betas=per_beta,
        theorem=(
            "uniform state linearly stable iff D > D_c = I_1(beta)/(beta I_0(beta)) (d = 2); "
            "continuous for beta <= beta_* = 2.447, discontinuous above (Mun and "
            "Rosenzweig 2026, arXiv 2606.05140)"
        ),
    )
    result = {
        f"beta={p['beta']:g}": {
            "D_c": p["D_c"],
            "max_gap": max(p["hysteresis_gap"]),
        }
        for p in per_beta
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Two panels (``r`` against ``D / D_c`` for each beta) and a Markdown table.

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    ratios = a["ratios"]
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.0), layout="constrained", sharey=True)
    rows = []
    for b, (ax, p) in enumerate(zip(axes, s["betas"], strict=True)):
        side = "continuous" if p["continuous"] else "discontinuous"
        for k, start in enumerate(STARTS):
            st = p["starts"][start]
            ax.errorbar(
                ratios,
                st["mean"],
                yerr=st["std"],
                fmt="o-" if start == "uniform" else "s--",
                color=f"C{k}",
                ms=3.5,
                lw=1,
                capsize=2,
                label=f"{start} start",
            )
            for j, ratio in enumerate(ratios):
                rows.append(
                    [
                        f"{p['beta']:g}",
                        start,
                        f"{ratio:.2f}",
                        f"{st['mean'][j]:.3f}",
                        f"{st['std'][j]:.3f}",
                        f"{st['min'][j]:.3f} - {st['max'][j]:.3f}",
                        f"{p['mean_field'][start][j]:.3f}",
                    ]
                )
        pde = a[f"b{b}_pde"]
        for k, start in enumerate(STARTS):
            ax.plot(
                ratios,
                pde[k],
                "-" if start == "uniform" else "--",
                color="k",
                lw=0.8,
                label=f"mean field, {start} start",
            )
        ax.axvline(1.0, color="0.4", lw=0.8, ls=":")
        ax.axhline(p["uniform_floor"], color="0.7", lw=0.8, ls="-.")
        ax.set_xlabel(r"$D / D_c$")
        ax.set_title(rf"$\beta$ = {p['beta']:g} ({side}; $D_c$ = {p['D_c']:.3f})")
        H.panel_label(ax, "ab"[b])
    axes[0].set_ylabel(r"$r = |\langle e^{i\theta} \rangle|$")
    # below the panels: the curves fill them
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4, frameon=False
    )
    header = ["beta", "start", "D / D_c", "mean r", "sd", "range", "mean field"]
    table = H.markdown_table(header, rows)
    return {NAME: fig, NAME + ".md": table}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
