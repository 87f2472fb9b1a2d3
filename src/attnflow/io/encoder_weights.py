"""Every weight of a post-LayerNorm encoder (BERT, ALBERT) for a forward pass, and the
sentence pooling its sentence-transformers files declare.

``load_encoder_weights`` reads them into an ``EncoderWeights`` (numpy float64, torch
layout ``(out, in)``); the forward pass itself is ``attnflow.networks.encoder``.
``read_pooling`` reads ``modules.json`` and the ``Pooling`` module's ``config.json``
(all-MiniLM-L6-v2: ``Transformer``, ``Pooling`` with ``pooling_mode_mean_tokens``,
``Normalize``).

Tensor names (after the checkpoint's prefix), per layer ``L`` of BERT, or per weight set
``G, I`` of ALBERT (``encoder.albert_layer_groups.G.albert_layers.I.``):

================  ====================================  ==========================
part              BERT ``encoder.layer.L.``              ALBERT
================  ====================================  ==========================
q, k, v           ``attention.self.{query,key,value}``  ``attention.{query,...}``
o                 ``attention.output.dense``            ``attention.dense``
ln1               ``attention.output.LayerNorm``        ``attention.LayerNorm``
ff1               ``intermediate.dense``                ``ffn``
ff2               ``output.dense``                      ``ffn_output``
ln2               ``output.LayerNorm``                  ``full_layer_layer_norm``
================  ====================================  ==========================

each with ``.weight`` and ``.bias``; embeddings ``embeddings.{word,position,
token_type}_embeddings.weight`` and ``embeddings.LayerNorm.{weight,bias}``; ALBERT adds
``encoder.embedding_hidden_mapping_in.{weight,bias}`` ``(H, E)``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .checkpoint_config import checked_tensor, expect_shape
from .checkpoints import _read_header, embedding_shapes, read_safetensors
from .layouts import detect_layout

__all__ = ["EncoderWeights", "SentencePooling", "load_encoder_weights", "read_pooling"]

ACTIVATIONS = {
    "gelu": "gelu",  # the exact erf GELU (BERT, MiniLM)
    "gelu_new": "gelu_tanh",  # tanh approximation (ALBERT v2, GPT-2)
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}
_BERT = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "ln1": "attention.output.LayerNorm",
    "ff1": "intermediate.dense",
    "ff2": "output.dense",
    "ln2": "output.LayerNorm",
}
_ALBERT = {
    "q": "attention.query",
    "k": "attention.key",
    "v": "attention.value",
    "o": "attention.dense",
    "ln1": "attention.LayerNorm",
    "ff1": "ffn",
    "ff2": "ffn_output",
    "ln2": "full_layer_layer_norm",
}
_POOL_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


@dataclasses.dataclass(frozen=True)
class SentencePooling:
    """The sentence embedding a sentence-transformers model declares (``read_pooling``).

    Attributes:
        mode: ``"mean"`` (over the tokens the attention mask keeps), ``"cls"`` (the
            first token), ``"max"`` or ``"mean_sqrt_len"`` (the sum over sqrt(length)).
        normalize: a ``Normalize`` module follows (L2, ``x / max(|x|, 1e-12)``).
        modules: the module types of ``modules.json``, in order.
    """

    mode: str
    normalize: bool
    modules: tuple[str, ...]


def read_pooling(folder: str | Path) -> SentencePooling | None:
    """The pooling declared by the sentence-transformers files in ``folder``.

    Returns ``None`` when there is no ``modules.json`` (a plain transformer checkpoint).

    Raises:
        ValueError: naming the file, for a module this package does not apply (``Dense``
            and the like: the embedding would not be the model's), a pooling config with
            no or several modes, or unreadable JSON.
    """
    folder = Path(folder)
    mj = folder / "modules.json"
    if not mj.is_file():
        return None
    try:
        mods = json.loads(mj.read_text())
        types = tuple(str(m["type"]) for m in mods)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{mj}: unreadable modules.json ({exc}).") from None
    kinds = [t.rsplit(".", 1)[-1] for t in types]
    other = [t for t, k in zip(types, kinds) if k not in ("Transformer", "Pooling", "Normalize")]
    if other or kinds.count("Pooling") != 1:
        raise ValueError(
            f"{mj} declares modules {list(types)}: attnflow applies one Transformer, one "
            f"Pooling and an optional Normalize, not {other or 'this Pooling count'}; load "
            f"with pooling=False for the hidden states alone."
        )
    pool = next(m for m, k in zip(mods, kinds) if k == "Pooling")
    pc = folder / str(pool.get("path") or "") / "config.json"
    try:
        cfg = json.loads(pc.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{pc}: unreadable pooling config ({exc}).") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{pc}: the pooling config must be a JSON object of pooling_mode_* keys.")
    on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in _POOL_KEYS:
        raise ValueError(
            f"{pc} turns on pooling modes {on}; attnflow applies exactly one of "
            f"{sorted(_POOL_KEYS)}."
        )
    return SentencePooling(_POOL_KEYS[on[0]], "Normalize" in kinds, types)


def _check_shapes(path: Path, arr: dict[str, Any], names: dict[str, str], layers) -> None:
    """Every tensor of the forward pass against the shapes the others imply: the width
    ``H`` from the query weight, the feed-forward width ``I`` from ``ff1``, the embedding
    width ``E`` from the word embeddings (BERT: ``E = H``; ALBERT: the projection ``(H,
    E)``). A LayerNorm gain of shape ``(1,)`` would broadcast: it is refused."""
    emb = {k.split(".", 1)[1]: v for k, v in arr.items() if k.startswith("emb.")}
    embedding_shapes(
        path, emb, {k.split(".", 1)[1]: v for k, v in names.items() if k.startswith("emb.")}
    )
    E = emb["word"].shape[1]
    for idx in layers:
        a = {k.split(".", 1)[1]: v for k, v in arr.items() if k.startswith(f"{idx}.")}
        n = {k.split(".", 1)[1]: v for k, v in names.items() if k.startswith(f"{idx}.")}
        q = a["q_w"]
        if q.ndim != 2 or q.shape[0] != q.shape[1] or q.shape[0] < 1:
            raise ValueError(
                f"checkpoint {str(path)!r}: tensor {n['q_w']!r} has shape {q.shape}; "
                f"expected (H, H)."
            )
        H = q.shape[0]
        ff = a["ff1_w"]
        if ff.ndim != 2 or ff.shape[1] != H or ff.shape[0] < 1:
            raise ValueError(
                f"checkpoint {str(path)!r}: tensor {n['ff1_w']!r} has shape {ff.shape}; "
                f"expected (I, {H})."
            )
        I = ff.shape[0]
        want = {
            **{f"{p}_w": (H, H) for p in ("k", "v", "o")},
            **{f"{p}_b": (H,) for p in ("q", "k", "v", "o", "ff2")},
            **{f"{p}_{wb}": (H,) for p in ("ln1", "ln2") for wb in "wb"},
            "ff1_b": (I,),
            "ff2_w": (H, I),
        }
        for k, shape in want.items():
            expect_shape(path, n[k], a[k], shape, f"hidden size H = {H}, feed-forward I = {I}")
    if "proj_w" in arr:
        H = arr["0.q_w"].shape[0] if "0.q_w" in arr else arr["proj_w"].shape[0]
        expect_shape(path, names["proj_w"], arr["proj_w"], (H, E), "hidden x embedding")
        expect_shape(path, names["proj_b"], arr["proj_b"], (H,), "hidden")
    elif layers and arr[f"{next(iter(layers))}.q_w"].shape[0] != E:
        first = next(iter(layers))
        raise ValueError(
            f"checkpoint {str(path)!r}: the word embeddings are {E} wide and "
            f"{names[f'{first}.q_w']!r} {arr[f'{first}.q_w'].shape[0]}: a BERT layout "
            f"has one width."
        )


@dataclasses.dataclass(frozen=True, eq=False)
class EncoderWeights:
    """The weights of a BERT or ALBERT encoder, float64, torch layout (``load_encoder_weights``).

    Attributes:
        layout: ``"bert"`` or ``"albert"``.
        embeddings: ``{"word": (vocab, E), "position": (max_len, E), "token_type":
            (types, E) or None, "ln_w", "ln_b": (E,)}``.
        projection: ALBERT's ``(W (H, E), b (H,))`` from embeddings to hidden states, or
            ``None`` (BERT: ``E = H``).
        layers: one ``{part_w, part_b}`` dict per layer applied, in order (``q_w`` ``(H,
            H)``, ``q_b``, ... ``ff1_w`` ``(I, H)``, ``ff2_w`` ``(H, I)``, ``ln2_b``); ALBERT
            repeats the same dict for the layers that share it.
        num_heads: heads per layer; eps: the LayerNorm epsilon (``layer_norm_eps``).
        activation: ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"relu"``.
        pooling: the declared ``SentencePooling`` or ``None``; pad_token_id: from config.
        source: the checkpoint file.
    """

    layout: str
    embeddings: dict
    projection: tuple | None
    layers: tuple
    num_heads: int
    eps: float
    activation: str
    pooling: SentencePooling | None
    pad_token_id: int
    source: str

    @property
    def d(self) -> int:
        return int(self.layers[0]["q_w"].shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def load_encoder_weights(
    checkpoint: str | Path, *, pooling: bool = True, reader: str = "auto"
) -> EncoderWeights:
    """Every weight of a BERT- or ALBERT-layout encoder, for ``attnflow.networks.encoder``.

    Args:
        checkpoint: ``"minilm"``, a ``.safetensors`` file or folder, with its
            ``config.json`` (``num_attention_heads``, ``layer_norm_eps``, ``hidden_act``;
            ALBERT: ``num_hidden_layers``, ``num_hidden_groups``, ``inner_group_num``).
        pooling: read the sentence-transformers pooling beside it (``read_pooling``).
        reader: see ``attnflow.io.checkpoints.read_safetensors``.

    Raises:
        ValueError: naming the checkpoint: another layout (GPT-2, Llama: decoders, not
            covered), a missing tensor or config key, relative position embeddings, an
            activation other than ``ACTIVATIONS``.

    Example:
        >>> w = load_encoder_weights("minilm")  # doctest: +SKIP
        >>> w.num_layers, w.num_heads, w.d, w.pooling.mode, w.pooling.normalize  # doctest: +SKIP
        (6, 12, 384, 'mean', True)
    """
    lay = detect_layout(checkpoint)
    path, cfg, pre = lay.path, lay.config, lay.prefix
    if lay.name not in ("bert", "albert"):
        raise ValueError(
            f"checkpoint {str(path)!r} is in the {lay.name!r} layout; the forward pass "
            f"covers the post-LayerNorm encoders (BERT, ALBERT). load_heads reads its heads."
        )
    # every key the forward pass reads, checked here (the file named), before any tensor
    for key in ("num_attention_heads",) + (("num_hidden_layers",) if lay.name == "albert" else ()):
        cfg.require(key, f"for the forward pass of {str(path)!r}")
    n_heads = cfg.integer("num_attention_heads")
    n_layers = cfg.integer("num_hidden_layers")
    n_groups = cfg.integer("num_hidden_groups", 1)
    if lay.name == "albert" and n_layers is not None and n_groups > n_layers:
        raise ValueError(
            f"{cfg.path}: num_hidden_groups = {n_groups} exceeds num_hidden_layers = "
            f"{n_layers}; fix config.json."
        )
    position = cfg.text("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"{cfg.path}: position_embedding_type = {position!r}; only 'absolute' is "
            f"implemented (fix config.json or use a checkpoint with absolute positions)."
        )
    act = cfg.text("hidden_act", "gelu", choices=tuple(ACTIVATIONS))
    eps = cfg.number("layer_norm_eps", 1e-12, lo=0.0, lo_open=True)
    pad = cfg.integer("pad_token_id", 0, lo=0)
    emb_names = {
        "word": "embeddings.word_embeddings.weight",
        "position": "embeddings.position_embeddings.weight",
        "token_type": "embeddings.token_type_embeddings.weight",
        "ln_w": "embeddings.LayerNorm.weight",
        "ln_b": "embeddings.LayerNorm.bias",
    }
    want: dict[str, str] = {f"emb.{k}": pre + v for k, v in emb_names.items()}
    parts = _BERT if lay.name == "bert" else _ALBERT
    for idx in lay.layers:
        if lay.name == "bert":
            stem = f"{pre}encoder.layer.{idx}."
        else:
            g, i = lay.keys[idx]
            stem = f"{pre}encoder.albert_layer_groups.{g}.albert_layers.{i}."
        for p, name in parts.items():
            for wb in ("weight", "bias"):
                want[f"{idx}.{p}_{wb[0]}"] = f"{stem}{name}.{wb}"
    if lay.name == "albert":
        want["proj_w"] = pre + "encoder.embedding_hidden_mapping_in.weight"
        want["proj_b"] = pre + "encoder.embedding_hidden_mapping_in.bias"
    header, _, _ = _read_header(path)
    optional = {"emb.token_type"}
    missing = [v for k, v in want.items() if v not in header and k not in optional]
    if missing:
        raise ValueError(
            f"checkpoint {str(path)!r} lacks {len(missing)} tensor(s) of the forward pass, "
            f"e.g. {missing[:4]}."
        )
    raw = read_safetensors(path, [v for v in want.values() if v in header], reader=reader)
    arr: dict[str, Any] = {k: checked_tensor(path, v, raw[v]) for k, v in want.items() if v in raw}
    _check_shapes(path, arr, want, lay.layers)
    per = {
        idx: {k.split(".", 1)[1]: arr[k] for k in arr if k.startswith(f"{idx}.")}
        for idx in lay.layers
    }
    if lay.name == "bert":
        seq = [per[idx] for idx in sorted(per)]
    else:  # layer l runs group int(l / (L / G)), all of its inner layers in order
        L, G = int(n_layers or 0), n_groups
        by_key = {lay.keys[idx]: per[idx] for idx in per}
        inner = sorted({i for _, i in by_key})
        seq = []
        for l in range(L):
            g = int(l / (L / G))
            for i in inner:
                if (g, i) not in by_key:
                    raise ValueError(f"checkpoint {str(path)!r} has no ALBERT layer group {g}.{i}.")
                seq.append(by_key[(g, i)])
    d = seq[0]["q_w"].shape[0]
    assert n_heads is not None  # required above
    if d % n_heads:
        raise ValueError(
            f"{cfg.path}: num_attention_heads = {n_heads} does not divide the hidden size {d}."
        )
    vocab = arr["emb.word"].shape[0]
    if pad >= vocab:
        raise ValueError(
            f"{cfg.path}: pad_token_id = {pad} is not a token id of the vocabulary "
            f"(0 .. {vocab - 1}); fix config.json."
        )
    emb = {k: arr.get(f"emb.{k}") for k in emb_names}
    return EncoderWeights(
        layout=lay.name,
        embeddings=emb,
        projection=(arr["proj_w"], arr["proj_b"]) if lay.name == "albert" else None,
        layers=tuple(seq),
        num_heads=n_heads,
        eps=eps,
        activation=ACTIVATIONS[act],
        pooling=read_pooling(path.parent) if pooling else None,
        pad_token_id=pad,
        source=str(path),
    )
