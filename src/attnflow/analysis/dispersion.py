"""Softmax dispersion: the largest attention coefficient against the bound, entropy, sinks.

Velickovic et al. (2024, Lemma 2.1): for ``n`` logits with spread ``delta = max - min``
(the temperature already inside the logits), no softmax coefficient exceeds

    bound_tight = 1 / (1 + (n - 1) e^{-delta})  <=  bound_loose = e^{delta} / n,

and the tight form is attained by one logit at the maximum and ``n - 1`` at the minimum.
So with bounded logits every coefficient tends to 0 as ``n`` grows: a head that looks
sharp at training length flattens at long context. Normalising queries and keys
(``kernel="qknorm"``) bounds ``delta`` by ``2 beta p`` whatever the tokens.

``dispersion`` measures, per query row ``i`` over the ``n_i`` keys it keeps: the
largest coefficient, the spread of the kept logits and both bounds with ``n = n_i``, the
entropy (nats, and divided by ``log n_i``; 0 for a row of one key), and the sink mass
(attention on the first ``sink`` tokens). The kept keys are a model's declared
``kept_keys`` (its mask's ``keep``; a family that masks inside its own weights declares
its own), or, for a matrix with its logits, the keys whose logit is finite (``-inf``: a
masked key); a matrix without logits keeps every key. On a causal softmax head row 0
keeps one key: its bound is 1. It reads an attention matrix (with its logits), a
trajectory at a saved time, or a model and tokens (then only the requested query rows
are computed, in tiles: never the ``(n, n)`` matrix). ``dispersion_scan`` tabulates the
largest coefficient and the bounds against ``n`` for several kernels (``attnflow
dispersion`` on the command line, figure 1 of ``attnflow.experiments.fig_dispersion``).

A bound is not a rate: the bound says how large a coefficient may be, not how fast
real attention flattens; it is a statement about a softmax over the keys a row keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
from jaxtyping import Float, Int

from .. import _checks
from ..dynamics import kernels as _kernels

__all__ = [
    "DispersionReport",
    "dispersion",
    "dispersion_scan",
    "bound_tight",
    "bound_loose",
    "qknorm_delta_bound",
    "prenorm_logit_bound",
]


# -------------------------------------------------------------------------- bounds
def bound_tight(delta: Float[npt.ArrayLike, "*b"], n: Any) -> Float[np.ndarray, "*b"]:
    """``1 / (1 + (n - 1) e^{-delta})``: the largest softmax coefficient possible for
    ``n`` logits of spread ``delta`` (temperature inside the logits). Arrays broadcast."""
    delta = np.asarray(delta, np.float64)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + (np.asarray(n, np.float64) - 1.0) * np.exp(-delta))


def bound_loose(delta: Float[npt.ArrayLike, "*b"], n: Any) -> Float[np.ndarray, "*b"]:
    """``e^{delta} / n`` (``>= bound_tight``); ``inf`` past the float range."""
    with np.errstate(over="ignore"):
        return np.exp(np.asarray(delta, np.float64)) / np.asarray(n, np.float64)


def qknorm_delta_bound(beta: float, p: int) -> float:
    """``2 beta p``: the largest logit spread of ``qknorm`` (``|q^| = |k^| = sqrt(p)``)."""
    return 2.0 * float(beta) * int(p)


def prenorm_logit_bound(
    Q: Float[npt.ArrayLike, "p d"], K: Float[npt.ArrayLike, "p d"], *, beta: float = 1.0
) -> float:
    """``beta d ||Q^T K||_2``: the largest ``|logit|`` of ``kernel="prenorm"``, whose
    tokens are normalised to ``|x^| = sqrt(d)`` before Q and K (so the spread ``delta``
    is at most twice this). Attained by a top singular pair of ``Q^T K``.

    Args:
        Q, K: query and key maps ``(p, d)``.
        beta: inverse temperature.

    Returns:
        The bound, a float.
    """
    Qa, Ka = np.asarray(Q, np.float64), np.asarray(K, np.float64)
    return float(beta) * Qa.shape[-1] * float(np.linalg.norm(Qa.T @ Ka, 2))


# -------------------------------------------------------------------------- report
@dataclasses.dataclass(frozen=True)
class DispersionReport:
    """Per-row dispersion statistics; every array has the shape of ``P`` without its last
    axis: ``(rows,)`` for one matrix, ``(b, rows)`` for a batch of trajectories.

    Attributes:
        max: the largest coefficient of each row, ``max_j P_ij``.
        argmax: the token it falls on (-1 for a row of NaN).
        delta: the logit spread ``max_j L_ij - min_j L_ij`` over the kept keys of the
            row (NaN without logits).
        bound_tight: ``1 / (1 + (n_i - 1) e^{-delta})``, the largest possible softmax
            coefficient for that spread over the ``n_i`` kept keys.
        bound_loose: ``e^{delta} / n_i``.
        entropy: ``-sum_j a_ij log a_ij`` in nats, of the row normalised to sum 1
            (``a = P`` for row-stochastic kernels; for ``sigmoid``, ``P / row_sum``).
        entropy_normalized: ``entropy / log n_i`` (1 for a uniform row over its kept
            keys; 0 for a row that keeps one key).
        sink_mass: ``sum_{j < sink} P_ij``, the attention on the first ``sink`` tokens
            (Bertsch et al. average it over queries: ``mean_sink_mass``).
        row_sum: ``sum_j P_ij`` (1 for every kernel but ``sigmoid``).
        share_max: ``max / row_sum``: the fraction of the row's attention on its top token.
        n: number of keys; sink: the number of sink tokens; kernel: the kernel, when known.
        kept: ``n_i``, the number of keys each row keeps (``n`` without a mask).
    """

    max: np.ndarray
    argmax: np.ndarray
    delta: np.ndarray
    bound_tight: np.ndarray
    bound_loose: np.ndarray
    entropy: np.ndarray
    entropy_normalized: np.ndarray
    sink_mass: np.ndarray
    row_sum: np.ndarray
    share_max: np.ndarray
    n: int
    sink: int
    kernel: str | None = None
    kept: np.ndarray | None = None

    @property
    def mean_sink_mass(self) -> np.ndarray:
        """Sink mass averaged over query rows (a number, or ``(b,)`` for a batch)."""
        return np.mean(self.sink_mass, axis=-1)

    @property
    def bound_holds(self) -> np.ndarray:
        """Whether ``max <= bound_tight`` in each row (to rounding); only meaningful for
        softmax-type kernels on the logits given (``ssmax``, ``adaptive`` and ``sigmoid``
        may exceed the softmax bound of their pre-kernel logits: that is their point)."""
        return self.max <= self.bound_tight * (1 + 1e-9) + 1e-300

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["mean_sink_mass"] = self.mean_sink_mass
        return out

    def summary(self) -> str:
        mx = np.nanmax(self.max)
        bt = np.nanmax(self.bound_tight) if np.any(np.isfinite(self.bound_tight)) else np.nan
        return (
            f"n = {self.n}{'' if self.kernel is None else f', kernel {self.kernel}'}: "
            f"largest coefficient {mx:.4g} (tight bound {bt:.4g}, max delta "
            f"{np.nanmax(self.delta) if np.any(np.isfinite(self.delta)) else np.nan:.4g}), "
            f"mean normalised entropy {np.nanmean(self.entropy_normalized):.4g}, "
            f"mean sink mass {np.nanmean(self.sink_mass):.4g} (first {self.sink})"
        )


# ---------------------------------------------------------------------- row stats
def _row_stats(P, L, sink: int, keep):
    """Per-row statistics of weights ``P`` ``(..., n)`` and logits ``L`` (or None) over
    the keys ``keep`` (boolean, the shape of ``P``) each row keeps."""
    rs = jnp.sum(P, axis=-1)
    mx = jnp.max(P, axis=-1)
    a = P / rs[..., None]
    ent = -jnp.sum(jnp.where(a > 0, a * jnp.log(jnp.where(a > 0, a, 1.0)), 0.0), axis=-1)
    out = dict(
        max=mx,
        argmax=jnp.argmax(P, axis=-1),
        entropy=ent,
        sink_mass=jnp.sum(P[..., :sink], axis=-1),
        row_sum=rs,
        share_max=mx / rs,
        kept=jnp.sum(keep, axis=-1),
    )
    if L is not None:
        if L.shape[-1] != keep.shape[-1]:  # logits of two maps side by side: every one
            keep = jnp.ones(L.shape, dtype=bool)
        hi, lo = jnp.where(keep, L, -jnp.inf), jnp.where(keep, L, jnp.inf)
        out["delta"] = jnp.max(hi, axis=-1) - jnp.min(lo, axis=-1)
    return out


@eqx.filter_jit
def _qk_stats(model, x, q, k, rows, sink: int, block: int):
    """Statistics of query rows ``rows`` (indices) against all keys, through the model's
    ``attention_rows`` and its declared ``kept_keys``: in tiles of ``block`` rows when
    the model is row-wise, else at once (row ``i`` may read every other row)."""

    def tile(ri):
        P, L, _ = model.attention_rows(q, k, ri)
        return _row_stats(P, L, sink, model.kept_keys(x, ri))

    r = rows.shape[0]
    if not model.rowwise or block <= 0 or block >= r:
        return tile(rows)
    nb = -(-r // block)
    rb = jnp.pad(rows, (0, nb * block - r)).reshape(nb, block)
    out = jax.lax.map(tile, rb)
    return {key: v.reshape((nb * block,) + v.shape[2:])[:r] for key, v in out.items()}


def _kind(model) -> str:
    """The report's ``kernel``: the kernel's name, or the family's own attention."""
    from ..dynamics.base import AbstractKernelAttention

    if isinstance(model, AbstractKernelAttention):
        return model.kernel.name
    return model.attention_kind


