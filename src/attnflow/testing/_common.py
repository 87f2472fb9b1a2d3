"""Helpers of the kit: float64 comparisons that name what differs, the tokens checked,
the declared pieces of kernels and masks as numpy."""

from __future__ import annotations

from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

# tolerances of float64 comparisons: the same arithmetic in another order, and loops
RTOL, ATOL = 1e-9, 1e-12
# the central differences of the gradients: step and relative tolerance
FD_EPS, FD_RTOL = 1e-6, 1e-6
FRAMES = ("original", "rescaled", "sphere")


# ------------------------------------------------------------------------ helpers
def _fail(what: str, msg: str) -> NoReturn:
    raise AssertionError(f"{what}: {msg}")


def _np(a: Any) -> np.ndarray:
    return np.asarray(a, np.float64)


def _close(what: str, got: Any, want: Any, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    got, want = _np(got), _np(want)
    if got.shape != want.shape:
        _fail(what, f"shape {got.shape}, expected {want.shape}")
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
        bad = ~((got == want) | (err <= atol + rtol * np.abs(want)))
    if bad.any():
        idx = np.unravel_index(
            int(np.argmax(np.where(bad, np.nan_to_num(err, nan=np.inf), -1))), got.shape
        )
        where = tuple(int(i) for i in idx)
        _fail(
            what,
            f"{int(bad.sum())} of {bad.size} entries differ; at {where}: got {float(got[idx])!r}, "
            f"expected {float(want[idx])!r} (rtol {rtol:g}, atol {atol:g})",
        )


def _require_x64() -> None:
    if not jax.config.read("jax_enable_x64"):
        raise ValueError(
            "attnflow.testing compares in float64: turn it on first, "
            "jax.config.update('jax_enable_x64', True) (the library never flips it)."
        )


def _tokens(x: Any, d: int) -> np.ndarray:
    try:
        arr = np.asarray(x, np.float64)
    except (TypeError, ValueError):
        arr = np.asarray(np.nan)
    if arr.ndim != 2 or arr.shape[1] != d or arr.shape[0] < 2 or not np.all(np.isfinite(arr)):
        raise ValueError(
            f"x must be finite tokens (n, {d}) with n >= 2 (the model's d = {d}); got "
            f"shape {arr.shape}."
        )
    return arr


def _heads(model: Any) -> list:
    h = model.num_heads
    return [] if h == 0 else [None] if h == 1 else list(range(h))


def _is_builtin(obj: Any) -> bool:
    return type(obj).__module__.startswith("attnflow.")


def _kernel_args(kernel: Any) -> dict:
    out: dict = {}
    for k, v in {**kernel.params(), **kernel.settings()}.items():
        a = np.asarray(v)
        out[k] = float(a) if a.ndim == 0 and a.dtype.kind == "f" else (a if a.ndim else v)
    return out


def _mask_pieces(mask: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The mask's declared ``keep`` and ``bias`` of ``n`` tokens, numpy."""
    if mask is None:
        return np.ones((n, n), bool), np.zeros((n, n))
    idx = jnp.arange(n)
    keep = np.asarray(mask.keep(idx, idx), bool)
    b = mask.bias(idx, idx)
    return keep, np.zeros((n, n)) if b is None else _np(b)
