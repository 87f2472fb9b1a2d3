"""The checks of ``attnflow.testing`` (see its docstring for the contract).

Every comparison is against plain numpy (``_reference``) or, for a family or kernel the
reference does not know, against numpy built from the pieces the extension declares
(its query and key maps, ``prepare_tokens``, its kernel's ``prepare`` and ``weights``, its
mask's ``keep``, ``bias`` and ``turn``, its ``kept_keys``, its value matrices); a failure
is an ``AssertionError`` whose message names the check, the model and the numbers.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _reference as ref
from ._common import (
    FD_EPS,
    FD_RTOL,
    FRAMES,
    _close,
    _fail,
    _heads,
    _is_builtin,
    _kernel_args,
    _mask_pieces,
    _np,
    _require_x64,
    _tokens,
)

__all__ = ["check_model"]


# ------------------------------------------------------------- the attention, numpy
def _reference_attention(head: Any, x: np.ndarray) -> np.ndarray | None:
    """The attention of one kernel head in numpy from its declared pieces: the kernel's
    rows in plain numpy for a built-in kernel, its own ``weights`` on numpy logits for
    another; ``None`` for a family that names no kernel (its weights are its own)."""
    from ..dynamics.base import AbstractKernelAttention

    if not isinstance(head, AbstractKernelAttention):
        return None
    n = x.shape[0]
    kern, mask = head.kernel, head.mask
    Q, K = (_np(a) for a in head.query_key_maps())
    beta = float(_np(head.beta))
    xp = _np(head.prepare_tokens(jnp.asarray(x)))
    q, k = xp @ Q.T, xp @ K.T
    keep, bias = _mask_pieces(mask, n)
    builtin = _is_builtin(kern)
    args: dict = {}
    if builtin:
        args = _kernel_args(kern)
        q, k = ref.kernel_prepare(kern.name, q, k, **args)
    else:
        q, k = (_np(a) for a in kern.prepare(jnp.asarray(q), jnp.asarray(k)))
    if mask is not None and mask.positional:
        q, k = (_np(a) for a in mask.turn(jnp.asarray(q), jnp.asarray(k)))
    if builtin:
        lam = args.pop("lam", 0.2)
        return ref.kernel_rows(
            kern.name, q, k, beta, keep, bias, lam=lam, masked=mask is not None, **args
        )
    L = np.where(keep, beta * q @ k.T + bias, -np.inf)
    if kern.causal:
        L = np.where(np.tri(n, dtype=bool), L, -np.inf)
    return _np(kern.weights(jnp.asarray(L)))


def _head_pieces(model: Any, h: Any, x: np.ndarray, what: str) -> dict:
    """One head's attention, kept keys and logits (as the analyses read them), checked
    against the facts it declares and against numpy."""
    from ..dynamics.base import AbstractAttentionSystem, AbstractKernelAttention

    head = model.head(h)
    if not isinstance(head, AbstractAttentionSystem):
        _fail(what, f"head({h!r}) must return an attention system; got {type(head).__name__}")
    n = x.shape[0]
    xj = jnp.asarray(x)
    P = _np(head.attention(xj))
    if P.shape != (n, n):
        _fail(f"{what} attention of head {h!r}", f"shape {P.shape}, expected {(n, n)}")
    if not np.all(np.isfinite(P)):
        _fail(f"{what} attention of head {h!r}", "non-finite weights")
    keep = np.asarray(head.kept_keys(xj), bool)
    if keep.shape != (n, n):
        _fail(f"{what} kept_keys", f"shape {keep.shape}, expected {(n, n)}")
    empty = np.flatnonzero(~keep.any(axis=1))
    if empty.size:
        _fail(f"{what} kept_keys", f"row {int(empty[0])} keeps no key")
    rows = jnp.asarray([n - 1, 0])
    sub = np.asarray(head.kept_keys(xj, rows), bool)
    if not np.array_equal(sub, keep[[n - 1, 0]]):
        _fail(f"{what} kept_keys(x, rows)", "the rows asked for differ from those of the whole")
    dropped = np.argwhere(~keep & (P != 0))
    if dropped.size:
        i, j = (int(v) for v in dropped[0])
        _fail(
            f"{what} attention of head {h!r}",
            f"P[{i}, {j}] = {float(P[i, j])!r} at a key that kept_keys declares dropped",
        )
    if head.rows_sum_to_one:
        s = P.sum(axis=1)
        bad = np.flatnonzero(np.abs(s - 1.0) > 1e-10)
        if bad.size:
            i = int(bad[0])
            _fail(
                f"{what} rows_sum_to_one",
                f"declared True, but row {i} of head {h!r} sums to {float(s[i])!r}",
            )
    want = _reference_attention(head, x)
    if want is not None:
        _close(f"{what} attention of head {h!r} against numpy", P, want)
    q, k = (_np(a) for a in head.queries_keys(xj))
    Q, K = (_np(a) for a in head.query_key_maps())
    xp = _np(head.prepare_tokens(xj))
    _close(f"{what} queries_keys against prepare_tokens(x) Q^T", q, xp @ Q.T)
    _close(f"{what} queries_keys against prepare_tokens(x) K^T", k, xp @ K.T)
    L = _np(head.logits(xj))
    beta = float(_np(head.beta))
    if head.bilinear_logits:
        _close(f"{what} logits (bilinear_logits declared) against beta q k^T", L, beta * q @ k.T)
    if isinstance(head, AbstractKernelAttention) and head.mask is not None:
        L = L + _mask_pieces(head.mask, n)[1]  # the logits the kernel weighs carry the bias
    return dict(head=head, P=P, keep=keep, L=L, beta=beta)


# --------------------------------------------------------------------- check_model
def check_model(
    model: Any,
    x: Any,
    *,
    gradients: bool = True,
    frames: tuple[str, ...] = FRAMES,
    t1: float = 0.5,
    dt: float = 0.25,
    seed: int = 0,
) -> None:
    """Hold a model against plain numpy built from its declared pieces.

    Args:
        model: any attnflow model (an ``AbstractModel``; not a stack).
        x: tokens ``(n, d)``, ``n >= 2``, at which every number is compared (a few
            tokens: the references loop over rows).
        gradients: check the gradient of every array leaf against central differences
            (one random direction per leaf) through ``attnflow.solve`` with
            ``attnflow.LayerSolver(dt)`` to ``t1``, in each of ``frames`` the model serves.
        frames: which frames the gradients are checked in; a frame the model does not
            declare it serves may be refused (``ValueError``), the original frame never,
            the rescaled one not when the model has a propagator and rows summing to one.
        t1, dt: the runs of the save/load and gradient checks (``t1 / dt`` layers).
        seed: of the random directions and weights.

    Raises:
        AssertionError: naming the check that failed and the numbers.
        ValueError: float64 is off, ``model`` is no model or ``x`` has the wrong shape.
    """
    from ..dynamics.base import AbstractModel

    _require_x64()
    if not isinstance(model, AbstractModel):
        raise ValueError(
            f"model must be an attnflow model (an attnflow.AbstractModel); got "
            f"{type(model).__name__}."
        )
    if model.stack_size is not None:
        raise ValueError("model is stacked (attnflow.stack): check one model (attnflow.unstack).")
    x = _tokens(x, model.d)
    what = f"check_model({type(model).__name__})"
    pieces = {h: _head_pieces(model, h, x, what) for h in _heads(model)}
    _check_field(model, x, pieces, what)
    for h, pc in pieces.items():
        _check_derived(model, h, x, pc, what)
    traj = _check_save_load(model, x, t1, dt, what)
    _check_analyses(model, x, traj, what)
    _check_stack(model, x, what)
    if gradients:
        _check_gradients(model, x, frames, t1, dt, seed, what)


def _check_field(model: Any, x: np.ndarray, pieces: dict, what: str) -> None:
    xj = jnp.asarray(x)
    F = _np(model.vector_field(xj))
    if F.shape != x.shape or not np.all(np.isfinite(F)):
        _fail(f"{what} vector_field", f"shape {F.shape} (expected {x.shape}) or non-finite")
    if len(pieces) > 1:
        A = _np(model.attention(xj))
        for h, pc in pieces.items():
            _close(f"{what} attention(x)[{h}] against head({h}).attention(x)", A[h], pc["P"])
    if not pieces or not model.pure_attention or model.beyond_attention:
        return  # a field beyond attention: no declared pieces to rebuild it from
    Vs = _np(model.value_matrices())
    want = sum((pc["P"] @ x) @ Vs[i].T for i, pc in enumerate(pieces.values()))
    _close(f"{what} vector_field against sum_h P_h x V_h^T (value_matrices)", F, want)


def _unique_top(M: np.ndarray) -> np.ndarray:
    s = np.sort(M, axis=1)
    with np.errstate(invalid="ignore"):
        return (s[:, -1] - s[:, -2]) > 1e-9 * np.maximum(1.0, np.abs(s[:, -1]))


def _check_derived(model: Any, h: Any, x: np.ndarray, pc: dict, what: str) -> None:
    from ..analysis.dispersion import dispersion
    from ..analysis.hardmax import hardmax_cells
    from ..dynamics import kernels as K
    from ..dynamics.base import AbstractKernelAttention

    head, P, keep, L, beta = pc["head"], pc["P"], pc["keep"], pc["L"], pc["beta"]
    n = x.shape[0]
    xj = jnp.asarray(x)
    tag = f"{what} head {h!r}"
    # dispersion: the cap, spread and entropy over the kept keys of each row
    rep = dispersion(model, x=x, head=h)
    # a kernel of two maps side by side (differential): the spread of all its logits
    every = None if L.shape == keep.shape else np.ones(L.shape, bool)
    want = ref.dispersion_rows(P, L, keep, every)
    if not np.array_equal(np.asarray(rep.kept), want["kept"].astype(int)):
        _fail(f"{tag} dispersion kept", f"{np.asarray(rep.kept)}, expected {want['kept']}")
    for key in ("max", "delta", "bound_tight", "entropy", "entropy_normalized"):
        _close(
            f"{tag} dispersion {key} (per row, over the kept keys)",
            getattr(rep, key),
            want[key],
            rtol=1e-8,
            atol=1e-11,
        )
    if isinstance(head, AbstractKernelAttention) and type(head.kernel) is K.Softmax:
        bad = np.flatnonzero(~np.asarray(rep.bound_holds))
        if bad.size:
            _fail(f"{tag} dispersion bound_holds", f"softmax row {int(bad[0])} above its cap")
    # log-masses of a subset of keys, and the argmax
    rng = np.random.default_rng(1)
    S = rng.uniform(size=(n, n)) < 0.5
    S[np.arange(n), rng.integers(0, n, n)] = True
    lm = _np(head.attention_log_mass(xj, jnp.asarray(P), jnp.asarray(S)))
    lw = ref.log_mass_rows(P, S)
    ok = np.isfinite(lw) & (lw > -600)
    _close(f"{tag} attention_log_mass against log sum P", lm[ok], lw[ok], rtol=1e-8, atol=1e-10)
    am = np.asarray(head.attention_argmax(xj, jnp.asarray(P)))
    u = _unique_top(P)
    if not np.array_equal(am[u], np.argmax(P, axis=1)[u]):
        _fail(f"{tag} attention_argmax", f"{am.tolist()}, expected {np.argmax(P, 1).tolist()}")
    # the hardmax cells where the logits are declared bilinear, else a refusal by name
    if head.bilinear_logits and not head.positional and not head.normalizes_tokens:
        cells = hardmax_cells(model, x, head=h)
        Lm = np.where(keep, L, -np.inf)
        u = _unique_top(Lm)
        if not np.array_equal(cells.leader[u], np.argmax(Lm, axis=1)[u]):
            _fail(f"{tag} hardmax_cells leader", f"{cells.leader.tolist()}")
        with np.errstate(invalid="ignore"):
            gap = (Lm.max(axis=1) - np.diagonal(Lm)) / beta
        _close(f"{tag} hardmax_cells gap", cells.gap, gap, rtol=1e-8, atol=1e-10)
    else:
        try:
            hardmax_cells(model, x, head=h)
        except ValueError as exc:
            if "refuses model" not in str(exc):
                _fail(f"{tag} hardmax_cells", f"refused without naming the model: {exc}")
        else:
            _fail(
                f"{tag} hardmax_cells",
                "served a head whose logits are not declared bilinear and position-free",
            )


def _check_save_load(model: Any, x: np.ndarray, t1: float, dt: float, what: str) -> Any:
    from ..dynamics.simulate import simulate
    from ..dynamics.trajectory import Trajectory

    traj = simulate(model, x, t1, frame="original", method="euler", dt=dt)
    if not traj.ok:
        _fail(f"{what} simulate (original frame, Euler layers)", f"status {traj.status!r}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.npz"
        traj.save(path)
        try:
            back = Trajectory.load(path)
        except ValueError as exc:
            _fail(f"{what} save and load", f"the saved run does not load: {exc}")
    if type(back.model) is not type(model):
        _fail(f"{what} save and load", f"loaded a {type(back.model).__name__}")
    a, b = (json.dumps(m.describe(), sort_keys=True, default=str) for m in (back.model, model))
    if a != b:
        _fail(f"{what} save and load", f"describe() differs after loading: {a:.200} != {b:.200}")
    _close(f"{what} save and load: the states", back.x, traj.x, rtol=0.0, atol=0.0)
    xj = jnp.asarray(x)
    _close(
        f"{what} save and load: the loaded model's field",
        back.model.vector_field(xj),
        model.vector_field(xj),
        rtol=0.0,
        atol=0.0,
    )
    return traj


def _check_analyses(model: Any, x: np.ndarray, traj: Any, what: str) -> None:
    """Each analysis serves the model or refuses it with a ``ValueError`` that says why;
    a theorem's label only for one head of plain softmax with nothing beyond it."""
    from ..analysis import dispersion, observe_limit, predict_regime, track_rank
    from ..analysis.hardmax import hardmax_cells
    from ..analysis.regimes import Label

    h = None if model.num_heads <= 1 else 0
    calls = {
        "track_rank": lambda: track_rank(traj, head=h),
        "dispersion": lambda: dispersion(traj, k=-1, head=h),
        "observe_limit": lambda: observe_limit(traj),
        "predict_regime": lambda: predict_regime(model),
        "hardmax_cells": lambda: hardmax_cells(model, x, head=h),
    }
    out = {}
    for name, call in calls.items():
        try:
            out[name] = call()
        except ValueError as exc:
            if not str(exc).strip():
                _fail(f"{what} {name}", "refused with an empty message")
        except Exception as exc:
            _fail(
                f"{what} {name}",
                f"neither served nor refused by name: {type(exc).__name__}: {exc}",
            )
    reg = out.get("predict_regime")
    if reg is not None and reg.label != Label.UNCLASSIFIED:
        alone = model.num_heads == 1 and model.pure_attention and not model.beyond_attention
        if not (alone and model.head().plain_softmax):
            _fail(
                f"{what} predict_regime",
                f"label {str(reg.label)!r} for a model that is not one head of plain, "
                f"unmasked, position-free softmax",
            )
    rt = out.get("track_rank")
    if rt is not None:
        P = _np(model.head(h).attention(jnp.asarray(traj.x[-1])))
        u = _unique_top(P)
        got = np.asarray(rt.attends_to[-1])
        if not np.array_equal(got[u], np.argmax(P, axis=1)[u]):
            _fail(f"{what} track_rank attends_to", f"{got.tolist()} at the last save")


