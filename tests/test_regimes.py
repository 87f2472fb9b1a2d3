"""predict_regime on the paper's examples and the failures; observe_limit on real runs."""

import json

import numpy as np
import pytest
import reference

import attnflow as af
from attnflow.analysis.observe import observe_limit
from attnflow.analysis.regimes import predict_regime, spectral_structure

PAPER = af.matrices.PAPER
I2, I3 = np.eye(2), np.eye(3)

CASES = [
    ("V = I_2", I2, I2, I2, "polytope"),
    ("V = I_3", I3, I3, I3, "polytope"),
    ("V = 2.5 I_3", I3, I3, 2.5 * I3, "polytope"),
    ("paper 2x2", I2, I2, PAPER["paper-2d"], "hyperplanes"),
    ("paper 3x3 Re<0", I3, I3, PAPER["paper-3d-re-neg"], "hyperplanes"),
    ("paper 3x3 Re>0", I3, I3, PAPER["paper-3d-re-pos"], "hyperplanes"),
    ("diag(1, 1, -0.5)", I3, I3, PAPER["paranormal"], "subspace"),
    ("V = -I_3", I3, I3, -I3, "origin"),
    ("rotation", I2, I2, np.array([[0.0, -1.0], [1.0, 0.0]]), "unclassified"),
    ("negative leading", I2, I2, np.diag([-2.0, 1.0]), "unclassified"),
    ("Jordan block", I2, I2, np.array([[1.0, 1.0], [0.0, 1.0]]), "unclassified"),
    ("Q^T K indefinite", I2, np.diag([1.0, -1.0]), I2, "unclassified"),
    ("-I with Q^T K != I", I2, np.diag([1.0, 2.0]), -I2, "unclassified"),
    ("tie in modulus", I2, I2, np.diag([1.0, -1.0]), "unclassified"),
    ("d = 1", [[1.0]], [[2.0]], [[0.5]], "polytope"),
    ("d = 1, QK < 0", [[1.0]], [[-2.0]], [[0.5]], "unclassified"),
]


@pytest.mark.parametrize("name,Q,K,V,label", CASES, ids=[c[0] for c in CASES])
def test_labels(name, Q, K, V, label):
    r = predict_regime(Q, K, V)
    assert r.label == label, r.reason
    assert (r.theorem is None) == (label == "unclassified")
    assert isinstance(r.reason, str) and len(r.reason) > 20
    # spectrum sorted by decreasing modulus, as numpy computes it
    want = np.linalg.eigvals(np.asarray(V, float))
    np.testing.assert_allclose(np.sort_complex(r.eigenvalues), np.sort_complex(want), atol=1e-12)
    assert np.all(np.diff(np.abs(r.eigenvalues)) <= 1e-12)
    assert r.eigenvalues.dtype == np.complex128


def test_failing_hypothesis_is_named():
    assert "complex" in predict_regime(I2, I2, [[0.0, -1.0], [1.0, 0.0]]).reason
    assert "negative" in predict_regime(I2, I2, np.diag([-2.0, 1.0])).reason
    assert "Jordan" in predict_regime(I2, I2, [[1.0, 1.0], [0.0, 1.0]]).reason
    r = predict_regime(I2, np.diag([1.0, -1.0]), I2)
    assert "positive definite" in r.reason
    assert [h.holds for h in r.hypotheses if "Q^T K" in h.name] == [False]


def test_more_specific_theorem_is_preferred_and_said():
    r = predict_regime(I3, I3, I3)
    assert r.label == "polytope" and any("subspace" in a for a in r.also)
    # a paranormal V with one-dimensional F is the hyperplane case
    r = predict_regime(I3, I3, np.diag([2.0, 1.0, -0.5]))
    assert r.label == "hyperplanes" and any("subspace" in a for a in r.also)
    # the hyperplane theorem needs only <Q phi, K phi> > 0, not Q^T K > 0
    r = predict_regime(I2, np.diag([1.0, -1.0]), np.diag([2.0, 1.0]))
    assert r.label == "hyperplanes" and not r.also


