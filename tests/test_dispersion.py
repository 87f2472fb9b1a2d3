"""Softmax dispersion: the bound of Velickovic et al., the kernels that escape it, reports."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af
from attnflow.analysis.dispersion import qknorm_delta_bound
from attnflow.dynamics import kernels as K

POLY = [-0.037, 0.481, -2.3, 4.917, -1.791]


def np_softmax(L):
    E = np.exp(L - L.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def adversarial_row(n, M, m):
    row = np.full(n, float(m))
    row[0] = M
    return row


# ----------------------------------------------------------------------- the bound
def test_bound_never_fails_on_random_logits():
    rng = np.random.default_rng(0)
    for n in (2, 3, 10, 100, 1000, 5000):
        for scale in (1e-3, 0.3, 1.0, 5.0, 40.0, 1e3):
            for draw in (rng.normal, rng.uniform, rng.standard_cauchy):
                L = scale * (
                    draw(size=(6, n)) if draw is not rng.uniform else draw(-1, 1, size=(6, n))
                )
                P = np.asarray(K.softmax(jnp.asarray(L)))
                rep = af.dispersion(P, logits=L)
                assert rep.max.shape == (6,)
                assert np.all(rep.max <= rep.bound_tight * (1 + 1e-12)), (n, scale)
                assert np.all(rep.bound_tight <= rep.bound_loose * (1 + 1e-12))
                assert np.all(rep.bound_holds)
                # and the lower end of the lemma: every coefficient >= e^{-delta}/n
                # (where e^{-delta} is a normal float, not underflowed)
                ok = rep.delta < 600
                assert np.all(P.min(-1)[ok] >= np.exp(-rep.delta[ok]) / n * (1 - 1e-12))


def test_bound_never_fails_on_adversarial_logits():
    # perturbations of the extremal configuration and two-level rows with k tops
    rng = np.random.default_rng(1)
    for n in (2, 5, 64, 1000):
        for delta in (0.1, 1.0, 4.0, 12.0):
            rows = [adversarial_row(n, delta, 0.0)]
            for ktop in (2, n // 2, n - 1):
                r = np.zeros(n)
                r[:ktop] = delta
                rows.append(r)
            for _ in range(5):
                r = adversarial_row(n, delta, 0.0)
                r[1:] += rng.uniform(0, delta, n - 1) * rng.uniform() ** 4
                rows.append(r)
            L = np.stack(rows)
            rep = af.dispersion(np_softmax(L), logits=L)
            assert np.all(rep.max <= rep.bound_tight * (1 + 1e-13))


@pytest.mark.parametrize(
    "n,M,m",
    [
        (2, 1.0, 0.0),
        (16, 3.0, -1.0),
        (1000, 5.0, 2.0),
        (16384, 9.0, 0.0),
        (7, 0.0, 0.0),
        (50, 700.0, -5.0),
    ],
)
def test_adversarial_row_attains_the_tight_bound(n, M, m):
    L = adversarial_row(n, M, m)[None]
    for P in (np_softmax(L), np.asarray(K.softmax(jnp.asarray(L)))):
        rep = af.dispersion(P, logits=L)
        want = 1.0 / (1.0 + (n - 1) * math.exp(-(M - m)))
        np.testing.assert_allclose(rep.max, want, rtol=1e-13)
        np.testing.assert_allclose(rep.bound_tight, want, rtol=1e-13)
        assert rep.argmax[0] == 0


def test_temperature_inside_the_logits():
    # softmax(L / theta): the bound with delta / theta
    rng = np.random.default_rng(2)
    L = rng.uniform(0, 2, size=(4, 300))
    for theta in (0.1, 0.5, 3.0):
        rep = af.dispersion(np_softmax(L / theta), logits=L / theta)
        np.testing.assert_allclose(rep.delta, np.ptp(L, -1) / theta, rtol=1e-13)
        assert np.all(rep.max <= rep.bound_tight)


@pytest.mark.parametrize("delta", [0.5, 2.0, 5.0])
@pytest.mark.parametrize("eps", [0.2, 0.01])
def test_many_tokens_force_every_coefficient_below_eps(delta, eps):
    rng = np.random.default_rng(3)
    n = int(math.exp(delta) / eps) + 1  # n > e^delta / eps
    rows = [adversarial_row(n, delta, 0.0)]
    for _ in range(4):
        r = rng.uniform(0, delta, n)
        r[:2] = (0.0, delta)  # spread exactly delta
        rows.append(r)
    L = np.stack(rows)
    assert np.allclose(np.ptp(L, -1), delta)
    assert np.all(np_softmax(L) < eps)
    # the exact threshold n > 1 + (1/eps - 1) e^delta, and it is tight
    n_star = 1 + (1 / eps - 1) * math.exp(delta)
    n_hi, n_lo = math.floor(n_star) + 1, math.ceil(n_star) - 1
    assert np_softmax(adversarial_row(n_hi, delta, 0.0)[None]).max() < eps
    if n_lo >= 2:
        assert np_softmax(adversarial_row(n_lo, delta, 0.0)[None]).max() > eps


# ------------------------------------------------------------------------ kernels
def test_qknorm_delta_stays_within_its_analytic_bound():
    rng = np.random.default_rng(4)
    d, p, beta = 5, 3, 0.7
    Q, Kk = rng.normal(size=(p, d)), rng.normal(size=(p, d))
    model = af.Attention(Q, Kk, np.eye(d), beta=beta, kernel="qknorm", rectangular=True)
    bound = qknorm_delta_bound(beta, p)
    assert bound == 2 * beta * p
    for scale in (1e-3, 1.0, 1e3, 1e100):
        x = scale * rng.normal(size=(400, d)) * rng.lognormal(0, 2, size=(400, 1))
        rep = af.dispersion(model, x=x)
        assert np.all(rep.delta <= bound * (1 + 1e-12))
        soft = af.dispersion(af.Attention(Q, Kk, np.eye(d), beta=beta, rectangular=True), x=x)
        if scale >= 1e3:
            assert np.min(soft.delta) > bound  # raw logits are not bounded
    # attained: a key along the query and one against it (Q = K = I, p = d)
    m = af.Attention(np.eye(3), np.eye(3), np.eye(3), beta=beta, kernel="qknorm")
    x = np.array([[2.0, 0, 0], [-5.0, 0, 0], [0, 1.0, 0]])
    rep = af.dispersion(m, x=x)
    np.testing.assert_allclose(rep.delta[0], 2 * beta * 3, rtol=1e-14)


@pytest.mark.parametrize("s,gap", [(1.0, 2.0), (2.0, 0.75), (0.5, 1.0), (1.0, 0.5)])
def test_ssmax_one_gap_tends_to_one_or_zero(s, gap):
    tops = []
    for n in (10, 100, 10_000, 1_000_000):
        L = jnp.zeros((1, n)).at[0, 0].set(gap)
        w = np.asarray(K.weights("ssmax", L, {"s": s}))
        want = 1.0 / (1.0 + (n - 1) * n ** (-s * gap))
        np.testing.assert_allclose(w[0, 0], want, rtol=1e-12)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-12)
        tops.append(w[0, 0])
    if s * gap > 1:
        assert np.all(np.diff(tops) > 0) and tops[-1] > 0.99
    else:
        assert np.all(np.diff(tops) < 0) and tops[-1] < 0.05
    # plain softmax on the same input tends to 0 either way
    soft = np_softmax(np.r_[gap, np.zeros(999_999)][None])[0, 0]
    assert soft < 1e-5


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 16384])
def test_sigmoid_zero_logits_give_one_over_n_plus_one(n):
    w = np.asarray(K.weights("sigmoid", jnp.zeros((3, n))))
    np.testing.assert_allclose(w, 1.0 / (n + 1), rtol=1e-15)
    rep = af.dispersion(w, logits=np.zeros((3, n)))
    np.testing.assert_allclose(rep.row_sum, n / (n + 1), rtol=1e-14)
    np.testing.assert_allclose(rep.share_max, 1.0 / n, rtol=1e-14)


def _entropy(L):
    p = np_softmax(L)
    return -np.sum(p * np.log(p + 1e-9), axis=-1)


def _row_with_entropy(n, H):
    """[a, 0, ..., 0] with the kernel's entropy H (bisection on a)."""
    lo, hi = 0.0, 200.0  # the entropy decreases in a for a > 0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _entropy(adversarial_row(n, mid, 0.0)[None])[0] > H:
            lo = mid
        else:
            hi = mid
    return adversarial_row(n, 0.5 * (lo + hi), 0.0)


