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
# # Leaders and the collapse of the attention matrix
#
# The clustering paper (Geshkovski, Letrouit, Polyanskiy and Rigollet 2023) proves, in
# $d = 1$ with $V > 0$ and $QK > 0$, that the attention matrix $P(t)$ converges to a
# Boolean matrix: every row but at most one becomes $e_k$ with $k$ one of the two extreme
# tokens, so a few *leaders* receive all the attention and the rank of $P$ falls to at
# most 3, the rows of escaping tokens doubly exponentially fast. Nothing is proved about
# the rank beyond $d = 1$; the paper's $2 \times 2$ hyperplane matrix is the case to look
# at.
#
# `attnflow.track_rank(traj)` follows $P$ along a trajectory: at every saved time its
# numerical rank ($\#\{\sigma_k > 10^{-6} \sigma_1\}$), its Boolean distance
# $D = \max_i (1 - \max_j P_{ij})$ (computed from the logits, so that $\log D$ stays
# finite after $D$ underflows), which token each row attends to; at the last time the
# leaders (the columns of mass above 1/2); and a straight-line fit of $\log(-\log D)$
# against $t$ over the saves with $D \le 10^{-10}$ (a doubly exponential law
# $D \sim e^{-c e^{rt}}$ is a line of slope $r$).

# %%
import jax

jax.config.update("jax_enable_x64", True)  # float64: D reaches 1e-300 and beyond
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow import plotting as afp  # noqa: E402

one = af.Attention(np.eye(1), np.eye(1), np.eye(1))  # d = 1, Q = K = V = 1
x1 = np.random.default_rng(0).uniform(-1, 1, (20, 1))
ts1 = np.linspace(0.0, 10.0, 241)
traj1 = af.simulate(one, x1, 10.0, ts=ts1, rtol=1e-9, atol=1e-12)
traj1.raise_for_status()
rank1 = af.track_rank(traj1)
print(rank1.summary())

x = np.asarray(traj1.x)[:, :, 0]  # (241, 20)
extremes = sorted([int(np.argmin(x1)), int(np.argmax(x1))])
order_kept = bool(np.all(np.argsort(x, axis=1) == np.argsort(x[0])))
own_side = np.where(x[-1] > 0, np.argmax(x[-1]), np.argmin(x[-1]))
rows_ok = bool(np.all(rank1.attends_to[-1] == own_side))
first_two = float(ts1[np.flatnonzero(rank1.rank != 2)[-1] + 1])  # 2 from then on
peak = int(rank1.rank.max())
t_peak = float(ts1[np.argmax(rank1.rank)])
print(f"extreme tokens at t = 0: {extremes}; leaders {rank1.leaders.tolist()}")
print(f"order kept: {order_kept}; every row attends the extreme on its side: {rows_ok}")
print(
    f"rank at t = 0: {rank1.rank[0]}, peak {peak} at t = {t_peak:.2f}, 2 from t = {first_two:.2f}"
)

# %% [markdown]
# ## $d = 1$: what the theorem says, and what it does not
#
# Twenty tokens uniform in $[-1, 1]$, $Q = K = V = 1$, to $t = 10$ (adaptive solver, rtol
# $10^{-9}$). As the theorem says: the order of the tokens never changes, the leaders are
# tokens 9 and 11, the largest and the smallest at the start, and at $t = 10$ every row
# attends the extreme token on its own side. The numerical rank is 6 at $t = 0$ (the
# logits $\beta x_i x_j$ have rank one, so $P$'s singular values fall off fast and six
# stand above $10^{-6}$ of the largest), first rises, to 10 at $t = 1.25$, then falls, and
# is 2 from $t = 5.92$ on: the theorem bounds the limit, not the path.
#
# The rate is observed, not proved: $\log(-\log D)$ is a straight line of slope 1.0010
# against $\lambda = 1$, $R^2 = 1.000000$. Not $2\lambda$, although the logits grow like
# $e^{2\lambda t}$: a follower collapses onto its leader like $e^{-\lambda t}$, so the
# logit gap between them grows only like $e^{\lambda t}$ ([Rank and leaders](../rank.md)).

