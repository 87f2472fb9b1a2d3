"""Lost in the middle, in particles: the retrieval profile measured on causal ALiBi
attention against the kinetic theory's closed form.

Duerinckx, Geshkovski and Rossi (2026, "Kinetic theory for Transformers and the
lost-in-the-middle phenomenon") solve the correlations of causal attention with the
ALiBi weights ``e^{-(lambda/N)(j - k)}`` among ``N`` i.i.d. uniform tokens on the circle:
the retrieval of the source at relative position ``s`` by the last token is the profile
``S_tau(s)`` (``analysis.lost_in_middle_profile``), U-shaped (primacy, a minimum,
recency) until ``t_crit(beta)`` (``analysis.lost_in_middle_threshold``, 2.457 at
``beta = 1``), after which the recency end falls. Their set-up: ``N = 64``, ``beta = 1``,
``lambda = 1``; their code simulates one run from four clusters of 16 tokens (to draw
the paths) and plots only the closed form. Here:

- the particles: ``Attention(I, I, I, beta=1, mask=ALiBi(1 / 64))`` (softmax) on the
  circle (``frame="sphere"``), an ensemble of i.i.d. uniform starts (the theory's
  hypothesis), saved at the kinetic times ``tau = 0, 1/8, .., 4`` and ``t_crit``; the
  model's time is ``t = beta I_0(beta) tau`` (the softmax normalises by
  ``sum_k w_jk e^{beta cos}``, about ``I_0(beta)`` times the authors' normaliser, and
  their field carries a factor ``beta``);
- the measure: ``analysis.retrieval_profile``, the correlation ``n sum_m w_m
  E[cos m (theta_N(t) - theta_k(0))]`` whose limit the theory solves (minus its value at
  ``t = 0``, 0 on average), with its standard error;
- the references: the closed form (``n = infinity``) and the finite-``n`` linear theory
  of this very model (the correlation equation ``dC/dt = A_m C`` with the softmax's
  mean-field weights ``e^{-(lambda/N)(j - l)} / (e^beta / I_0(beta) + sum_{l' < j}
  e^{-(lambda/N)(j - l')})``, whose self-weight term is the ``O(1/n)`` difference from the
  closed form), by ``scipy.linalg.expm``;
- the authors' four-cluster start (centres ``0.1, 0.7, 1.3, 1.9`` pi, spread 0.075,
  their seed 17), as one batch of such starts: the paths of the first, and the same
  measure on the batch.

Panels: (a) the four-cluster run's angles against time; (b)-(h) the profile at
``tau = 0.5, 1, 1.5, 2, t_crit, 3, 4``: particles averaged over bins of 7 sources
(``retrieval_profile(..., window=7)``; bars: twice the standard error), the closed form,
the finite-``n`` linear theory.

The ensemble is float32 (Tsit5, rtol 1e-5): against float64 at rtol 1e-9 on the same
2000 starts the profile moved by under 1e-4 of its standard error at every time.

Run:  python -m attnflow.experiments.fig_lost_middle [--quick] [--out figures] [--redraw]

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

NAME = "fig_lost_middle"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 15, "full": 26}
N, BETA, LAM, M, MODES = 64, 1.0, 1.0, 8.0, 20
SEED, CLUSTER_SEED = 0, 17
# every batch has CHUNK systems, so that one compiled solve serves them all
CHUNK, CHUNKS = 500, {"quick": 1, "full": 20}
RTOL, ATOL, DTYPE = 1e-5, 1e-7, np.float32
TAU_STEP, TAU_MAX = 0.125, 4.0
SHOWN = (0.5, 1.0, 1.5, 2.0, None, 3.0, 4.0)  # None: t_crit
BIN = 7  # sources per bin of the drawn particle profile (63 = 9 bins)
CENTRES, SPREAD = (0.1, 0.7, 1.3, 1.9), 0.075  # the authors' four clusters (units of pi)


def time_scale(beta: float) -> float:
    """``beta I_0(beta)``: the softmax model's time per unit of kinetic time."""
    from scipy.special import i0

    return float(beta * i0(beta))


def kinetic_times(beta: float = BETA, lam: float = LAM) -> np.ndarray:
    """The saved kinetic times: ``0, TAU_STEP, .., TAU_MAX`` and ``t_crit``, sorted."""
    from attnflow.analysis import lost_in_middle_threshold

    grid = np.arange(0.0, TAU_MAX + TAU_STEP / 2, TAU_STEP)
    return np.unique(np.append(grid, lost_in_middle_threshold(beta, lam=lam, M=M, modes=MODES)))


