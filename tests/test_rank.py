"""Attention rank tracking: numbers checked against independent numpy references."""

import json
import math
import time

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.rank import (
    boolean_distance,
    leaders_of,
    nearest_boolean,
    rank_of,
    track_rank,
)


def np_softmax_rows(L):
    L = L - L.max(-1, keepdims=True)
    E = np.exp(L)
    return E / E.sum(-1, keepdims=True)


def np_rank(P, tol):
    s = np.linalg.svd(P, compute_uv=False)
    return int((s > tol * s[0]).sum())


def one_d(lam=1.0, n=10, seed=0, t1=12.0, saves=241, shuffle=True):
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1, 1, size=(n, 1))
    if not shuffle:
        x0 = np.sort(x0, axis=0)
    model = af.Attention(np.eye(1), np.eye(1), lam * np.eye(1))
    traj = af.simulate(model, x0, t1, ts=np.linspace(0, t1, saves))
    return x0, traj


@pytest.fixture(scope="module")
def d1():
    x0, traj = one_d()
    assert traj.ok
    return x0, traj, track_rank(traj)


# ------------------------------------------------------------------ d = 1 theorem
def test_d1_order_preserved(d1):
    x0, traj, _ = d1
    order = np.argsort(x0[:, 0])
    z = np.asarray(traj.z)[:, order, 0]  # (m, n), sorted by the initial order
    assert np.all(np.diff(z, axis=1) > 0), "token order changed"


def test_d1_limit_rows_are_e1_or_en(d1):
    x0, traj, rt = d1
    n = x0.shape[0]
    lo, hi = int(np.argmin(x0)), int(np.argmax(x0))
    x = np.asarray(traj.x[-1])[:, 0]
    P = np_softmax_rows(np.outer(x, x))  # independent of the library's kernel
    # every row attends the largest token if it is positive, the smallest if negative
    expected = np.where(x > 0, hi, lo)
    assert np.array_equal(P.argmax(1), expected)
    assert np.array_equal(rt.attends_to[-1], expected)
    assert 1.0 - P.max(1).min() < 1e-15
    assert rt.boolean_distance[-1] < 1e-100
    B = np.zeros((n, n))
    B[np.arange(n), expected] = 1.0
    np.testing.assert_allclose(P, B, atol=1e-15)


def test_d1_leaders_are_extreme_tokens(d1):
    x0, traj, rt = d1
    z = np.asarray(traj.z[-1])[:, 0]
    assert z.min() < 0 < z.max()  # both extremes survive on their side of 0 here
    assert rt.leaders.tolist() == sorted([int(np.argmin(x0)), int(np.argmax(x0))])
    assert bool(rt.leaders_settled)
    # column masses: how many rows attend each leader (the sign of the limit token)
    assert rt.column_mass[np.argmax(x0)] == pytest.approx((z > 0).sum())
    assert rt.column_mass[np.argmin(x0)] == pytest.approx((z < 0).sum())


def test_d1_rank_at_most_two(d1):
    _, traj, rt = d1
    assert rt.rank[-1] == 2 and rt.final_rank == 2
    assert np.all(rt.rank[rt.ts >= 8] <= 2)
    assert rt.rank_method[-1] == "boolean"
    # independent SVD rank where the library used the certificate
    for k in np.flatnonzero(rt.rank_method == "boolean")[::20]:
        assert np_rank(np.asarray(traj.attention(int(k))), rt.tol) == rt.rank[k]
    for k in np.flatnonzero(rt.rank_method == "svd")[::10]:
        assert np_rank(np.asarray(traj.attention(int(k))), rt.tol) == rt.rank[k]
    # starts full-ish, ends low: the rank never needs to be monotone, but it drops
    assert rt.rank[0] > 2