def test_adaptive_leaves_low_and_high_entropy_rows_unchanged():
    roots = np.sort(
        np.roots(np.polysub(POLY, [1])).real[np.isreal(np.roots(np.polysub(POLY, [1])))]
    )
    np.testing.assert_allclose(roots, [0.848582, 5.944521], atol=1e-6)
    rows, Hs = [], []
    n = 2000
    for H in (0.05, 0.3, 0.5, 0.7, 0.8485, 5.945, 6.3, 7.0, 7.5):
        r = _row_with_entropy(n, H)
        rows.append(r)
        Hs.append(H)
    rows.append(np.zeros(n))  # uniform: H = log 2000 = 7.6
    rows.append(adversarial_row(n, 60.0, 0.0))  # one-hot: H ~ 0
    L = np.stack(rows)
    H = _entropy(L)
    np.testing.assert_allclose(H[: len(Hs)], Hs, atol=1e-9)
    assert np.all((H <= 0.8485 + 1e-9) | (H >= 5.945 - 1e-9))
    inv = np.asarray(K.adaptive_inverse_temperature(jnp.asarray(L)))
    np.testing.assert_array_equal(inv, 1.0)
    got = np.asarray(K.weights("adaptive", jnp.asarray(L)))
    np.testing.assert_array_equal(got, np.asarray(K.softmax(jnp.asarray(L))))


