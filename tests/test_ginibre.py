"""The Ginibre genericity study: exact values at d = 1, 2, interval formulas against
independent references, the decision rules on constructed spectra, the eigenvector /
good-triple computation against numpy.linalg.eig, split independence (workers, chunks,
two forced JAX devices), the on-disk sweep and the CLI."""

import json
import math

import jax
import numpy as np
import pytest

import attnflow
from attnflow.cli import main
from attnflow.studies import _ginibre_kernel as GK
from attnflow.studies import ginibre as G
from attnflow.studies import sweep as S

EXACT_D2 = 1 / (2 * math.sqrt(2))


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ------------------------------------------------------------------ exact values
def test_d1_is_one_half_and_good_triples_one_quarter():
    est = attnflow.ginibre_fraction(1, 40_000, seed=0)
    assert isinstance(est, attnflow.GinibreEstimate)
    assert est.samples == 40_000 and est.d == 1
    assert est.low < 0.5 < est.high
    assert est.high - est.low < 0.011
    # Q, K Ginibre 1x1: <q phi, k phi> = q k > 0 with probability 1/2, independently
    assert est.good_ginibre.low < 0.25 < est.good_ginibre.high
    assert est.good_identity.count == est.count
    assert est.borderline == 0


def test_d2_is_one_over_two_sqrt_two():
    est = attnflow.ginibre_fraction(2, 40_000, seed=1)
    assert est.low < EXACT_D2 < est.high
    assert est.good_ginibre.low < EXACT_D2 / 2 < est.good_ginibre.high
    assert est.good_identity.count == est.count
    assert est.borderline == 0 and est.borderline_ginibre == 0


def test_interval_coverage_is_about_95_percent_at_d2():
    # 200 independent estimates of p = 1/(2 sqrt 2) with 400 samples each: the Wilson
    # interval must cover p about 95% of the time (+-3 standard errors: 0.90 .. 0.99).
    covered = 0
    for seed in range(200):
        e = G.ginibre_fraction(2, 400, seed=1000 + seed)
        covered += e.low < EXACT_D2 < e.high
    assert 0.90 <= covered / 200 <= 0.99


# -------------------------------------------------------------------- intervals
@pytest.mark.parametrize(
    "k,n", [(0, 10), (3, 10), (14, 100), (50, 100), (100, 100), (1412, 10_000)]
)
def test_wilson_interval_solves_its_quadratic(k, n):
    # Wilson's bounds are the roots p of (k/n - p)^2 = z^2 p (1 - p) / n.
    z = 1.959963984540054
    ph = k / n
    roots = np.sort(np.roots([1 + z * z / n, -(2 * ph + z * z / n), ph * ph]).real)
    low, high = G.binomial_interval(k, n)
    np.testing.assert_allclose([low, high], np.clip(roots, 0, 1), atol=1e-12)


def _binom_tail_ge(k, n, p):
    return sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


@pytest.mark.parametrize("k", [0, 1, 5, 15, 29, 30])
def test_clopper_pearson_solves_its_defining_equations(k):
    n, alpha = 30, 0.05
    low, high = G.binomial_interval(k, n, method="clopper-pearson")
    if k == 0:
        assert low == 0.0
        np.testing.assert_allclose(high, 1 - (alpha / 2) ** (1 / n), rtol=1e-10)
    elif k == n:
        assert high == 1.0
        np.testing.assert_allclose(low, (alpha / 2) ** (1 / n), rtol=1e-10)
    else:
        np.testing.assert_allclose(_binom_tail_ge(k, n, low), alpha / 2, rtol=1e-8)
        np.testing.assert_allclose(1 - _binom_tail_ge(k + 1, n, high), alpha / 2, rtol=1e-8)
    # exact intervals are wider than Wilson's
    wl, wh = G.binomial_interval(k, n)
    assert low <= wl + 1e-12 and high >= wh - 1e-12


