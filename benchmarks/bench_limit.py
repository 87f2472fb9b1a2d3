"""The vector field against the machine's limit: the same work in plain JAX.

The limit is a plain jitted function doing only what any implementation must: the two
projections, the logit product, the n^2 exponentials of a max-shifted softmax, the
weighted sum and the value map. attnflow's vector field (both frames; the rescaled one in
modal coordinates) is timed in the same run; the ratio limit / attnflow is reported
(1.0 = at the limit), from the fastest call of each (also from the medians); the
three are timed in alternation. float64 and float32, n = 1024, d = 64.

    python benchmarks/bench_limit.py
"""

from __future__ import annotations

import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import save  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.dynamics.frames import make_frame  # noqa: E402
from attnflow.dynamics.terms import FlowTerm  # noqa: E402


def interleaved(fns: dict, rounds: int = 15, per_round: int = 10) -> dict:
    """Wall times of each function, run in alternation (``per_round`` calls each per
    round) after a warm-up, so that a change in the machine's load hits all alike."""
    for f in fns.values():
        f()
        f()
    out = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                f()
                out[k].append(time.perf_counter() - t0)
    return out


def main():
    n, d = 1024, 64
    rng = np.random.default_rng(0)
    A = rng.standard_normal((d, d)) / np.sqrt(d)
    V = (A + A.T) / 2
    Q = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    K = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    out = {"n": n, "d": d}
    for dtype in (np.float64, np.float32):
        model = af.Attention(*(np.asarray(a, dtype) for a in (Q, K, V)), beta=0.125)
        x = jnp.asarray(rng.standard_normal((n, d)), dtype)
        Qj, Kj, Vj, bj = model.Q, model.K, model.V, model.beta

        @jax.jit
        def plain(x):
            q = x @ Qj.T
            k = x @ Kj.T
            L = (bj * q) @ k.T
            e = jnp.exp(L - L.max(axis=1, keepdims=True))
            return ((e / e.sum(axis=1, keepdims=True)) @ x) @ Vj.T

        field = jax.jit(lambda dyn, t, y: FlowTerm(dyn).field(t, y))
        t = jnp.asarray(0.3, dtype)
        fns = {"plain": lambda: plain(x).block_until_ready()}
        for frame in ("original", "rescaled"):
            dyn = make_frame(frame, model)
            y = dyn.initial_state(x)
            fns[frame] = lambda dyn=dyn, y=y: field(dyn, t, y).block_until_ready()
        times = interleaved(fns)
        row = {
            "plain_ms": 1e3 * min(times["plain"]),
            "plain_median_ms": 1e3 * float(np.median(times["plain"])),
        }
        for frame in ("original", "rescaled"):
            row[f"{frame}_ms"] = 1e3 * min(times[frame])
            row[f"{frame}_median_ms"] = 1e3 * float(np.median(times[frame]))
            row[f"{frame}_fraction_of_limit"] = min(times["plain"]) / min(times[frame])
            row[f"{frame}_fraction_of_limit_median"] = float(np.median(times["plain"])) / float(
                np.median(times[frame])
            )
        out[np.dtype(dtype).name] = row
    save("limit", out)


if __name__ == "__main__":
    main()
