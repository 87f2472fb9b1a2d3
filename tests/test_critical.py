"""Critical attention scaling (``attnflow.analysis.critical``): the closed forms of one
layer on simplex tokens against the model's own layer, and their three limits."""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis import critical_gamma, critical_layer, simplex_tokens


def _cos(z: np.ndarray) -> np.ndarray:
    u = z / np.linalg.norm(z, axis=1, keepdims=True)
    return u @ u.T


@pytest.mark.parametrize("gamma", [0.8, 2.0, 3.5])
@pytest.mark.parametrize("n", [16, 200])
def test_closed_forms_equal_the_models_own_layer(gamma, n):
    """One softmax layer (Q = K = V = I, beta = gamma log n, no residual) through
    attnflow's model, and through ssmax with s = gamma at beta = 1: the self-weight and
    the outputs' cosine are the closed forms at this n."""
    rho = 0.5  # gamma_c = 2
    y = simplex_tokens(n, rho)
    eye = np.eye(n + 1)
    r = critical_layer(gamma, rho, n)
    for model in (
        af.Attention(eye, eye, eye, beta=gamma * math.log(n)),
        af.Attention(eye, eye, eye, kernel="ssmax", kernel_params={"s": gamma}),
    ):
        P = np.asarray(model.attention(y))
        np.testing.assert_allclose(np.diag(P), r.self_weight, rtol=1e-12)
        C = _cos(np.asarray(model.pure_layer(y)))
        off = C[~np.eye(n, dtype=bool)]
        np.testing.assert_allclose(off, r.cosine, rtol=1e-11)


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.8])
def test_the_three_limits_as_n_grows(rho):
    gc = critical_gamma(rho)
    assert gc == pytest.approx(1 / (1 - rho))
    big = 10**15
    below, at, above = (critical_layer(g, rho, big) for g in (0.5 * gc, gc, 1.5 * gc))
    assert (below.phase, at.phase, above.phase) == ("collapse", "critical", "preserved")
    assert below.cosine == pytest.approx(1.0, abs=1e-3) and below.limit_cosine == 1.0
    assert at.self_weight == pytest.approx(0.5, abs=1e-12)
    assert at.cosine == pytest.approx(4 * rho / (1 + 3 * rho), abs=1e-6)
    assert above.cosine == pytest.approx(rho, abs=1e-3) and above.limit_cosine == rho
    # at the critical scale the cosine approaches its limit as n grows, like 1/n
    errs = [abs(critical_layer(gc, rho, n).cosine - at.limit_cosine) for n in (10**2, 10**4)]
    assert errs[1] < errs[0] / 50


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="rho must be"):
        critical_layer(1.0, 1.0, 10)
    with pytest.raises(ValueError, match="gamma must be"):
        critical_layer(0.0, 0.5, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        critical_layer(1.0, 0.5, 1)