def _log_binom_pmf(n, p):
    from math import lgamma

    j = np.arange(n + 1)
    lg = np.array([lgamma(x + 1) for x in range(n + 1)])
    return lg[n] - lg - lg[::-1] + j * np.log(p) + (n - j) * np.log1p(-p)


def test_clopper_pearson_large_n_solves_its_equations():
    # n = 100000: check P(X >= k | low) = P(X <= k | high) = 0.005 with a binomial tail
    # summed in log space (independent of the incomplete-beta code).
    n, k = 100_000, 14_000
    low, high = G.binomial_interval(k, n, method="exact", level=0.99)
    lp = _log_binom_pmf(n, low)
    hp = _log_binom_pmf(n, high)
    np.testing.assert_allclose(np.exp(lp[k:]).sum(), 0.005, rtol=1e-7)
    np.testing.assert_allclose(np.exp(hp[: k + 1]).sum(), 0.005, rtol=1e-7)
    wl, wh = G.binomial_interval(k, n, level=0.99)
    assert abs(low - wl) < 2e-5 and abs(high - wh) < 2e-5


def test_interval_arguments_are_checked():
    with pytest.raises(ValueError, match="count"):
        G.binomial_interval(11, 10)
    with pytest.raises(ValueError, match="level"):
        G.binomial_interval(1, 10, level=1.0)
    with pytest.raises(ValueError, match="interval"):
        G.binomial_interval(1, 10, method="bayes")


# ---------------------------------------------------------------- decisions
def _decide(V):
    V = np.asarray(V, dtype=float)[None]
    return GK.analyse(V, 0, 0, V.shape[1] * np.finfo(float).eps, "numpy")


@pytest.mark.parametrize(
    "V,spectral,borderline",
    [
        (np.diag([3.0, -2.0, 1.0]), True, False),  # real, positive, simple
        (np.diag([-3.0, 2.0, 1.0]), False, False),  # negative
        (np.diag([2.0, -2.0, 1.0]), False, True),  # |lambda_1| = |lambda_2|: tie
        (np.diag([2.0, 2.0, 1.0]), False, True),  # double eigenvalue
        ([[1.0, -2.0, 0], [2.0, 1.0, 0], [0, 0, 0.5]], False, False),  # complex top pair
        (np.diag([2.0, 2.0 - 1e-13, 1.0]), True, True),  # simple, but within 1000 tol
        (np.diag([2.0, 2.0 - 1e-17, 1.0]), False, True),  # equal in floating point
        ([[0.0, 3.0], [1.0, 0.0]], False, True),  # +-sqrt 3: tie in modulus
        ([[5.0]], True, False),
        ([[-5.0]], False, False),
    ],
)
def test_spectral_decision_on_constructed_matrices(V, spectral, borderline):
    out = _decide(V)
    assert bool(out["spectral"][0]) is spectral
    assert bool(out["borderline"][0]) is borderline


def test_good_triples_against_numpy_eig():
    d, n, seed = 6, 400, 2
    arr = G.ginibre_kernel(
        {"d": d, "tol": d * 2.0**-52, "backend": "numpy", "version": 1}, 0, n, seed
    )
    checked = 0
    for i in np.nonzero(arr["spectral"])[0][:40]:
        V, Q, K = G.ginibre_sample(d, int(i), seed=seed)
        w, vecs = np.linalg.eig(V)
        k = int(np.argmax(np.abs(w)))
        assert w[k].imag == 0 and w[k].real > 0
        np.testing.assert_allclose(arr["lam1"][i], w[k], rtol=1e-12)
        phi = vecs[:, k].real / np.linalg.norm(vecs[:, k].real)
        ref = (Q @ phi) @ (K @ phi) / (np.linalg.norm(Q) * np.linalg.norm(K))
        np.testing.assert_allclose(arr["qk"][i], ref, rtol=1e-9, atol=1e-14)
        assert arr["good_ginibre"][i] == (ref > 0)
        checked += 1
    assert checked == 40
    assert np.all(np.isnan(arr["qk"][~arr["spectral"]]))
    np.testing.assert_array_equal(arr["good_identity"], arr["spectral"])


