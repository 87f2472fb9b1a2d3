"""The noise level at which the uniform state of the noisy transformer loses stability.

Contract. Every token gets its own noise on the sphere ``S^{d-1}``: ``dx_i = Proj_{x_i}(
F_i) dt + sqrt(2 D) Proj_{x_i} dW_i`` (plus the Ito term that keeps ``|x_i| = 1``), with
``F`` the field of ``Q = K = V = I`` at inverse temperature ``beta``; the mean-field
equation gains the Laplace-Beltrami term ``D Delta_S mu``. Linearised about the uniform
measure, the spherical harmonics of degree ``l`` grow at the rate of the deterministic
equation (``attnflow.analysis.modes``) minus ``D l (l + d - 2)``:

    lambda_l(D) = l (l + d - 2) (m_l(beta) / (beta m_0(beta)) - D)      (SA)
    lambda_l(D) = l (l + d - 2) (m_l(beta) / beta - D)                  (USA)

with ``m_l(beta) = Gamma(d/2) (2 / beta)^{d/2 - 1} I_{l + d/2 - 1}(beta)``. Since ``m_l``
decreases in ``l``, the uniform state is linearly stable exactly when ``D`` exceeds the
critical noise of the first mode (``l = 1``):

    SA:  D_c = I_{d/2}(beta) / (beta I_{d/2 - 1}(beta))      (the circle: I_1 / (beta I_0))
    USA: D_c = Gamma(d/2) (2 / beta)^{d/2 - 1} I_{d/2}(beta) / beta

(``D_c -> 1/d`` as ``beta -> 0`` for SA). Below ``D_c`` the uniform state is unstable and
clusters form. The type of the transition is the statement of Mun and Rosenzweig (2026,
arXiv 2606.05140), not derived here: continuous for ``beta <= beta_*`` and discontinuous
(a jump, with hysteresis) above, ``beta_*`` the root of
``I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d``. Closed forms in logs
(``attnflow._special.log_ive``), finite for every ``beta`` below 1e300; USA's threshold
is returned with its log, as it leaves the float range near ``beta = 700``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .. import _checks
from .._special import log_ive
from .modes import _kernel_name

__all__ = ["NoiseThreshold", "predict_noise_threshold"]


@dataclasses.dataclass(frozen=True)
class NoiseThreshold:
    """``predict_noise_threshold``'s answer.

    Attributes:
        noise: the critical ``D`` (``inf`` past the float range: see ``log_noise``).
        log_noise: ``log D_c``, finite.
        beta_star: where the transition changes from continuous to discontinuous.
        continuous: whether ``beta <= beta_star`` (the statement of Mun and Rosenzweig).
        beta, d, kernel: the question.
    """

    noise: float
    log_noise: float
    beta_star: float
    continuous: bool
    beta: float
    d: int
    kernel: str


def _log_ratio(nu_hi: float, nu_lo: float, beta: float) -> float:
    """``log(I_{nu_hi}(beta) / I_{nu_lo}(beta))``."""
    return float(log_ive(nu_hi, beta) - log_ive(nu_lo, beta))


def beta_star(d: int) -> float:
    """The root of ``I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d`` (the ratio increases from 0
    to 1 in beta)."""
    from scipy.optimize import brentq

    target = math.log(1.0 / d)

    def f(b: float) -> float:
        return _log_ratio(d / 2 + 1, d / 2, b) - target

    lo, hi = 1e-8, 1.0
    while f(hi) < 0:
        hi *= 2
    log_root: Any = brentq(lambda lb: f(math.exp(lb)), math.log(lo), math.log(hi), xtol=1e-14)
    return math.exp(float(log_root))


def predict_noise_threshold(beta: float, *, d: int = 2, kernel: Any = "softmax") -> NoiseThreshold:
    """The critical noise ``D_c`` of the uniform state of the noisy transformer, and
    ``beta_*`` (see the module docstring for the formulas and what is derived).

    Args:
        beta: the inverse temperature (> 0, below 1e300).
        d: the dimension of the tokens (>= 2: the sphere ``S^{d-1}``).
        kernel: ``"softmax"`` (SA) or ``"usa"``.

    Example:
        >>> r = predict_noise_threshold(1.0)
        >>> round(r.noise, 6), round(r.beta_star, 4)  # I_1(1) / I_0(1), and beta_* for d = 2
        (0.44639, 2.4469)
    """
    b = _checks.positive("beta", beta)
    if b >= 1e300:
        raise ValueError(f"beta must be below 1e300; got {beta!r}.")
    dd = _checks.integer("d", d, lo=2)
    name = _kernel_name(kernel)
    if name == "softmax":
        log_d = _log_ratio(dd / 2, dd / 2 - 1, b) - math.log(b)
    else:
        log_d = (
            math.lgamma(dd / 2)
            + (dd / 2 - 1) * math.log(2 / b)
            + b
            + float(log_ive(dd / 2, b))
            - math.log(b)
        )
    noise = math.exp(log_d) if log_d < 709.0 else math.inf
    bs = beta_star(dd)
    return NoiseThreshold(
        noise=noise,
        log_noise=log_d,
        beta_star=bs,
        continuous=b <= bs,
        beta=b,
        d=dd,
        kernel=str(name),
    )
