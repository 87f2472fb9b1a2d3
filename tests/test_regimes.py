"""predict_regime on the paper's examples and the failures; observe_limit on real runs."""

import json

import numpy as np
import pytest
import reference

import attnflow as af
from attnflow.analysis.regimes import observe_limit, predict_regime, spectral_structure

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