def test_adaptive_sharpens_rows_in_between():
    n = 2000
    L = np.stack([_row_with_entropy(n, H) for H in (0.9, 2.0, 4.412, 5.9)])
    inv = np.asarray(K.adaptive_inverse_temperature(jnp.asarray(L)))
    np.testing.assert_allclose(inv, np.polyval(POLY, _entropy(L)), rtol=1e-9)
    assert np.all(inv > 1.0)
    np.testing.assert_allclose(inv[2], K.ADAPTIVE_MAX_INVERSE_TEMPERATURE, rtol=1e-6)
    got = np.asarray(K.weights("adaptive", jnp.asarray(L)))
    np.testing.assert_allclose(got, np_softmax(L * inv[:, None]), rtol=1e-12)
    assert np.all(got.max(-1) > np_softmax(L).max(-1))
    # REFERENCES rounds the lower threshold to 0.849; the root is 0.848582
    assert np.polyval(POLY, 0.849) > 1.0


# ------------------------------------------------------------------------ reports
def test_report_fields_on_simple_matrices():
    n = 8
    P = np.full((3, n), 1.0 / n)
    rep = af.dispersion(P, logits=np.zeros((3, n)))
    np.testing.assert_allclose(rep.entropy, math.log(n), rtol=1e-14)
    np.testing.assert_allclose(rep.entropy_normalized, 1.0, rtol=1e-14)
    np.testing.assert_allclose(rep.max, 1 / n)
    np.testing.assert_allclose(rep.bound_tight, 1 / n, rtol=1e-14)  # delta = 0: attained
    np.testing.assert_allclose(rep.bound_loose, 1 / n, rtol=1e-14)
    np.testing.assert_allclose(rep.sink_mass, 1 / n)
    assert np.all(af.dispersion(P, sink=3).sink_mass == pytest.approx(3 / n))
    assert np.all(np.isnan(af.dispersion(P).delta))
    E = np.eye(4)
    rep = af.dispersion(E)
    np.testing.assert_allclose(rep.entropy, 0.0, atol=0)
    np.testing.assert_allclose(rep.sink_mass, [1, 0, 0, 0])
    assert rep.mean_sink_mass == pytest.approx(0.25)
    one = af.dispersion(np.array([0.5, 0.25, 0.25]))
    assert one.max.shape == () and float(one.max) == 0.5
    d = rep.to_dict()
    assert {
        "max",
        "delta",
        "bound_tight",
        "bound_loose",
        "entropy",
        "entropy_normalized",
        "sink_mass",
        "mean_sink_mass",
    } <= set(d)


