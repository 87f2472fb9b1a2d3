"""Hostile and malformed checkpoint files: every ``config.json`` value and tensor the head
loaders and the forward pass read goes through one checked reader
(``attnflow.io.checkpoint_config``), so a bad one is a ``ValueError`` naming the file (and
the key or tensor) before any computation, never NaN hidden states, a silent default, a
truncation, a broadcast or a raw conversion error."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_checkpoints_layouts import gpt2, llama
from test_forward import albert_checkpoint, bert_checkpoint

from attnflow.io import checkpoints as C
from attnflow.io.encoder_weights import load_encoder_weights
from attnflow.io.layouts import detect_layout, load_heads


def set_config(folder: Path, **changes) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))  # NaN and inf as JSON's NaN
    return folder / "config.json"


def names_config(exc: pytest.ExceptionInfo, key: str) -> None:
    msg = str(exc.value)
    assert "config.json" in msg and key in msg, msg


# ------------------------------------------------------------------ config values
@pytest.mark.parametrize(
    "key, value",
    [
        ("layer_norm_eps", -10),
        ("layer_norm_eps", 0),
        ("layer_norm_eps", "1e-12"),
        ("layer_norm_eps", math.nan),
        ("layer_norm_eps", math.inf),
        ("layer_norm_eps", True),
        ("num_attention_heads", 1.5),
        ("num_attention_heads", "3"),
        ("num_attention_heads", True),
        ("num_attention_heads", 0),
        ("hidden_act", 5),
        ("hidden_act", "swish"),
        ("pad_token_id", -1),
        ("pad_token_id", 2.0),
        ("pad_token_id", 40),  # the vocabulary has 40 ids: 0 .. 39
        ("position_embedding_type", ["absolute"]),
    ],
)
def test_forward_pass_config_values_are_checked(tmp_path, key, value):
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    set_config(folder, **{key: value})
    with pytest.raises(ValueError) as exc:
        load_encoder_weights(folder)
    names_config(exc, key)


def test_albert_layer_counts_are_checked(tmp_path):
    folder = albert_checkpoint(tmp_path / "albert")[0]
    for key, value in [
        ("num_hidden_layers", 2.5),
        ("num_hidden_groups", 0),
        ("num_hidden_groups", 9),
        ("inner_group_num", "1"),
    ]:
        good = json.loads((folder / "config.json").read_text())
        set_config(folder, **{key: value})
        with pytest.raises(ValueError) as exc:
            load_encoder_weights(folder) if key != "inner_group_num" else load_heads(folder)
        names_config(exc, key)
        (folder / "config.json").write_text(json.dumps(good))
    load_encoder_weights(folder)  # the original config loads


@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_theta", 0),
        ("rope_theta", -1e4),
        ("rope_theta", "1e6"),
        ("rope_theta", math.nan),
        ("num_key_value_heads", 1.5),
        ("num_key_value_heads", 0),
        ("num_key_value_heads", True),
        ("head_dim", 4.0),
        ("rms_norm_eps", -1e-6),
        ("partial_rotary_factor", 2.0),
        ("rope_parameters", [1.0]),
        ("rope_scaling", "linear"),
        ("model_type", 5),
        ("architectures", "Qwen3ForCausalLM"),
    ],
)
def test_decoder_config_values_are_checked(tmp_path, key, value):
    folder, _ = llama(tmp_path / "qwen3")
    set_config(folder, **{key: value})
    with pytest.raises(ValueError) as exc:
        load_heads(folder)
    names_config(exc, key)


def test_rope_theta_zero_inside_rope_parameters_is_refused_not_defaulted(tmp_path):
    folder, _ = llama(tmp_path / "qwen3")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 0, "rope_type": "default"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope_theta = 0 is not a finite number > 0"):
        load_heads(folder)
    cfg["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_heads(folder)[0].rope_theta == 5e5
    del cfg["rope_parameters"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_heads(folder)[0].rope_theta == 10000.0  # absent: transformers' default


def test_gpt2_config_values_are_checked(tmp_path):
    folder = gpt2(tmp_path / "gpt2")
    folder = folder[0] if isinstance(folder, tuple) else folder
    for key, value in [("scale_attn_weights", "no"), ("n_head", 2.5)]:
        good = json.loads((folder / "config.json").read_text())
        set_config(folder, **{key: value})
        with pytest.raises(ValueError) as exc:
            load_heads(folder)
        names_config(exc, key)
        (folder / "config.json").write_text(json.dumps(good))


@pytest.mark.parametrize(
    "content", [b"[1, 2, 3]", b"12", b'"bert"', b"\xff\xfe{}", b"{", b"[" * 100_000]
)
def test_config_json_that_is_not_an_object_is_refused_by_name(tmp_path, capsys, content):
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    (folder / "config.json").write_bytes(content)
    for load in (detect_layout, load_heads, load_encoder_weights, C.load_embedding_weights):
        with pytest.raises(ValueError, match=r"config\.json"):
            load(folder)
    from attnflow.cli import main

    with pytest.raises(SystemExit) as e:
        main(["heads", "--checkpoint", str(folder)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "internal error" not in err and "config.json" in err


# ------------------------------------------------------------------ tensors
@pytest.mark.parametrize(
    "name, shape",
    [
        ("encoder.layer.0.attention.output.LayerNorm.weight", (1,)),
        ("encoder.layer.1.output.LayerNorm.bias", (1,)),
        ("embeddings.LayerNorm.weight", (1,)),
        ("encoder.layer.0.intermediate.dense.bias", (19,)),
        ("encoder.layer.0.attention.self.key.bias", (12, 1)),
        ("embeddings.token_type_embeddings.weight", (2, 11)),
        ("encoder.layer.1.output.dense.weight", (12, 21)),
    ],
)
def test_forward_pass_tensor_shapes_are_checked(tmp_path, name, shape):
    folder, t, _ = bert_checkpoint(tmp_path / "bert")
    t[name] = np.ones(shape, np.float32)
    C.write_safetensors(folder / "model.safetensors", t)
    with pytest.raises(ValueError) as exc:
        load_encoder_weights(folder)
    msg = str(exc.value)
    assert "model.safetensors" in msg and name in msg and str(shape) in msg


def test_non_finite_tensors_name_the_file(tmp_path):
    folder, t, _ = bert_checkpoint(tmp_path / "bert")
    t["encoder.layer.1.attention.self.query.weight"][0, 0] = np.nan
    C.write_safetensors(folder / "model.safetensors", t)
    for load in (load_encoder_weights, load_heads):
        with pytest.raises(ValueError, match=r"model\.safetensors.*query\.weight.*non-finite"):
            load(folder)


def test_qk_norm_gain_of_shape_one_is_refused(tmp_path):
    folder, t = llama(tmp_path / "qwen3")
    t["model.layers.0.self_attn.q_norm.weight"] = np.ones(1, np.float32)
    t["model.layers.0.self_attn.k_norm.weight"] = np.ones(1, np.float32)
    C.write_safetensors(folder / "model.safetensors", t)
    with pytest.raises(ValueError, match=r"model\.safetensors.*q_norm\.weight.*\(1,\)"):
        load_heads(folder)


# ------------------------------------------------------------------ safetensors
class FakeSafetensorError(Exception):
    pass


@pytest.fixture
def fake_safetensors(monkeypatch):
    """The safetensors package, stood in for: records the files it opens and fails as the
    real one does on a file it cannot read."""
    opened: list[str] = []

    def safe_open(path, framework):
        opened.append(path)
        raise FakeSafetensorError("Error while deserializing header: InvalidHeaderDeserialization")

    mod = types.ModuleType("safetensors")
    mod.safe_open = safe_open  # type: ignore[attr-defined]
    mod.__spec__ = types.SimpleNamespace(name="safetensors")  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "safetensors", mod)
    return opened


def test_package_errors_are_reported_naming_the_file(tmp_path, fake_safetensors):
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    path = folder / "model.safetensors"
    with pytest.raises(ValueError) as exc:
        C.read_safetensors(path, reader="safetensors")
    msg = str(exc.value)
    assert str(path) in msg and "FakeSafetensorError" in msg and "reader='numpy'" in msg
    assert fake_safetensors == [str(path)]


@pytest.mark.parametrize("damage", ["truncate", "extend", "offsets"])
def test_damaged_headers_never_reach_the_package(tmp_path, fake_safetensors, damage):
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    path = folder / "model.safetensors"
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[:-7]
    elif damage == "extend":
        raw += b"\0" * 8
    else:
        n = int.from_bytes(raw[:8], "little")
        header = raw[8 : 8 + n].replace(b'"data_offsets":[0,', b'"data_offsets":[8,', 1)
        raw[8 : 8 + n] = header
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="damaged or not a safetensors file"):
        C.read_safetensors(path, reader="safetensors")
    assert fake_safetensors == []


# ------------------------------------------------------------------ property
HOSTILE = st.sampled_from(
    [
        -10,
        -1,
        0,
        0.5,
        1.5,
        1e300,
        10**30,
        math.nan,
        math.inf,
        -math.inf,
        "12",
        "",
        True,
        False,
        [],
        [12],
        {},
        {"a": 1},
    ]  # fmt: skip
)
KEYS = [
    "num_attention_heads",
    "layer_norm_eps",
    "hidden_act",
    "pad_token_id",
    "position_embedding_type",
    "model_type",
    "architectures",
]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.sampled_from(KEYS), value=HOSTILE)
@example(key="position_embedding_type", value="12")  # its message named the weights file
def test_any_hostile_config_value_is_refused_by_name_or_harmless(tmp_path_factory, key, value):
    folder = tmp_path_factory.getbasetemp() / "hostile-bert"
    if not (folder / "model.safetensors").is_file():
        bert_checkpoint(folder)
    good = json.loads((folder / "config.json").read_text())
    set_config(folder, **{key: value})
    try:
        w = load_encoder_weights(folder, pooling=False)
    except ValueError as exc:
        msg = str(exc)
        assert "config.json" in msg and key in msg, msg
    else:  # accepted: a value that means what it says
        assert math.isfinite(w.eps) and w.eps > 0 and w.num_heads >= 1
        assert 0 <= w.pad_token_id < w.embeddings["word"].shape[0]
        assert 12 % w.num_heads == 0
    finally:
        (folder / "config.json").write_text(json.dumps(good))