def test_sample_rebuilds_the_matrices_of_the_study():
    d, seed = 8, 4
    B = G.block_size(d)
    V = GK.generate_V(seed, d, 0, 2 * B + 3)
    for i in (0, 1, B - 1, B, 2 * B + 2):
        Vi, Qi, Ki = G.ginibre_sample(d, i, seed=seed)
        np.testing.assert_array_equal(Vi, V[i])
        assert Qi.shape == Ki.shape == (d, d) and not np.array_equal(Qi, Ki)
    # the documented stream: matrix i mod B of block i // B, row-major standard normals
    g = S.rng(seed, GK.TAG, d, 0, 1)
    np.testing.assert_array_equal(V[B + 5], g.standard_normal((6, d, d))[5])


# ---------------------------------------------------- split independence, devices
def test_kernel_does_not_depend_on_the_split():
    cfg = {"d": 5, "tol": 5 * 2.0**-52, "backend": "numpy", "version": 1}
    whole = G.ginibre_kernel(cfg, 0, 3000, 7)
    parts = [G.ginibre_kernel(cfg, a, b, 7) for a, b in [(0, 1), (1, 1030), (1030, 3000)]]
    same(whole, {k: np.concatenate([p[k] for p in parts]) for k in whole})


def test_jax_backend_sharded_over_two_devices_equals_unsharded(monkeypatch):
    assert len(jax.devices()) == 2
    sw = G.ginibre_sweep(12, 301, seed=3, backend="jax")  # 301: padded to the devices
    two = S.compute(sw).arrays
    real = S.map_devices
    monkeypatch.setattr(
        S, "map_devices", lambda fn, *a, devices=None: real(fn, *a, devices=jax.devices()[:1])
    )
    one = S.compute(sw).arrays
    same(two, one)
    # and the decisions agree with the numpy backend
    ref = S.compute(G.ginibre_sweep(12, 301, seed=3)).arrays
    np.testing.assert_array_equal(two["spectral"], ref["spectral"])
    np.testing.assert_array_equal(two["good_ginibre"], ref["good_ginibre"])


def test_worker_processes_equal_one_process():
    a = G.ginibre_fraction(10, 3000, seed=11, workers=1)
    b = G.ginibre_fraction(10, 3000, seed=11, workers=2)
    assert a == b


def test_on_disk_sweep_equals_in_memory_and_resumes(tmp_path):
    mem = G.ginibre_fraction(16, 900, seed=2)
    disk = G.ginibre_fraction(16, 900, seed=2, out=tmp_path, shard_size=256)
    assert disk == mem
    files = sorted(tmp_path.glob("shard-*.npz"))
    assert len(files) == 4
    files[1].unlink()  # lose one shard
    stamp = {p.name: p.stat().st_mtime_ns for p in files if p.exists()}
    again = G.ginibre_fraction(16, 900, seed=2, out=tmp_path, shard_size=256)
    assert again == mem
    assert all(p.stat().st_mtime_ns == stamp[p.name] for p in files if p.name in stamp)


def test_arguments_are_checked():
    for kw, word in [
        (dict(d=0, samples=10), "d"),
        (dict(d=2, samples=0), "samples"),
        (dict(d=2, samples=10, seed=-1), "seed"),
        (dict(d=2, samples=10, level=95), "level"),
        (dict(d=2, samples=10, interval="bayes"), "interval"),
        (dict(d=2, samples=10, tol=-1.0), "tol"),
        (dict(d=2, samples=10, backend="torch"), "backend"),
        (dict(d=2.5, samples=10), "d"),
    ]:
        with pytest.raises(ValueError, match=word):
            G.ginibre_fraction(**kw)
    with pytest.raises(ValueError, match="workers"):
        G.ginibre_fraction(2, 10, backend="jax", workers=2)


