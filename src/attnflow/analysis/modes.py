"""The linear modes of the mean-field equation about the uniform measure: how many
metastable clusters tokens started near uniform form first, and how soon.

Contract. ``predict_metastable(beta, d=2, kernel="softmax")`` linearises the continuity
equation ``d_t mu + div(mu X[mu]) = 0`` of tokens on ``S^{d-1}`` (``Q = K = V = I``, the
mean-field limit of ``simulate(IsotropicAttention(d, beta=beta), ..., frame="sphere")``)
about the uniform probability measure ``sigma``, with

- SA (``kernel="softmax"``): ``X[mu](x) = Proj_x int e^{beta <x, y>} y dmu(y) /
  int e^{beta <x, y>} dmu(y)``;
- USA (``kernel="usa"``): the same without the denominator (``Z_i = n``).

Both fields are tangential gradients, ``X = grad_S (K * mu) / beta`` for SA divided by
``K * mu``, with ``(K * mu)(x) = int e^{beta <x, y>} dmu(y)``. By the Funk-Hecke formula
the operator ``K *`` acts on the spherical harmonics of degree ``l`` by the factor

    m_l(beta) = Gamma(d/2) (2 / beta)^{d/2 - 1} I_{l + d/2 - 1}(beta)

(``I_nu`` the modified Bessel function; ``m_l = I_l`` on the circle), and
``-Delta_S Y_l = l (l + d - 2) Y_l``. A perturbation ``mu = (1 + eps Y_l) sigma`` therefore
grows as ``e^{lambda_l t}`` with

    USA: lambda_l = l (l + d - 2) m_l(beta) / beta
    SA:  lambda_l = l (l + d - 2) m_l(beta) / (beta m_0(beta))

On the circle (``d = 2``) these are ``k^2 I_k(beta) / beta`` and ``k^2 I_k(beta) /
(beta I_0(beta))`` (Bruno, Pasqualotto and Agazzi 2025: the rate of mode ``k`` is
proportional to ``k^2 I_k(beta)``). The fastest mode ``k* = argmax_l lambda_l`` is the
same for SA and USA; on the circle it is the predicted number of metastable clusters
(about ``sqrt(2 beta)`` for large beta); on ``S^{d-1}``, ``d >= 3``, it is the degree of
the harmonic that grows first, not a cluster count. Nothing here simulates: the numbers
are closed forms in logs (``attnflow._special.log_ive``: scipy's exponentially scaled
``ive`` where it is exact, the uniform asymptotic expansion of ``I_nu`` for high orders
and Hankel's for large arguments elsewhere), finite for every ``beta`` and ``d`` in the
float range: ``mode_rates`` for ``0 < beta < 1e300``, any ``d``; ``predict_metastable``,
which lists every mode up to ``3 sqrt(2 beta) + 10``, for ``beta <= 1e11`` (``k*`` about
``sqrt(2 beta)``, 447,214 there).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import numpy as np

from .. import _checks

__all__ = ["ModePrediction", "predict_metastable", "mode_rates"]

_KERNELS = ("softmax", "usa")
# predict_metastable lists the modes 1 .. 3 sqrt(2 beta) + 10: 1.3 million at this beta
MAX_BETA = 1e11


@dataclasses.dataclass(frozen=True)
class ModePrediction:
    """The linear modes of the uniform measure, from ``predict_metastable``.

    Attributes:
        beta, d, kernel: the set-up (``kernel`` ``"softmax"`` for SA or ``"usa"``).
        k: ``(K,)`` the modes (harmonic degrees) ``1 .. K``.
        rates: ``(K,)`` their growth rates ``lambda_k`` (``inf`` where USA's rate
            exceeds the float range; ``log_rates`` stays finite).
        log_rates: ``(K,)`` ``log lambda_k``.
        clusters: ``k* = argmax_k lambda_k``: the predicted number of metastable
            clusters on the circle (the fastest harmonic's degree when ``d >= 3``).
        rate: ``lambda_{k*}``.
        growth_time: ``1 / lambda_{k*}``, the e-folding time of the fastest mode; a
            perturbation of size ``eps`` leaves the linear phase after about
            ``growth_time * log(1 / eps)`` (``linear_time``).
    """

    beta: float
    d: int
    kernel: str
    k: np.ndarray
    rates: np.ndarray
    log_rates: np.ndarray
    clusters: int
    rate: float
    growth_time: float

    def linear_time(self, eps: float) -> float:
        """``log(1 / eps) / lambda_{k*}``: how long a perturbation of relative size
        ``eps`` (0 < eps < 1) of the uniform measure takes to reach order one."""
        eps = _checks.number("eps", eps, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        return math.log(1.0 / eps) * self.growth_time

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers (JSON): the set-up, the modes, their rates and ``k*``."""
        return {
            "beta": self.beta,
            "d": self.d,
            "kernel": self.kernel,
            "k": self.k.tolist(),
            "rates": [float(r) for r in self.rates],
            "log_rates": [float(r) for r in self.log_rates],
            "clusters": self.clusters,
            "rate": self.rate,
            "growth_time": self.growth_time,
        }


def _kernel_name(kernel: Any) -> str:
    # a kernel object exists only once the kernels are imported: a name needs no JAX
    base = sys.modules.get("attnflow.dynamics.kernels._base")
    name = kernel
    if base is not None and isinstance(kernel, base.AbstractKernel):
        name = kernel.name
    if name not in _KERNELS:
        raise ValueError(
            f"kernel must be 'softmax' (SA) or 'usa' (unnormalised self-attention), the "
            f"two whose mean-field modes are known in closed form; got {kernel!r}."
        )
    return str(name)


def _log_m_scaled(degrees: np.ndarray, beta: float, d: int) -> np.ndarray:
    """``log(m_l(beta) e^{-beta})`` (Funk-Hecke factor of ``e^{beta <x, y>}`` on degree
    ``l``, scaled: ``beta`` itself is never added, so differences keep their digits at
    any beta)."""
    from scipy import special

    from .._special import log_ive

    nu = degrees + d / 2.0 - 1.0
    log_i = log_ive(nu, beta)  # finite at every order and beta (no underflow, no NaN)
    return special.gammaln(d / 2.0) + (d / 2.0 - 1.0) * math.log(2.0 / beta) + log_i


def _log_rates(beta: float, ks: np.ndarray, d: int, name: str) -> tuple[np.ndarray, float]:
    """``(log lambda_k - shift, shift)``: the shift is ``beta`` for USA, 0 for SA."""
    out = np.log(ks * (ks + d - 2.0)) + _log_m_scaled(ks.astype(float), beta, d)
    out = out - math.log(beta)
    if name == "softmax":
        return out - _log_m_scaled(np.zeros(1), beta, d)[0], 0.0
    return out, beta


def mode_rates(
    beta: float, k: Any, *, d: int = 2, kernel: Any = "softmax"
) -> tuple[np.ndarray, np.ndarray]:
    """The growth rates ``lambda_k`` and their logs for the given modes ``k`` (integers
    >= 1); see the module docstring for the formulas. Finite logs for every
    ``0 < beta < 1e300`` and ``d``; USA's rates are ``inf`` past the float range.

    Example:
        >>> rates, _ = mode_rates(2.0, [1, 2, 3])
        >>> int(np.argmax(rates)) + 1
        2
    """
    beta = _checks.positive("beta", beta)
    if beta >= 1e300:
        raise ValueError(f"beta must be below 1e300 (the logs of the rates); got {beta!r}.")
    d = _checks.integer("d", d, lo=2)
    name = _kernel_name(kernel)
    ks = np.asarray(k)
    if ks.ndim != 1 or ks.size == 0 or not np.all(ks == np.round(ks)) or np.any(ks < 1):
        raise ValueError(f"k must be a non-empty 1-d list of integers >= 1; got {k!r}.")
    shifted, shift = _log_rates(beta, ks.astype(np.int64), d, name)
    log_rates = shifted + shift
    with np.errstate(over="ignore"):
        rates = np.exp(log_rates)
    return rates, log_rates


def predict_metastable(beta: float, *, d: int = 2, kernel: Any = "softmax") -> ModePrediction:
    """The fastest-growing mode of the uniform measure: the predicted number of
    metastable clusters of tokens started near uniform on the circle.

    Args:
        beta: the inverse temperature (> 0, at most ``MAX_BETA = 1e11``; ``mode_rates``
            takes any beta below 1e300 for chosen modes).
        d: the dimension of the tokens (>= 2: the sphere ``S^{d-1}``).
        kernel: ``"softmax"`` (SA) or ``"usa"``, a name or a kernel object of that name.

    Returns:
        A ``ModePrediction``: the modes ``1 .. K`` (``K`` well past the maximum, about
        ``3 sqrt(2 beta) + 10``), their rates and ``clusters = argmax``.

    Example:
        >>> tuple(predict_metastable(b).clusters for b in (1, 2, 5, 8, 20, 100))
        (1, 2, 3, 4, 6, 14)
        >>> round(predict_metastable(5.0).rate, 4)  # 9 I_3(5) / (5 I_0(5))
        0.6827
    """
    beta = _checks.positive("beta", beta)
    d = _checks.integer("d", d, lo=2)
    name = _kernel_name(kernel)
    if beta > MAX_BETA:
        raise ValueError(
            f"beta = {beta:g} is beyond predict_metastable's range (beta <= {MAX_BETA:g}): "
            f"it lists every mode up to 3 sqrt(2 beta) + 10 ({int(3 * math.sqrt(2 * beta)):,} "
            f"here); the fastest is near sqrt(2 beta) = {math.sqrt(2 * beta):.4g}. Use "
            f"mode_rates(beta, k) for chosen modes k at any beta below 1e300."
        )
    top = int(3 * math.sqrt(2 * beta)) + 10
    ks = np.arange(1, top + 1)
    shifted, shift = _log_rates(beta, ks, d, name)
    best = int(np.argmax(shifted))  # before USA's + beta, which would round the maximum away
    log_rates = shifted + shift
    with np.errstate(over="ignore"):
        rates = np.exp(log_rates)
    return ModePrediction(
        beta=beta,
        d=d,
        kernel=name,
        k=ks,
        rates=rates,
        log_rates=log_rates,
        clusters=int(ks[best]),
        rate=float(rates[best]),
        growth_time=float(np.exp(-log_rates[best])),
    )