def _scaled(model: Any, factor: float) -> Any:
    return jax.tree_util.tree_map(lambda a: a * factor if eqx.is_inexact_array(a) else a, model)


def _check_stack(model: Any, x: np.ndarray, what: str) -> None:
    from ..dynamics.stack import stack

    other = _scaled(model, 1.01)
    try:
        st = stack([model, other])
    except ValueError as exc:
        if not str(exc).strip():
            _fail(f"{what} attnflow.stack", "refused with an empty message")
        return
    if st.stack_size != 2:
        _fail(f"{what} attnflow.stack", f"stack_size {st.stack_size}, expected 2")
    xs = jnp.asarray(np.stack([x, x + 0.1]))
    F = eqx.filter_vmap(lambda m, xi: m.vector_field(xi))(st, xs)
    want = np.stack([_np(model.vector_field(xs[0])), _np(other.vector_field(xs[1]))])
    _close(f"{what} attnflow.stack: the stacked field", F, want)


def _rescaled_declared(model: Any) -> bool:
    from ..dynamics.base import AbstractAttentionSystem

    if model.propagator is None:
        return False
    return not isinstance(model, AbstractAttentionSystem) or model.rows_sum_to_one


def _check_gradients(
    model: Any, x: np.ndarray, frames: tuple, t1: float, dt: float, seed: int, what: str
) -> None:
    from ..dynamics.solve import LayerSolver, solve

    params, static = eqx.partition(model, eqx.is_inexact_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    if not flat:
        return
    paths = [jax.tree_util.keystr(p) for p, _ in flat]
    leaves = [v for _, v in flat]
    rng = np.random.default_rng(seed)
    W = jnp.asarray(rng.normal(size=x.shape))
    for frame in frames:
        if frame not in FRAMES:
            raise ValueError(f"frames must be among {FRAMES}; got {frame!r}.")
        x0 = x / np.linalg.norm(x, axis=1, keepdims=True) if frame == "sphere" else x
        x0j = jnp.asarray(x0)

        def loss(ls, frame=frame, x0j=x0j):
            m = eqx.combine(jax.tree_util.tree_unflatten(treedef, ls), static)
            sol = solve(m, x0j, t1, ts=jnp.asarray([t1]), frame=frame, solver=LayerSolver(dt))
            return jnp.sum(W * sol.ys[-1])

        f = eqx.filter_jit(loss)
        try:
            val = float(f(leaves))
        except ValueError as exc:
            if frame == "original" or (frame == "rescaled" and _rescaled_declared(model)):
                _fail(f"{what} solve(frame={frame!r})", f"refused a frame the model serves: {exc}")
            continue
        if not np.isfinite(val):
            _fail(f"{what} solve(frame={frame!r})", "non-finite result")
        grads = eqx.filter_jit(jax.grad(loss))(leaves)
        for i, (leaf, g) in enumerate(zip(leaves, grads, strict=True)):
            d = rng.normal(size=leaf.shape)
            plus = list(leaves)
            minus = list(leaves)
            plus[i] = leaf + FD_EPS * d
            minus[i] = leaf - FD_EPS * d
            fd = (float(f(plus)) - float(f(minus))) / (2 * FD_EPS)
            ad = float(np.sum(_np(g) * d))
            if not abs(ad - fd) <= FD_RTOL * (1.0 + abs(fd)):
                _fail(
                    f"{what} gradient of {paths[i] or 'the leaf'} in frame {frame!r}",
                    f"<grad, direction> = {ad:.10g}, central difference {fd:.10g}",
                )