def test_d1_doubly_exponential_fit(d1):
    _, _, rt = d1
    assert rt.rate > 0
    # measured: the slope of log(-log D) is lambda = 1 (not 2 lambda), r2 ~ 1
    assert rt.rate == pytest.approx(1.0, abs=0.05)
    assert rt.r2 > 0.999
    assert rt.fit_points >= 10
    t0, t1 = rt.fit_window
    inside = (rt.ts >= t0) & (rt.ts <= t1)
    assert np.all(rt.boolean_distance[inside] <= rt.fit_max)
    assert np.all(rt.boolean_distance[inside] >= rt.fit_min)
    # the fitted line reproduces the data (independent recomputation)
    y = np.log(-np.log(rt.boolean_distance[inside]))
    slope, icpt = np.polyfit(rt.ts[inside], y, 1)
    assert slope == pytest.approx(rt.rate, rel=1e-6)
    assert icpt == pytest.approx(rt.intercept, rel=1e-6)


def test_d1_rate_scales_with_lambda():
    _, traj = one_d(lam=2.0, t1=6.0, saves=241)
    rt = track_rank(traj)
    assert rt.rate == pytest.approx(2.0, abs=0.1)
    assert rt.lambda_max == pytest.approx(2.0)


def test_log_distance_matches_float_distance(d1):
    _, _, rt = d1
    ok = (rt.boolean_distance > 1e-300) & (rt.boolean_distance < 0.5)
    np.testing.assert_allclose(
        rt.log_boolean_distance[ok], np.log(rt.boolean_distance[ok]), rtol=1e-10, atol=1e-10
    )
    # the logit-based log keeps going after the float distance underflows
    gone = rt.boolean_distance == 0
    assert gone.any() and np.all(np.isfinite(rt.log_boolean_distance[gone]))
    assert np.all(rt.log_boolean_distance[gone] < -700)


def test_d1_euler_transformer():
    rng = np.random.default_rng(3)
    x0 = rng.uniform(-1, 1, size=(8, 1))
    model = af.Attention(np.eye(1), np.eye(1), np.eye(1))
    traj = af.simulate(model, x0, 10.0, ts=np.arange(0, 101) * 0.1, method="euler", dt=0.1)
    assert traj.ok
    rt = track_rank(traj)
    assert rt.rank[-1] <= 2
    # tokens may cross 0 (order is kept, signs are not): here the only positive token
    # is pulled below 0 before attention sharpens, so every row ends on the smallest
    x = np.asarray(traj.x[-1])[:, 0]
    lo, hi = int(np.argmin(x0)), int(np.argmax(x0))
    np.testing.assert_array_equal(rt.attends_to[-1], np.where(x > 0, hi, lo))
    assert set(rt.leaders.tolist()) <= {lo, hi} and rt.leaders.tolist() == [lo]
    assert rt.rank[-1] == 1
    # discrete time: z^k = (1 + dt)^{-k} x^k, so the rate per unit time is log(1 + dt)/dt
    assert rt.rate == pytest.approx(math.log(1.1) / 0.1, abs=0.01)


# ----------------------------------------------------------- constructed matrices
def test_constructed_boolean_matrix():
    rng = np.random.default_rng(0)
    n = 9
    cols = np.array([2, 2, 7, 5, 2, 7, 7, 5, 2])
    B = np.zeros((n, n))
    B[np.arange(n), cols] = 1.0
    assert boolean_distance(B) == 0.0
    assert boolean_distance(B, norm="l1") == 0.0
    assert boolean_distance(B, stochastic=False) == 0.0
    assert int(rank_of(B)) == 3
    r, how = rank_of(B, return_method=True)
    assert str(how) == "boolean"
    assert int(rank_of(B, method="svd")) == 3
    np.testing.assert_array_equal(nearest_boolean(B), B)
    assert leaders_of(B).tolist() == [2, 5, 7]
    # a stack: permuted rows and columns keep the rank
    perm = rng.permutation(n)
    stack = np.stack([B, B[perm][:, perm], np.eye(n), np.tile(np.eye(n)[:1], (n, 1))])
    np.testing.assert_array_equal(rank_of(stack), [3, 3, n, 1])
    np.testing.assert_array_equal(boolean_distance(stack), 0.0)


