"""Checkpoint layouts (``attnflow.io.layouts``): a small synthetic checkpoint written in
each exact Hugging Face layout, its heads equal to the weights written (numpy), each
head's attention equal to a hand-written numpy attention of that architecture, the
unknown-layout error, and ``attnflow heads --checkpoint PATH`` on every layout.

The layouts written (tensor names and config keys as transformers saves them):

- ALBERT (``AlbertForMaskedLM``, prefix ``albert.``): ``albert.embeddings.{word,position,
  token_type}_embeddings.weight`` ``(V, E)``, ``albert.embeddings.LayerNorm.{weight,bias}``,
  ``albert.encoder.embedding_hidden_mapping_in.{weight,bias}`` ``(H, E)``,
  ``albert.encoder.albert_layer_groups.0.albert_layers.0.attention.{query,key,value,dense}
  .{weight,bias}`` ``(H, H)``, ``...attention.LayerNorm``, ``...ffn``, ``...ffn_output``,
  ``...full_layer_layer_norm``, ``predictions.*``; config ``model_type: albert``,
  ``embedding_size``, ``hidden_size``, ``num_attention_heads``, ``num_hidden_layers``,
  ``num_hidden_groups``, ``inner_group_num``.
- GPT-2 (``GPT2LMHeadModel``): ``wte.weight``, ``wpe.weight``, ``h.L.ln_1.{weight,bias}``,
  ``h.L.attn.c_attn.{weight (d, 3d), bias (3d,)}``, ``h.L.attn.c_proj.{weight (d, d),
  bias}``, ``h.L.attn.bias`` (the causal buffer of old files), ``h.L.ln_2``,
  ``h.L.mlp.c_fc.weight (d, 4d)``, ``h.L.mlp.c_proj.weight (4d, d)``, ``ln_f``; config
  ``model_type: gpt2``, ``n_embd``, ``n_head``, ``n_layer``, ``n_positions``,
  ``layer_norm_epsilon``, ``scale_attn_weights``.
- Llama-style (``Qwen3ForCausalLM``, ``LlamaForCausalLM``, ``Olmo2ForCausalLM``):
  ``model.embed_tokens.weight``, ``model.layers.L.input_layernorm.weight``,
  ``model.layers.L.self_attn.{q,k,v,o}_proj.weight`` (q ``(n_h d_h, d)``, k and v
  ``(n_kv d_h, d)``, o ``(d, n_h d_h)``), Qwen3's ``model.layers.L.self_attn.{q,k}_norm
  .weight`` ``(d_h,)`` or OLMo-2's ``(n_h d_h,)`` and ``(n_kv d_h,)``,
  ``model.layers.L.post_attention_layernorm.weight``, ``model.layers.L.mlp.{gate,up,down}
  _proj.weight``, ``model.norm.weight``, ``lm_head.weight``; config ``model_type``,
  ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``rope_theta`` (or ``rope_parameters``), ``rope_scaling``, ``rms_norm_eps``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.io import checkpoints as C
from attnflow.io.layouts import TrainedHead, detect_layout, load_heads
from attnflow.studies.heads import analyze_heads

RNG = np.random.default_rng(7)


def f32(*shape, sd=0.5):
    return (sd * RNG.standard_normal(shape)).astype(np.float32)


def write(folder: Path, tensors: dict, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    C.write_safetensors(folder / "model.safetensors", tensors, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def softmax_rows(L):
    e = np.exp(L - L.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------ the checkpoints
def albert(folder: Path, E=6, H=8, heads=2, layers=3):
    P, G = "albert.", "albert.encoder.albert_layer_groups.0.albert_layers.0."
    t = {
        P + "embeddings.word_embeddings.weight": f32(30, E),
        P + "embeddings.position_embeddings.weight": f32(16, E),
        P + "embeddings.token_type_embeddings.weight": f32(2, E),
        P + "embeddings.LayerNorm.weight": f32(E),
        P + "embeddings.LayerNorm.bias": f32(E),
        P + "encoder.embedding_hidden_mapping_in.weight": f32(H, E),
        P + "encoder.embedding_hidden_mapping_in.bias": f32(H),
        G + "ffn.weight": f32(4 * H, H),
        G + "ffn.bias": f32(4 * H),
        G + "ffn_output.weight": f32(H, 4 * H),
        G + "ffn_output.bias": f32(H),
        G + "full_layer_layer_norm.weight": f32(H),
        G + "full_layer_layer_norm.bias": f32(H),
        G + "attention.LayerNorm.weight": f32(H),
        G + "attention.LayerNorm.bias": f32(H),
        "predictions.dense.weight": f32(E, H),
        "predictions.bias": f32(30),
    }
    for part in ("query", "key", "value", "dense"):
        t[G + f"attention.{part}.weight"] = f32(H, H)
        t[G + f"attention.{part}.bias"] = f32(H)
    cfg = {
        "architectures": ["AlbertForMaskedLM"],
        "model_type": "albert",
        "embedding_size": E,
        "hidden_size": H,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_hidden_groups": 1,
        "inner_group_num": 1,
        "intermediate_size": 4 * H,
        "hidden_act": "gelu_new",
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 16,
        "type_vocab_size": 2,
        "vocab_size": 30,
    }
    return write(folder, t, cfg), t


def gpt2(folder: Path, d=8, heads=2, layers=2, prefix=""):
    t = {prefix + "wte.weight": f32(30, d), prefix + "wpe.weight": f32(16, d)}
    for l in range(layers):
        p = f"{prefix}h.{l}."
        t.update(
            {
                p + "ln_1.weight": f32(d),
                p + "ln_1.bias": f32(d),
                p + "attn.c_attn.weight": f32(d, 3 * d),  # Conv1D: (in, out)
                p + "attn.c_attn.bias": f32(3 * d),
                p + "attn.c_proj.weight": f32(d, d),
                p + "attn.c_proj.bias": f32(d),
                p + "attn.bias": np.tril(np.ones((16, 16), np.float32))[None, None],
                p + "ln_2.weight": f32(d),
                p + "ln_2.bias": f32(d),
                p + "mlp.c_fc.weight": f32(d, 4 * d),
                p + "mlp.c_fc.bias": f32(4 * d),
                p + "mlp.c_proj.weight": f32(4 * d, d),
                p + "mlp.c_proj.bias": f32(d),
            }
        )
    t[prefix + "ln_f.weight"], t[prefix + "ln_f.bias"] = f32(d), f32(d)
    cfg = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": d,
        "n_head": heads,
        "n_layer": layers,
        "n_positions": 16,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": True,
        "vocab_size": 30,
    }
    return write(folder, t, cfg), t


def llama(folder: Path, kind="qwen3", d=12, heads=4, kv=2, dh=4, layers=2, **extra):
    """Qwen3 (per-head q_norm/k_norm (d_h,)), OLMo-2 (norms over all heads) or plain
    Llama; hidden 12 while heads x head_dim = 16 (the projections are not square)."""
    t = {"model.embed_tokens.weight": f32(30, d), "model.norm.weight": f32(d)}
    t["lm_head.weight"] = f32(30, d)
    for l in range(layers):
        p = f"model.layers.{l}."
        t.update(
            {
                p + "input_layernorm.weight": f32(d),
                p + "self_attn.q_proj.weight": f32(heads * dh, d),
                p + "self_attn.k_proj.weight": f32(kv * dh, d),
                p + "self_attn.v_proj.weight": f32(kv * dh, d),
                p + "self_attn.o_proj.weight": f32(d, heads * dh),
                p + "post_attention_layernorm.weight": f32(d),
                p + "mlp.gate_proj.weight": f32(20, d),
                p + "mlp.up_proj.weight": f32(20, d),
                p + "mlp.down_proj.weight": f32(d, 20),
            }
        )
        if kind == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1 + f32(dh, sd=0.3)
            t[p + "self_attn.k_norm.weight"] = 1 + f32(dh, sd=0.3)
        elif kind == "olmo2":
            t[p + "self_attn.q_norm.weight"] = 1 + f32(heads * dh, sd=0.3)
            t[p + "self_attn.k_norm.weight"] = 1 + f32(kv * dh, sd=0.3)
    arch = {"qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM", "llama": "LlamaForCausalLM"}
    cfg = {
        "architectures": [arch[kind]],
        "model_type": kind,
        "hidden_size": d,
        "intermediate_size": 20,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": dh,
        "num_hidden_layers": layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": 64,
        "vocab_size": 30,
        **extra,
    }
    return write(folder, t, cfg), t


# ------------------------------------------------------------------------- ALBERT
def test_albert_heads_are_the_shared_layer(tmp_path):
    folder, t = albert(tmp_path / "albert")
    lay = detect_layout(folder)
    assert (lay.name, lay.prefix, lay.keys) == ("albert", "albert.", {0: (0, 0)})
    heads = load_heads(folder)
    assert [(h.layer, h.head) for h in heads] == [(0, 0), (0, 1)]
    G = "albert.encoder.albert_layer_groups.0.albert_layers.0.attention."
    WQ, WK, WV, WO = (
        t[G + p + ".weight"].astype(np.float64) for p in ("query", "key", "value", "dense")
    )
    for h in heads:
        r = slice(4 * h.head, 4 * h.head + 4)
        assert isinstance(h, TrainedHead) and h.layout == "albert" and not h.causal
        np.testing.assert_array_equal(h.Q, WQ[r])
        np.testing.assert_array_equal(h.K, WK[r])
        np.testing.assert_allclose(h.V, WO[:, r] @ WV[r], rtol=1e-14, atol=1e-15)
        assert h.V.shape == (8, 8) and h.beta == 0.5  # 1/sqrt(4): heads act on H = 8, not E = 6
        assert h.shared_layers == (0, 1, 2) and "shared by layers [0, 1, 2]" in h.describe()
    an = analyze_heads(folder)
    assert (an.num_layers, an.num_heads, an.d_model, an.d_head) == (1, 2, 8, 4)


# -------------------------------------------------------------------------- GPT-2
@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_conv1d_heads(tmp_path, prefix):
    folder, t = gpt2(tmp_path / "gpt2", prefix=prefix)
    assert detect_layout(folder).name == "gpt2"
    heads = load_heads(folder)
    assert len(heads) == 4 and all(h.causal and h.layout == "gpt2" for h in heads)
    d, dh = 8, 4
    for h in heads:
        A = t[f"{prefix}h.{h.layer}.attn.c_attn.weight"].astype(np.float64)  # (in, out)
        Pw = t[f"{prefix}h.{h.layer}.attn.c_proj.weight"].astype(np.float64)
        r = slice(h.head * dh, (h.head + 1) * dh)
        # Q_h x = (x @ c_attn)[q columns of head h]: the transpose of the stored block
        np.testing.assert_array_equal(h.Q, A[:, r].T)
        np.testing.assert_array_equal(h.K, A[:, d + r.start : d + r.stop].T)
        Vv = A[:, 2 * d + r.start : 2 * d + r.stop]  # (in, d_h)
        np.testing.assert_allclose(h.V, (Vv @ Pw[r, :]).T, rtol=1e-14, atol=1e-15)
    # the heads of layer 1 add up to GPT-2's causal attention block (biases 0)
    X = RNG.standard_normal((5, d))
    A = t[f"{prefix}h.1.attn.c_attn.weight"].astype(np.float64)
    Pw = t[f"{prefix}h.1.attn.c_proj.weight"].astype(np.float64)
    qkv = X @ A
    out = np.zeros((5, d))
    for hh in range(2):
        c = slice(hh * dh, (hh + 1) * dh)
        q, k, v = (
            qkv[:, c],
            qkv[:, d + c.start : d + c.stop],
            qkv[:, 2 * d + c.start : 2 * d + c.stop],
        )
        L = np.where(np.tril(np.ones((5, 5))) > 0, q @ k.T / math.sqrt(dh), -np.inf)
        out[:, c] = softmax_rows(L) @ v
    block = out @ Pw
    ours = sum(np.asarray(h.attention().vector_field(jnp.asarray(X))) for h in heads[2:])
    np.testing.assert_allclose(ours, block, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ Llama / Qwen3
def hf_llama_attention(X, Wq, Wk, h, g, dh, theta, gq=None, gk=None, eps=0.0):
    """Head h of a Llama/Qwen3 layer as transformers computes it: q = x W_q^T (rows of
    head h), Qwen3's RMSNorm with gains, rotate_half RoPE at positions 0..n-1, causal
    softmax of q k^T / sqrt(d_h); its key/value group g."""
    n = X.shape[0]
    q = X @ Wq[h * dh : (h + 1) * dh].T
    k = X @ Wk[g * dh : (g + 1) * dh].T
    if gq is not None:
        q = q / np.sqrt((q**2).mean(-1, keepdims=True) + eps) * gq
        k = k / np.sqrt((k**2).mean(-1, keepdims=True) + eps) * gk
    inv = 1.0 / theta ** (np.arange(0, dh, 2) / dh)
    ang = np.arange(n)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rot(u):
        return u * cos + np.concatenate([-u[:, dh // 2 :], u[:, : dh // 2]], 1) * sin

    q, k = rot(q), rot(k)
    L = np.where(np.tril(np.ones((n, n))) > 0, q @ k.T / math.sqrt(dh), -np.inf)
    return softmax_rows(L), q @ k.T / math.sqrt(dh)


def test_qwen3_grouped_query_heads_with_qk_norm_and_rope(tmp_path):
    folder, t = llama(tmp_path / "qwen3")
    heads = load_heads(folder)
    assert len(heads) == 8 and [h.kv_head for h in heads[:4]] == [0, 0, 1, 1]
    dh, pi = 4, np.array([0, 2, 1, 3])  # rotate_half pairs (c, c + 2) -> planes (2c, 2c+1)
    p = "model.layers.1.self_attn."
    Wq, Wk, Wv, Wo = (t[p + s + "_proj.weight"].astype(np.float64) for s in "qkvo")
    gq, gk = (t[p + s + "_norm.weight"].astype(np.float64) for s in "qk")
    X = RNG.standard_normal((6, 12))
    block = np.zeros((6, 12))
    for h in heads[4:]:
        g = h.head // 2
        rh, rg = slice(h.head * dh, (h.head + 1) * dh), slice(g * dh, (g + 1) * dh)
        assert (h.layout, h.causal, h.rope_theta, h.num_kv_heads, h.qk_norm_scope) == (
            "llama", True, 1e6, 2, "head",
        )  # fmt: skip
        assert h.norm_eps == 1e-6 and h.beta == 0.5 and h.rope_scaling is None
        np.testing.assert_array_equal(h.Q, Wq[rh][pi])
        np.testing.assert_array_equal(h.K, Wk[rg][pi])
        np.testing.assert_allclose(h.V, Wo[:, rh] @ Wv[rg], rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(h.q_norm, gq[pi])
        np.testing.assert_array_equal(h.k_norm, gk[pi])
        # the head as attnflow.Attention (QKNorm kernel, RoPE(1e6, Causal())) is the HF head
        P_ref, L_ref = hf_llama_attention(X, Wq, Wk, h.head, g, dh, 1e6, gq, gk)
        P = np.asarray(h.attention().attention(jnp.asarray(X)))
        np.testing.assert_allclose(P, P_ref, rtol=1e-12, atol=1e-14)
        # with the model's rms_norm_eps = 1e-6 the weights move by ~1e-6 relative only
        P_eps, _ = hf_llama_attention(X, Wq, Wk, h.head, g, dh, 1e6, gq, gk, eps=1e-6)
        assert 0 < np.abs(P - P_eps).max() < 1e-5
        # the QK-norm bound of the logits: attnflow.kernels.qknorm_logit_bound, and a bound
        B = h.logit_bound()
        assert B == pytest.approx(0.5 * dh * np.abs(gq).max() * np.abs(gk).max(), rel=1e-14)
        assert np.abs(L_ref).max() <= B
        block += P_ref @ (X @ Wv[rg].T) @ Wo[:, rh].T
    # the eight query heads of layer 1, with their groups' values, are the attention block
    ours = sum(np.asarray(h.attention().vector_field(jnp.asarray(X))) for h in heads[4:])
    np.testing.assert_allclose(ours, block, rtol=1e-11, atol=1e-12)
    assert "qwen3, causal, 2 key/value heads" in heads[0].describe()


def test_olmo2_norm_over_all_heads_and_llama_rope_options(tmp_path):
    folder, t = llama(tmp_path / "olmo2", kind="olmo2")
    h = load_heads(folder, layers=[0])[3]  # query head 3 reads key/value group 1
    gq = t["model.layers.0.self_attn.q_norm.weight"].astype(np.float64)
    gk = t["model.layers.0.self_attn.k_norm.weight"].astype(np.float64)
    pi = np.array([0, 2, 1, 3])
    assert (h.kv_head, h.qk_norm_scope, h.qk_norm_width) == (1, "layer", (16, 8))
    np.testing.assert_array_equal(h.q_norm, gq[12:16][pi])
    np.testing.assert_array_equal(h.k_norm, gk[4:8][pi])
    assert h.logit_bound() == pytest.approx(
        0.5 * math.sqrt(16 * 8) * np.abs(gq[12:16]).max() * np.abs(gk[4:8]).max()
    )
    with pytest.raises(ValueError, match="all heads of a\\s+layer together"):
        h.attention()
    from attnflow.kernels import QKNorm

    assert h.attention(kernel=QKNorm(h.q_norm, h.k_norm)).Q.shape == (4, 12)
    # plain Llama-3: rope_scaling changes the frequencies, so no mask is guessed
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    folder, _ = llama(tmp_path / "llama3", kind="llama", kv=4, rope_theta=5e5, rope_scaling=scaling)
    h = load_heads(folder)[0]
    assert h.q_norm is None and h.logit_bound() is None and h.num_kv_heads == 4
    assert h.rope_theta == 5e5 and h.rope_scaling == scaling
    with pytest.raises(ValueError, match="rope_scaling"):
        h.attention()
    from attnflow.masks import Causal, RoPE

    assert h.attention(mask=RoPE(5e5, Causal())).mask is not None
    # the newer config spelling: rope_parameters = {rope_theta, rope_type: default}
    folder, _ = llama(
        tmp_path / "new", kind="llama", rope_theta=None, rope_scaling=None,
        rope_parameters={"rope_theta": 2.5e5, "rope_type": "default"},
    )  # fmt: skip
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["rope_theta"]
    (folder / "config.json").write_text(json.dumps(cfg))
    h = load_heads(folder)[0]
    assert h.rope_theta == 2.5e5 and h.rope_scaling is None


# --------------------------------------------------------------- detection errors
def test_unknown_layout_names_the_tensors(tmp_path):
    t = {
        f"distilbert.transformer.layer.0.attention.{p}.weight": f32(8, 8)
        for p in ("q_lin", "k_lin", "v_lin", "out_lin")
    }
    folder = write(
        tmp_path / "distil", t, {"model_type": "distilbert", "architectures": ["DistilBertModel"]}
    )
    with pytest.raises(ValueError) as exc:
        load_heads(folder)
    msg = str(exc.value)
    assert "no attention layout" in msg and "model_type='distilbert'" in msg
    assert "distilbert.transformer.layer.0.attention.q_lin.weight" in msg
    assert "c_attn" in msg and "{q,k,v,o}_proj" in msg and "albert_layer_groups" in msg
    # a BART-like encoder (q/k/v_proj but out_proj): no complete Llama layer either
    t = {
        f"model.encoder.layers.0.self_attn.{p}.weight": f32(8, 8)
        for p in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    with pytest.raises(ValueError, match="no attention layout"):
        detect_layout(write(tmp_path / "bart", t, {"model_type": "bart"}))
    # config and tensors disagree
    folder, _ = llama(tmp_path / "mixed", kind="llama")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="config.json says .*gpt2.* 'llama' layout"):
        detect_layout(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma2"}))
    with pytest.raises(ValueError, match="gemma2.*not supported"):
        detect_layout(folder)
    # a layer without its output projection
    folder, t = gpt2(tmp_path / "broken")
    del t["h.1.attn.c_proj.weight"]
    C.write_safetensors(folder / "model.safetensors", t)
    with pytest.raises(ValueError, match=r"layer \(1,\) lacks \['c_proj'\]"):
        detect_layout(folder)
    folder, _ = llama(tmp_path / "badkv", kind="llama", num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_key_value_heads = 3"):
        load_heads(folder)


# -------------------------------------------------------------------------- CLI
def run_cli(capsys, *args):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def test_cli_heads_on_every_layout(tmp_path, capsys):
    cases = {
        "albert": (albert(tmp_path / "a")[0], 2, "albert, shared by layers [0, 1, 2]"),
        "gpt2": (gpt2(tmp_path / "g")[0], 4, "gpt2, causal"),
        "qwen3": (llama(tmp_path / "q")[0], 8, "qwen3, causal, 2 key/value heads"),
    }
    for name, (folder, n, arch) in cases.items():
        code, out, err = run_cli(capsys, "heads", "--checkpoint", str(folder), "--json")
        assert code == 0, (name, err)
        res = json.loads(out)
        assert len(res["heads"]) == n and sum(res["counts"].values()) == n, name
        assert res["architecture"].startswith(arch), (name, res["architecture"])
        ref = analyze_heads(folder)
        assert [h["label"] for h in res["heads"]] == [h.label for h in ref.heads]
    code, out, _ = run_cli(capsys, "heads", "--checkpoint", str(cases["qwen3"][0]))
    assert code == 0 and "architecture: qwen3" in out and "RoPE base 1e+06" in out
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(cases["gpt2"][0]), "--dynamics")
    assert code == 2 and out == "" and "--dynamics" in err and "'gpt2' layout" in err
    t = {"encoder.blocks.0.attn.qkv.weight": f32(8, 24)}
    code, out, err = run_cli(capsys, "heads", "--checkpoint", str(write(tmp_path / "u", t, {})))
    assert code == 2 and "no attention layout" in err and len(err.splitlines()) == 1
