"""Are the leaders the informative tokens? Each token's measured importance to the
sentence embedding, against the attention it receives in the real forward pass and the
leaders that each head's particle system predicts.

Importance (``token_importance``). For a sentence of word pieces ``[CLS] w_1 .. w_m
[SEP]`` with pooled, L2-normalised embedding ``e`` (the checkpoint's declared pooling;
all-MiniLM-L6-v2: the mean over the tokens, normalised), the importance of ``w_k`` is
``1 - <e, e_k> = |e - e_k|^2 / 2`` where ``e_k`` is the embedding of

- ``"remove"``: the sentence with ``w_k`` deleted (the later tokens move up one
  position, as if the word piece had not been written), or
- ``"mask"``: the sentence with ``w_k``'s attention-mask entry 0 (no token attends to
  it, the mean pooling leaves it out; every other token keeps its position).

[CLS] and [SEP] are never removed or masked (a sentence without them is not what the
model was trained on): importances are given for ``w_1 .. w_m`` only, positions ``1 ..
n - 2``. Variants are run in padded batches of a fixed shape (padded keys get weight
exactly 0, as in ``encoder_forward``).

Scores compared with the importance over the word pieces of each sentence (positions
``1 .. n - 2``; the attention [CLS] and [SEP] receive is reported by the layerwise
summary): for every layer ``l`` and head ``h``, ``attention`` the column sums ``sum_i
P^h_ij`` of the real forward pass at layer ``l``; ``predicted`` the leaders of head
``h`` run as a particle system from the tokens entering layer ``l``
(``attnflow.studies.layerwise``): the column sums of its final attention matrix where
they exceed 0.5 (``leaders_of``'s rule), 0 elsewhere, so the leaders count with the
attention they receive (their followers, once the matrix is Boolean) and the other word
pieces tie; per layer, either score averaged over the heads.

Statistics (``compare``). Per sentence, Spearman's ``rho`` (Pearson correlation of the
average ranks; ``spearman``) and Kendall's ``tau_b`` (``scipy.stats.kendalltau``) of a
score against the importance; undefined where the score is constant over the word
pieces (a head whose leaders are all [CLS] or [SEP]): those sentences are left out of
that head's mean and counted (``defined``). Per head and per layer: the mean over
sentences with a percentile bootstrap interval over sentences (``bootstrap_mean``), and
a random baseline: the same mean with the importances permuted at random within each
sentence, its 2.5 and 97.5 percentiles over the permutations. ``top1``: how often the
word piece with the largest score is the most important one, against the chance rate
``mean 1 / m``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _checks
from ._rankstats import bootstrap_mean, nanmean, pearson_rows, ranks, spearman

__all__ = [
    "MODES",
    "token_importance",
    "run_importance",
    "load_importance",
    "ImportanceResult",
    "spearman",
    "bootstrap_mean",
    "compare",
]

MODES = ("remove", "mask")
LEADER_THRESHOLD = 0.5  # attnflow.analysis.rank.leaders_of


# ================================================================== importance
def _variants(ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, mask) rows: the sentence, then each word piece removed, then masked."""
    n = ids.size
    rows = [(ids, np.ones(n, np.int64))]
    rows += [(np.delete(ids, k), np.ones(n - 1, np.int64)) for k in range(1, n - 1)]
    for k in range(1, n - 1):
        m = np.ones(n, np.int64)
        m[k] = 0
        rows.append((ids, m))
    return rows