def test_near_boolean_matrix_distance_and_rank():
    n, delta = 12, 1e-3
    cols = np.arange(n) % 4
    B = np.zeros((n, n))
    B[np.arange(n), cols] = 1.0
    P = (1 - delta) * B + delta * np.ones((n, n)) / n
    # 1 - max_j P_ij = delta (n - 1) / n exactly
    assert boolean_distance(P) == pytest.approx(delta * (n - 1) / n, rel=1e-12)
    assert boolean_distance(P, norm="l1") == pytest.approx(2 * delta * (n - 1) / n, rel=1e-12)
    assert boolean_distance(P, stochastic=False) == pytest.approx(delta * (n - 1) / n, rel=1e-9)
    np.testing.assert_allclose(boolean_distance(P, per_row=True), delta * (n - 1) / n)
    # identical rows stay identical: rank 4 at any tolerance
    assert int(rank_of(P, 1e-12)) == 4 == np_rank(P, 1e-12)
    # a random row-stochastic perturbation of size delta: full rank at a small
    # tolerance, the Boolean rank 4 at a large one
    R = np.random.default_rng(0).uniform(size=(n, n))
    P2 = (1 - delta) * B + delta * R / R.sum(1, keepdims=True)
    for tol in (1e-9, 1e-2):
        assert int(rank_of(P2, tol)) == np_rank(P2, tol)
    assert int(rank_of(P2, 1e-9)) == n and int(rank_of(P2, 1e-2)) == 4
    assert str(rank_of(P2, 1e-2, return_method=True)[1]) == "boolean"


def test_certificate_agrees_with_svd_on_random_near_boolean():
    rng = np.random.default_rng(1)
    for trial in range(30):
        n = int(rng.integers(2, 30))
        scale = 10.0 ** rng.uniform(0, 3)
        L = scale * rng.standard_normal((n, n))
        P = np_softmax_rows(L)
        tol = 10.0 ** rng.uniform(-10, -2)
        r, how = rank_of(P, tol, return_method=True)
        assert int(r) == np_rank(P, tol), (trial, str(how))


def test_tiny_distances_resolved_below_epsilon():
    p = np_softmax_rows(np.array([[0.0, -700.0, -705.0]]))
    assert 1.0 - p.max() == 0.0  # the naive formula loses it
    expected = math.exp(-700) + math.exp(-705)
    assert boolean_distance(p) == pytest.approx(expected, rel=1e-12)


def test_large_n_uses_no_svd():
    n = 3000
    rng = np.random.default_rng(2)
    cols = rng.choice([0, 17, 2999], size=n)
    P = np.full((n, n), 1e-14 / n)
    P[np.arange(n), cols] = 1.0 - 1e-14 * (n - 1) / n
    t = time.perf_counter()
    r, how = rank_of(P, return_method=True)
    assert time.perf_counter() - t < 5.0
    assert int(r) == 3 and str(how) == "boolean"


def test_randomized_rank_above_svd_limit():
    rng = np.random.default_rng(4)
    n, k = 60, 3
    U, W = rng.uniform(0.1, 1, (n, k)), rng.uniform(0.1, 1, (k, n))
    P = U @ W
    P /= P.sum(1, keepdims=True)  # row-stochastic, rank exactly 3
    r, how = rank_of(P, 1e-8, svd_max_n=10, return_method=True)
    assert str(how) == "randomized" and int(r) == 3
    r, how = rank_of(
        np_softmax_rows(rng.standard_normal((n, n))),
        1e-8,
        svd_max_n=10,
        rank_cap=8,
        return_method=True,
    )
    assert int(r) == 8  # capped: "at least rank_cap"