def uniform_starts(rng: np.random.Generator, b: int, n: int = N) -> np.ndarray:
    """``b`` systems of ``n`` i.i.d. uniform tokens on the circle, ``(b, n, 2)``."""
    th = rng.uniform(0.0, 2 * math.pi, (b, n))
    return np.stack([np.cos(th), np.sin(th)], axis=-1).astype(DTYPE)


def cluster_starts(b: int, n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """``b`` four-cluster starts (consecutive quarters of the tokens around the centres,
    Gaussian spread); the first is the authors' draw (``default_rng(17)``). Returns the
    tokens ``(b, n, 2)`` and the cluster of each token."""
    labels = np.repeat(np.arange(4), -(-n // 4))[:n]
    centres = np.asarray(CENTRES)[labels] * math.pi
    first = np.random.default_rng(CLUSTER_SEED).normal(0.0, SPREAD, n)
    rest = np.random.default_rng(CLUSTER_SEED + 1).normal(0.0, SPREAD, (b - 1, n))
    th = centres + np.concatenate([first[None], rest])
    return np.stack([np.cos(th), np.sin(th)], axis=-1).astype(DTYPE), labels


def linear_theory(taus: np.ndarray, n: int = N, beta: float = BETA, lam: float = LAM) -> np.ndarray:
    """The finite-``n`` linear correlation profile of the softmax ALiBi model at the kinetic
    times ``taus``, ``(len(taus), n - 1)``: ``n sum_m w_m [e^{t A_m}]_{n-1, k}`` with
    ``t = beta I_0(beta) tau``, ``A_m = (m^2 I_m(beta) / beta) D / Z``, ``D_jl =
    e^{-(lambda/n)(j - l)}`` for ``l < j`` and ``Z_j = e^beta + I_0(beta) sum_{l<j} D_jl``
    (the mean of the softmax normaliser over uniform tokens)."""
    from scipy.linalg import expm
    from scipy.special import iv

    j = np.arange(n)[:, None]
    l = np.arange(n)[None, :]
    D = np.where(l < j, np.exp(-(lam / n) * (j - l)), 0.0)
    Z = math.exp(beta) + iv(0, beta) * D.sum(axis=1, keepdims=True)
    m = np.arange(1, MODES + 1)
    w = np.exp(-0.5 * (math.pi * m / M) ** 2)
    a = m**2 * iv(m, beta) / beta
    out = np.zeros((len(taus), n - 1))
    for i, tau in enumerate(taus):
        t = time_scale(beta) * tau
        for am, wm in zip(a, w, strict=True):
            out[i] += wm * n * expm(t * am * D / Z)[n - 1, : n - 1]
    return out


def bins(v: np.ndarray, size: int = BIN) -> np.ndarray:
    """Means over consecutive groups of ``size`` sources (the last axis)."""
    k = v.shape[-1] // size * size
    return v[..., :k].reshape(*v.shape[:-1], -1, size).mean(axis=-1)


def _simulate(af, model, x0: np.ndarray, ts: np.ndarray):
    traj = af.simulate(model, x0, float(ts[-1]), ts=ts, frame="sphere", rtol=RTOL, atol=ATOL)
    return traj.raise_for_status()


def ends(v: np.ndarray) -> tuple[float, float]:
    """``(first - middle, last - middle)`` of a binned profile (9 bins): the first and the
    last bin against the mean of the middle three."""
    mid = float(np.mean(v[3:6]))
    return float(v[0]) - mid, float(v[-1]) - mid


def _summary(tau: float, prof, cluster, closed: np.ndarray, lin: np.ndarray, i: int) -> dict:
    """The numbers of one drawn time: binned particles, closed form and linear theory."""
    part, se = prof.S[i], prof.stderr[i]
    cb, lb = bins(closed), bins(lin)
    inner = np.arange(part.size) >= 1  # s >= 8/64: the first bin holds the singular end
    pe, ce = ends(part), ends(cb)
    return dict(
        tau=tau,
        t=float(prof.t[i]),
        s_bins=prof.s.tolist(),
        particles=part.tolist(),
        particles_se=se.tolist(),
        closed=cb.tolist(),
        linear=lb.tolist(),
        max_rel_dev_closed=float(np.max(np.abs(part / cb - 1)[inner])),
        max_rel_dev_linear=float(np.max(np.abs(part / lb - 1)[inner])),
        linear_vs_closed=float(np.max(np.abs(lb / cb - 1)[inner])),
        argmin_bin_particles=int(np.argmin(part)),
        argmin_bin_closed=int(np.argmin(cb)),
        # first / last bin minus the middle three, and a bound on their standard error
        primacy_particles=pe[0],
        recency_particles=pe[1],
        primacy_se_bound=float(se[0] + np.mean(se[3:6])),
        recency_se_bound=float(se[-1] + np.mean(se[3:6])),
        primacy_closed=ce[0],
        recency_closed=ce[1],
        four_clusters=cluster.S[i].tolist(),
        four_clusters_se=cluster.stderr[i].tolist(),
    )


def compute(quick: bool) -> F.Data:
    """The ensemble, its profile and the references (see the module docstring).

    Args:
        quick: the small version (one batch of 500 uniform starts; full: 20 batches,
            10000 starts); the four-cluster batch has 500 starts either way.

    Returns:
        the sidecar (parameters; per drawn time the binned particles, closed form and
        linear theory and their deviations) and, for ``draw``, the arrays.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.analysis import (
        lost_in_middle_profile,
        lost_in_middle_threshold,
        retrieval_profile,
    )
    from attnflow.masks import ALiBi

    tc = lost_in_middle_threshold(BETA, lam=LAM, M=M, modes=MODES)
    taus = kinetic_times()
    ts = time_scale(BETA) * taus
    eye = np.eye(2, dtype=DTYPE)
    model = af.Attention(eye, eye, eye, beta=BETA, mask=ALiBi(LAM / N))
    rng = np.random.default_rng(SEED)
    chunks = CHUNKS["quick" if quick else "full"]
    uniform = [_simulate(af, model, uniform_starts(rng, CHUNK), ts) for _ in range(chunks)]
    prof = retrieval_profile(uniform, M=M, modes=MODES, window=BIN)
    x0c, labels = cluster_starts(CHUNK)
    clustered = _simulate(af, model, x0c, ts)
    cprof = retrieval_profile(clustered, M=M, modes=MODES, window=BIN)
    xc = np.asarray(clustered.x[0], np.float64)
    cluster_angles = np.unwrap(np.arctan2(xc[..., 1], xc[..., 0]), axis=0)

    shown = np.array([tc if t is None else t for t in SHOWN])
    idx = [int(np.argmin(np.abs(taus - t))) for t in shown]
    s_fine = np.linspace(1.0 / N, 1.0, 400)
    closed_fine = np.stack([lost_in_middle_profile(s_fine, t, BETA, lam=LAM) for t in shown])
    s_all = np.arange(1, N) / N
    closed = np.stack([lost_in_middle_profile(s_all, t, BETA, lam=LAM) for t in shown])
    lin = linear_theory(shown)
    times = [
        _summary(float(t), prof, cprof, closed[j], lin[j], i)
        for j, (t, i) in enumerate(zip(shown, idx, strict=True))
    ]
    runs = [
        dict(
            name=name,
            seed=seed,
            n=N,
            d=2,
            t1=float(ts[-1]),
            Q="identity",
            K="identity",
            V="identity",
            solver="tsit5",
            tolerances=[RTOL, ATOL],
            systems=systems,
            dtype=np.dtype(DTYPE).name,
        )
        for name, seed, systems in (
            ("uniform", SEED, prof.systems),
            ("four clusters", CLUSTER_SEED, cprof.systems),
        )
    ]
    side = H.sidecar(
        script="attnflow.experiments.fig_lost_middle",
        quick=quick,
        runs=runs,
        seeds=[SEED, CLUSTER_SEED, CLUSTER_SEED + 1],
        seeds_note=(
            "uniform starts: one numpy default_rng(SEED) stream, chunk by chunk; four "
            "clusters: the first start from default_rng(CLUSTER_SEED) (the authors' draw), "
            "the rest from default_rng(CLUSTER_SEED + 1)"
        ),
        beta=BETA,
        lam=LAM,
        kernel="softmax",
        mask=["alibi", LAM / N],
        M=M,
        modes=MODES,
        t_crit=tc,
        time_scale=time_scale(BETA),
        kinetic_times=taus.tolist(),
        bin=BIN,
        cluster_centres_pi=list(CENTRES),
        cluster_spread=SPREAD,
        times=times,
        measure=(
            "retrieval_profile: n sum_m w_m [cos m(theta_N(t) - theta_k(0)) - cos "
            "m(theta_N(0) - theta_k(0))], mean over the systems; closed form at "
            "tau = t / (beta I_0(beta))"
        ),
        theorem=(
            "[DGR26]: S_tau(s) is U-shaped for tau < t_crit, the recency end falls after; "
            "n E[cos m(theta_N(t) - theta_sN(0))] -> g_{a_m}(tau, 1; s) as n -> infinity."
        ),
    )
    arrays = {
        "tau": taus,
        "t": prof.t,
        "s_bins": prof.s,
        "S_bins": prof.S,
        "stderr_bins": prof.stderr,
        "s": s_all,
        "shown": shown,
        "shown_index": np.asarray(idx),
        "s_fine": s_fine,
        "closed_fine": closed_fine,
        "closed": closed,
        "linear": lin,
        "cluster_angles": cluster_angles,
        "cluster_labels": labels,
    }
    result = {
        "systems": prof.systems,
        "max_rel_dev_closed": {f"{d['tau']:.3g}": d["max_rel_dev_closed"] for d in times},
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Eight panels and a Markdown table (matplotlib only, from ``compute``'s data).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    fig, grid = plt.subplots(2, 4, figsize=(10.0, 5.0), layout="constrained")
    ax = grid[0, 0]
    colours = ["C0", "C1", "C2", "C3"]
    t = a["t"]
    for k in range(a["cluster_angles"].shape[1]):
        lab = int(a["cluster_labels"][k])
        ax.plot(t, a["cluster_angles"][:, k] / math.pi, color=colours[lab], lw=0.6)
    ax.set_xlabel("t (model)")
    ax.set_ylabel(r"$\theta_j / \pi$ (unwrapped)")
    ax.set_title("four-cluster start (the authors' seed)", fontsize=7)
    H.panel_label(ax, "a")
    sb = a["s_bins"]
    for j, (tau, d) in enumerate(zip(a["shown"], s["times"], strict=True)):
        ax = grid.flat[j + 1]
        part = np.asarray(d["particles"])
        se = np.asarray(d["particles_se"])
        ax.plot(a["s_fine"], a["closed_fine"][j], "-", color="k", lw=1, label="closed form")
        ax.plot(a["s"], a["linear"][j], "--", color="C1", lw=1, label=f"linear, n = {N}")
        ax.errorbar(sb, part, yerr=2 * se, fmt="o", color="C0", ms=3, label="particles")
        top = max(float(np.max(part + 2 * se)), float(np.max(a["closed"][j][BIN:])))
        ax.set_ylim(0, 1.15 * top)
        ax.set_xlim(0, 1)
        crit = r" = $t_{crit}$" if abs(tau - s["t_crit"]) < 1e-9 else ""
        ax.set_title(rf"$\tau$ = {tau:.3g}{crit} (t = {d['t']:.2f})", fontsize=7)
        ax.set_xlabel("source position s")
        if j % 4 == 3:
            ax.set_ylabel(r"$S_\tau(s)$")
        H.panel_label(ax, "bcdefgh"[j])
    grid[0, 1].set_ylabel(r"$S_\tau(s)$")
    grid[0, 1].legend(fontsize=6, loc="upper left")
    fig.suptitle(
        f"Lost in the middle: softmax ALiBi attention on the circle, n = {N}, "
        rf"$\beta$ = {s['beta']:g}, $\lambda$ = {s['lam']:g}, "
        f"{s['runs'][0]['systems']} uniform starts",
        fontsize=8,
    )
    rows = []
    for d in s["times"]:
        rows.append(
            [
                f"{d['tau']:.3f}",
                f"{d['t']:.3f}",
                f"{d['s_bins'][d['argmin_bin_particles']]:.2f}",
                f"{d['s_bins'][d['argmin_bin_closed']]:.2f}",
                f"{d['primacy_particles']:+.2f} ({d['primacy_se_bound']:.2f})",
                f"{d['primacy_closed']:+.2f}",
                f"{d['recency_particles']:+.2f} ({d['recency_se_bound']:.2f})",
                f"{d['recency_closed']:+.2f}",
                f"{d['max_rel_dev_closed']:.3f}",
                f"{d['max_rel_dev_linear']:.3f}",
                f"{d['linear_vs_closed']:.3f}",
            ]
        )
    table = H.markdown_table(
        [
            "tau",
            "t",
            "min at s: particles",
            "closed",
            "primacy: particles (se bound)",
            "closed",
            "recency: particles (se bound)",
            "closed",
            "max rel. dev. particles / closed",
            "particles / linear",
            "linear / closed",
        ],
        rows,
    )
    return {NAME: fig, NAME + ".md": table + "\n"}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