def test_conjecture_is_mentioned_never_a_label():
    r = predict_regime(I3, I3, PAPER["paper-codim"])  # eigenvalues 1.963, 0.253, -0.222
    assert r.label == "hyperplanes" and "conjecture" in r.reason
    r = predict_regime(I3, I3, np.array([[1.0, 1.0, 0], [0, 1.0, 0], [0, 0, 0.5]]))
    assert r.label == "unclassified" and "conjecture" in r.reason


def test_left_eigenvector_and_accepts_model():
    V = PAPER["paper-3d-re-pos"]
    st = spectral_structure(V)
    lam = st.lambda1.real
    np.testing.assert_allclose(st.phi1_left @ V, lam * st.phi1_left, atol=1e-12)
    np.testing.assert_allclose(V @ st.phi1, lam * st.phi1, atol=1e-12)
    assert st.phi1_left @ st.phi1 == pytest.approx(1.0)
    # independent: numpy's left eigenvector, normalised the same way
    w, L = np.linalg.eig(V.T)
    left = L[:, np.argmax(w.real)].real
    np.testing.assert_allclose(st.phi1_left, left / (left @ st.phi1), atol=1e-10)
    assert predict_regime(af.Attention(I3, I3, V)).label == "hyperplanes"


@pytest.mark.parametrize(
    "args,word",
    [
        ((I2, I2, np.ones((2, 3))), "V"),
        ((I2, np.eye(3), I2), "K"),
        ((np.full((2, 2), np.nan), I2, I2), "Q"),
        ((I2, I2, [[np.inf, 0], [0, 1]]), "V"),
        ((I2, I2, 1j * I2), "V"),
    ],
)
def test_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        predict_regime(*args)


def _run(Q, K, V, t1, frame="rescaled", seed=0, n=16):
    d = np.asarray(V).shape[0]
    x0 = np.random.default_rng(seed).uniform(-5, 5, (n, d))
    ts = np.linspace(0, t1, 49)
    return af.simulate(af.Attention(Q, K, V), x0, t1, ts=ts, frame=frame)


def test_observe_polytope():
    traj = _run(I2, I2, I2, 12.0)
    obs = observe_limit(traj)
    assert obs.label == "polytope" and obs.n_clusters >= 2
    # independent check: every token ends within 1e-2 of a limit point, and each limit
    # point c satisfies the theorem's set condition |c|^2 = max_s <c, s> (Q = K = I)
    z = np.asarray(traj.z[-1])
    C = np.asarray(obs.details["limit_points"])
    assert np.linalg.norm(z[:, None] - C[None], axis=-1).min(axis=1).max() < 0.05
    gap = (C @ C.T).max(axis=1) - (C * C).sum(axis=1)
    assert np.all(gap <= 1e-3 * np.abs(C).max() ** 2)


def test_observe_hyperplanes_against_numpy_left_eigenvector():
    V = PAPER["paper-2d"]
    traj = _run(I2, I2, V, 12.0)
    obs = observe_limit(traj)
    assert obs.label == "hyperplanes"
    w, L = np.linalg.eig(V.T)
    left = L[:, np.argmax(w.real)].real
    levels = np.asarray(traj.z[-1]) @ left
    a, b = levels.min(), levels.max()
    near = np.minimum(np.minimum(abs(levels - a), abs(levels - b)), abs(levels))
    assert near.max() < 1e-2 * max(abs(a), abs(b))
    assert obs.n_clusters <= 3


def test_observe_subspace_and_origin_and_not_converged():
    obs = observe_limit(_run(I3, I3, PAPER["paranormal"], 12.0))
    assert obs.label == "subspace"
    obs = observe_limit(_run(I2, I2, -I2, 60.0, frame="original"))
    assert obs.label == "origin" and obs.details["ratio"] < 0.2
    obs = observe_limit(_run(I2, I2, np.array([[0.0, -1.0], [1.0, 0.0]]), 6.0))
    assert obs.label == "not-converged"
    obs = observe_limit(_run(I2, I2, I2, 0.5))  # far too short
    assert obs.label == "not-converged"