# the kernels of this file (the others: tests/test_kernels_escape.py)
CLASSIC = ("softmax", "qknorm", "ssmax", "sigmoid", "adaptive")


def test_dispersion_of_a_trajectory_and_of_a_model():
    rng = np.random.default_rng(5)
    x0 = rng.uniform(-1, 1, (30, 2))
    for kern in CLASSIC:  # the other kernels: test_kernels_escape.py
        m = af.Attention(
            np.eye(2), np.array([[1.0, 0.4], [0.0, 1.0]]), 0.5 * np.eye(2), beta=1.5, kernel=kern
        )
        traj = af.simulate(m, x0, 1.0, frame="original", method="euler", dt=0.1, ts=[0.0, 0.5, 1.0])
        rep = af.dispersion(traj, k=1)
        xk = traj.x[1]
        ref = af.dispersion(np.asarray(traj.attention(1)), logits=np.asarray(m.logits(xk)))
        for f in ("max", "delta", "entropy", "sink_mass", "bound_tight"):
            np.testing.assert_allclose(getattr(rep, f), getattr(ref, f), rtol=1e-12)
        assert rep.kernel == kern and rep.n == 30
        sub = af.dispersion(m, x=xk, rows=[3, 7, 29], block=2)
        np.testing.assert_allclose(sub.max, rep.max[[3, 7, 29]], rtol=1e-13)
        np.testing.assert_allclose(sub.delta, rep.delta[[3, 7, 29]], rtol=1e-13)
    batch = af.simulate(
        af.Attention(np.eye(2), np.eye(2), np.eye(2)),
        np.stack([x0, 0.5 * x0]),
        1.0,
        method="euler",
        dt=0.1,
    )
    rep = af.dispersion(batch)
    assert rep.max.shape == (2, 30) and rep.mean_sink_mass.shape == (2,)


@pytest.mark.parametrize(
    "call,word",
    [
        (lambda: af.dispersion(np.ones((2, 3)) / 3, logits=np.ones((2, 4))), "logits"),
        (lambda: af.dispersion(-np.ones((2, 3))), "negative"),
        (lambda: af.dispersion(np.ones((2, 3)) / 3, sink=4), "sink"),
        (lambda: af.dispersion(np.ones((2, 3)) / 3, sink=True), "sink"),
        (lambda: af.dispersion(np.ones((2, 3)) / 3, x=np.ones((3, 2))), "model"),
        (lambda: af.dispersion(af.Attention(np.eye(2), np.eye(2), np.eye(2))), "x"),
        (
            lambda: af.dispersion(af.Attention(np.eye(2), np.eye(2), np.eye(2)), x=np.ones((4, 3))),
            "x",
        ),
        (
            lambda: af.dispersion(
                af.Attention(np.eye(2), np.eye(2), np.eye(2)), x=np.ones((4, 2)), rows=[9]
            ),
            "rows",
        ),
        (lambda: af.dispersion(np.array([["a"]])), "P"),
    ],
)
def test_bad_dispersion_input(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_dispersion_scan_table():
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (512, 3))
    res = af.dispersion_scan(
        np.eye(3),
        np.eye(3),
        x,
        [4, 64, 512],
        beta=2.0,
        queries=32,
        kernel_params={"ssmax": {"s": 0.5}},
        kernels=CLASSIC,
    )
    assert res["kernels"] == list(CLASSIC) and len(res["rows"]) == 15
    for kern in ("softmax", "qknorm"):
        r = res["results"][kern]
        assert np.all(np.array(r["max"]) <= np.array(r["bound_tight"]) * (1 + 1e-12))
    assert res["results"]["qknorm"]["delta"][-1] <= 2 * 2.0 * 3
    with pytest.raises(ValueError, match="ns"):
        af.dispersion_scan(np.eye(3), np.eye(3), x, [1024])


