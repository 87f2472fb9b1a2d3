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
# # The mean field against particles
#
# As $n \to \infty$ the tokens $\dot x_i = \sum_j P_{ij} V x_j$ follow the mean-field
# equation: each point $x$ moves with the velocity $V\, \mathbb{E}_{y \sim \mu_x}[y]$,
# where $\mu_x(dy) \propto e^{\beta x^\top Q^\top K y} \mu(dy)$ is the law of the tokens
# tilted by the attention logits. For a Gaussian $\mu = N(m, S)$ the tilted law is the
# Gaussian $N(m + \beta S K^\top Q x, S)$, so the velocity $V m + \beta V S K^\top Q x$ is
# affine in $x$ and a Gaussian stays Gaussian (Castin, Ablin, Carrillo and Peyré 2025):
#
# $$
# m' = V m + \beta V S K^\top Q m, \qquad
# S' = \beta \left(V S K^\top Q S + S Q^\top K S V^\top\right),
# $$
#
# for any $d$ and any $(Q, K, V)$. `attnflow.gaussian_closure(Q, K, V, mean, cov, ts,
# beta=...)` solves these equations. Here they are held against particles: $n$ tokens
# sampled from $N(m_0, S_0)$ and run by `attnflow.simulate` in the original frame.

# %%
import jax

jax.config.update("jax_enable_x64", True)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow import plotting as afp  # noqa: E402

beta, t1 = 1.0, 1.0
Q, K = np.eye(2), np.array([[0.8, 0.2], [-0.1, 0.9]])
V = np.array([[0.3, -0.5], [0.4, 0.2]])
m0, S0 = np.array([0.5, -0.3]), np.array([[0.4, 0.1], [0.1, 0.25]])
ts = np.linspace(0.0, t1, 11)
closure = af.gaussian_closure(Q, K, V, m0, S0, ts, beta=beta)
print(f"status {closure.status}; at t = {t1:g}: mean {closure.means[-1].round(4).tolist()}")
print(f"covariance {closure.covs[-1].round(4).tolist()}")

# %% [markdown]
# ## Particles, for three $n$
#
# For each $n$ in 100, 400 and 1600, four samples of $n$ tokens from $N(m_0, S_0)$ run as
# one batch (adaptive solver, rtol $10^{-7}$), saved at the closure's eleven times. The
# distance of a sample to the closure at time $t$ is
# $\max_{k,l} |\widehat S_{kl}(t) - S_{kl}(t)| + \max_k |\widehat m_k(t) - m_k(t)|$, with
# $\widehat m$ and $\widehat S$ the sample mean and covariance of the tokens, averaged over
# the four samples.

# %%
model = af.Attention(Q, K, V, beta=beta)
ns, samples = (100, 400, 1600), 4


def distance(x, mean, cov):
    """Sample moments of the tokens x (n, d) against the closure's (mean, cov)."""
    return np.abs(np.cov(x.T) - cov).max() + np.abs(x.mean(axis=0) - mean).max()


def ellipse(mean, cov, radius=2.0):
    """Points of the ellipse {x : (x - mean)^T cov^-1 (x - mean) = radius^2}."""
    w, U = np.linalg.eigh(cov)
    a = np.linspace(0.0, 2 * np.pi, 200)
    return mean + radius * (np.stack([np.cos(a), np.sin(a)], axis=-1) * np.sqrt(w)) @ U.T


tokens, dist = {}, {}
for n in ns:
    x0 = np.stack(
        [np.random.default_rng(s).multivariate_normal(m0, S0, size=n) for s in range(samples)]
    )
    traj = af.simulate(model, x0, t1, ts=ts, frame="original", rtol=1e-7, atol=1e-9)
    traj.raise_for_status()
    x = np.asarray(traj.x)  # (samples, 11, n, 2)
    tokens[n] = x
    dist[n] = np.array(
        [
            [distance(x[s, k], closure.means[k], closure.covs[k]) for k in range(len(ts))]
            for s in range(samples)
        ]
    ).mean(axis=0)
    print(f"n = {n:4d}: distance at t = 0: {dist[n][0]:.4f}, at t = {t1:g}: {dist[n][-1]:.4f}")
ratio = dist[1600][-1] / dist[100][-1]
print(f"at t = {t1:g}, n = 1600 against n = 100: {ratio:.3f} (n^-1/2 says 0.25)")

# %% [markdown]
# At $t = 1$ the distance is 0.151 at $n = 100$, 0.094 at $n = 400$ and 0.037 at
# $n = 1600$: sixteen times the tokens, 0.247 times the distance, where the sampling error
# $n^{-1/2}$ says a quarter. Most of it is there from the start: at $t = 0$, before any
# dynamics, the samples are already 0.107, 0.062 and 0.031 away, the error of estimating
# a mean and a covariance from $n$ draws. The dynamics carries that error along and
# enlarges it, by a factor 1.40 at $n = 100$ and 1.20 at $n = 1600$ over the run. Four
# samples per $n$ are few: the ratio is an estimate, not a measured exponent.

# %% tags=["figure"]
with afp.use_style():
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(9.0, 3.0), layout="constrained")
    x = tokens[1600][0]  # one sample of 1600 tokens
    for k, color in ((0, "0.6"), (-1, "C0")):
        left.plot(*x[k].T, ".", ms=1.5, color=color, alpha=0.5)
        e = ellipse(closure.means[k], closure.covs[k])
        left.plot(*e.T, color="C1" if k else "k", lw=1.0)
    left.plot(*closure.means.T, color="C1", lw=1.0, label="closure: mean, 2 sd")
    left.plot(*x.mean(axis=1).T, "--", color="k", lw=0.8, label="tokens' mean")
    left.set_aspect("equal")
    left.set_xlabel("$x_1$")
    left.set_ylabel("$x_2$")
    left.set_title(f"(a) n = 1600 at t = 0 (grey) and t = {t1:g}")
    left.legend(loc="lower right", frameon=False)
    for n, color in zip(ns, ("C2", "C0", "C3")):
        mid.plot(ts, dist[n], "o-", ms=2.5, color=color, label=f"n = {n}")
    mid.set_ylim(0, None)
    mid.set_xlabel("$t$")
    mid.set_ylabel("distance to the closure")
    mid.set_title("(b) mean over four samples")
    mid.legend(frameon=False)
    nn = np.array(ns, float)
    right.loglog(nn, [dist[n][-1] for n in ns], "o-", color="C0", ms=3, label=f"t = {t1:g}")
    right.loglog(nn, [dist[n][0] for n in ns], "s-", color="0.5", ms=3, label="t = 0")
    right.loglog(nn, dist[100][-1] * (nn / 100) ** -0.5, ":", color="k", label="$n^{-1/2}$")
    right.set_xlabel("$n$")
    right.set_title("(c) distance against $n$")
    right.legend(frameon=False)