def test_parse_dims():
    from attnflow.cli._parse import parse_dims

    assert parse_dims("2,4,8,...,256") == [2, 4, 8, 16, 32, 64, 128, 256]
    assert parse_dims("8, 16, 24, ..., 48") == [8, 16, 24, 32, 40, 48]
    assert parse_dims("3,5") == [3, 5]
    for bad in ("2,4,...,16", "2,4,8,...,100", "x", "0", "2,4,8,..."):
        with pytest.raises(ValueError, match="--d"):
            parse_dims(bad)


# ------------------------------------------------------------------------ CLI
def _cli_json(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["ginibre", *args, "--json", "--workers", "1"])
    cap = capsys.readouterr()
    assert exc.value.code == 0, cap.err
    lines = cap.out.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_cli_job_array_then_merge_equals_one_run(tmp_path, capsys):
    args = ["--d", "2,3", "--samples", "2500", "--seed", "5"]
    one = _cli_json(capsys, *args)
    assert one["complete"] and [r["d"] for r in one["results"]] == [2, 3]
    r2 = one["results"][0]
    assert {"fraction", "low", "high", "samples", "good_ginibre", "borderline"} <= set(r2)
    assert r2["low"] < EXACT_D2 < r2["high"]
    est = attnflow.ginibre_fraction(2, 2500, seed=5)
    assert r2 == json.loads(json.dumps(est.to_dict()))
    out = str(tmp_path / "runs")
    first = _cli_json(capsys, *args, "--out", out, "--shard", "0/2")
    assert not first["complete"] and first["results"] == []
    second = _cli_json(capsys, *args, "--out", out, "--shard", "1/2")
    assert second["complete"]
    # two dimensions, one shard each: job 0 computed d = 2, job 1 computed d = 3
    assert [r["computed"] for r in first["runs"]] == [[0], []]
    assert [r["computed"] for r in second["runs"]] == [[], [0]]
    assert all(r["skipped"] == [] for r in first["runs"] + second["runs"])
    merged = _cli_json(capsys, *args, "--out", out, "--merge")
    assert merged["results"] == one["results"]


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    for args in (
        ["--d", "2,4,...,9"],
        ["--d", "2", "--samples", "0"],
        ["--d", "2", "--shard", "0/2"],
        ["--d", "2", "--out", str(tmp_path), "--merge"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["ginibre", *args])
        cap = capsys.readouterr()
        assert exc.value.code == 2
        assert cap.err.count("\n") == 1 and cap.err.startswith("attnflow: error:")
        assert cap.out == ""


# ----------------------------------------------------------------------- slow
@pytest.mark.slow
def test_d128_reproduces_about_fourteen_percent():
    est = G.ginibre_fraction(128, 20_000, seed=0, workers=None)
    assert est.borderline == 0
    assert abs(est.fraction - 0.14) < 0.01
    assert est.good_ginibre.low < est.fraction / 2 < est.good_ginibre.high


@pytest.mark.slow
def test_cli_sweep_killed_and_rerun_equals_uninterrupted(tmp_path):
    import subprocess
    import sys
    import time

    out = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "attnflow",
        "ginibre",
        "--d",
        "64",
        "--samples",
        "16000",
        "--seed",
        "4",
        "--out",
        str(out),
        "--workers",
        "1",
        "--json",
    ]
    assert G.default_shard_size(64) == 4096  # so 4 shards
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not list((out / "d00064").glob("shard-*.npz")):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    done = {p.name: p.stat().st_mtime_ns for p in (out / "d00064").glob("shard-*.npz")}
    assert 1 <= len(done) < 4
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    study = json.loads(res.stdout)
    assert study["complete"]
    run = study["runs"][0]
    assert len(run["skipped"]) == len(done) and len(run["computed"]) == 4 - len(done)
    assert all((out / "d00064" / n).stat().st_mtime_ns == t for n, t in done.items())
    ref = G.ginibre_fraction(64, 16000, seed=4, workers=1)
    assert study["results"][0] == json.loads(json.dumps(ref.to_dict()))