def _report(st: dict, n: int, sink: int, kernel) -> DispersionReport:
    st = {key: np.asarray(v) for key, v in st.items()}
    mx = st["max"]
    delta = st.get("delta")
    if delta is None:
        delta = np.full(mx.shape, np.nan)
    delta = np.asarray(delta, np.float64)
    ent = st["entropy"]
    kept = np.asarray(st["kept"], np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a row of one key: entropy 0 of at most 0, reported 0 (all its weight on one key)
        ent_n = np.where(kept > 1, ent / np.log(np.maximum(kept, 2)), 0.0)
    ent_n = np.where(np.isnan(ent), np.nan, ent_n)
    return DispersionReport(
        max=mx,
        # a row with a NaN (the unreached saves of a failed system) has no top token
        argmax=np.where(np.isnan(mx), -1, st["argmax"]),
        delta=delta,
        bound_tight=bound_tight(delta, kept),
        bound_loose=bound_loose(delta, kept),
        entropy=ent,
        entropy_normalized=ent_n,
        sink_mass=st["sink_mass"],
        row_sum=st["row_sum"],
        share_max=st["share_max"],
        n=int(n),
        sink=int(sink),
        kernel=kernel,
        kept=kept,
    )


def _check_sink(sink: Any, n: int) -> int:
    return _checks.integer("sink", sink, lo=0, hi=n)


def _auto_rows_block(n: int) -> int:
    return max(1, _kernels.BLOCK_ENTRIES // max(1, n))


def _model_report(full, head, x, rows, sink, block, *, finite: bool = True) -> DispersionReport:
    """The report of ``full.head(head)`` on tokens ``x``. A stacked model (``attnflow.stack``)
    serves a batch ``(b, n, d)`` with ``b`` its stack size, system ``i`` with model ``i``.
    ``finite=False`` for a trajectory's saves: the unreached saves of a failed system are
    NaN, and their rows come out NaN (``argmax`` -1), the other systems' as usual."""
    stacked = full.stack_size
    if stacked is None:
        model = full.head(head)
    else:
        from ..dynamics.stack import unstack

        model = unstack(full, 0).head(head)  # its d, dtype and kernel: those of every one
    hint = f"(n, {model.d}) or (b, n, {model.d})"
    x = jnp.asarray(
        _checks.real_array("x", x, ndim=(2, 3), finite=finite, shape_hint=hint), model.dtype
    )
    if x.shape[-1] != model.d:
        raise ValueError(
            f"x must be tokens (n, {model.d}) or a batch (b, n, {model.d}); "
            f"got shape {tuple(x.shape)}."
        )
    if stacked is not None and (x.ndim != 3 or x.shape[0] != stacked):
        raise ValueError(
            f"the model is stacked ({stacked} models, attnflow.stack): x must be a batch "
            f"({stacked}, n, {model.d}), system i for model i; got shape {tuple(x.shape)}."
        )
    n = x.shape[-2]
    sink = _check_sink(sink, n)
    if rows is None:
        idx = np.arange(n)
    else:
        if isinstance(rows, slice):
            idx = np.arange(n)[rows]
        else:
            given = np.asarray(rows)
            whole = given.dtype.kind in "iu" or (
                given.dtype.kind == "f"
                and bool(np.all(np.isfinite(given) & (given == np.round(given))))
            )
            if not whole or given.dtype == bool:  # 0.5 would have become row 0
                raise ValueError(
                    f"rows must be a slice or a 1-d array of whole query indices in "
                    f"[0, {n}); got {rows!r}."
                )
            idx = given.astype(np.int64)
        if idx.ndim != 1 or idx.size < 1 or np.any((idx < -n) | (idx >= n)):
            raise ValueError(
                f"rows must be a slice or a 1-d array of query indices in [0, {n}); got {rows!r}."
            )
    block = _auto_rows_block(n) if block is None else int(block)
    idx = jnp.asarray(idx % n)

    def one_of(m, xi):
        q, k = m.queries_keys(xi)
        return _qk_stats(m, xi, q, k, idx, sink, block)

    if stacked is not None:
        st = eqx.filter_vmap(lambda m, xi: one_of(m.head(head), xi))(full, x)
    elif x.ndim == 2:
        st = one_of(model, x)
    else:
        st = jax.vmap(lambda xi: one_of(model, xi))(x)
    return _report(st, n, sink, _kind(model))


# ---------------------------------------------------------------------- public
def dispersion(
    P: Any,
    *,
    logits: Float[npt.ArrayLike, "*b n"] | None = None,
    sink: int = 1,
    k: int = -1,
    x: Float[npt.ArrayLike, "*b n d"] | None = None,
    rows: slice | Int[npt.ArrayLike, " r"] | None = None,
    block: int | None = None,
    head: int | None = None,
) -> DispersionReport:
    """Dispersion statistics of attention rows: largest coefficient, bounds, entropy, sink.

    Args:
        P: one of
            - an attention matrix ``(rows, n)`` or ``(n, n)`` (any leading batch axes;
              a single row ``(n,)`` gives 0-d fields), with ``logits`` the matching
              pre-kernel logits (same shape; the inverse temperature already inside).
              Without logits, ``delta`` and the bounds are NaN.
            - an ``attnflow.Trajectory``: the attention at saved index ``k`` (of one
              system or of each system of a batch), logits from the model (for
              ``qknorm``, those of the normalised queries and keys).
            - a model (any family with an attention head: ``model.head(head)``) with
              tokens ``x`` ``(n, d)`` or ``(b, n, d)``.
        logits: pre-kernel logits matching ``P`` (matrix input only).
        sink: the number of leading tokens counted as the sink (default 1).
        k: saved-time index (trajectory input).
        x: tokens (model input).
        rows: query rows to compute (model and trajectory input): a slice or indices;
            default all. With large ``n`` a few hundred rows against all keys are cheap
            where the ``(n, n)`` matrix is not.
        block: query rows per tile (model and trajectory input), an integer ``>= 0``
            (0: all rows in one tile); default about ``4M / n``.
        head: for a model or trajectory of several heads (a ``MultiHeadAttention`` or a
            ``Block`` of one), the head whose attention is measured (required when there
            are several).

    Returns:
        A ``DispersionReport``. The bounds are those of softmax on the given logits; for
        ``ssmax``, ``adaptive`` and ``sigmoid`` the coefficients may exceed them (those
        kernels rescale the logits inside, which is how they escape dispersion).

    Example:
        >>> import numpy as np, attnflow as af
        >>> x = np.random.default_rng(1).normal(size=(64, 3))  # 64 tokens in R^3
        >>> report = af.dispersion(af.Attention(np.eye(3), np.eye(3), np.eye(3)), x=x)
        >>> report.max.shape  # the largest coefficient of each query row
        (64,)
        >>> bool(np.all(report.max <= report.bound_tight + 1e-12))  # under the bound
        True
    """
    from ..dynamics.base import AbstractModel
    from ..dynamics.trajectory import Trajectory

    _checks.refuse_mean_field(P, "dispersion", "Its Fourier modes: analysis.fourier_modes.")
    if block is not None:  # a whole number of rows per tile (0: all rows in one tile)
        block = _checks.integer("block", block, lo=0)
    if isinstance(P, Trajectory):
        if logits is not None or x is not None:
            raise ValueError("with a trajectory, pass k (the saved index), not logits or x.")
        k = _checks.index("k", k, P.x.shape[-3], what="saved times")
        xk = P.x[..., k, :, :]
        return _model_report(P.model, head, xk, rows, sink, block, finite=False)
    if isinstance(P, AbstractModel):
        if x is None:
            raise ValueError("dispersion(model, x=tokens): the tokens x are required.")
        if logits is not None:
            raise ValueError("with a model, the logits are computed: pass x, not logits.")
        return _model_report(P, head, x, rows, sink, block)
    if head is not None:
        raise ValueError("head applies to a model or a trajectory, not to a matrix P.")
    if x is not None or rows is not None or block is not None:
        raise ValueError("x, rows and block apply to a model or trajectory, not to a matrix P.")
    Pa = _checks.real_array("P", P, shape_hint="(rows, n)")
    if Pa.ndim < 1:
        raise ValueError(f"P must be a real (rows, n) attention matrix; got shape {Pa.shape}.")
    if np.any(Pa < 0):
        raise ValueError("P has negative entries; attention weights are >= 0.")
    La = None
    if logits is not None:
        La = _checks.real_array("logits", logits, finite=False)
        if La.shape != Pa.shape:
            raise ValueError(f"logits must have the shape of P {Pa.shape}; got {La.shape}.")
        if np.any(np.isnan(La) | (La == np.inf)):
            raise ValueError("logits has NaN or +inf entries; only -inf (a masked key) is allowed.")
    n = Pa.shape[-1]
    sink = _check_sink(sink, n)
    Pf = Pa.astype(np.float64) if not np.issubdtype(Pa.dtype, np.floating) else Pa
    keep = np.ones(Pa.shape, bool) if La is None else np.isfinite(La)
    if La is not None and not np.all(keep.any(axis=-1)):
        raise ValueError(
            "logits has a row whose every entry is -inf: a row must keep at least one key."
        )
    st = _row_stats_np(Pf, La, sink, keep)
    return _report(st, n, sink, None)


def _row_stats_np(P, L, sink, keep):
    rs = P.sum(-1)
    mx = P.max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = P / rs[..., None]
        ent = -np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0), axis=-1)
        share = mx / rs
    out = dict(
        max=mx,
        argmax=P.argmax(-1),
        entropy=ent,
        sink_mass=P[..., :sink].sum(-1),
        row_sum=rs,
        share_max=share,
        kept=keep.sum(-1),
    )
    if L is not None:
        L = L.astype(np.float64)
        hi, lo = np.where(keep, L, -np.inf), np.where(keep, L, np.inf)
        out["delta"] = hi.max(-1) - lo.min(-1)
    return out


