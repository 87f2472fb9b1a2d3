"""Observables on the sphere against plain numpy, scipy and closed forms; the equiangular
curve against simulations of orthogonal starts; special starts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components
from scipy.stats import ortho_group

import attnflow as af


def _clumpy_tokens(rng, b, m, n, d):
    """Tokens in a few tight clumps (so thresholds near 1 matter), not normalised."""
    centres = rng.normal(size=(b, m, 3, d))
    pick = rng.integers(0, 3, size=(b, m, n))
    x = np.take_along_axis(centres, pick[..., None], axis=2)
    return (x + 0.01 * rng.normal(size=x.shape)) * rng.uniform(0.5, 2.0, size=(b, m, n, 1))


def test_clustered_fraction_and_count_against_loops():
    rng = np.random.default_rng(0)
    x = _clumpy_tokens(rng, 3, 4, 12, 3)
    thr = 0.99
    frac = af.clustered_fraction(x, threshold=thr)
    cnt = af.count_clusters(x, threshold=thr)
    assert frac.shape == (3, 4) and cnt.shape == (3, 4)
    for b in range(3):
        for m in range(4):
            u = x[b, m] / np.linalg.norm(x[b, m], axis=-1, keepdims=True)
            pairs = [(i, j) for i in range(12) for j in range(12) if i != j]
            want = sum(float(u[i] @ u[j]) > thr for i, j in pairs) / len(pairs)
            assert frac[b, m] == pytest.approx(want, abs=1e-15)
            c, _ = connected_components(u @ u.T > thr, directed=False)
            assert cnt[b, m] == c
    # one system: (m,)
    assert np.array_equal(af.count_clusters(x[1]), af.count_clusters(x)[1])
    # a path graph (chain of close neighbours) is one component: closure, not adjacency
    ang = np.arange(10) * 0.03
    chain = np.stack([np.cos(ang), np.sin(ang)], -1)[None]
    assert af.count_clusters(chain, threshold=math.cos(0.031))[0] == 1
    assert af.clustered_fraction(chain, threshold=math.cos(0.031))[0] == pytest.approx(18 / 90)
    with pytest.raises(ValueError, match="threshold"):
        af.clustered_fraction(x, threshold=1.0)
    with pytest.raises(ValueError, match="n >= 2"):
        af.count_clusters(x[:, :, :1])


@pytest.mark.parametrize("thr", [0.999, 0.99, 0.9, 0.0, -0.5])
def test_count_clusters_on_the_circle_sorts_and_equals_the_graph(thr):
    # the d = 2 path sorts by angle; the graph's components (scipy) are the reference,
    # over clumps (some straddling the angle's cut at pi), spread tokens and tight arcs
    rng = np.random.default_rng(7)
    ang = []
    for k in range(40):
        c = rng.uniform(-np.pi, np.pi, rng.integers(1, 6))
        if k % 4 == 0:
            c[0] = np.pi - 1e-3  # a clump across the cut
        pick = rng.integers(0, c.size, 25)
        ang.append(c[pick] + rng.normal(scale=10 ** rng.uniform(-4, -0.5), size=25))
    ang.append(np.linspace(0.0, 3.5, 25))  # one arc longer than pi
    ang.append(np.repeat([0.0, np.pi], [12, 13]))  # antipodal clusters
    ang = np.array(ang)
    x = np.stack([np.cos(ang), np.sin(ang)], -1) * rng.uniform(0.5, 2.0, ang.shape)[..., None]
    got = af.count_clusters(x[None], threshold=thr)[0]
    for m in range(ang.shape[0]):
        u = x[m] / np.linalg.norm(x[m], axis=-1, keepdims=True)
        c, _ = connected_components(u @ u.T > thr, directed=False)
        assert got[m] == c, (m, thr)


def test_interaction_energy_against_sum_and_monotone_under_usa():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 7, 3))
    beta = 3.0
    E = af.interaction_energy(x, beta)
    u = x / np.linalg.norm(x, axis=-1, keepdims=True)
    for b in range(2):
        for m in range(5):
            s = sum(
                math.exp(beta * float(u[b, m, i] @ u[b, m, j])) for i in range(7) for j in range(7)
            )
            assert E[b, m] == pytest.approx(s / (2 * beta * 49), rel=1e-13)
    # Q = K = V = I, USA: a gradient ascent of E_beta, so E never decreases; bounds [1, e^beta]
    I3 = np.eye(3)
    model = af.Attention(I3, I3, I3, beta=beta, kernel="usa")
    ts = np.linspace(0, 10, 41)
    traj = af.simulate(
        model, rng.normal(size=(7, 3)), 10.0, ts=ts, frame="sphere", rtol=1e-10, atol=1e-12
    )
    e = af.interaction_energy(traj, beta)
    assert np.all(np.diff(e) >= -1e-12) and e[-1] > e[0]
    assert np.all(2 * beta * e >= 1 - 1e-12) and np.all(
        2 * beta * e <= math.exp(beta) * (1 + 1e-12)
    )


@pytest.mark.parametrize(("kernel", "n", "d", "beta"), [("usa", 4, 6, 1.0), ("softmax", 5, 7, 3.0)])
def test_equiangular_curve_matches_orthogonal_start(kernel, n, d, beta):
    ts = np.linspace(0.0, 12.0, 13)
    x0 = ortho_group.rvs(d, random_state=3)[:n]  # n orthonormal rows, not the basis
    I = np.eye(d)
    model = af.Attention(I, I, I, beta=beta, kernel=kernel)
    traj = af.simulate(model, x0, 12.0, ts=ts, frame="sphere", rtol=1e-12, atol=1e-14)
    assert traj.ok
    G = np.einsum("mid,mjd->mij", traj.x, traj.x)
    off = ~np.eye(n, dtype=bool)
    gamma = af.equiangular_curve(n, beta, ts, kernel=kernel)
    assert gamma[0] == 0 and np.all(np.diff(gamma) >= 0) and gamma.max() <= 1
    # every pair follows the same curve
    assert np.abs(G[:, off] - gamma[:, None]).max() < 1e-8


def test_equiangular_rate_closed_form_and_time():
    # at gamma = 0: rate = 2 / (e^beta + n - 1) (SA), 2 / n (USA)
    n, beta = 7, 1.7
    g = af.equiangular_curve(n, beta, [0.0, 1e-6])
    assert g[1] / 1e-6 == pytest.approx(2 / (math.exp(beta) + n - 1), rel=1e-5)
    g = af.equiangular_curve(n, beta, [0.0, 1e-6], kernel="usa")
    assert g[1] / 1e-6 == pytest.approx(2 / n, rel=1e-5)
    t = af.equiangular_time(n, beta, 0.999)
    assert af.equiangular_curve(n, beta, [0.0, t])[1] == pytest.approx(0.999, abs=1e-9)
    with pytest.raises(ValueError, match="beta"):
        af.equiangular_curve(n, 0.0, [0.0, 1.0])


def test_wendel_closed_forms_and_monte_carlo():
    assert af.wendel_probability(3, 3) == 1.0 and af.wendel_probability(5, 9) == 1.0
    for n in range(1, 9):  # d = 2: n / 2^(n-1)
        assert af.wendel_probability(n, 2) == pytest.approx(n / 2 ** (n - 1), rel=1e-15)
    # Monte Carlo on the circle: in an open half-plane iff the largest angular gap > pi
    rng = np.random.default_rng(4)
    ang = np.sort(rng.uniform(0, 2 * np.pi, size=(40_000, 5)), axis=1)
    gaps = np.diff(np.concatenate([ang, ang[:, :1] + 2 * np.pi], axis=1), axis=1)
    mc = float(np.mean(gaps.max(axis=1) > np.pi))
    assert mc == pytest.approx(af.wendel_probability(5, 2), abs=0.01)


def test_antipodal_pair_is_stationary():
    """x_2 = -x_1: each sees the other at <x_1, x_2> = -1, the field is parallel to x_i,
    its tangent part is 0, so the pair never moves (for every beta and kernel)."""
    I = np.eye(3)
    x0 = np.array([[0.6, 0.0, 0.8], [-0.6, 0.0, -0.8]])
    model = af.Attention(I, I, I, beta=4.0)
    tr = af.simulate(model, x0, 50.0, frame="sphere")
    assert tr.ok and np.abs(np.asarray(tr.x[-1]) - x0).max() < 1e-14
    usa = af.Attention(I, I, I, beta=4.0, kernel="usa")
    post = af.simulate(usa, x0, 50.0, frame="sphere", method="euler", dt=0.1)
    assert post.ok and np.abs(np.asarray(post.x[-1]) - x0).max() < 1e-14


def test_phase_diagram_matches_a_numpy_loop():
    """studies.sphere.phase_diagram (all betas in one compiled call) against the authors'
    post-LN scheme in plain numpy on the same starts."""
    import jax

    from attnflow.studies.sphere import phase_diagram

    betas, s, n, d, dt = np.array([0.5, 2.0, 6.0]), 8, 6, 3, 0.1
    V = np.eye(d) + 0.3 * np.random.default_rng(5).normal(size=(d, d))
    kw = dict(n=n, d=d, systems=s, t1=2.0, dt=dt, save_every=5, V=V, threshold=0.99)
    pdg = phase_diagram(betas, **kw)  # one beta at a time (the default)
    blocks = phase_diagram(betas, **kw, beta_batch=2)  # vmapped blocks of two betas
    np.testing.assert_array_equal(blocks.fraction, pdg.fraction)
    np.testing.assert_array_equal(blocks.one_cluster, pdg.one_cluster)
    assert pdg.fraction.shape == (3, 5) and np.allclose(pdg.ts, [0, 0.5, 1.0, 1.5, 2.0])
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    off = ~np.eye(n, dtype=bool)
    for i, beta in enumerate(betas):
        x = np.asarray(jax.random.normal(keys[i], (s, n, d), dtype=np.float64))
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
        fr = []
        for k in range(21):
            if k % 5 == 0:
                G = np.einsum("sid,sjd->sij", x, x)
                fr.append(np.mean(G[:, off] > 0.99))
            if k < 20:
                L = beta * np.einsum("sid,sjd->sij", x, x)
                P = np.exp(L - L.max(-1, keepdims=True))
                P /= P.sum(-1, keepdims=True)
                x = x + dt * (P @ x) @ V.T
                x = x / np.linalg.norm(x, axis=-1, keepdims=True)
        np.testing.assert_allclose(pdg.fraction[i], fr, atol=1e-15)
    assert pdg.fraction[-1, -1] >= pdg.fraction[-1, 0]


def test_phase_diagram_skips_clustered_systems_exactly():
    """Skipping the systems whose every pair is clustered gives the fractions of stepping
    every system (V = I, post-LN, the default where it applies), refuses where a
    clustered system need not stay clustered, and rests on an invariant checked here in
    numpy: a positive combination of unit vectors with pairwise inner products >= c > 0
    has, after normalisation, pairwise inner products >= c."""
    from attnflow.studies.sphere import phase_diagram

    betas = np.array([0.5, 1.5, 4.0, 9.0])
    kw = dict(n=6, d=3, systems=40, t1=6.0, dt=0.1, save_every=5, threshold=0.99)
    full = phase_diagram(betas, **kw, skip_clustered=False)
    skip = phase_diagram(betas, **kw, chunk=8)  # 5 chunks of 8: some skipped, some not
    np.testing.assert_array_equal(skip.fraction, full.fraction)
    np.testing.assert_array_equal(skip.one_cluster, full.one_cluster)
    # the run must have had clustered systems to skip and others still moving
    assert 0 < full.one_cluster[0, -1] and full.one_cluster[-1, -1] < 1
    odd = phase_diagram(betas, **kw, chunk=7)  # 40 systems in chunks of 7: padded
    np.testing.assert_array_equal(odd.fraction, full.fraction)
    with pytest.raises(ValueError, match="skip_clustered=True needs V = I"):
        phase_diagram(betas, **kw, V=2 * np.eye(3), skip_clustered=True)
    with pytest.raises(ValueError, match="layernorm='pre'"):
        phase_diagram(betas, **kw, layernorm="pre", skip_clustered=True)

    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.normal(size=(5, 4)) * 0.05 + rng.normal(size=4)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        c = (x @ x.T).min()
        y = rng.uniform(0, 1, (5, 5)) @ x  # positive combinations
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        assert c > 0 and (y @ y.T).min() >= c - 1e-12


@pytest.mark.parametrize("layernorm", ["post", "pre", "ngpt"])
def test_phase_diagram_in_the_span_of_the_start_equals_the_run_in_rd(layernorm):
    """d > n with Q = K = V = I: the run in the n-dimensional span of each start (the
    default there) gives the fractions of the run in R^d; the invariants it rests on are
    checked in numpy (the layer keeps the tokens in the span of the start and commutes
    with a rotation)."""
    from attnflow.studies.sphere import phase_diagram

    betas = np.array([0.5, 3.0, 9.0])
    kw = dict(n=6, d=40, systems=24, t1=20.0, dt=0.1, save_every=20, threshold=0.99)
    kw["layernorm"] = layernorm
    full = phase_diagram(betas, **kw, in_span=False)
    span = phase_diagram(betas, **kw)
    np.testing.assert_array_equal(span.fraction, full.fraction)
    np.testing.assert_array_equal(span.one_cluster, full.one_cluster)
    # partly clustered runs, where a miscounted pair would show
    assert np.any((full.fraction > 0) & (full.fraction < 1)) and full.fraction.max() == 1
    with pytest.raises(ValueError, match="in_span=True needs Q = K = V = I"):
        phase_diagram(betas, **kw, V=np.eye(40), in_span=True)

    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 40))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    R = np.linalg.qr(rng.normal(size=(40, 40)))[0]

    def layer(x):
        L = 3.0 * x @ x.T
        P = np.exp(L - L.max(1, keepdims=True))
        y = x + 0.1 * (P / P.sum(1, keepdims=True)) @ x
        return y / np.linalg.norm(y, axis=1, keepdims=True)

    np.testing.assert_allclose(layer(x @ R), layer(x) @ R, atol=1e-14)
    U = np.linalg.qr(x.T)[0]  # an orthonormal basis of the start's span
    y = layer(layer(x))
    np.testing.assert_allclose(y @ U @ U.T, y, atol=1e-14)


def test_wendel_at_large_n_against_the_binomial_tail():
    """The sum is the binomial tail P(Bin(n - 1, 1/2) <= d - 1): against scipy's
    incomplete-beta form at sizes where the exact sum has 20,000 terms."""
    from scipy.special import bdtr

    for n, d in ((20000, 20000), (20000, 9900), (20000, 10100), (4096, 100), (301, 150)):
        ref = float(bdtr(min(d, n) - 1, n - 1, 0.5))
        assert af.wendel_probability(n, d) == pytest.approx(ref, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(("beta", "kernel"), [(50.0, "usa"), (30.0, "usa"), (1.0, "softmax")])
def test_equiangular_curve_at_large_beta_inverts_the_time_integral(beta, kernel):
    """At large beta USA's gamma jumps from near 0 to 1 within less than the spacing of
    the floats around t (the ODE solve cannot step): the curve then inverts the time
    integral, and at t = equiangular_time(level) it is at the level (quad in gamma
    against brentq in log(1 - gamma)); 1 afterwards, 0 at t = 0."""
    # past gamma ~ 1 / beta the rest of USA's climb takes less than the float spacing of
    # t: only the levels before it have distinguishable times
    levels = (0.3, 0.9, 0.999) if kernel == "softmax" else (0.002, 0.01)
    for level in levels:
        t_star = af.equiangular_time(32, beta, level, kernel=kernel)
        g = af.equiangular_curve(32, beta, [0.0, t_star, 10 * t_star + 20], kernel=kernel)
        assert g[0] == 0.0 and g[2] == pytest.approx(1.0, abs=1e-12)
        assert g[1] == pytest.approx(level, rel=1e-8)


def test_a_zero_token_is_refused_by_name_not_counted_as_unreached():
    """A zero token has no direction: the observables say so (count_clusters returned -1,
    the code of a save never reached)."""
    x = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]] * 2)
    x[1, 2] = 0.0
    with pytest.raises(ValueError, match=r"zero token \(save 1, token 2\)"):
        af.count_clusters(x)
    with pytest.raises(ValueError, match="zero token"):
        af.clustered_fraction(x[None])
    # NaN saves (never reached) still count as -1
    x[1] = np.nan
    np.testing.assert_array_equal(af.count_clusters(x), [3, -1])


def test_observe_limit_on_the_sphere_uses_no_theorem_label():
    """On the sphere every token is on the boundary of the hull, so the polytope test
    would always pass: observe_limit says that the theorems' labels do not apply, and
    counts the clusters of the unit tokens instead."""
    model = af.Attention(np.eye(3), np.eye(3), np.eye(3), beta=1.0)
    x0 = np.random.default_rng(3).normal(size=(6, 3))
    ts = np.linspace(0.0, 60.0, 13)
    traj = af.simulate(model, x0, 60.0, ts=ts, frame="sphere")
    obs = af.observe_limit(traj)
    assert obs.label == "unclassified" and "do not apply" in obs.reason
    assert obs.details["structure"] == "sphere"
    # one cluster (d = 3, V = I), the same as count_clusters at a tight threshold
    assert obs.n_clusters == 1 == af.count_clusters(traj, threshold=0.99)[-1]
    early = af.simulate(model, x0, 0.5, ts=np.linspace(0, 0.5, 3), frame="sphere")
    assert af.observe_limit(early).label == "not-converged"
