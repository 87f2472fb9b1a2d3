"""Every weight of a post-LayerNorm encoder (BERT, ALBERT) for a forward pass, and the
sentence pooling its sentence-transformers files declare.

``load_encoder_weights`` reads them into an ``EncoderWeights`` (numpy float64, torch
layout ``(out, in)``); the forward pass itself is ``attnflow.studies.encoder``.
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

import numpy as np

from .checkpoints import _read_header, read_safetensors
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
    on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in _POOL_KEYS:
        raise ValueError(
            f"{pc} turns on pooling modes {on}; attnflow applies exactly one of "
            f"{sorted(_POOL_KEYS)}."
        )
    return SentencePooling(_POOL_KEYS[on[0]], "Normalize" in kinds, types)


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
    """Every weight of a BERT- or ALBERT-layout encoder, for ``attnflow.studies.encoder``.

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
    for key in ("num_attention_heads",) + (("num_hidden_layers",) if lay.name == "albert" else ()):
        if not isinstance(cfg.get(key), int):
            raise ValueError(
                f"checkpoint {str(path)!r} needs a config.json with {key} beside it for the "
                f"forward pass."
            )
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"checkpoint {str(path)!r} has position_embedding_type = "
            f"{cfg['position_embedding_type']!r}; only 'absolute' is implemented."
        )
    act = str(cfg.get("hidden_act", "gelu"))
    if act not in ACTIVATIONS:
        raise ValueError(f"config hidden_act = {act!r} is not one of {sorted(ACTIVATIONS)}.")
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
    arr: dict[str, Any] = {}
    for k, v in want.items():
        if v in raw:
            a = np.asarray(raw[v], np.float64)
            if not np.all(np.isfinite(a)):
                raise ValueError(f"checkpoint tensor {v!r} has non-finite entries.")
            arr[k] = a
    per = {
        idx: {k.split(".", 1)[1]: arr[k] for k in arr if k.startswith(f"{idx}.")}
        for idx in lay.layers
    }
    if lay.name == "bert":
        seq = [per[idx] for idx in sorted(per)]
    else:  # layer l runs group int(l / (L / G)), all of its inner layers in order
        L, G = int(cfg["num_hidden_layers"]), int(cfg.get("num_hidden_groups") or 1)
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
    n_heads = int(cfg["num_attention_heads"])
    if d % n_heads:
        raise ValueError(f"num_attention_heads = {n_heads} does not divide the hidden size {d}.")
    emb = {k: arr.get(f"emb.{k}") for k in emb_names}
    return EncoderWeights(
        layout=lay.name,
        embeddings=emb,
        projection=(arr["proj_w"], arr["proj_b"]) if lay.name == "albert" else None,
        layers=tuple(seq),
        num_heads=n_heads,
        eps=float(cfg.get("layer_norm_eps", 1e-12)),
        activation=ACTIVATIONS[act],
        pooling=read_pooling(path.parent) if pooling else None,
        pad_token_id=int(cfg.get("pad_token_id") or 0),
        source=str(path),
    )
