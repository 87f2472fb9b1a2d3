# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A phase diagram on the sphere
#
# With layer normalisation the tokens live on the unit sphere $S^{d-1}$. The authors'
# phase-diagram scheme is the post-LN layer
#
# $$
# x_i \leftarrow \frac{x_i + \Delta t \sum_j P_{ij} V x_j}
# {\big\lVert x_i + \Delta t \sum_j P_{ij} V x_j \big\rVert},
# \qquad P_{ij} = \frac{e^{\beta \langle Q x_i, K x_j\rangle}}
# {\sum_k e^{\beta \langle Q x_i, K x_k\rangle}},
# $$
#
# here with $Q = K = V = I$, $n = 16$ tokens uniform on the sphere and $\Delta t = 0.1$.
# `attnflow.studies.sphere.phase_diagram` runs every $\beta$ and every random start in
# one compiled call and records, every five layers, the fraction of ordered pairs
# $i \ne j$ with $\langle x_i, x_j\rangle > 0.999$. A small version of the gallery's
# figure: 36 values of $\beta$, 64 starts each, to $t = 30$, in $d = 2$ and $d = 32$.

# %%
import jax

jax.config.update("jax_enable_x64", True)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow import plotting as afp  # noqa: E402
from attnflow.studies.sphere import phase_diagram  # noqa: E402

n = 16
betas = np.linspace(0.25, 9.0, 36)
diagrams = {
    d: phase_diagram(
        betas, n=n, d=d, systems=64, t1=30.0, dt=0.1, save_every=5, dtype=np.float32, seed=0
    )
    for d in (2, 32)
}
for d, pd in diagrams.items():
    final = pd.fraction[:, -1]
    half = betas[np.argmax(final < 0.5)]
    print(
        f"d = {d:2d}: {pd.fraction.shape[1]} saved times; at t = {pd.ts[-1]:g} the "
        f"clustered fraction falls below 1/2 first at beta = {half:.2f}"
    )

# %% [markdown]
# At $t = 30$ the clustered fraction falls below one half first at $\beta = 4.50$ in
# $d = 2$ and at $\beta = 6.50$ in $d = 32$. In high dimension the boundary is sharp and
# follows the equiangular curve: $n \le d$ tokens that start pairwise orthogonal keep
# a common inner product $\gamma(t)$, and `attnflow.equiangular_time` gives the time it
# takes to reach $0.999$. It bends where $e^\beta$ overtakes $n$, at $\beta = \log n$:
# below, the time to cluster barely depends on $\beta$; above, it grows like $e^\beta$.

# %%
curve = np.array([af.equiangular_time(n, b) for b in betas])
print(
    f"log n = {np.log(n):.3f}; t* at beta = 1, log n, 6: "
    f"{af.equiangular_time(n, 1.0):.2f}, {af.equiangular_time(n, np.log(n)):.2f}, "
    f"{af.equiangular_time(n, 6.0):.2f}"
)

# %% tags=["figure"]
with afp.use_style():
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0), layout="constrained", sharey=True)
    for ax, (d, pd) in zip(axes, diagrams.items()):
        im = ax.pcolormesh(
            betas,
            pd.ts,
            pd.fraction.T,
            vmin=0,
            vmax=1,
            cmap="viridis",
            shading="nearest",
            rasterized=True,
        )
        if d >= n:  # n tokens can start pairwise orthogonal only when n <= d
            ax.plot(betas, curve, color="w", lw=1.0, ls="--", label=r"equiangular $t^*(\beta)$")
        ax.axvline(np.log(n), color="w", lw=0.6, ls=":")
        ax.set_ylim(0, pd.ts[-1])
        ax.set_xlabel(r"$\beta$")
        ax.set_title(f"$d = {d}$, $n = {n}$")
    axes[0].set_ylabel("$t$")
    axes[1].legend(loc="upper left", frameon=False, labelcolor="w")
    fig.colorbar(im, ax=axes, label="clustered pairs")
