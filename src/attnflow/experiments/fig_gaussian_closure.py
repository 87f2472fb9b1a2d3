"""The Gaussian closure of the mean field against particle clouds, as n grows.

Castin, Ablin, Carrillo and Peyre (2025): for softmax attention the mean-field law started
Gaussian stays Gaussian, ``N(m(t), S(t))``, with ``m' = V m + beta V S K^T Q m`` and
``S' = beta (V S K^T Q S + S Q^T K S V^T)`` (``attnflow.gaussian_closure``). Particles
sampled from ``N(m_0, S_0)`` and run by ``attnflow.simulate`` (original frame, adaptive
solver) follow it up to a sampling error ``O(n^{-1/2})``. Two cases: ``d = 2`` with a
rotating value matrix and ``d = 3`` with a random one (contracting symmetric part).

Panels: (a) one cloud of the largest ``n`` in ``d = 2`` at ``t = 0`` and ``t = t1`` with the
closure's two-standard-deviation ellipses; (b) the distance of the sample moments at
``t1`` to the closure against ``n``, for each case, mean and spread over the seeds, with
the ``n^{-1/2}`` slope; two distances: to the closure of the law ``(m_0, S_0)`` (sampling
error included) and to the closure started from each sample's own initial moments (what
the dynamics adds). The fitted exponents are in the sidecar with their intervals.

What it does not show: the closure is exact for Gaussian laws only; the particles'
distance to it mixes the empirical measure's sampling error with the mean-field error,
and the second distance removes only the part present at ``t = 0``.

Run:  python -m attnflow.experiments.fig_gaussian_closure [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_gaussian_closure"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 20, "full": 400}
# left out of a full ``attnflow figures`` run (run it with --only gaussian_closure)
LONG = "several minutes of particle runs up to 8,192 tokens"
SEED, BETA, T1, SAVES = 0, 1.0, 1.0, 6


def _cases() -> list[dict]:
    """The two set-ups: ``(Q, K, V, m0, S0)`` in ``d = 2`` and ``d = 3``."""
    rng = np.random.default_rng(SEED + 17)
    A = rng.normal(size=(3, 3)) / math.sqrt(3)
    V3 = A - A.T - 0.5 * np.eye(3)  # a rotation part and a contracting symmetric part
    return [
        dict(
            name="d2",
            Q=np.eye(2),
            K=np.array([[0.8, 0.2], [-0.1, 0.9]]),
            V=np.array([[0.3, -0.5], [0.4, 0.2]]),
            m0=np.array([0.5, -0.3]),
            S0=np.array([[0.4, 0.1], [0.1, 0.25]]),
        ),
        dict(
            name="d3",
            Q=np.eye(3) + 0.2 * rng.normal(size=(3, 3)),
            K=np.eye(3) + 0.2 * rng.normal(size=(3, 3)),
            V=V3,
            m0=np.array([0.3, 0.0, -0.4]),
            S0=np.diag([0.3, 0.2, 0.25]),
        ),
    ]


def _distance(x: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> float:
    """The sample moments of tokens ``x`` ``(n, d)`` against ``(mean, cov)``:
    ``max |S_hat - S| + max |m_hat - m|``."""
    return float(np.abs(np.cov(x.T) - cov).max() + np.abs(x.mean(axis=0) - mean).max())


def _slope(ns: list[int], d: np.ndarray) -> tuple[float, list[float]]:
    """The least-squares slope of ``log d`` against ``log n`` (every seed a point) and its
    95% interval (scipy's ``linregress``)."""
    from scipy import stats

    x = np.repeat(np.log(np.asarray(ns, np.float64)), d.shape[1])
    fit: Any = stats.linregress(x, np.log(d.ravel()))
    half = stats.t.ppf(0.975, x.size - 2) * fit.stderr
    return float(fit.slope), [float(fit.slope - half), float(fit.slope + half)]


def compute(quick: bool) -> F.Data:
    """Particles against the closure for each case and ``n``.

    Args:
        quick: ``n`` = 64 and 256 with 2 seeds (full: 128 to 8,192 with 4 seeds).

    Returns:
        the sidecar (per case the closure's final moments, per ``n`` the distances of every
        seed and their mean and spread, the fitted exponents with intervals) and, for
        ``draw``, one cloud in ``d = 2``.
    """
    H.setup()
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af

    ns, seeds = ([64, 256], 2) if quick else ([128, 512, 2048, 8192], 4)
    ts = np.linspace(0.0, T1, SAVES)
    arrays: dict[str, np.ndarray] = {}
    cases = []
    for c, case in enumerate(_cases()):
        Q, K, V, m0, S0 = (case[k] for k in ("Q", "K", "V", "m0", "S0"))
        law = af.gaussian_closure(Q, K, V, m0, S0, ts, beta=BETA)
        if not law.ok:
            raise RuntimeError(f"the closure of case {case['name']} stopped: {law.status}")
        model = af.Attention(Q, K, V, beta=BETA)
        to_law = np.zeros((len(ns), seeds))
        to_own = np.zeros((len(ns), seeds))
        at_start = np.zeros((len(ns), seeds))
        for i, n in enumerate(ns):
            x0 = np.stack(
                [
                    np.random.default_rng([SEED, c, n, s]).multivariate_normal(m0, S0, size=n)
                    for s in range(seeds)
                ]
            )
            traj = af.simulate(model, x0, T1, ts=ts, frame="original", rtol=1e-7, atol=1e-9)
            traj.raise_for_status()
            x = np.asarray(traj.x)  # (seeds, saves, n, d)
            for s in range(seeds):
                own = af.gaussian_closure(
                    Q, K, V, x[s, 0].mean(axis=0), np.cov(x[s, 0].T), ts, beta=BETA
                )
                to_law[i, s] = _distance(x[s, -1], law.means[-1], law.covs[-1])
                to_own[i, s] = _distance(x[s, -1], own.means[-1], own.covs[-1])
                at_start[i, s] = _distance(x[s, 0], m0, S0)
            if c == 0 and i == len(ns) - 1:
                arrays["cloud_start"] = x[0, 0]
                arrays["cloud_end"] = x[0, -1]
        arrays[f"c{c}_to_law"] = to_law
        arrays[f"c{c}_to_own"] = to_own
        cases.append(
            dict(
                name=case["name"],
                d=int(V.shape[0]),
                Q=Q.tolist(),
                K=K.tolist(),
                V=V.tolist(),
                m0=m0.tolist(),
                S0=S0.tolist(),
                closure_mean_t1=law.means[-1].tolist(),
                closure_cov_t1=law.covs[-1].tolist(),
                closure_means=law.means.tolist(),
                closure_covs=law.covs.tolist(),
                n=ns,
                to_law=to_law.tolist(),
                to_own=to_own.tolist(),
                at_start=at_start.tolist(),
                to_law_mean=to_law.mean(axis=1).tolist(),
                to_law_std=to_law.std(axis=1, ddof=1).tolist(),
                to_own_mean=to_own.mean(axis=1).tolist(),
                to_own_std=to_own.std(axis=1, ddof=1).tolist(),
                exponent_to_law=_slope(ns, to_law),
                exponent_to_own=_slope(ns, to_own),
            )
        )
    side = H.sidecar(
        script="attnflow.experiments.fig_gaussian_closure",
        quick=quick,
        runs=[],
        seed=SEED,
        seeds=[SEED],
        seeds_note="numpy default_rng([seed, case, n, sample]) draws each sample of n tokens",
        sample_seeds=[[SEED, c, n, s] for c in range(2) for n in ns for s in range(seeds)],
        t1=T1,
        beta=BETA,
        solver=dict(method="adaptive", rtol=1e-7, atol=1e-9, frame="original"),
        distance="max |S_hat - S| + max |m_hat - m| at t1",
        cases=cases,
        theorem=(
            "the mean-field law of softmax attention started Gaussian stays Gaussian with "
            "m' = V m + beta V S K^T Q m, S' = beta (V S K^T Q S + S Q^T K S V^T) (Castin, "
            "Ablin, Carrillo and Peyre 2025); particles follow it up to O(n^-1/2)"
        ),
    )
    result = {
        c["name"]: {"to_law": c["exponent_to_law"][0], "to_own": c["exponent_to_own"][0]}
        for c in cases
    }
    return F.Data(sidecar=side, arrays=arrays, result=result)


def _ellipse(mean: np.ndarray, cov: np.ndarray, radius: float = 2.0) -> np.ndarray:
    w, U = np.linalg.eigh(np.asarray(cov))
    a = np.linspace(0.0, 2 * np.pi, 200)
    return np.asarray(mean) + radius * (np.stack([np.cos(a), np.sin(a)], -1) * np.sqrt(w)) @ U.T


def draw(data: F.Data) -> dict[str, Figure | str]:
    """Two panels (the cloud and the distances against ``n``) and a Markdown table.

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure, NAME + ".md": table}``.
    """
    import matplotlib.pyplot as plt

    s, a = data.sidecar, data.arrays
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.2, 3.2), layout="constrained")
    first = s["cases"][0]
    n_big = first["n"][-1]
    left.plot(*a["cloud_start"].T, ".", ms=1, color="0.65", alpha=0.5, label="tokens, t = 0")
    left.plot(*a["cloud_end"].T, ".", ms=1, color="C0", alpha=0.5, label=f"tokens, t = {s['t1']:g}")
    means = np.asarray(first["closure_means"])
    covs = np.asarray(first["closure_covs"])
    left.plot(*_ellipse(means[0], covs[0]).T, color="k", lw=1, label="closure, 2 sd")
    left.plot(*_ellipse(means[-1], covs[-1]).T, color="C1", lw=1)
    left.plot(*means.T, color="C1", lw=1)
    left.set_aspect("equal")
    left.set_xlabel("$x_1$")
    left.set_ylabel("$x_2$")
    left.set_title(f"d = 2, n = {n_big:,}")
    left.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False, markerscale=6
    )
    H.panel_label(left, "a")
    rows = []
    for c, case in enumerate(s["cases"]):
        ns = np.asarray(case["n"], np.float64)
        for key, style, what in (("to_law", "o-", "law"), ("to_own", "s--", "own start")):
            mean = np.asarray(case[f"{key}_mean"])
            std = np.asarray(case[f"{key}_std"])
            slope, (lo, hi) = case[f"exponent_{key}"]
            right.errorbar(
                ns,
                mean,
                yerr=std,
                fmt=style,
                color=f"C{c}",
                ms=3.5,
                lw=1,
                capsize=2,
                label=f"d = {case['d']}, {what}: slope {slope:.2f}",
            )
            for i, n in enumerate(case["n"]):
                rows.append(
                    [
                        case["name"],
                        what,
                        n,
                        f"{mean[i]:.4f}",
                        f"{std[i]:.4f}",
                        f"{slope:.2f} [{lo:.2f}, {hi:.2f}]",
                    ]
                )
    ns = np.asarray(s["cases"][0]["n"], np.float64)
    ref = np.asarray(s["cases"][0]["to_law_mean"])[0] * (ns / ns[0]) ** -0.5
    right.plot(ns, ref, ":", color="0.4", lw=1, label=r"$n^{-1/2}$")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("$n$")
    right.set_ylabel(f"distance of the moments at t = {s['t1']:g}")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False, fontsize=6)
    H.panel_label(right, "b")
    table = H.markdown_table(["case", "closure from", "n", "mean", "sd", "fitted exponent"], rows)
    return {NAME: fig, NAME + ".md": table}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