# ------------------------------------------------ scipy intervals, pinned to before
# (k, n, level, method, low, high) from the former hand-written code (Wilson's formula;
# Clopper-Pearson by bisection on a continued-fraction incomplete beta)
FORMER = [
    (3, 10, 0.95, "wilson", 0.10779126740630104, 0.6032218525388545),
    (33333, 100000, 0.99, "wilson", 0.32950135908935496, 0.33718075620764787),
    (0, 50, 0.95, "wilson", 0.0, 0.0713475991333587),
    (1, 12345, 0.999, "wilson", 6.353758931358796e-06, 0.0010318256832764507),
    (50, 100, 0.5, "wilson", 0.46635196422237973, 0.5336480357776203),
    (3, 10, 0.95, "clopper-pearson", 0.06673951117773452, 0.6524528500599969),
    (33333, 100000, 0.99, "clopper-pearson", 0.3294932009283791, 0.337182683111514),
    (1, 100000, 0.99, "clopper-pearson", 5.012541695965688e-08, 7.429890621707402e-05),
    (49, 50, 0.9, "clopper-pearson", 0.9086018692803022, 0.998974660132768),
    (333, 1000, 0.95, "clopper-pearson", 0.30381780242015965, 0.3631692178520004),
]


@pytest.mark.parametrize("k,n,level,method,low,high", FORMER)
def test_intervals_equal_the_former_numbers(k, n, level, method, low, high):
    got = G.binomial_interval(k, n, level=level, method=method)
    if method == "wilson":  # the same formula, other rounding
        np.testing.assert_allclose(got, (low, high), rtol=0, atol=4e-16)
    else:  # the former code was accurate to ~4e-10 relative (its incomplete beta)
        np.testing.assert_allclose(got, (low, high), rtol=1e-9, atol=0)
    assert (got[0] == 0.0) == (k == 0) and (got[1] == 1.0) == (k == n)


def test_clopper_pearson_to_the_last_bits_where_brentq_is_not():
    """k = 1: low solves P(X >= 1 | p) = 1 - (1 - p)^n = alpha/2, so in closed form
    low = -expm1(log1p(-alpha/2) / n). Some scipy releases find it with brentq to an
    absolute 2e-12 only (binomtest(...).proportion_ci("exact"), a relative error of ~1e-5
    here); the interval must not depend on which release is installed."""
    for n, level in ((100_000, 0.99), (100_000, 0.999), (12_345, 0.95)):
        alpha = 1 - level
        exact = -math.expm1(math.log1p(-alpha / 2) / n)
        low, _ = G.binomial_interval(1, n, level=level, method="exact")
        assert low == pytest.approx(exact, rel=1e-14)
        # k = n - 1 by symmetry: high = 1 - low
        _, high = G.binomial_interval(n - 1, n, level=level, method="exact")
        assert 1 - high == pytest.approx(exact, rel=1e-9)  # 1 - high loses the digits of 1


def test_wilson_is_scipys_textbook_interval_not_the_continuity_corrected_one():
    from scipy.stats import binomtest

    for k, n in ((3, 10), (14, 100), (1412, 10_000)):
        r = binomtest(k, n)
        w, cc = r.proportion_ci(0.95, method="wilson"), r.proportion_ci(0.95, method="wilsoncc")
        got = G.binomial_interval(k, n)
        assert got == (float(w.low), float(w.high))
        assert got[0] > cc.low and got[1] < cc.high


