"""One post-LN step of n tokens on the circle, side by side in one run (the machine's
load recorded): attnflow's engine (``simulate`` chooses the exact O(n K) circle field,
``attnflow.dynamics.fields.circle``; the compiled step timed after a warm-up) against a
plain numpy prototype of the same Fourier-moment field (scipy's ``ive`` coefficients,
numpy moments), and the step's agreement with dense numpy rows (sampled rows, every key).

Q = K = I, V = I, beta = 20, float64, x <- N(x + dt F(x)) with dt = 0.1.

Run:  python benchmarks/bench_circle.py [--quick]     (n = 10^6; --quick: n = 10^5)
Writes benchmarks/results/circle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import RESULTS, machine  # noqa: E402
from scipy.special import ive  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.dynamics.fields import choose_field, circle_modes  # noqa: E402
from attnflow.dynamics.frames import Sphere  # noqa: E402

BETA, DT = 20.0, 0.1


def numpy_step(x: np.ndarray, K: int) -> np.ndarray:
    """The prototype: moments C_k = sum_j e^{-ik t_j}, then D_i and N_i mode by mode."""
    t = np.arctan2(x[:, 1], x[:, 0])
    a = ive(np.arange(K + 2), BETA)
    z = np.exp(-1j * t)
    C = [np.complex128(len(t))]
    p = np.ones_like(z)
    for _ in range(K + 1):
        p = p * z
        C.append(p.sum())
    w = np.exp(1j * t)
    D = a[0] * C[0].real * np.ones(len(t))
    N = a[0] * np.conj(C[1]) * np.ones(len(t), complex)
    wk = np.ones_like(w)
    for k in range(1, K + 1):
        wk = wk * w
        D += 2 * a[k] * np.real(wk * C[k])
        N += a[k] * (wk * C[k - 1] + np.conj(wk) * np.conj(C[k + 1]))
    m = N / D
    u = x + DT * np.stack([m.real, m.imag], axis=-1)
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def dense_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = []
    for i in rows:
        L = BETA * (x @ x[i])
        w = np.exp(L - L.max())
        m = (w / w.sum()) @ x
        u = x[i] + DT * m
        out.append(u / np.linalg.norm(u))
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 100_000 if args.quick else 1_000_000
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 2 * np.pi, n)
    x = np.stack([np.cos(t), np.sin(t)], axis=-1)
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=BETA)
    fast, info = choose_field(model, n)
    assert info["field"] == "circle", info
    frame = Sphere(fast, "post")
    step = jax.jit(lambda y: frame.step(y, None, DT, None))
    xj = jnp.asarray(x)
    jax.block_until_ready(step(xj))  # compile
    load0 = os.getloadavg()[0]
    t_af, t_np = [], []
    for _ in range(3):  # interleaved
        s = time.perf_counter()
        got = np.asarray(jax.block_until_ready(step(xj)))
        t_af.append(time.perf_counter() - s)
        s = time.perf_counter()
        proto = numpy_step(x, info["modes"])
        t_np.append(time.perf_counter() - s)
    load1 = os.getloadavg()[0]
    rows = rng.choice(n, 64, replace=False)
    ref = dense_rows(x, rows)
    res = {
        "machine": machine(),
        "n": n,
        "beta": BETA,
        "modes": info["modes"],
        "modes_rule_9_sqrt_beta_plus_6": 9 * np.sqrt(BETA) + 6,
        "error_bound": info["error_bound"],
        "attnflow_s": min(t_af),
        "numpy_s": min(t_np),
        "ratio_numpy_over_attnflow": min(t_np) / min(t_af),
        "max_abs_vs_dense_rows": float(np.max(np.abs(got[rows] - ref))),
        "max_abs_vs_numpy": float(np.max(np.abs(got - proto))),
        "load_avg_1min": [load0, load1],
    }
    assert res["modes"] == circle_modes(BETA)
    print(json.dumps(res, indent=1))
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "circle.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
