"""``check_kernel`` and ``check_mask`` of ``attnflow.testing``: a kernel's or a mask's
registration, saved form and declared facts against its own numbers and plain numpy,
then one head with it through ``check_model``."""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
import numpy as np

from . import _reference as ref
from ._common import _close, _fail, _is_builtin, _kernel_args, _np, _require_x64
from ._kit import check_model

__all__ = ["check_kernel", "check_mask"]


# -------------------------------------------------------------------- check_kernel
def _small_head(d: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    K = np.eye(d) + 0.3 * rng.normal(size=(d, d))
    V = 0.3 * rng.normal(size=(d, d)) + 0.2 * np.eye(d)
    x = 0.6 * rng.normal(size=(6, d))  # small logits: unnormalised kernels stay tame
    return Q, K, V, x


def check_kernel(kernel: Any, *, gradients: bool = True, seed: int = 0) -> None:
    """Hold a kernel against its declared facts and plain numpy, then one head with it
    through ``check_model`` (and one under a causal mask when it takes a mask).

    Args:
        kernel: an ``attnflow.kernels.AbstractKernel`` object.
        gradients: passed to ``check_model`` (the unmasked head only).
        seed: of the random logits, weights and tokens.

    Raises:
        AssertionError: naming what is wrong. ValueError: float64 off, or not a kernel.
    """
    from ..dynamics import kernels as K
    from ..dynamics.model import Attention

    _require_x64()
    if not isinstance(kernel, K.AbstractKernel):
        raise ValueError(
            f"kernel must be an attnflow.kernels.AbstractKernel; got {type(kernel).__name__}."
        )
    what = f"check_kernel({type(kernel).__name__})"
    name = type(kernel).__dict__.get("name")
    if not isinstance(name, str) or K.KERNEL_CLASSES.get(name) is not type(kernel):
        _fail(
            what, f"the class is not registered under its name: declare name = '...' (got {name!r})"
        )
    rebuilt = K.get(name, **{**kernel.params(), **kernel.settings()})
    if rebuilt.describe() != kernel.describe():
        _fail(
            what, f"kernels.get(name, **params) gives {rebuilt.describe()}, not {kernel.describe()}"
        )
    rng = np.random.default_rng(seed)
    n = 6
    L = 1.5 * rng.normal(size=(n, 2 * n if name == "differential" else n))
    P = _np(kernel.weights(jnp.asarray(L)))
    if not np.all(np.isfinite(P)):
        _fail(what, "weights(L) has non-finite entries for finite logits")
    if kernel.row_stochastic:
        s = P.sum(axis=1)
        if np.max(np.abs(s - 1)) > 1e-10:
            _fail(
                f"{what} row_stochastic",
                f"declared True, but a row sums to {float(s[np.argmax(np.abs(s - 1))])!r}",
            )
    if kernel.rowwise:
        _close(
            f"{what} rowwise (declared): weights of rows 2:4 alone",
            kernel.weights(jnp.asarray(L[2:4])),
            P[2:4],
        )
    if kernel.causal:
        upper = np.triu(np.ones((n, n), bool), 1)
        if np.any(P[upper] != 0):
            _fail(f"{what} causal", "declared True, but a key after its query has weight")
    if kernel.takes_mask:
        drop = ~np.tri(n, dtype=bool)
        Pm = _np(kernel.weights(jnp.asarray(np.where(drop, -np.inf, L))))
        if np.any(Pm[drop] != 0) or not np.all(np.isfinite(Pm)):
            _fail(f"{what} takes_mask", "declared True, but a -inf logit does not weigh 0")
    q, k = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
    if kernel.bilinear_logits:
        qp, kp = kernel.prepare(jnp.asarray(q), jnp.asarray(k))
        _close(f"{what} bilinear_logits (declared): prepare(q, k) is (q, k)", qp, q, rtol=0, atol=0)
        _close(f"{what} bilinear_logits (declared): prepare(q, k) is (q, k)", kp, k, rtol=0, atol=0)
    if not kernel.normalizes_tokens:
        _close(
            f"{what} normalizes_tokens False: prepare_tokens(x) is x",
            kernel.prepare_tokens(jnp.asarray(q)),
            q,
            rtol=0,
            atol=0,
        )
    if _is_builtin(kernel) and name != "differential":
        args = _kernel_args(kernel)
        args.pop("lam", None)
        want = ref.kernel_rows(
            name, L, np.eye(n), 1.0, np.ones((n, n), bool), np.zeros((n, n)), masked=False, **args
        )
        _close(f"{what} weights against numpy", P, want)
    Q, Kx, V, x = _small_head(4, seed)
    block = None if kernel.rowwise else 0
    check_model(Attention(Q, Kx, V, kernel=kernel, block=block), x, gradients=gradients, seed=seed)
    if kernel.takes_mask:
        from ..dynamics.kernels.masks import Causal

        causal = Attention(Q, Kx, V, kernel=kernel, block=block, mask=Causal())
        check_model(causal, x, gradients=False, seed=seed)


# ---------------------------------------------------------------------- check_mask
def check_mask(mask: Any, *, n: int = 6, gradients: bool = True, seed: int = 0) -> None:
    """Hold a mask against its declared facts and saved form, then one head under it
    through ``check_model``.

    Args:
        mask: an ``attnflow.masks.AbstractMask`` object.
        n: the number of tokens (a mask for a fixed number of tokens, ``Graph``, needs
            its own).
        gradients: passed to ``check_model``.
        seed: of the random weights and tokens.

    Raises:
        AssertionError: naming what is wrong. ValueError: float64 off, or not a mask.
    """
    from ..dynamics.kernels import masks as M
    from ..dynamics.model import Attention

    _require_x64()
    if not isinstance(mask, M.AbstractMask):
        raise ValueError(f"mask must be an attnflow.masks.AbstractMask; got {type(mask).__name__}.")
    what = f"check_mask({type(mask).__name__})"
    name = type(mask).__dict__.get("name")
    if not isinstance(name, str) or M.MASK_CLASSES.get(name) is not type(mask):
        _fail(
            what, f"the class is not registered under its name: declare name = '...' (got {name!r})"
        )
    form = mask.describe()
    if not isinstance(form, list) or not form or form[0] != name:
        _fail(f"{what} describe()", f"must be a list [{name!r}, ...]; got {form!r:.200}")
    try:
        text = json.dumps(form)
    except TypeError as exc:
        _fail(f"{what} describe()", f"not JSON-ready ({exc})")
    try:
        back = M.check_mask(json.loads(text))
    except ValueError as exc:
        _fail(f"{what} saved form", f"check_mask(describe()) refuses it: {exc}")
    if back is None or type(back) is not type(mask) or back.describe() != form:
        _fail(f"{what} saved form", f"rebuilds {back!r:.200}, not the mask")
    idx = jnp.arange(n)
    keep = np.asarray(mask.keep(idx, idx), bool)
    if keep.shape != (n, n):
        _fail(f"{what} keep", f"shape {keep.shape}, expected {(n, n)}")
    if not np.array_equal(np.asarray(back.keep(idx, idx), bool), keep):
        _fail(f"{what} saved form", "the rebuilt mask keeps other keys")
    empty = np.flatnonzero(~keep.any(axis=1))
    if empty.size:
        _fail(f"{what} keep", f"row {int(empty[0])} keeps no key")
    if not np.array_equal(np.asarray(mask.keep(idx[2:5], idx), bool), keep[2:5]):
        _fail(f"{what} keep", "keep(rows 2:5) differs from rows 2:5 of the whole (tiles)")
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(n, n))
    whole = _np(mask.apply(jnp.asarray(L)))
    _close(
        f"{what} apply of the rows 2:5 (a tile) against the whole",
        mask.apply(jnp.asarray(L[2:5]), 2),
        whole[2:5],
    )
    one = mask.head(0) if mask.heads is not None else mask
    b = one.bias(idx, idx)
    q, k = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
    tq, tk = (_np(a) for a in one.turn(jnp.asarray(q), jnp.asarray(k)))
    moved = (b is not None and np.any(_np(b)[keep] != 0)) or not (
        np.array_equal(tq, q) and np.array_equal(tk, k)
    )
    if moved and not mask.positional:
        _fail(
            f"{what} positional",
            "declared False, but the mask moves the logits (a bias or a turn): declare "
            "positional = True",
        )
    Q, K, V, _ = _small_head(4, seed)
    x = 0.6 * rng.normal(size=(n, 4))
    check_model(Attention(Q, K, V, mask=one), x, gradients=gradients, seed=seed)