# ------------------------------------------------------- the one spectral decision
def test_kernel_decision_equals_the_former_rule_on_random_stacks():
    """The Ginibre decision is regimes.leading_eigenvalue with cluster_rtol = tol: the
    former rule |Im l1| <= a, Re l1 > a, m1 - m2 > a (a = tol ||V||_F) exactly."""
    from attnflow.analysis.regimes import leading_eigenvalue

    rng = np.random.default_rng(4)
    for d in (1, 2, 3, 5, 9):
        V = rng.standard_normal((3000, d, d))
        V[:50] = np.round(V[:50])  # integer matrices: exact ties and multiple roots
        V[50:60] = np.eye(d)
        w = np.linalg.eigvals(V)
        fro = np.sqrt(np.einsum("pij,pij->p", V, V))
        tol = d * np.finfo(float).eps
        a = tol * fro
        mod = np.abs(w)
        order = np.argsort(-mod, axis=1, kind="stable")
        ms = np.take_along_axis(mod, order, axis=1)
        lam = w[np.arange(len(V)), order[:, 0]]
        m2 = ms[:, 1] if d > 1 else np.zeros(len(V))
        former = (np.abs(lam.imag) <= a) & (lam.real > a) & (ms[:, 0] - m2 > a)
        lead = leading_eigenvalue(w, fro, rtol=tol, cluster_rtol=tol)
        np.testing.assert_array_equal(lead.spectral, former)
        np.testing.assert_array_equal(GK.analyse(V, 0, 0, tol, "numpy")["spectral"], former)


def test_ginibre_curve_checks_every_folder_before_computing_any(tmp_path, monkeypatch):
    """A later d's folder holding another sweep is refused before the first d runs."""
    G.ginibre_curve([32], 100, out=tmp_path, workers=1)  # d = 32 holds 100 samples

    def forbidden(*args, **kwargs):
        raise AssertionError("a sweep ran before every folder was checked")

    monkeypatch.setattr(S, "run", forbidden)
    with pytest.raises(ValueError, match=r"different sweep .*size: stored 100, asked 200"):
        G.ginibre_curve([8, 32], 200, out=tmp_path, workers=1)
    assert not (tmp_path / "d00008").exists()
    with pytest.raises(ValueError, match="holds no sweep"):
        G.ginibre_curve([8, 32], 100, out=tmp_path, merge_only=True)


@pytest.mark.slow
def test_fig_ginibre_reuses_saved_sweeps_and_redraws(tmp_path):
    """The figure script: a saved sweep is used instead of computing (make's results
    option reaches compute), the exact values of d = 1, 2 lie in the plotted intervals,
    the PNG keeps its full resolution in a quick run, and redrawing from the saved data
    rewrites the same sidecar and the same pixels."""
    import matplotlib.image as mi

    from attnflow.experiments import fig_ginibre as FG

    sweeps = tmp_path / "sweeps"
    saved = G.ginibre_fraction(4, 2000, seed=0, out=sweeps / "d00004", workers=1)
    out = tmp_path / "fig"
    FG.make(out, quick=True, results=sweeps, workers=1)
    text = (out / "ginibre_fraction.json").read_text()
    by_d = {r["d"]: r for r in json.loads(text)["results"]}
    assert sorted(by_d) == FG.DIMS_QUICK
    assert by_d[4]["source"] == str(sweeps / "d00004") and by_d[4]["samples"] == 2000
    assert by_d[4]["fraction"] == saved.fraction
    assert {by_d[d]["source"] for d in by_d if d != 4} == {"computed"}
    assert by_d[1]["samples"] == by_d[2]["samples"] == 1000
    assert by_d[1]["low"] <= 0.5 <= by_d[1]["high"]
    assert by_d[2]["low"] <= EXACT_D2 <= by_d[2]["high"]
    png = out / "ginibre_fraction.png"
    pixels = mi.imread(png)
    assert pixels.shape[:2] == (840, 1280)  # 6.4 x 4.2 inches at 200 dpi, quick or not
    png.unlink()
    FG.make.redraw(out, quick=True)
    assert (out / "ginibre_fraction.json").read_text() == text
    np.testing.assert_array_equal(mi.imread(png), pixels)