def test_observe_levels_in_solver_coordinates_when_negative_modes_diverge():
    """V = S diag(2, -1.7) S^-1: in the rescaled frame the -1.7 mode grows like
    (1 - 0.17)^-k (~1e16 after 200 layers), so phi_1*(z) read off the standard-basis z
    is swamped by that product's rounding and looks as if it still moved. Measured in
    the solver's modal state the levels are exact: they match a numpy Euler transformer
    in the original frame, where phi_1*(z^k) = phi_1*(x^k) / (1 + 2 dt)^k."""
    S = np.array([[1.0, 0.6], [0.3, 1.0]])
    V = S @ np.diag([2.0, -1.7]) @ np.linalg.inv(S)
    x0 = np.random.default_rng(3).uniform(-1, 1, (20, 2))
    dt, layers = 0.1, 200
    traj = af.simulate(
        af.Attention(I2, I2, V),
        x0,
        dt * layers,
        method="euler",
        dt=dt,
        ts=np.linspace(0, dt * layers, 11),
    )
    assert traj.coords == "modal"
    assert np.abs(np.asarray(traj.state[-1])).max() > 1e14  # the diverging mode
    left = np.linalg.inv(S)[0]  # left eigenvector of lambda_1 = 2
    xs = reference.euler_original(x0, I2, I2, V, dt, layers)
    k = np.arange(0, layers + 1, 20)
    ref = (xs[k] @ left) / (1 + 2 * dt) ** k[:, None]
    got = np.asarray(traj.project(left[None]))[..., 0]
    assert np.abs(got - ref).max() < 1e-9 * np.abs(ref).max()
    obs = observe_limit(traj)
    assert obs.label == "hyperplanes", obs.reason
    assert obs.details["moving"] < 1e-6
    # the same functional through the standard-basis z is off by far more
    naive = np.asarray(traj.z[-1]) @ left
    assert np.abs(naive - ref[-1]).max() > 1e3 * np.abs(got[-1] - ref[-1]).max()


def test_project_matches_z_without_divergence():
    traj = _run(I3, I3, PAPER["paper-3d-re-neg"], 3.0)
    P = np.random.default_rng(0).standard_normal((2, 3))
    want = np.asarray(traj.z) @ P.T
    got = np.asarray(traj.project(P))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-8 * np.abs(want).max())
    with pytest.raises(ValueError, match="P must have 3 columns"):
        traj.project(np.ones((2, 2)))
    with pytest.raises(ValueError, match="system="):
        traj.project(P, system=0)


def test_observe_one_system_of_a_batch():
    """system=i reads only that system, and matches the batch's own slice and the
    same system solved alone."""
    V = PAPER["paper-2d"]
    x0 = np.random.default_rng(7).uniform(-5, 5, (3, 16, 2))
    ts = np.linspace(0, 12.0, 49)
    batch = af.simulate(af.Attention(I2, I2, V), x0, 12.0, ts=ts)
    left = np.linalg.inv(np.linalg.eig(V)[1])[np.argmax(np.linalg.eigvals(V).real)]
    whole = np.asarray(batch.project(left[None]))
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(batch.project(left[None], system=i)), whole[i])
        obs = observe_limit(batch, system=i)
        one = observe_limit(af.simulate(af.Attention(I2, I2, V), x0[i], 12.0, ts=ts))
        assert obs.label == one.label == "hyperplanes"
        np.testing.assert_allclose(
            obs.details["levels"], one.details["levels"], rtol=1e-8, atol=1e-8
        )