def dispersion_scan(
    Q: Float[npt.ArrayLike, "p d"],
    K: Float[npt.ArrayLike, "p d"],
    x: Float[npt.ArrayLike, "N d"],
    ns: Sequence[int],
    *,
    kernels: Sequence[str] | None = None,
    beta=1.0,
    kernel_params: Mapping[str, Mapping] | None = None,
    queries: int | None = 256,
    sink: int = 1,
    rectangular: bool = False,
) -> dict:
    """The largest coefficient and the bounds against ``n``, for several kernels.

    For each ``n`` in ``ns`` the keys are the first ``n`` tokens of ``x`` (so the token
    stream is fixed and only grows) and the queries the first ``min(n, queries)`` of them
    (all ``n`` with ``queries=None``); nothing of size ``n x n`` is held.

    Args:
        Q, K: query and key maps ``(d, d)`` (or ``(p, d)`` with ``rectangular=True``).
        x: tokens ``(N, d)`` with ``N >= max(ns)``.
        ns: numbers of tokens.
        kernels: kernel names (default all).
        beta: inverse temperature.
        kernel_params: per kernel, its parameters, e.g. ``{"ssmax": {"s": 1.0}}``.
        queries: query rows per ``n``.
        sink: sink tokens for the sink mass.

    Returns:
        ``{"n": [...], "kernels": [...], "queries": ..., "results": {kernel: {"max",
        "mean_max", "bound_tight", "bound_loose", "delta", "entropy_normalized",
        "sink_mass", "share_max": list over n}}, "rows": [one dict per (kernel, n)]}``:
        ``max`` is the largest coefficient over the query rows, ``bound_tight`` and
        ``bound_loose`` the largest per-row bounds (each row's coefficient is below its
        own bound, so ``max <= bound_tight`` for softmax and qknorm), ``delta`` the
        largest per-row spread, and the rest means over the query rows.
    """
    from ..dynamics.model import Attention

    x = np.asarray(x)
    ns = [int(v) for v in ns]
    if not ns or min(ns) < 1 or max(ns) > x.shape[0]:
        raise ValueError(
            f"ns must be positive and at most the {x.shape[0]} tokens given; got {ns}."
        )
    kernels = list(_kernels.KERNELS if kernels is None else kernels)
    kernel_params = dict(kernel_params or {})
    d = x.shape[-1]
    results, rows_out = {}, []
    for kern in kernels:
        model = Attention(
            Q,
            K,
            np.eye(d),
            beta=beta,
            kernel=kern,
            rectangular=rectangular,
            kernel_params=kernel_params.get(kern),
            propagator="eigh",
        )
        res = {
            key: []
            for key in (
                "max",
                "mean_max",
                "bound_tight",
                "bound_loose",
                "delta",
                "entropy_normalized",
                "sink_mass",
                "share_max",
            )
        }
        for n in ns:
            r = n if queries is None else min(n, int(queries))
            rep = dispersion(model, x=x[:n], rows=slice(0, r), sink=min(sink, n))
            row = dict(
                kernel=kern,
                n=n,
                queries=r,
                max=float(np.max(rep.max)),
                mean_max=float(np.mean(rep.max)),
                bound_tight=float(np.max(rep.bound_tight)),
                bound_loose=float(np.max(rep.bound_loose)),
                delta=float(np.max(rep.delta)),
                entropy_normalized=float(np.mean(rep.entropy_normalized))
                if n > 1
                else float("nan"),
                sink_mass=float(np.mean(rep.sink_mass)),
                share_max=float(np.max(rep.share_max)),
            )
            for key in res:
                res[key].append(row[key])
            rows_out.append(row)
        results[kern] = res
    return {
        "n": ns,
        "kernels": kernels,
        "queries": queries,
        "beta": float(beta),
        "kernel_params": {k: dict(v) for k, v in kernel_params.items()},
        "results": results,
        "rows": rows_out,
    }