# %%
V = af.matrices.PAPER["paper-2d"]  # eigenvalues 1.348 and -0.068
two = af.Attention(np.eye(2), np.eye(2), V)
x2 = np.random.default_rng(0).uniform(-5, 5, (20, 2))
ts2 = np.linspace(0.0, 10.0, 101)
traj2 = af.simulate(two, x2, 10.0, ts=ts2)
traj2.raise_for_status()
rank2 = af.track_rank(traj2)
limit = af.observe_limit(traj2)
print(rank2.summary())
print(f"predicted {af.predict_regime(two).label}, observed {limit.label}")

phi = af.spectral_structure(V).phi1_left  # the left eigenvector of lambda_1
levels = np.asarray(traj2.project(phi[None, :]))[:, :, 0]  # phi_1^*(z_i(t)), (101, 20)
leaders2 = rank2.leaders.tolist()
a, b = limit.details["a"], limit.details["b"]
on_levels = sorted(levels[-1, leaders2].round(3).tolist())
start_extremes = sorted([int(np.argmin(levels[0])), int(np.argmax(levels[0]))])
first_two2 = float(ts2[np.flatnonzero(rank2.rank != 2)[-1] + 1])
print(f"leaders {leaders2} end on levels {on_levels}; a = {a:.3f}, b = {b:.3f}")
print(f"extreme phi_1^* at t = 0: tokens {start_extremes}; rank 2 from t = {first_two2}")

# %% [markdown]
# ## The paper's hyperplane matrix in $d = 2$: observed only
#
# The tokens of the [ten lines](../getting-started.md): twenty uniform in $[-5, 5]^2$,
# $Q = K = I$ and the paper's $V$, whose leading eigenvalue $\lambda_1 = 1.348$ drives the
# levels $\varphi_1^*(z_i)$ of the rescaled tokens to $\{a, 0, b\}$. The rank of $P$ is 2
# from $t = 1.3$ on, and the two leaders, tokens 1 and 13, end one on each extreme
# hyperplane $\{\varphi_1^* = a\}$ and $\{\varphi_1^* = b\}$; here they are also the two
# tokens with the extreme levels at the start, which in the gallery's 32 runs holds in
# 27 only. The fitted slope is 1.459, that is $1.08\,\lambda_1$ with $R^2 = 0.9990$: the
# default window ($D$ from $10^{-10}$ down) still catches the transient in $d \ge 2$, and
# deeper windows bring the slope to $\lambda_1$ ([Rank and leaders](../rank.md)).

# %% tags=["figure"]
with afp.use_style():
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(9.0, 3.0), layout="constrained")
    cases = {"$d = 1$, $V = 1$": (ts1, rank1, "C0"), "paper 2x2 $V$": (ts2, rank2, "C1")}
    for name, (ts, rk, color) in cases.items():
        left.step(ts, rk.rank, where="post", color=color, label=name)
        y = np.log(-rk.log_boolean_distance)
        mid.plot(ts, y, color=color, lw=1.0, label=name)
        t0, t1 = rk.fit_window
        tt = np.array([t0, t1])
        mid.plot(tt, rk.rate * tt + rk.intercept, color="k", lw=2.2, alpha=0.35)
    left.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    left.set_xlabel("$t$")
    left.set_ylabel("numerical rank of $P(t)$")
    left.set_title("(a) rank")
    left.legend(frameon=False)
    mid.set_xlabel("$t$")
    mid.set_ylabel(r"$\log(-\log D(t))$")
    mid.set_title("(b) Boolean distance, fitted lines in grey")
    z = np.asarray(traj2.z)  # rescaled frame, (101, 20, 2)
    afp.draw_trajectories(right, z, lw=0.5)
    lo, hi = z.min(axis=(0, 1)) - 0.5, z.max(axis=(0, 1)) + 0.5
    afp.draw_levels(right, phi, (a, 0.0, b), lo, hi, color="C1", lw=0.8, zero={"ls": ":"})
    right.plot(*z[-1, leaders2].T, "*", color="C3", ms=11, label="leaders", zorder=4)
    right.set_xlim(lo[0], hi[0])
    right.set_ylim(lo[1], hi[1])
    right.set_xlabel("$z_1$")
    right.set_ylabel("$z_2$")
    right.set_title(r"(c) paper 2x2 $V$: levels $a$, 0, $b$")
    right.legend(loc="lower right", frameon=False)