# ----------------------------------------------------------------------- batches
def test_batch_matches_single_systems():
    # the discrete transformer with the shapes of the other Euler tests: compiles are shared
    rng = np.random.default_rng(5)
    xb = rng.uniform(-1, 1, size=(3, 8, 1))
    xb[0] = rng.permutation(np.linspace(-1, 1, 8))[:, None]  # symmetric: both leaders
    xb[2] = np.abs(xb[2]) + 0.05  # all positive: one leader, rank 1
    model = af.Attention(np.eye(1), np.eye(1), np.eye(1))
    ts = np.arange(0, 101) * 0.1
    run = dict(ts=ts, method="euler", dt=0.1)
    rb = track_rank(af.simulate(model, xb, 10.0, **run))
    assert rb.batched and rb.rank.shape == (3, 101) and rb.boolean_distance.shape == (3, 101)
    assert rb.row_distance.shape == (3, 101, 8) and rb.rate.shape == (3,)
    assert isinstance(rb.leaders, tuple) and len(rb.leaders) == 3
    for i in range(3):
        ri = track_rank(af.simulate(model, xb[i], 10.0, **run))
        np.testing.assert_array_equal(rb.rank[i], ri.rank)
        np.testing.assert_array_equal(rb.leaders[i], ri.leaders)
        assert rb.rate[i] == pytest.approx(ri.rate, rel=1e-9)
    assert rb.leaders[0].tolist() == sorted([int(np.argmin(xb[0])), int(np.argmax(xb[0]))])
    assert rb.leaders[2].tolist() == [int(np.argmax(xb[2]))]
    assert rb.final_rank[0] == 2 and rb.final_rank[2] == 1


def test_batch_with_failed_system():
    model = af.Attention(np.eye(1), np.eye(1), np.eye(1))
    x = np.linspace(-1, 1, 8)[:, None]
    xb = np.stack([x, x * 1e150, 2 * x])  # logits near e^690: the second overflows at t ~ 8
    traj = af.simulate(model, xb, 10.0, ts=np.arange(0, 101) * 0.1, method="euler", dt=0.1)
    assert traj.statuses[0] == "ok" and traj.statuses[1] != "ok"
    rt = track_rank(traj)
    unreached = ~np.asarray(traj.reached[1])
    assert unreached.any()
    assert np.all(rt.rank[1][unreached] == -1)
    assert np.all(rt.rank_method[1][unreached] == "none")
    assert np.all(np.isnan(rt.boolean_distance[1][unreached]))
    assert np.all(rt.rank[0] >= 1)


# ------------------------------------------------------------------- beyond d = 1
def test_d2_identity_value_leaders_are_hull_vertices():
    spatial = pytest.importorskip("scipy.spatial")
    rng = np.random.default_rng(6)
    x0 = rng.uniform(-1, 1, size=(15, 2))
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    traj = af.simulate(model, x0, 8.0, ts=np.arange(0, 81) * 0.1, method="euler", dt=0.1)
    assert traj.ok
    rt = track_rank(traj)
    hull = set(spatial.ConvexHull(x0).vertices.tolist())
    assert set(rt.leaders.tolist()) <= hull  # the hull never grows; leaders are vertices
    assert rt.rank[-1] == len(rt.leaders) == rt.n_attended[-1]
    assert rt.rate > 0