def token_importance(
    weights: Any,
    ids: Sequence[npt.ArrayLike],
    *,
    batch: int = 32,
    bucket: int = 16,
) -> list[dict[str, np.ndarray]]:
    """Importance by removal and by masking of every word piece of every sentence.

    Args:
        weights: an ``EncoderWeights`` with a pooling (``load_encoder_weights``).
        ids: per sentence its token ids ``(n,)``, [CLS] first and [SEP] last, ``n >= 3``.
        batch: rows per forward pass; bucket: rows are padded to a multiple of this
            length (so that few shapes are compiled).

    Returns:
        Per sentence ``{"remove": (n - 2,), "mask": (n - 2,)}``: ``1 - <e, e_k>`` for
        ``k = 1 .. n - 2`` (module docstring).

    Raises:
        ValueError: a checkpoint without a pooling, a sentence shorter than 3 tokens.
    """
    from ..networks.encoder import encoder_forward

    if weights.pooling is None:
        raise ValueError(
            "weights has no sentence pooling (no modules.json beside the checkpoint): the "
            "importance is a change of the sentence embedding."
        )
    batch = _checks.integer("batch", batch, lo=1)
    bucket = _checks.integer("bucket", bucket, lo=1)
    arrs = [np.asarray(a, np.int64).reshape(-1) for a in ids]
    if any(a.size < 3 for a in arrs):
        raise ValueError("every sentence needs [CLS], one word piece and [SEP] (n >= 3).")
    rows = [(s, r) for s, a in enumerate(arrs) for r in _variants(a)]
    emb: list[np.ndarray | None] = [None] * len(rows)
    limit = int(weights.embeddings["position"].shape[0])
    by_len: dict[int, list[int]] = {}
    for i, (_, (a, _)) in enumerate(rows):
        by_len.setdefault(min(-(-a.size // bucket) * bucket, limit), []).append(i)
    for width, idx in sorted(by_len.items()):
        for c in range(0, len(idx), batch):
            part = idx[c : c + batch]
            ids_b = np.full((batch, width), weights.pad_token_id, np.int64)
            mask_b = np.zeros((batch, width), np.int64)
            for r, i in enumerate(part + [part[0]] * (batch - len(part))):
                a, m = rows[i][1]
                ids_b[r, : a.size], mask_b[r, : a.size] = a, m
            out = encoder_forward(weights, ids_b, mask_b)
            pooled = np.asarray(out.pooled, np.float64)
            for r, i in enumerate(part):
                emb[i] = pooled[r] / np.linalg.norm(pooled[r])
    result, pos = [], 0
    for a in arrs:
        m = a.size - 2
        e = [x for x in emb[pos : pos + 1 + 2 * m] if x is not None]
        base = e[0]
        result.append(
            {
                "remove": 1.0 - np.array([base @ v for v in e[1 : 1 + m]]),
                "mask": 1.0 - np.array([base @ v for v in e[1 + m :]]),
            }
        )
        pos += 1 + 2 * m
    return result


@dataclasses.dataclass(frozen=True, eq=False)
class ImportanceResult:
    """A run of ``run_importance``: ``config``, ``info`` and per finished sentence a
    record ``{"index", "ids", "remove", "mask"}`` (importances of positions 1 .. n - 2)."""

    config: dict
    info: dict
    records: list

    def summary(self) -> dict[str, Any]:
        """Means of the importances, and how the two kinds agree (mean Spearman)."""
        if not self.records:
            return {"sentences": 0}
        rem = np.concatenate([r["remove"] for r in self.records])
        msk = np.concatenate([r["mask"] for r in self.records])
        rho = [spearman(r["remove"], r["mask"]) for r in self.records]
        return {
            "sentences": len(self.records),
            "word_pieces": int(rem.size),
            "remove_mean": float(rem.mean()),
            "remove_max": float(rem.max()),
            "mask_mean": float(msk.mean()),
            "mask_max": float(msk.max()),
            "remove_vs_mask_spearman_mean": float(np.nanmean(rho)),
        }


def run_importance(
    out_dir: str | Path,
    corpus: Any,
    *,
    checkpoint: str | Path = "minilm",
    batch: int = 32,
    bucket: int = 16,
    chunk: int = 8,
    progress: bool = True,
) -> ImportanceResult:
    """The importance of every word piece of every sentence of ``corpus`` (module
    docstring), saved per sentence in ``out_dir`` and resumable like
    ``attnflow.studies.layerwise.run_layerwise``.

    Args:
        out_dir: the store's folder.
        corpus: a ``Corpus`` or a list of sentences.
        checkpoint: ``"minilm"`` or a path (with its ``tokenizer.json`` and
            sentence-transformers files).
        batch, bucket: see ``token_importance``; chunk: sentences per call.
        progress: a tqdm bar over the sentences.

    Returns:
        The ``ImportanceResult`` (``load_importance(out_dir)``).

    Example:
        >>> res = run_importance("runs/importance", ["The cat sat on the mat."])  # doctest: +SKIP
        >>> first = res.records[0]  # doctest: +SKIP
        >>> first.get("remove")  # one importance per word piece  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from .._meta import run_metadata
    from .._parallel import blas_threads
    from ..io.checkpoints import load_tokenizer, resolve_checkpoint
    from ..io.encoder_weights import load_encoder_weights
    from ..networks._sentence_store import SentenceStore, code_hash

    sentences = list(getattr(corpus, "sentences", corpus))
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError("corpus must be a Corpus or a non-empty list of non-empty sentences.")
    chunk = _checks.integer("chunk", chunk, lo=1)
    path = resolve_checkpoint(checkpoint)
    weights = load_encoder_weights(path)
    enc = load_tokenizer(path).encode_batch(sentences)
    config = dict(
        checkpoint=str(path),
        sentences=sentences,
        modes=list(MODES),
        code=code_hash(__name__, "attnflow.networks.encoder"),
    )
    store = SentenceStore(out_dir, "importance", config, info=run_metadata())
    with store.locked(), blas_threads(1):
        todo = [k for k in range(len(sentences)) if k not in store.done()]
        bar = tqdm(total=len(todo), desc="importance", unit="sentence", disable=not progress)
        for c in range(0, len(todo), chunk):
            part = todo[c : c + chunk]
            ids = [np.asarray(enc[k].ids, np.int64) for k in part]
            imps = token_importance(weights, ids, batch=batch, bucket=bucket)
            for k, a, imp in zip(part, ids, imps):
                store.write(k, {"index": k, "ids": a, **imp})
                bar.update(1)
        bar.close()
    return load_importance(out_dir)


def load_importance(out_dir: str | Path) -> ImportanceResult:
    """An importance run read back from its folder (finished sentences only)."""
    from ..io.files import read_json
    from ..networks._sentence_store import SentenceStore

    meta = read_json(Path(out_dir) / "meta.json", kind="the metadata of an importance store")
    if meta.get("kind") != "importance":
        raise ValueError(f"{out_dir} is not an importance store (kind {meta.get('kind')!r}).")
    store = SentenceStore(out_dir, "importance", meta["config"])
    records = [store.read(k) for k in sorted(store.done())]
    return ImportanceResult(config=meta["config"], info=meta.get("info", {}), records=records)


# ================================================================== comparison
def _json(a: np.ndarray) -> Any:
    """Nested lists with None for NaN (undefined)."""
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return None if np.isnan(a) else float(a)
    return [_json(v) for v in a]


def _quantiles(v: np.ndarray, a: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``a`` and ``1 - a`` quantiles over the first axis, NaN for all-NaN columns."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(v, a, axis=0), np.nanquantile(v, 1 - a, axis=0)


def compare(
    layerwise: Any,
    importance: ImportanceResult,
    *,
    kind: str = "remove",
    n_boot: int = 2000,
    n_perm: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Rank correlations of the scores with the importance (module docstring).

    Args:
        layerwise: a ``LayerwiseResult`` of the same sentences and checkpoint.
        importance: an ``ImportanceResult``.
        kind: ``"remove"`` or ``"mask"``.
        n_boot, level: the bootstrap over sentences; n_perm: permutations of the random
            baseline; seed: of both.

    Returns:
        ``{"attention": ..., "predicted": ...}`` (``predicted`` over the simulated
        sentences), each with ``per_head`` (``(L, h)`` nested lists: ``rho``, ``rho_low``,
        ``rho_high``, ``null_low``, ``null_high``, ``tau``, ``tau_low``, ``tau_high``,
        ``defined``), ``per_layer`` (the mean over the heads, per sentence, then over
        sentences: the same keys, and ``top1``), ``layer_mean_score`` (the score
        averaged over the heads first), ``sentences`` and the counts of heads whose
        interval lies above or below the baseline's. ``None`` where undefined.
    """
    from scipy.stats import kendalltau

    kind = _checks.choice("kind", kind, MODES)
    n_perm = _checks.integer("n_perm", n_perm, lo=1)
    if layerwise.config["sentences"] != importance.config["sentences"]:
        raise ValueError("layerwise and importance were run on different sentences.")
    imp = {int(r["index"]): np.asarray(r[kind], np.float64) for r in importance.records}
    recs = {int(r["index"]): r for r in layerwise.records}
    common = sorted(set(recs) & set(imp))
    L, H = layerwise.num_layers, layerwise.num_heads
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"kind": kind, "level": level, "n_boot": n_boot, "n_perm": n_perm}
    for score in ("attention", "predicted"):
        rows = [k for k in common if score == "attention" or bool(recs[k]["simulated"])]
        if not rows:
            continue
        S = len(rows)
        rho = np.full((S, L, H + 1), np.nan)
        tau = np.full((S, L, H + 1), np.nan)
        top = np.full((S, L, H), np.nan)
        null = np.full((n_perm, S, L, H + 1), np.nan)
        chance = np.zeros(S)
        for s, k in enumerate(rows):
            y = imp[k]
            m = y.size
            mass = recs[k]["attn_mass" if score == "attention" else "head_mass"][:, :, 1:-1]
            if score == "predicted":  # the leaders, weighted by what they receive
                mass = np.where(mass > LEADER_THRESHOLD, mass, 0.0)
            if mass.shape[-1] != m:
                raise ValueError(f"sentence {k}: the two runs tokenised it differently.")
            X = np.concatenate([mass, mass.mean(axis=1, keepdims=True)], axis=1).reshape(-1, m)
            yr = ranks(y)
            perms = np.stack([rng.permutation(yr) for _ in range(n_perm)])
            R = pearson_rows(ranks(X), np.vstack([yr[None], perms]))
            rho[s] = R[:, 0].reshape(L, H + 1)
            null[:, s] = R[:, 1:].T.reshape(n_perm, L, H + 1)
            for i in np.flatnonzero(np.isfinite(R[:, 0])):
                tau[s].flat[i] = np.float64(kendalltau(X[i], y)[0])  # pyright: ignore[reportArgumentType]
            hit = (X.reshape(L, H + 1, m)[:, :H].argmax(-1) == y.argmax()).astype(float)
            top[s] = np.where(np.isnan(rho[s, :, :H]), np.nan, hit)
            chance[s] = 1.0 / m
        res: dict[str, Any] = {"sentences": S}
        r_m, r_lo, r_hi = bootstrap_mean(rho, n_boot=n_boot, level=level, seed=seed)
        t_m, t_lo, t_hi = bootstrap_mean(tau, n_boot=n_boot, level=level, seed=seed)
        nm = nanmean(null, axis=1)  # (P, L, H + 1): the baseline's mean over sentences
        a = (1 - level) / 2
        n_lo, n_hi = _quantiles(nm, a)
        defined = np.isfinite(rho).sum(0)
        res["per_head"] = {
            "rho": _json(r_m[:, :H]), "rho_low": _json(r_lo[:, :H]),
            "rho_high": _json(r_hi[:, :H]), "null_low": _json(n_lo[:, :H]),
            "null_high": _json(n_hi[:, :H]), "tau": _json(t_m[:, :H]),
            "tau_low": _json(t_lo[:, :H]), "tau_high": _json(t_hi[:, :H]),
            "defined": defined[:, :H].tolist(),
        }  # fmt: skip
        res["layer_mean_score"] = {
            "rho": _json(r_m[:, H]), "rho_low": _json(r_lo[:, H]),
            "rho_high": _json(r_hi[:, H]), "null_low": _json(n_lo[:, H]),
            "null_high": _json(n_hi[:, H]), "tau": _json(t_m[:, H]),
            "defined": defined[:, H].tolist(),
        }  # fmt: skip
        lay = nanmean(rho[:, :, :H], axis=2)  # (S, L): per sentence, mean over heads
        l_m, l_lo, l_hi = bootstrap_mean(lay, n_boot=n_boot, level=level, seed=seed)
        lt_m, lt_lo, lt_hi = bootstrap_mean(
            nanmean(tau[:, :, :H], axis=2), n_boot=n_boot, level=level, seed=seed
        )
        ln = nanmean(nanmean(null[..., :H], axis=3), axis=1)  # (P, L)
        res["per_layer"] = {
            "rho": _json(l_m), "rho_low": _json(l_lo), "rho_high": _json(l_hi),
            "null_low": _json(_quantiles(ln, a)[0]),
            "null_high": _json(_quantiles(ln, a)[1]),
            "tau": _json(lt_m), "tau_low": _json(lt_lo), "tau_high": _json(lt_hi),
            "defined_fraction": (np.isfinite(rho[:, :, :H]).mean(axis=(0, 2))).tolist(),
            "top1": _json(nanmean(top.transpose(1, 0, 2).reshape(L, S * H), axis=1)),
            "top1_chance": float(chance.mean()),
        }  # fmt: skip
        ok = np.isfinite(r_lo[:, :H]) & np.isfinite(n_hi[:, :H])
        res["heads_above_baseline"] = int((ok & (r_lo[:, :H] > n_hi[:, :H])).sum())
        res["heads_below_baseline"] = int((ok & (r_hi[:, :H] < n_lo[:, :H])).sum())
        res["heads_compared"] = int(ok.sum())
        out[score] = res
    return out
