"""The record of ``fig_leaders``: independent checks of the leaders, per-case summaries,
and cluster counts against ranks (numbers only, no drawing).

Every function reads one case's run as ``fig_leaders`` makes it: a dict with ``case``
(the case's parameters), ``x0`` ``(b, n, d)``, ``traj`` (the batch's ``Trajectory``),
``rt`` and ``deep`` (``track_rank`` with the default and the deep fit window) and
``seconds``. The checks use numpy and scipy on the tokens, not the rank module.

Not a figure script (the runner only runs ``fig_*.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jaxtyping import Float

from attnflow.experiments import _layers as L


def left_eigvec(V: Float[np.ndarray, "d d"]) -> Float[np.ndarray, " d"]:
    """The unit left eigenvector phi_1^* of V's eigenvalue of largest real part (real
    part of numpy's, sign as numpy gives it)."""
    w, vl = np.linalg.eig(V.T)
    i = int(np.argmax(np.real(w)))
    v = np.real(vl[:, i])
    return v / np.linalg.norm(v)


def checks(res: dict[str, Any], i: int) -> dict[str, Any]:
    """Independent checks of the leaders of system ``i``, from the tokens alone (numpy,
    scipy).

    Args:
        res: one case's run (``fig_leaders._run_case``: ``case``, ``x0``, ``traj``,
            ``rt``).
        i: the system of the batch.

    Returns:
        ``{check name: bool}`` (and the number of initial hull vertices in the polytope
        case), chosen by the case: d = 1, V = I, or a hyperplane case.
    """
    x0 = res["x0"][i]
    z = np.asarray(res["traj"].z)[i]
    rt = res["rt"]
    leaders = set(rt.leaders[i].tolist())
    V = np.asarray(res["case"]["V"])
    out = {}
    if x0.shape[1] == 1:
        lo, hi = int(np.argmin(x0)), int(np.argmax(x0))
        x = np.asarray(res["traj"].x)[i, -1, :, 0]
        out["order_preserved"] = bool(np.all(np.diff(z[:, np.argsort(x0[:, 0]), 0], axis=1) > 0))
        out["leaders_are_extreme_tokens"] = leaders <= {lo, hi}
        out["rows_attend_by_sign"] = bool(
            np.array_equal(rt.attends_to[i, -1], np.where(x > 0, hi, lo))
        )
    elif np.allclose(V, np.eye(V.shape[0])):
        try:
            from scipy.spatial import ConvexHull

            hull = set(ConvexHull(x0).vertices.tolist())
            out["leaders_are_initial_hull_vertices"] = leaders <= hull
            out["initial_hull_vertices"] = len(hull)
        except ImportError:  # scipy is optional
            pass
    else:
        # Leaders lie on the extreme hyperplanes {phi_1^*(z) = max} and {= min} at the end.
        # (Which token of a collapsed group leads is decided by lower-order terms, so the
        # leader need not be the exact argmax of phi_1^*: followers on the same hyperplane
        # agree with it to about e^{-lambda t}.)
        u = left_eigvec(V)
        p = z[-1] @ u
        tol = 1e-6 * (p.max() - p.min())
        on = [min(abs(p[L] - p.max()), abs(p[L] - p.min())) <= tol for L in leaders]
        out["leaders_on_extreme_hyperplanes"] = bool(all(on))
        p0 = x0 @ u
        out["leaders_were_phi1_extremes_at_start"] = leaders == {int(p0.argmin()), int(p0.argmax())}
    out["rank_equals_number_of_leaders"] = int(rt.final_rank[i]) == len(leaders)
    return out


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The sidecar record of one case: per system the checks, rank, leaders and both fits;
    over the batch the counts of passed checks and ranks and the rate statistics.

    Args:
        res: one case's run (``fig_leaders._run_case``).

    Returns:
        a JSON-ready dict (``systems``: one entry per system).
    """
    rt, deep, traj = res["rt"], res["deep"], res["traj"]
    lam = rt.lambda_max
    b = len(traj.statuses)
    per = []
    for i in range(b):
        per.append(
            dict(
                checks=checks(res, i),
                status=traj.statuses[i],
                final_rank=int(rt.final_rank[i]),
                leaders=rt.leaders[i].tolist(),
                leaders_settled=bool(rt.leaders_settled[i]),
                final_boolean_distance=float(rt.boolean_distance[i][traj.reached[i]][-1]),
                final_log_boolean_distance=float(rt.log_boolean_distance[i][traj.reached[i]][-1]),
                rate=float(rt.rate[i]),
                r2=float(rt.r2[i]),
                intercept=float(rt.intercept[i]),
                rate_stderr=float(rt.rate_stderr[i]),
                fit_window=[float(v) for v in rt.fit_window[i]],
                fit_points=int(rt.fit_points[i]),
                deep_rate=float(deep.rate[i]),
                deep_r2=float(deep.r2[i]),
                deep_fit_window=[float(v) for v in deep.fit_window[i]],
                cluster_rate_deep=float(deep.cluster_rate[i]),
                cluster_r2_deep=float(deep.cluster_r2[i]),
            )
        )

    def stats(key, scale=1.0):
        v = np.array([p[key] for p in per], float) / scale
        v = v[np.isfinite(v)]
        if v.size == 0:
            return None
        return dict(mean=float(v.mean()), min=float(v.min()), max=float(v.max()), count=int(v.size))

    ranks = [p["final_rank"] for p in per]
    passed: dict[str, int] = {}
    for p in per:
        for key, v in p["checks"].items():
            if isinstance(v, bool):
                passed[key] = passed.get(key, 0) + int(v)
    return dict(
        checks_passed={k: f"{v} of {b}" for k, v in passed.items()},
        lambda_max=lam,
        seconds=res["seconds"],
        final_rank_counts={str(r): ranks.count(r) for r in sorted(set(ranks))},
        rate_over_lambda=stats("rate", lam),
        r2=stats("r2"),
        deep_rate_over_lambda=stats("deep_rate", lam),
        cluster_rate_over_lambda_deep=stats("cluster_rate_deep", lam),
        systems=per,
    )


def rank_vs_clusters(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case with d >= 2: (observe_limit's cluster count, final rank) of every system.

    Args:
        results: the cases' runs (``fig_leaders._run_case``).

    Returns:
        ``{case key: {"pairs": [[clusters, rank, label], ...], "equal": "k of b", the
        times to cluster and their median}}``.
    """
    import attnflow as af

    out = {}
    for res in results:
        if res["case"]["d"] < 2:
            continue
        traj, rt = res["traj"], res["rt"]
        pairs, settle_t = [], []
        z_all = np.asarray(traj.z)
        ts = np.asarray(traj.ts)
        for i in range(len(traj.statuses)):
            obs = af.observe_limit(traj, system=i)
            pairs.append((obs.n_clusters, int(rt.final_rank[i]), str(obs.label)))
            pts, _ = L.measured(z_all[i], np.asarray(res["case"]["V"]))
            settle_t.append(float(ts[L.settle(L.cluster_counts(pts))[1]]))
        agree = sum(c == r for c, r, _ in pairs)
        out[res["case"]["key"]] = dict(
            pairs=[list(p) for p in pairs],
            equal=f"{agree} of {len(pairs)}",
            time_to_cluster=settle_t,
            median_time_to_cluster=float(np.median(settle_t)),
            median_layers_to_cluster_at_dt_0_1=float(np.median(settle_t)) / 0.1,
        )
    return out