def test_classify_cli(capsys):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["classify", "--V", "paranormal", "--json"])
    assert exc.value.code == 0
    res = json.loads(capsys.readouterr().out)
    assert res["label"] == "subspace" and res["prediction"]["structure"] == "paranormal"
    assert res["eigenvalues"]["real"][0] == pytest.approx(1.0)
    with pytest.raises(SystemExit) as exc:
        main(["classify", "--V", "paper-2d", "--simulate", "--n", "10", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert res["agree"] is True and res["observation"]["label"] == "hyperplanes"
    with pytest.raises(SystemExit) as exc:
        main(["classify", "--V", "nope"])
    assert exc.value.code == 2


# ---------------------------------------------------------------------- Label
def test_label_is_a_string_enum_that_serialises_as_its_name():
    from attnflow.analysis.regimes import LABELS, Label
    from attnflow.io.serialize import to_jsonable

    assert Label.POLYTOPE == "polytope" and Label.NOT_CONVERGED == "not-converged"
    assert [str(x) for x in LABELS] == [
        "polytope",
        "hyperplanes",
        "subspace",
        "origin",
        "unclassified",
    ]
    r = predict_regime(I2, I2, PAPER["paper-2d"])
    assert r.label is Label.HYPERPLANES and f"{r.label:<12}|" == "hyperplanes |"
    text = json.dumps(to_jsonable({r.label: r.to_dict()}))
    back = json.loads(text)
    assert list(back) == ["hyperplanes"] and back["hyperplanes"]["label"] == "hyperplanes"
    assert json.dumps([Label.ORIGIN]) == '["origin"]'
    obs = observe_limit(_run(I2, I2, I2, 0.5))
    assert obs.label is Label.NOT_CONVERGED


# -------------------------------------------------------- the one spectral decision
def _decide_by_hand(w, scale, rtol, ctol):
    """The leading-eigenvalue hypotheses written out for one spectrum (the reference)."""
    w = np.asarray(w, complex)
    w = w[np.lexsort((-w.real, -np.abs(w)))]
    l1 = w[0]
    tol = rtol * scale
    real = np.abs(l1.imag) <= tol
    centre = l1.real if real else l1
    others = [v for v in w[1:] if np.abs(v - centre) > ctol * scale]
    k = len(w) - len(others)
    rho = max((np.abs(v) for v in others), default=0.0)
    return dict(
        real=real,
        positive=real and l1.real > tol,
        simple=k == 1,
        dominant=np.abs(l1) - rho > tol,
        multiplicity=k,
        lambda2_abs=rho,
    )


def test_leading_eigenvalue_vectorised_equals_the_rules_one_by_one():
    from attnflow.analysis.regimes import leading_eigenvalue

    rng = np.random.default_rng(5)
    spectra = [np.linalg.eigvals(rng.standard_normal((4, 4))) for _ in range(300)]
    spectra += [
        np.array([3.0, -2.0, 1.0, 0.5]),
        np.array([2.0, -2.0, 1.0, 0.0]),  # tie in modulus
        np.array([2.0, 2.0, 1.0, 0.0]),  # double
        np.array([2.0, 2.0 - 1e-12, 1.0, 0.0]),  # double at sqrt(rtol), simple at rtol
        np.array([1 + 2j, 1 - 2j, 0.5, 0.1]),  # complex pair on top
        np.array([-3.0, 1.0, 0.5, 0.1]),  # negative
    ]
    W = np.stack(spectra)
    scale = np.abs(W).max(axis=1) * 1.5
    for rtol, ctol in ((1e-8, 1e-4), (1e-15, 1e-15)):
        lead = leading_eigenvalue(W, scale, rtol=rtol, cluster_rtol=ctol)
        for i, w in enumerate(spectra):
            want = _decide_by_hand(w, scale[i], rtol, ctol)
            got = {key: getattr(lead, key)[i] for key in want}
            assert got == want, (i, w, got, want)
        ref = [_decide_by_hand(w, s, rtol, ctol) for w, s in zip(spectra, scale)]
        spectral = [r["real"] and r["positive"] and r["simple"] and r["dominant"] for r in ref]
        np.testing.assert_array_equal(lead.spectral, spectral)
    # one spectrum: 0-d fields, the same decisions
    one = leading_eigenvalue(spectra[-3], scale[-3], rtol=1e-8)
    assert one.spectral.shape == () and not one.spectral and one.multiplicity == 2


def test_predict_regime_and_spectral_structure_use_the_one_decision():
    from attnflow.analysis.regimes import leading_eigenvalue

    rng = np.random.default_rng(11)
    for _ in range(200):
        V = rng.standard_normal((3, 3))
        st = spectral_structure(V)
        ref = leading_eigenvalue(np.linalg.eigvals(V), st.scale, rtol=1e-8)
        assert bool(ref.spectral) == bool(st.leading.spectral)
        # "simple" structure <=> the hypothesis holds (no Jordan block for a simple root)
        assert (st.kind == "simple") == bool(ref.spectral)
        if st.kind == "simple":
            assert st.rho_G == pytest.approx(float(ref.lambda2_abs), rel=0, abs=0)


# ------------------------------------------------------------- overflow safety
@pytest.mark.parametrize("c", [1e154, 1e200, 1e300, 1e-200, 1e-300])
def test_scale_does_not_change_the_prediction(c):
    """A regression: past ~1e154 the norm of V - cI overflowed and `inf <= rtol * inf`
    called any V "V = c I, polytope"; tiny entries underflowed the same way."""
    for V, label in (
        (PAPER["paper-2d"], "hyperplanes"),
        (np.array([[1.0, 1.0], [0.0, 1.0]]), "unclassified"),
        (np.array([[0.0, -1.0], [1.0, 0.0]]), "unclassified"),
        (I2, "polytope"),
    ):
        r = predict_regime(I2, I2, c * np.asarray(V))
        assert r.label == label, (c, r.reason)
        assert predict_regime(I2, I2, V).label == label
    # Q and K of any scale: Q^T K of 1e400 is not representable, the decision is
    r = predict_regime(c * I2, c * I2, I2)
    assert r.label == "polytope", r.reason
    r = predict_regime(c * I2, c * np.diag([1.0, -1.0]), I2)
    assert r.label == "unclassified" and "positive definite" in r.reason
    r = predict_regime(c * I2, c * I2, -I2)
    assert r.label == "origin"
    s = [h.value for h in r.hypotheses if h.name.startswith("Q^T K")][0]
    assert s == pytest.approx(c * c, rel=1e-12, abs=0)  # inf past the float range
    r = predict_regime(c * I2, np.eye(2), PAPER["paper-2d"])
    qk = [h.value for h in r.hypotheses if h.name.startswith("<Q phi_1")][0]
    want = predict_regime(I2, I2, PAPER["paper-2d"]).hypotheses[-1].value
    assert r.label == "hyperplanes" and qk == pytest.approx(c * want, rel=1e-12)


def test_unscaled_decisions_are_bit_identical():
    """Matrices of ordinary size are not rescaled: the reported numbers are those of the
    matrix itself (the spectrum straight from numpy)."""
    V = PAPER["paper-3d-re-pos"]
    r = predict_regime(I3, 2 * I3, V)
    np.testing.assert_array_equal(
        np.sort_complex(r.eigenvalues), np.sort_complex(np.linalg.eigvals(V))
    )
    assert r.hypotheses[-1].value == float((I3 @ r.structure.phi1) @ (2 * I3 @ r.structure.phi1))


# -------------------------------------------------------------- observe_limit
def test_observe_limit_refuses_what_is_not_a_trajectory():
    with pytest.raises(ValueError, match="traj must be an attnflow.Trajectory"):
        observe_limit(np.zeros((3, 4, 2)))
    traj = _run(I2, I2, I2, 1.0)
    with pytest.raises(ValueError, match="tol"):
        observe_limit(traj, tol=-1.0)
    with pytest.raises(ValueError, match="move_tol"):
        observe_limit(traj, move_tol=float("nan"))
    x0 = np.random.default_rng(0).uniform(-1, 1, (2, 5, 2))
    batch = af.simulate(af.Attention(I2, I2, I2), x0, 1.0, ts=np.linspace(0, 1, 5))
    with pytest.raises(IndexError, match="system = 2 is out of range"):
        observe_limit(batch, system=2)


def _clusters_by_hand(points, tol):
    """The former hand-written single-linkage search (the reference for csgraph)."""
    n = points.shape[0]
    labels = -np.ones(n, dtype=int)
    D = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    c = 0
    for i in range(n):
        if labels[i] >= 0:
            continue
        stack = [i]
        labels[i] = c
        while stack:
            j = stack.pop()
            for k in np.flatnonzero((D[j] <= tol) & (labels < 0)):
                labels[k] = c
                stack.append(k)
        c += 1
    return labels, np.stack([points[labels == j].mean(axis=0) for j in range(c)])


def test_clusters_are_the_connected_components_of_the_old_search():
    from attnflow.analysis.observe import clusters

    rng = np.random.default_rng(2)
    for trial in range(60):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 4))
        centres = rng.uniform(-1, 1, (int(rng.integers(1, 6)), k))
        pts = centres[rng.integers(0, len(centres), n)] + 1e-3 * rng.standard_normal((n, k))
        tol = [1e-4, 1e-2, 0.3][trial % 3]
        lab, cen = clusters(pts, tol)
        ref_lab, ref_cen = _clusters_by_hand(pts, tol)
        np.testing.assert_array_equal(lab, ref_lab)
        np.testing.assert_array_equal(cen, ref_cen)