# --------------------------------------------------------------------------- CLI
def _run(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "attnflow", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_dispersion_json_matches_the_library():
    import json

    p = _run(
        "dispersion",
        "--n",
        "16,64",
        "--kernels",
        "softmax,ssmax",
        "--d",
        "3",
        "--queries",
        "8",
        "--s",
        "0.5",
        "--x64",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)  # exactly one JSON object on stdout
    assert res["n"] == [16, 64] and res["kernels"] == ["softmax", "ssmax"]
    assert len(res["rows"]) == 4
    rng = np.random.default_rng(1)
    Q = rng.normal(size=(3, 3)) / np.sqrt(3)
    Kk = rng.normal(size=(3, 3)) / np.sqrt(3)
    x = rng.normal(size=(64, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    want = af.dispersion_scan(
        Q,
        Kk,
        x,
        [16, 64],
        kernels=["softmax", "ssmax"],
        beta=2.5,
        queries=8,
        kernel_params={"ssmax": {"s": 0.5}},
    )
    for kern in ("softmax", "ssmax"):
        for f in ("max", "bound_tight", "bound_loose", "delta", "sink_mass"):
            np.testing.assert_allclose(
                res["results"][kern][f], want["results"][kern][f], rtol=1e-12
            )
    r = res["results"]["softmax"]
    assert all(m <= b for m, b in zip(r["max"], r["bound_tight"]))


@pytest.mark.parametrize(
    "args,word",
    [
        (("--kernels", "flash"), "--kernels"),
        (("--n", "16,32,...,100"), "--n"),
        (("--sink", "40", "--n", "16,32"), "--sink"),
        (("--s", "0"), "s"),
    ],
)
def test_cli_dispersion_errors_are_one_line(args, word, capsys):
    # in this process: the options are checked before anything is computed
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["dispersion", *args])
    cap = capsys.readouterr()
    assert exc.value.code == 2
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


@pytest.mark.slow
def test_fig_dispersion_quick(tmp_path):
    import importlib
    import json
    from pathlib import Path

    mod = importlib.import_module("attnflow.experiments.fig_dispersion")
    res = mod.make(tmp_path, quick=True)
    assert len(res["figures"]) == 6 and all(Path(p).stat().st_size > 0 for p in res["figures"])
    side = json.loads(Path(res["json"]).read_text())
    assert side["quick"] is True and "versions" in side and "parameters" in side
    for kern in ("softmax", "qknorm"):
        r = side["results"]["max"]["kernels"][kern]
        assert all(m <= b * (1 + 1e-12) for m, b in zip(r["max"], r["bound_tight"]))
    from attnflow.analysis.dispersion import bound_tight

    # the extra kernels: prenorm is a softmax, so under the bound of its spread
    extra = side["results"]["max"]["kernels_extra"]
    assert set(extra) == {"linearnorm", "stickbreaking", "offbyone", "prenorm", "differential"}
    ns = side["results"]["max"]["ns"]
    for m, dl, n in zip(extra["prenorm"]["max"], extra["prenorm"]["delta"], ns, strict=True):
        assert m <= bound_tight(dl, n) * (1 + 1e-12)


# ------------------------------------------------------------- non-finite input
def test_non_finite_input_is_refused_not_reported_as_numbers():
    """A regression: NaN tokens or weights used to come back as finite statistics
    (qknorm normalised a NaN token to 0: a uniform, plausible row)."""
    P = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="P has non-finite entries"):
        af.dispersion(np.where(np.eye(2, 3, dtype=bool), np.nan, P))
    with pytest.raises(ValueError, match="logits has NaN"):
        af.dispersion(P, logits=np.array([[0.0, np.nan, 1.0], [0.0, 0.0, 0.0]]))
    x = np.random.default_rng(0).uniform(-1, 1, (5, 2))
    x[2, 1] = np.nan
    for kernel in ("softmax", "qknorm"):
        m = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel=kernel)
        with pytest.raises(ValueError, match="x has non-finite entries"):
            af.dispersion(m, x=x)
    # a masked key (logit -inf, weight 0) is a legitimate row: it is not counted, the
    # spread and the cap are those of the two kept keys (1 / (1 + 1 e^0) = 0.5)
    rep = af.dispersion(np.array([[0.5, 0.5, 0.0]]), logits=np.array([[1.0, 1.0, -np.inf]]), sink=1)
    assert rep.delta[0] == 0.0 and rep.bound_tight[0] == 0.5 and rep.max[0] == 0.5
    assert rep.kept[0] == 2 and rep.bound_holds[0]


