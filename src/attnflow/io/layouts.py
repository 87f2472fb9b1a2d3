"""Checkpoint layouts: BERT, ALBERT, GPT-2 and Llama-style decoders, detected from
``config.json`` and the tensor names, every attention head a ``TrainedHead`` (a
``HeadWeights`` of ``attnflow.io.checkpoints``, in its convention, with what the
architecture adds: causality, rotary positions, grouped keys and values, QK norm).

``detect_layout`` names the layout, ``load_heads`` returns the heads of any of them.
Tensor names may carry a prefix (``bert.``, ``albert.``, ``transformer.``, ``model.``);
weights are read in torch layout and the config keys are those Hugging Face writes.

``bert``    ``encoder.layer.L.attention.self.{query,key,value}.weight`` and
            ``encoder.layer.L.attention.output.dense.weight``, each ``(d, d)``;
            ``num_attention_heads``. Mapped by ``load_bert_heads``.
``albert``  ``encoder.albert_layer_groups.G.albert_layers.I.attention.{query,key,value,
            dense}.weight``, ``(H, H)``; the word pieces are embedded in ``embedding_size``
            ``E`` and projected by ``encoder.embedding_hidden_mapping_in.weight`` ``(H, E)``
            before the first layer (the heads act in ``H``); ``num_attention_heads``,
            ``num_hidden_layers``, ``num_hidden_groups``, ``inner_group_num``. One head
            per weight set ``(G, I)``; ``shared_layers`` lists the layers applying it
            (layer ``l`` runs group ``floor(l G / num_hidden_layers)``, all its inner
            layers). Mapped as BERT (``dense`` is ``W_O``).
``gpt2``    ``h.L.attn.c_attn.weight`` ``(d, 3d)`` and ``h.L.attn.c_proj.weight`` ``(d, d)``:
            ``Conv1D`` weights, stored ``(in, out)`` (``y = x W + b``), queries, keys and
            values fused along the output axis; ``n_head``. ``W_Q = c_attn[:, :d].T``,
            ``W_K = c_attn[:, d:2d].T``, ``W_V = c_attn[:, 2d:].T``, ``W_O = c_proj.T``,
            then as BERT; causal; ``beta = 1/sqrt(d_h)`` (times ``1/(L + 1)`` with
            ``scale_attn_by_inverse_layer_idx``, 1 without ``scale_attn_weights``).
``llama``   ``layers.L.self_attn.{q,k,v,o}_proj.weight``: ``q`` ``(n_h d_h, d)``, ``k`` and
            ``v`` ``(n_kv d_h, d)``, ``o`` ``(d, n_h d_h)``; optional
            ``layers.L.self_attn.{q,k}_norm.weight``: ``(d_h,)`` one RMSNorm per head with
            gains shared by the heads (Qwen3), or ``(n_h d_h,)`` and ``(n_kv d_h,)`` one
            RMSNorm over all heads (OLMo-2); ``num_attention_heads``,
            ``num_key_value_heads``, ``head_dim``, ``rope_theta`` (or
            ``rope_parameters.rope_theta``), ``rope_scaling``, ``rms_norm_eps``. Query head
            ``h`` reads key/value group ``g = h // (n_h / n_kv)`` (``repeat_kv``):
            ``Q_h = W_q[r_h][pi]``, ``K_h = W_k[r_g][pi]``, ``V_h = W_o[:, r_h] W_v[r_g]``,
            ``beta = 1/sqrt(d_h)``; causal, rotary. ``pi = (0, d_h/2, 1, d_h/2 + 1, ...)``
            reorders the rows so that ``attnflow.masks.RoPE``, which turns the planes
            ``(2c, 2c + 1)``, is Hugging Face's ``rotate_half``, which turns ``(c, c +
            d_h/2)`` by the same angle ``i theta^(-2c/d_h)`` (a common permutation of the
            rows of Q and K leaves ``Q^T K``, V and every hypothesis unchanged).

Biases are ignored, as in ``load_bert_heads``. ``TrainedHead.attention()`` is the head as
an ``attnflow.Attention`` with the layout's mask (``Causal()``, ``RoPE(rope_theta,
Causal())``) and kernel (``QKNorm(q_norm, k_norm)``); see ``attnflow.io.trained_head``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint_config import CheckpointConfig, checked_tensor, expect_shape
from .checkpoints import (
    HeadWeights,
    _read_header,
    load_bert_heads,
    read_config,
    read_safetensors,
    resolve_checkpoint,
)
from .trained_head import TrainedHead

__all__ = ["LAYOUTS", "CheckpointLayout", "TrainedHead", "detect_layout", "load_heads"]

LAYOUTS = ("bert", "albert", "gpt2", "llama")

_PREFIX = r"^(?P<prefix>(?:[A-Za-z0-9_]+\.)*?)"
# layout: (pattern of one attention tensor, required parts, optional parts)
_PATTERNS: dict[str, tuple[re.Pattern, frozenset, frozenset]] = {
    "bert": (
        re.compile(
            _PREFIX + r"encoder\.layer\.(?P<layer>\d+)\.attention\."
            r"(?P<part>self\.query|self\.key|self\.value|output\.dense)\.weight$"
        ),
        frozenset({"self.query", "self.key", "self.value", "output.dense"}),
        frozenset(),
    ),
    "albert": (
        re.compile(
            _PREFIX + r"encoder\.albert_layer_groups\.(?P<group>\d+)\.albert_layers\."
            r"(?P<inner>\d+)\.attention\.(?P<part>query|key|value|dense)\.weight$"
        ),
        frozenset({"query", "key", "value", "dense"}),
        frozenset(),
    ),
    "gpt2": (
        re.compile(_PREFIX + r"h\.(?P<layer>\d+)\.attn\.(?P<part>c_attn|c_proj)\.weight$"),
        frozenset({"c_attn", "c_proj"}),
        frozenset(),
    ),
    "llama": (
        re.compile(
            _PREFIX + r"layers\.(?P<layer>\d+)\.self_attn\."
            r"(?P<part>q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight$"
        ),
        frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}),
        frozenset({"q_norm", "k_norm"}),
    ),
}
_SHAPES = {
    "bert": "encoder.layer.L.attention.self.{query,key,value}.weight + "
    "attention.output.dense.weight",
    "albert": "encoder.albert_layer_groups.G.albert_layers.I.attention."
    "{query,key,value,dense}.weight",
    "gpt2": "h.L.attn.c_attn.weight + h.L.attn.c_proj.weight",
    "llama": "layers.L.self_attn.{q,k,v,o}_proj.weight [+ {q,k}_norm.weight]",
}
# model_type -> layout; architectures are matched by their leading word
_MODEL_TYPES = {
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "electra", "camembert"), "bert"),
    "albert": "albert",
    "gpt2": "gpt2",
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo"),
        "llama",
    ),
    "olmo2": "llama",
}
_ARCHITECTURES = {
    "Bert": "bert",
    "Roberta": "bert",
    "XLMRoberta": "bert",
    "Electra": "bert",
    "Albert": "albert",
    "GPT2": "gpt2",
    "Llama": "llama",
    "Mistral": "llama",
    "Mixtral": "llama",
    "Qwen2": "llama",
    "Qwen3": "llama",
    "Olmo": "llama",
}
_REFUSED = {
    "gemma": "Gemma stores its RMSNorm gains as 1 + w, scales its embeddings and (Gemma 2 "
    "and 3) its logits by query_pre_attn_scalar"
}


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """What ``detect_layout`` found.

    Attributes:
        name: one of ``LAYOUTS``.
        prefix: the prefix of the tensor names (``""``, ``"albert."``, ``"model."``, ...).
        layers: ``{index: {part: tensor name}}``, the attention tensors of each layer
            (ALBERT: of each weight set, in the order of ``keys``).
        keys: ``{index: (layer,)}``, or ``(group, inner)`` for ALBERT.
        config: the ``config.json`` beside the file (``{}`` when there is none), a
            ``CheckpointConfig`` whose accessors check each key read.
        path: the ``.safetensors`` file.
    """

    name: str
    prefix: str
    layers: dict
    keys: dict
    config: CheckpointConfig
    path: Path

    @property
    def model_type(self) -> str:
        return str(self.config.text("model_type", ""))


def _config_layout(cfg: CheckpointConfig) -> str | None:
    mt = str(cfg.text("model_type", "")).lower()
    if mt in _MODEL_TYPES:
        return _MODEL_TYPES[mt]
    for arch in cfg.texts("architectures"):
        for word, lay in _ARCHITECTURES.items():
            if isinstance(arch, str) and re.match(word + r"(?![a-z])", arch):
                return lay
    return None


def detect_layout(checkpoint: str | Path) -> CheckpointLayout:
    """The layout of a checkpoint, from its tensor names and its ``config.json``.

    Args:
        checkpoint: ``"minilm"``, a ``.safetensors`` file or a folder (see
            ``attnflow.io.checkpoints.resolve_checkpoint``).

    Returns:
        A ``CheckpointLayout``: ``name`` in ``LAYOUTS``, the prefix, the attention tensors
        of every layer.

    Raises:
        ValueError: one message naming the file, its ``model_type`` and
            ``architectures``, the tensors it holds and the layouts known, when no layout
            (or more than one) matches; when the config names another layout than the
            tensors; when a layer lacks one of its tensors; for model types whose
            attention these layouts would get wrong (Gemma).

    Example:
        >>> detect_layout("minilm").name  # doctest: +SKIP
        'bert'
    """
    path = resolve_checkpoint(checkpoint)
    header, _, _ = _read_header(path)
    names = [k for k in header if k != "__metadata__"]
    cfg = read_config(path)
    mt = str(cfg.text("model_type", ""))
    for word, why in _REFUSED.items():
        if mt.lower().startswith(word):
            raise ValueError(
                f"checkpoint {str(path)!r} is a {mt!r} model: not supported ({why}); the "
                f"layouts known are {', '.join(LAYOUTS)}."
            )
    found: dict[str, tuple[set, dict]] = {}
    for lay, (pat, _, _) in _PATTERNS.items():
        prefixes: set[str] = set()
        layers: dict[tuple, dict[str, str]] = {}
        for n in names:
            m = pat.match(n)
            if m:
                prefixes.add(m["prefix"])
                key = (
                    tuple(int(m[g]) for g in ("group", "inner"))
                    if lay == "albert"
                    else (int(m["layer"]),)
                )
                layers.setdefault(key, {})[m["part"]] = n
        required = _PATTERNS[lay][1]
        if any(required <= set(parts) for parts in layers.values()):  # one complete layer
            found[lay] = (prefixes, layers)
    arch = cfg.texts("architectures")
    said = f"model_type={mt or None!r}, architectures={arch or None}"
    if len(found) != 1:
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} tensors)" if len(names) > 12 else "")
        known = "; ".join(f"{k}: {v}" for k, v in _SHAPES.items())
        what = "no attention layout" if not found else f"several layouts ({sorted(found)})"
        raise ValueError(
            f"checkpoint {str(path)!r} ({said}) has {what} attnflow knows: its tensors are "
            f"[{shown}]. Known layouts (names after an optional prefix) - {known}."
        )
    lay, (prefixes, layers) = next(iter(found.items()))
    want = _config_layout(cfg)
    if want is not None and want != lay:
        raise ValueError(
            f"checkpoint {str(path)!r}: config.json says {said} (layout {want!r}) but the "
            f"tensors are in the {lay!r} layout ({_SHAPES[lay]}); fix config.json or the "
            f"file."
        )
    if len(prefixes) > 1:
        raise ValueError(
            f"checkpoint {str(path)!r} holds several models (prefixes {sorted(prefixes)}); "
            f"extract one."
        )
    required = _PATTERNS[lay][1]
    for key, parts in sorted(layers.items()):
        missing = sorted(required - set(parts))
        if missing:
            raise ValueError(f"checkpoint {str(path)!r}: layer {key} lacks {missing}.")
    keys = sorted(layers)
    return CheckpointLayout(
        name=lay,
        prefix=prefixes.pop(),
        layers={i: layers[k] for i, k in enumerate(keys)}
        if lay == "albert"
        else {k[0]: layers[k] for k in keys},
        keys={i: k for i, k in enumerate(keys)} if lay == "albert" else {k[0]: k for k in keys},
        config=cfg,
        path=path,
    )


def _f64(path: Path, names: Sequence[str], reader: str) -> dict[str, np.ndarray]:
    raw = read_safetensors(path, list(names), reader=reader)
    return {k: checked_tensor(path, k, v) for k, v in raw.items()}


def _heads_count(num_heads: Any, cfg: CheckpointConfig, keys: Sequence[str], path: Path) -> int:
    n = num_heads
    if n is None:
        n = next((cfg.integer(k) for k in keys if cfg.get(k) is not None), None)
        if n is None:
            raise ValueError(
                f"num_heads is needed: {str(path)!r} has no config.json with "
                f"{' or '.join(keys)} beside it; pass num_heads=."
            )
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"num_heads must be a positive integer; got {n!r}.")
    return int(n)


def _split(
    layer: int,
    h: int,
    WQ: np.ndarray,
    WK: np.ndarray,
    WV: np.ndarray,
    WO: np.ndarray,
    dh: int,
    g: int,
    beta: float,
    base: dict,
    rows: np.ndarray | None = None,
) -> TrainedHead:
    """Head ``h`` reading key/value group ``g``: rows ``r_h`` of W_Q, ``r_g`` of W_K and
    W_V, columns ``r_h`` of W_O; Q and K rows reordered by ``rows``."""
    rh, rg = slice(h * dh, (h + 1) * dh), slice(g * dh, (g + 1) * dh)
    perm = np.arange(dh) if rows is None else rows
    WOh, WVh = WO[:, rh].copy(), WV[rg, :].copy()
    return TrainedHead(
        layer=layer,
        head=h,
        Q=WQ[rh][perm].copy(),
        K=WK[rg][perm].copy(),
        V=WOh @ WVh,
        beta=beta,
        W_O_h=WOh,
        W_V_h=WVh,
        kv_head=g,
        **base,
    )


def _albert(lay: CheckpointLayout, num_heads, reader: str) -> list[TrainedHead]:
    cfg, heads = lay.config, []
    n_layers = cfg.integer("num_hidden_layers")
    groups = cfg.integer("num_hidden_groups", 1)
    inner = cfg.integer("inner_group_num", 1)
    for idx, parts in lay.layers.items():
        g, i = lay.keys[idx]
        shared: tuple[int, ...] = ()
        if n_layers:
            per = n_layers / groups
            shared = tuple(l * inner + i for l in range(n_layers) if int(l / per) == g)
        W = _f64(lay.path, [parts[p] for p in ("query", "key", "value", "dense")], reader)
        WQ, WK, WV, WO = (W[parts[p]] for p in ("query", "key", "value", "dense"))
        d = WQ.shape[-1]
        for p, A in zip(("query", "key", "value", "dense"), (WQ, WK, WV, WO)):
            expect_shape(lay.path, parts[p], A, (d, d), "ALBERT's attention weights are (H, H)")
        n = _heads_count(num_heads, cfg, ["num_attention_heads"], lay.path)
        if d % n:
            raise ValueError(
                f"checkpoint {str(lay.path)!r}: num_heads = {n} does not divide the hidden "
                f"size {d}."
            )
        dh = d // n
        base = dict(
            source=str(lay.path), layout="albert", model_type=lay.model_type,
            shared_layers=shared, num_kv_heads=None,
        )  # fmt: skip
        heads += [_split(idx, h, WQ, WK, WV, WO, dh, h, 1 / math.sqrt(dh), base) for h in range(n)]
    return heads


def _gpt2(lay: CheckpointLayout, num_heads, reader: str) -> list[TrainedHead]:
    cfg, heads = lay.config, []
    scale = cfg.boolean("scale_attn_weights", True)
    by_layer = cfg.boolean("scale_attn_by_inverse_layer_idx", False)
    for layer, parts in lay.layers.items():
        W = _f64(lay.path, [parts["c_attn"], parts["c_proj"]], reader)
        A, P = W[parts["c_attn"]], W[parts["c_proj"]]
        d = A.shape[0]
        expect_shape(lay.path, parts["c_attn"], A, (d, 3 * d), "Conv1D (in, out), q|k|v fused")
        expect_shape(lay.path, parts["c_proj"], P, (d, d), "Conv1D (in, out)")
        WQ, WK, WV, WO = A[:, :d].T, A[:, d : 2 * d].T, A[:, 2 * d :].T, P.T
        n = _heads_count(num_heads, cfg, ["n_head", "num_attention_heads"], lay.path)
        if d % n:
            raise ValueError(
                f"checkpoint {str(lay.path)!r}: num_heads = {n} does not divide n_embd = {d}."
            )
        dh = d // n
        beta = (1 / math.sqrt(dh) if scale else 1.0) / ((layer + 1) if by_layer else 1)
        base = dict(source=str(lay.path), layout="gpt2", model_type=lay.model_type, causal=True)
        heads += [_split(layer, h, WQ, WK, WV, WO, dh, h, beta, base) for h in range(n)]
    return heads


def _rope(cfg: CheckpointConfig) -> tuple[float, dict | None]:
    """``(theta, scaling)``: ``rope_theta`` (or ``rope_parameters.rope_theta``, default
    10000 as transformers' when neither is given; a given one must be a number > 0),
    and the scaling when it changes the frequencies."""
    params = CheckpointConfig(cfg.mapping("rope_parameters") or {}, cfg.path)
    theta = cfg.number("rope_theta", lo=0.0, lo_open=True)
    if theta is None:
        theta = params.number("rope_theta", 10000.0, lo=0.0, lo_open=True)
    scaling = cfg.mapping("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    factor = cfg.number("partial_rotary_factor", 1.0, lo=0.0, lo_open=True, hi=1.0)
    if factor != 1.0:
        scaling = {**(scaling or {}), "partial_rotary_factor": factor}
    return float(theta), scaling


def _llama(lay: CheckpointLayout, num_heads, reader: str) -> list[TrainedHead]:
    cfg, heads = lay.config, []
    theta, scaling = _rope(cfg)
    eps = cfg.number("rms_norm_eps", lo=0.0)
    for layer, parts in lay.layers.items():
        names = [
            parts[p]
            for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
            if p in parts
        ]
        W = _f64(lay.path, names, reader)
        WQ, WK, WV, WO = (W[parts[p]] for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
        d = WQ.shape[-1]
        n = _heads_count(num_heads, cfg, ["num_attention_heads"], lay.path)
        if WQ.ndim != 2 or WQ.shape[0] % n or WQ.shape[0] == 0:
            raise ValueError(
                f"checkpoint {str(lay.path)!r}: tensor {parts['q_proj']!r} has shape "
                f"{WQ.shape}: num_heads = {n} does not divide its rows (num_heads x head_dim)."
            )
        dh = WQ.shape[0] // n
        head_dim = cfg.integer("head_dim")
        if head_dim not in (None, dh):
            raise ValueError(
                f"{cfg.path}: head_dim = {head_dim} but {parts['q_proj']!r} has "
                f"{WQ.shape[0]} rows for {n} heads (head_dim {dh})."
            )
        if dh % 2:
            raise ValueError(
                f"checkpoint {str(lay.path)!r}: head_dim = {dh} is odd: rotary embeddings "
                f"need an even one."
            )
        n_kv = cfg.integer("num_key_value_heads", n)
        if n % n_kv:
            raise ValueError(
                f"{cfg.path}: num_key_value_heads = {n_kv} does not divide num_heads = {n}."
            )
        P = lay.path
        expect_shape(P, parts["q_proj"], WQ, (n * dh, d), "num_heads x head_dim, hidden")
        expect_shape(P, parts["k_proj"], WK, (n_kv * dh, d), "num_kv_heads x head_dim, hidden")
        expect_shape(P, parts["v_proj"], WV, (n_kv * dh, d), "num_kv_heads x head_dim, hidden")
        expect_shape(P, parts["o_proj"], WO, (d, n * dh), "hidden, num_heads x head_dim")
        gq, gk, scope, width = (
            W.get(parts.get("q_norm", "")),
            W.get(parts.get("k_norm", "")),
            None,
            None,
        )
        if (gq is None) != (gk is None):
            raise ValueError(
                f"checkpoint {str(lay.path)!r}: layer {layer} has one of q_norm and k_norm "
                f"but not the other."
            )
        if gq is not None and gk is not None:
            if gq.shape == gk.shape == (dh,):
                scope, width = "head", (dh, dh)
                gq, gk = np.tile(gq, n), np.tile(gk, n_kv)
            else:
                why = "(head_dim,) per head or all heads'"
                expect_shape(P, parts["q_norm"], gq, (n * dh,), why)
                expect_shape(P, parts["k_norm"], gk, (n_kv * dh,), why)
                scope, width = "layer", (n * dh, n_kv * dh)
        pi = np.arange(dh).reshape(2, dh // 2).T.reshape(-1)  # rotate_half -> planes (2c, 2c+1)
        group = n // n_kv
        for h in range(n):
            g = h // group
            extra = {}
            if gq is not None and gk is not None:
                extra = dict(
                    q_norm=gq[h * dh : (h + 1) * dh][pi].copy(),
                    k_norm=gk[g * dh : (g + 1) * dh][pi].copy(),
                    qk_norm_scope=scope, qk_norm_width=width,
                )  # fmt: skip
            base = dict(
                source=str(lay.path), layout="llama", model_type=lay.model_type, causal=True,
                num_kv_heads=n_kv, rope_theta=theta, rope_scaling=scaling,
                norm_eps=eps, **extra,
            )  # fmt: skip
            heads.append(_split(layer, h, WQ, WK, WV, WO, dh, g, 1 / math.sqrt(dh), base, pi))
    return heads


def load_heads(
    checkpoint: str | Path,
    *,
    num_heads: int | None = None,
    layers: Sequence[int] | None = None,
    reader: str = "auto",
) -> list[TrainedHead]:
    """Every attention head of a BERT, ALBERT, GPT-2 or Llama-style checkpoint.

    Args:
        checkpoint: ``"minilm"``, a ``.safetensors`` file or a folder (with its
            ``config.json``); the layout is ``detect_layout``'s.
        num_heads: query heads per layer; default from ``config.json``
            (``num_attention_heads``, GPT-2's ``n_head``).
        layers: only these layers (ALBERT: weight sets), default all.
        reader: see ``attnflow.io.checkpoints.read_safetensors``.

    Returns:
        One ``TrainedHead`` per (layer, head) in order, float64, in the convention of
        ``attnflow.io.checkpoints`` (``Q_h, K_h`` ``(d_h, d)``, ``V_h = W_O[:, r_h]
        W_V[r_g]`` ``(d, d)``), with the layout's extras (module doc).

    Raises:
        ValueError: from ``detect_layout``, or naming a tensor whose shape does not fit
            the config.

    Example:
        >>> heads = load_heads("path/to/qwen3")  # doctest: +SKIP
        >>> heads[0].describe()  # doctest: +SKIP
        'qwen3, causal, 8 key/value heads (query head -> 0), RoPE base 1e+06, QK norm ...'
    """
    lay = detect_layout(checkpoint)
    if layers is not None:
        bad = [l for l in layers if l not in lay.layers]
        if bad:
            raise ValueError(
                f"layers {bad} are not in the checkpoint (it has {sorted(lay.layers)})."
            )
        lay = dataclasses.replace(lay, layers={l: lay.layers[l] for l in layers})
    if lay.name == "bert":
        out = load_bert_heads(lay.path, num_heads=num_heads, layers=layers, reader=reader)
        fields = [f.name for f in dataclasses.fields(HeadWeights)]
        return [
            TrainedHead(
                **{f: getattr(h, f) for f in fields}, layout="bert", model_type=lay.model_type
            )
            for h in out
        ]
    return {"albert": _albert, "gpt2": _gpt2, "llama": _llama}[lay.name](lay, num_heads, reader)