# ------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(tol=0.0), "tol"),
        (dict(tol=1.5), "tol"),
        (dict(norm="l2"), "norm"),
        (dict(leader_threshold=0), "leader_threshold"),
        (dict(fit_max=1.0), "fit_max"),
        (dict(fit_min=0.5), "fit_min"),
        (dict(min_fit_points=1), "min_fit_points"),
        (dict(method="qr"), "method"),
        (dict(svd_max_n=0), "svd_max_n"),
    ],
)
def test_track_rank_bad_arguments(d1, kwargs, word):
    with pytest.raises(ValueError, match=word):
        track_rank(d1[1], **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="traj"):
        track_rank(np.eye(3))
    with pytest.raises(ValueError, match="P"):
        rank_of(np.ones(3))
    with pytest.raises(ValueError, match="non-finite"):
        boolean_distance(np.array([[np.nan, 1.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="negative"):
        boolean_distance(np.array([[-0.5, 1.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="complex"):
        rank_of(np.eye(2) + 0j)
    with pytest.raises(ValueError, match="tol"):
        rank_of(np.eye(2), tol=-1)


# --------------------------------------------------------------------------- CLI
def run_cli(args, capsys):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_rank_json(capsys):
    code, out, err = run_cli(
        [
            "rank",
            "--d",
            "1",
            "--n",
            "8",
            "--t1",
            "10",
            "--saves",
            "101",
            "--scale",
            "1",
            "--seed",
            "2",
            "--x64",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    res = json.loads(out)
    x0 = np.random.default_rng(2).uniform(-1, 1, size=(8, 1))  # the CLI's "uniform" start
    assert set(res["leaders"]) <= {int(np.argmin(x0)), int(np.argmax(x0))}
    assert res["rank"][-1] == len(res["leaders"]) == res["final_rank"]
    assert all(a in res["leaders"] for a in res["attends_to"][-1])
    assert len(res["ts"]) == len(res["rank"]) == len(res["boolean_distance"]) == 101
    assert res["rate"] > 0 and res["r2"] > 0.99
    for key in (
        "rank_method",
        "log_boolean_distance",
        "fit_window",
        "column_mass",
        "intercept",
        "tol",
        "norm",
        "metadata",
    ):
        assert key in res


def test_cli_rank_error_exit_2(capsys):
    code, out, err = run_cli(["rank", "--d", "1", "--tol", "2", "--x64", "--json"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("attnflow: error:") and "tol" in err and err.count("\n") == 1


def test_chunked_evaluation_matches(d1, monkeypatch):
    from attnflow.analysis import _rank_numerics

    _, traj, rt = d1
    monkeypatch.setattr(_rank_numerics, "CHUNK_ELEMENTS", 7 * 10 * 10)  # 7 saved times per chunk
    rc = track_rank(traj)
    np.testing.assert_array_equal(rc.rank, rt.rank)
    np.testing.assert_array_equal(rc.rank_method, rt.rank_method)
    # the same numbers up to the last bit of rounding (XLA vectorises by batch size)
    np.testing.assert_allclose(rc.boolean_distance, rt.boolean_distance, rtol=1e-13)
    np.testing.assert_allclose(rc.log_boolean_distance, rt.log_boolean_distance, rtol=1e-13)
    np.testing.assert_allclose(rc.column_mass, rt.column_mass, rtol=1e-13)
    assert rc.rate == pytest.approx(rt.rate, rel=1e-12)


def test_to_dict_is_json_ready(d1):
    from attnflow.io.serialize import to_jsonable

    _, _, rt = d1
    d = json.loads(json.dumps(to_jsonable(rt.to_dict())))
    assert d["leaders"] == rt.leaders.tolist() and d["final_rank"] == 2
    assert len(d["rank"]) == len(rt.ts)
    assert "fit log(-log D)" in rt.summary()


@pytest.mark.slow
def test_fig_leaders_quick(tmp_path):
    import importlib
    from pathlib import Path

    mod = importlib.import_module("attnflow.experiments.fig_leaders")
    res = mod.make(tmp_path, quick=True)
    assert len(res["figures"]) == 8 and all(Path(p).stat().st_size > 0 for p in res["figures"])
    side = json.loads(Path(res["json"]).read_text())
    assert side["x64"] and side["versions"]["jax"] and side["cases"][0]["seed"] == 0
    d1 = side["results"]["d1"]
    assert all(v.split(" of ")[0] == v.split(" of ")[1] for v in d1["checks_passed"].values())
    # rank is not the number of clusters: one hyperplane (the level z^(1) = 1 exactly, the
    # discrete frame keeps equal levels equal), P(T) the identity to rounding
    two = side["rank_is_not_clusters"]
    assert two["observed"] == "hyperplanes" and two["n_clusters"] == 1 and two["final_rank"] == 2
    assert two["level_deviation"] < 1e-14 and two["off_diagonal_final"] < 1e-100
    for key, v in side["clusters_against_rank"].items():
        equal = sum(c == r for c, r, _ in v["pairs"])
        assert v["equal"] == f"{equal} of {len(v['pairs'])}"
        systems = side["results"][key]["systems"]
        assert [p[1] for p in v["pairs"]] == [q["final_rank"] for q in systems]


def test_huge_logits_give_exact_rows_not_nan():
    # |logits| ~ 1e20: XLA CPU may fuse q.k - max into an FMA whose rounding error
    # (~ulp/2 ~ 1e4) overflows exp; the rank module pins the argmax and stays exact.
    from attnflow.analysis._rank_numerics import traj_stats

    model = af.Attention(np.eye(1), np.eye(1), np.eye(1))
    x = np.linspace(-1, 1, 8)[:, None] * 1e10
    st = traj_stats(model, np.asarray(x)[None], True)
    P = np.asarray(st["P"][0])
    assert np.all(np.isfinite(P))
    np.testing.assert_array_equal(P, np_softmax_rows(np.outer(x, x)))
    assert np.all(np.isfinite(np.asarray(st["log_off"])))


def test_track_rank_uses_kernel_parameters():
    """ssmax with s = 3: the tracked distance is the one of the model's own P."""
    m = af.Attention(np.eye(1), np.eye(1), np.eye(1), kernel="ssmax", kernel_params={"s": 3.0})
    traj = af.simulate(
        m, np.random.default_rng(0).uniform(-1, 1, (8, 1)), 1.0, method="euler", dt=0.1
    )
    want = (1 - np.asarray(traj.attention(-1)).max(axis=1)).max()
    assert float(af.track_rank(traj).boolean_distance[-1]) == pytest.approx(want, rel=1e-10)
    assert traj.metadata()["model"]["kernel_params"] == {"s": 3.0}


# --------------------------------------------------- the fit and the kernel's softmax
def _fit_by_hand(t, y):
    """The former hand-written least squares (the reference for scipy's linregress)."""
    tm, ym = t.mean(), y.mean()
    sxx = ((t - tm) ** 2).sum()
    slope = ((t - tm) * (y - ym)).sum() / sxx
    icpt = ym - slope * tm
    res = y - (slope * t + icpt)
    ss_res, ss_tot = (res**2).sum(), ((y - ym) ** 2).sum()
    return slope, icpt, 1 - ss_res / ss_tot, math.sqrt(ss_res / (len(t) - 2) / sxx)


@pytest.mark.parametrize("noise", [1e-1, 1e-4, 1e-8, 1e-12])
def test_fit_equals_the_hand_written_least_squares(noise):
    from attnflow.analysis._rank_numerics import fit_double_exponential

    rng = np.random.default_rng(int(-math.log10(noise)))
    t = np.linspace(2.0, 9.0, 29)
    y = 1.37 * t + 0.4 + noise * rng.standard_normal(t.size)  # y = log(-log D)
    logD = -np.exp(y)
    fit = fit_double_exponential(t, logD, np.ones(t.size, bool), 0.0, 1e-3, 3)
    slope, icpt, r2, se = _fit_by_hand(t, np.log(-logD))
    assert fit["points"] == t.size and fit["window"] == (2.0, 9.0)
    np.testing.assert_allclose([fit["rate"], fit["intercept"]], [slope, icpt], rtol=1e-14)
    assert abs(fit["r2"] - r2) < 1e-15
    # The standard error from the residuals, which carry ~1e-15 |y| of rounding: as
    # accurate as the residuals allow. scipy's own stderr comes from 1 - r^2 and cancels:
    # at noise 1e-12 it is wrong by orders of magnitude.
    np.testing.assert_allclose(fit["rate_stderr"], se, rtol=max(1e-12, 1e-13 / noise))
    if noise <= 1e-8:
        from scipy.stats import linregress

        scipy_se = float(linregress(t, np.log(-logD)).stderr)  # type: ignore[attr-defined]
        assert abs(scipy_se - se) > 100 * abs(fit["rate_stderr"] - se)
    # two points: a line, no standard error; a constant: no R^2
    two = fit_double_exponential(t[:2], logD[:2], np.ones(2, bool), 0.0, 1e-3, 2)
    assert np.isfinite(two["rate"]) and math.isnan(two["rate_stderr"])
    flat = fit_double_exponential(t, np.full(t.size, -50.0), np.ones(t.size, bool), 0.0, 1e-3, 3)
    assert flat["rate"] == 0.0 and math.isnan(flat["r2"])


def test_track_rank_rows_are_the_kernels_softmax(d1):
    """The attention track_rank measures is kernels.softmax (one band rule): its log
    Boolean distance is the log of the off-argmax mass of those very rows."""
    from attnflow.dynamics import kernels as K

    _, traj, rt = d1
    for k in (0, 60, 120):
        L = np.asarray(traj.logits(k), np.float64)
        P = np.asarray(K.softmax(L))
        top = np.argmax(L, axis=-1)
        off = P.sum(-1) - P[np.arange(len(P)), top]
        off = np.where(off > 0, off, np.nan)
        np.testing.assert_allclose(rt.boolean_distance[k], np.nanmax(1 - P.max(-1)), atol=1e-15)
        # log(off-argmax mass) from logsumexp of the off-argmax logits (numpy reference)
        Lo = np.where(np.eye(len(L), dtype=bool)[top], -np.inf, L)
        mo = Lo.max(-1, keepdims=True)
        ref = (mo[:, 0] + np.log(np.exp(Lo - mo).sum(-1))) - (
            L.max(-1) + np.log(np.exp(L - L.max(-1, keepdims=True)).sum(-1))
        )
        np.testing.assert_allclose(rt.log_boolean_distance[k], ref.max(), rtol=1e-12)


@pytest.mark.parametrize("kernel", ["softmax", pytest.param("qknorm", marks=pytest.mark.slow)])
def test_track_rank_on_non_finite_tokens_gives_nan_not_numbers(kernel):
    """A save whose tokens are NaN (a non-finite stop state) has no attention matrix:
    rank -1, NaN distances; it used to stop in LinAlgError inside the SVD."""
    import dataclasses

    import jax.numpy as jnp

    m = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel=kernel)
    x0 = np.random.default_rng(0).uniform(-1, 1, (6, 2))
    traj = af.simulate(m, x0, 1.0, ts=np.linspace(0, 1, 5))
    y = np.array(traj._y)
    y[:, -1, 2, :] = np.nan
    bad = dataclasses.replace(traj, _y=jnp.asarray(y))
    rt = track_rank(bad)
    good = track_rank(traj)
    assert rt.rank[-1] == -1 and rt.rank_method[-1] == "none"
    assert math.isnan(rt.boolean_distance[-1]) and math.isnan(rt.log_boolean_distance[-1])
    assert np.all(rt.attends_to[-1] == -1)
    np.testing.assert_array_equal(rt.rank[:-1], good.rank[:-1])
    np.testing.assert_array_equal(rt.boolean_distance[:-1], good.boolean_distance[:-1])


def test_validators_keep_their_messages(d1):
    with pytest.raises(ValueError, match=r"tol must be in \(0, 1\) \(relative to the largest"):
        rank_of(np.eye(2), tol=2.0)
    with pytest.raises(ValueError, match="norm must be one of 'inf', 'l1'"):
        boolean_distance(np.eye(2), norm="l2")
    with pytest.raises(ValueError, match="leader_threshold must be a finite number > 0"):
        leaders_of(np.eye(2), threshold=float("inf"))
    with pytest.raises(ValueError, match="svd_max_n must be an integer >= 1"):
        rank_of(np.eye(2), svd_max_n=True)
    with pytest.raises(ValueError, match=r"fit_min must be in \[0, fit_max"):
        track_rank(d1[1], fit_min=1e-9)