def test_trajectory_saves_of_a_failed_system_give_nan_rows():
    """In a batch, the saves a failed system never reached are NaN: their rows are NaN
    with argmax -1, the other systems' rows are unchanged."""
    import dataclasses

    m = af.Attention(np.eye(2), np.eye(2), np.eye(2), kernel="qknorm")
    x0 = np.random.default_rng(1).uniform(-1, 1, (2, 6, 2))
    traj = af.simulate(m, x0, 1.0, ts=np.linspace(0, 1, 3))
    y = np.array(traj._y)
    y[1, -1] = np.nan
    bad = dataclasses.replace(traj, _y=jnp.asarray(y))
    rep, ref = af.dispersion(bad, k=-1), af.dispersion(traj, k=-1)
    assert np.all(np.isnan(rep.max[1])) and np.all(rep.argmax[1] == -1)
    np.testing.assert_array_equal(rep.max[0], ref.max[0])
    np.testing.assert_array_equal(rep.argmax[0], ref.argmax[0])
    with pytest.raises(IndexError, match="k = 3 is out of range for 3 saved times"):
        af.dispersion(traj, k=3)


@pytest.mark.parametrize("rows", [[0.5], [1.0, 2.5], [True, False], [np.nan]])
def test_rows_must_be_whole_indices(rows):
    """A fractional index was cast to an integer (0.5 read row 0, silently)."""
    x = np.random.default_rng(0).normal(size=(6, 3))
    m = af.Attention(np.eye(3), np.eye(3), np.eye(3))
    with pytest.raises(ValueError, match="whole query indices"):
        af.dispersion(m, x=x, rows=rows)
    np.testing.assert_array_equal(
        af.dispersion(m, x=x, rows=[1.0, 2.0]).max, af.dispersion(m, x=x, rows=[1, 2]).max
    )


@pytest.mark.parametrize("block", [-3, -1, 2.5, "8", True])
def test_block_must_be_a_whole_number_of_rows(block):
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x = np.random.default_rng(0).normal(size=(6, 2))
    with pytest.raises(ValueError, match="block must be an integer >= 0"):
        af.dispersion(m, x=x, block=block)
    with pytest.raises(ValueError, match="block must be an integer >= 0"):
        af.dispersion(af.simulate(m, x, 0.5), block=block)


def test_block_zero_and_tiles_give_the_same_report():
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x = np.random.default_rng(0).normal(size=(7, 2))
    whole, tiled = af.dispersion(m, x=x, block=0), af.dispersion(m, x=x, block=3)
    np.testing.assert_allclose(whole.max, tiled.max, rtol=1e-14)
    P = np.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="block apply to a model or trajectory"):
        af.dispersion(P, block=2)
