"""attnflow against a careful numpy + scipy.integrate.solve_ivp implementation.

1. One system, n = 1024 tokens, d = 64, t1 = 5, float64, rtol 1e-6 / atol 1e-9:
   attnflow (``method="dopri5"``: the Dormand-Prince 5(4) pair of RK45, jit) against
   solve_ivp(RK45) with a vectorised numpy vector field (BLAS matmuls, in-place
   softmax). Both integrate the original frame (no e^{tV}). Also attnflow with its
   defaults (Tsit5, rescaled frame) on the same problem.
2. An ensemble: 256 systems of n = 32, d = 2, t1 = 10: one batched attnflow call
   against a loop of the scipy version over the 256 systems.

Side by side in one run; attnflow timed warm (compiled; the compile time is reported
separately). Also reports the step counts and the difference of the final states.

    python benchmarks/bench_scipy.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import best_of, save  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import attnflow as af  # noqa: E402


def numpy_field(Q, K, V, beta):
    """The original-frame field, vectorised numpy, tokens as rows."""
    Qt, Kt, Vt = Q.T.copy(), K.T.copy(), V.T.copy()
    n_d = None

    def f(t, y):
        X = y.reshape(n_d)
        L = (X @ Qt) @ (X @ Kt).T
        L *= beta
        L -= L.max(axis=1, keepdims=True)
        np.exp(L, out=L)
        L /= L.sum(axis=1, keepdims=True)
        return ((L @ X) @ Vt).ravel()

    def make(shape):
        nonlocal n_d
        n_d = shape
        return f

    return make


def scipy_solve(Q, K, V, beta, x0, t1, rtol, atol):
    f = numpy_field(Q, K, V, beta)(x0.shape)
    sol = solve_ivp(f, (0.0, t1), x0.ravel(), method="RK45", rtol=rtol, atol=atol, t_eval=[t1])
    return sol.y[:, -1].reshape(x0.shape), sol.nfev


def weights(d, seed):
    """Q, K near the identity; V symmetric with spectrum in about [-0.66, 0.66] (GOE / 2).

    The spectrum is kept small on purpose: with the tokens growing like e^{t lambda_max}
    the logits grow like e^{2 t lambda_max}; past ~e^{10} the attention switches like a
    hard argmax and any adaptive integrator (ours and scipy's) crawls through
    thousands of steps (a shifted V = GOE + 0.5 I, lambda_max = 1.8, took 336 Tsit5 steps
    to t = 2 and minutes to t = 5). That regime is the discrete transformer's
    (``bench_paper128.py``)."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, d)) / np.sqrt(d)
    V = 0.25 * (A + A.T)
    Q = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    K = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    return Q, K, V


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rtol, atol = 1e-6, 1e-9
    out = {}

    # 1. one large system
    n, d, t1 = (256, 16, 2.0) if args.quick else (1024, 64, 5.0)
    Q, K, V = weights(d, 0)
    beta = 1.0 / np.sqrt(d)
    x0 = np.random.default_rng(1).standard_normal((n, d))
    model = af.Attention(Q, K, V, beta=beta)
    t = time.perf_counter()
    traj = af.simulate(model, x0, t1, frame="original", method="dopri5", rtol=rtol, atol=atol)
    jax.block_until_ready(traj.x)
    first = time.perf_counter() - t
    say(
        f"single n={n} d={d}: attnflow first call {first:.2f} s, "
        f"{int(traj.stats['num_steps'])} steps"
    )
    t_af = best_of(
        lambda: jax.block_until_ready(
            af.simulate(model, x0, t1, frame="original", method="dopri5", rtol=rtol, atol=atol).x
        ),
        repeats=3,
    )
    say(f"attnflow compiled {t_af:.3f} s; scipy ...")
    x_sp, nfev = scipy_solve(Q, K, V, beta, x0, t1, rtol, atol)
    t_sp = best_of(lambda: scipy_solve(Q, K, V, beta, x0, t1, rtol, atol), repeats=2, warmup=0)
    say(f"scipy {t_sp:.3f} s ({nfev} field evaluations): ratio {t_sp / t_af:.1f}x")
    diff = float(np.abs(np.asarray(traj.x[-1]) - x_sp).max() / np.abs(x_sp).max())
    out["single"] = {
        "n": n,
        "d": d,
        "t1": t1,
        "method": "dopri5",
        "frame": "original",
        "attnflow_s": t_af,
        "attnflow_first_call_s": first,
        "scipy_s": t_sp,
        "speedup": t_sp / t_af,
        "attnflow_steps": int(traj.stats["num_steps"]),
        "attnflow_field_evals": 6 * int(traj.stats["num_steps"]) + 1,
        "scipy_field_evals": int(nfev),
        "relative_difference": diff,
        "status": traj.status,
    }
    # attnflow's defaults (Tsit5, rescaled frame in V's modal basis) on the same
    # problem: the same x(t1) to the same tolerances
    traj_r = af.simulate(model, x0, t1, rtol=rtol, atol=atol)
    jax.block_until_ready(traj_r.x)
    t_r = best_of(
        lambda: jax.block_until_ready(af.simulate(model, x0, t1, rtol=rtol, atol=atol).x), repeats=3
    )
    diff_r = float(np.abs(np.asarray(traj_r.x[-1]) - x_sp).max() / np.abs(x_sp).max())
    say(
        f"attnflow default (rescaled) frame {t_r:.3f} s, "
        f"{int(traj_r.stats['num_steps'])} steps: ratio {t_sp / t_r:.1f}x"
    )
    out["single_default_frame"] = {
        "method": "adaptive (Tsit5)",
        "frame": "rescaled",
        "coords": traj_r.coords,
        "attnflow_s": t_r,
        "scipy_s": t_sp,
        "speedup": t_sp / t_r,
        "attnflow_steps": int(traj_r.stats["num_steps"]),
        "relative_difference": diff_r,
        "status": traj_r.status,
    }

    # 2. an ensemble
    b, n, d, t1 = (32, 32, 2, 10.0) if args.quick else (256, 32, 2, 10.0)
    Q, K, V = np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"]
    xs = np.random.default_rng(2).uniform(-1, 1, (b, n, d))
    model = af.Attention(Q, K, V)
    batch = af.simulate(model, xs, t1, frame="original", rtol=rtol, atol=atol)
    jax.block_until_ready(batch.x)
    t_af = best_of(
        lambda: jax.block_until_ready(
            af.simulate(model, xs, t1, frame="original", rtol=rtol, atol=atol).x
        ),
        repeats=3,
    )

    def loop():
        return [scipy_solve(Q, K, V, 1.0, xs[i], t1, rtol, atol)[0] for i in range(b)]

    say(f"ensemble b={b}: attnflow {t_af:.3f} s; scipy loop ...")
    t = time.perf_counter()
    res = loop()
    t_sp = time.perf_counter() - t
    say(f"scipy loop {t_sp:.3f} s: ratio {t_sp / t_af:.1f}x")
    diff = max(
        float(np.abs(np.asarray(batch.x[i, -1]) - res[i]).max() / np.abs(res[i]).max())
        for i in range(b)
    )
    out["ensemble"] = {
        "systems": b,
        "n": n,
        "d": d,
        "t1": t1,
        "attnflow_s": t_af,
        "scipy_loop_s": t_sp,
        "speedup": t_sp / t_af,
        "max_relative_difference": diff,
        "status": batch.status,
    }
    save("scipy_quick" if args.quick else "scipy", out)


if __name__ == "__main__":
    main()