def test_phi1_sign_convention_is_pinned():
    """phi_1 does not depend on the sign an SVD returns: its entry of largest modulus is
    positive, for V and for every orthogonal similarity of V (whose SVDs differ)."""
    rng = np.random.default_rng(12)
    V = np.diag([1.9, 0.4, -0.3]) + 0.1 * rng.normal(size=(3, 3))
    for _ in range(10):
        Qo, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        st = af.spectral_structure(Qo @ V @ Qo.T)
        top = int(np.argmax(np.abs(st.phi1)))
        assert st.phi1[top] > 0
        np.testing.assert_allclose(st.phi1_left @ st.phi1, 1.0, rtol=1e-12)
        # the same line as Qo's image of V's own phi_1, with the convention's sign
        ref = Qo @ af.spectral_structure(V).phi1
        ref = ref if ref[np.argmax(np.abs(ref))] > 0 else -ref
        np.testing.assert_allclose(st.phi1, ref, atol=1e-10)


def test_planar_hull_distances_equal_scipy_convex_hull():
    """observe_limit's hull in the plane (by hand, Andrew's monotone chain) gives every
    point's distance to the hull's boundary as scipy's Qhull facets do: random clouds,
    integer lattices with repeated and collinear points, rings."""
    from scipy.spatial import ConvexHull

    from attnflow.analysis.observe import _planar_hull_facets

    rng = np.random.default_rng(0)
    clouds = []
    for _ in range(20):
        n = int(rng.integers(3, 60))
        t = rng.uniform(0, 2 * np.pi, n)
        clouds += [
            rng.normal(size=(n, 2)) * [1.0, 1e-3],  # thin
            rng.integers(-3, 4, size=(n + 5, 2)).astype(float),  # repeats, collinear
            np.c_[np.cos(t), np.sin(t)] * rng.uniform(0.5, 1.0, (n, 1)),
        ]
    for Y in clouds:
        eq = ConvexHull(Y).equations
        want = np.maximum(-(Y @ eq[:, :-1].T + eq[:, -1]).min(axis=1), 0.0)
        normals, offsets = _planar_hull_facets(Y)
        got = np.maximum(-(Y @ normals.T + offsets).min(axis=1), 0.0)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * np.abs(Y).max())
        assert np.allclose(np.linalg.norm(normals, axis=1), 1.0)
