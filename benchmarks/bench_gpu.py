"""Throughput on whatever device JAX finds: ready to run on a GPU node, small on a CPU.

Prints the device (platform, kind, count) and reports pairs per second for:

1. **the dense field**: one vector-field evaluation of a softmax head (float32,
   d = 64, n = 65,536; tiled in blocks of query rows past 2048 tokens), n^2 pairs;
2. **the circle field**: one post-LN step on the circle through the exact O(n K) field
   that ``simulate`` chooses by itself (float64, beta = 20, n = 10^7): the n^2 pairs a
   dense field would weigh, per second (its own cost is n K), and its agreement with
   dense rows (16 rows, every key);
3. **the phase diagram's step**: the post-LN layer of the sphere frame that
   ``studies.sphere`` runs (``IsotropicAttention``, float32, 1,024 systems of n = 32,
   d = 128, 20 layers in one compiled loop): systems x n^2 x layers pairs.

Every float32 product asks for full precision (``attnflow._precision``: no TF32 on an
NVIDIA GPU); for byte-identical reruns on a GPU set
``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` (``attnflow figures`` sets it for its
workers). Each number is the best of 3 timed calls after a compiled warm-up.

    python benchmarks/bench_gpu.py              # the GPU sizes
    python benchmarks/bench_gpu.py --small      # n = 2048, 10^5 and 32 systems (CPU: seconds)

Writes benchmarks/results/gpu.json (gpu_small.json with --small), or ``--out PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.dynamics.fields import choose_field  # noqa: E402
from attnflow.dynamics.frames import Sphere  # noqa: E402
from attnflow.dynamics.kernels import auto_block  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = {
    "full": {"dense_n": 65_536, "circle_n": 10_000_000, "systems": 1024, "layers": 20},
    "small": {"dense_n": 2048, "circle_n": 100_000, "systems": 32, "layers": 3},
}


def best_of(fn, *args, repeats: int = 3) -> float:
    """Smallest wall time of ``fn(*args)`` after one compiled warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def device() -> dict:
    d = jax.devices()[0]
    return {
        "platform": d.platform,
        "kind": getattr(d, "device_kind", "?"),
        "count": jax.device_count(),
        "processes": jax.process_count(),
        "jax": jax.__version__,
    }


def dense_field(n: int, d: int = 64) -> dict:
    rng = np.random.default_rng(0)
    Q = (np.eye(d) + 0.1 * rng.standard_normal((d, d))).astype(np.float32)
    K = (np.eye(d) + 0.1 * rng.standard_normal((d, d))).astype(np.float32)
    V = (0.5 * np.eye(d) + 0.1 * rng.standard_normal((d, d))).astype(np.float32)
    model = af.Attention(Q, K, V, beta=1.0 / np.sqrt(d))
    x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    field = jax.jit(lambda m, x: m.vector_field(x))
    t = best_of(field, model, x)
    return {
        "n": n,
        "d": d,
        "dtype": "float32",
        "tile_rows": auto_block(n),
        "seconds": t,
        "pairs_per_second": n * n / t,
        "gflops": 4.0 * n * n * d / t / 1e9,  # q k^T and P V
    }


def circle_step(n: int, beta: float = 20.0, dt: float = 0.1) -> dict:
    rng = np.random.default_rng(0)
    th = rng.uniform(0, 2 * np.pi, n)
    x = jnp.asarray(np.stack([np.cos(th), np.sin(th)], axis=-1))
    model = af.Attention(np.eye(2), np.eye(2), np.eye(2), beta=beta)
    fast, info = choose_field(model, n)
    assert info["field"] == "circle", info
    frame = Sphere(fast, "post")
    step = jax.jit(lambda x: frame.step(x, None, dt, None))
    t = best_of(step, x)
    # agreement with dense rows: 16 query rows against every key
    rows = jnp.asarray(rng.choice(n, 16, replace=False))
    L = beta * (x[rows] @ x.T)
    P = jnp.exp(L - L.max(axis=-1, keepdims=True))
    u = x[rows] + dt * (P @ x) / P.sum(-1, keepdims=True)
    dense = u / jnp.linalg.norm(u, axis=-1, keepdims=True)
    err = float(jnp.max(jnp.abs(step(x)[rows] - dense)))
    return {
        "n": n,
        "beta": beta,
        "dtype": "float64",
        "modes": info["modes"],
        "seconds": t,
        "tokens_per_second": n / t,
        "pairs_per_second": n * n / t,  # the pairs a dense field would weigh
        "max_abs_vs_dense_rows": err,
    }


def phase_step(systems: int, layers: int, n: int = 32, d: int = 128) -> dict:
    model = af.IsotropicAttention(d, beta=4.0, dtype=np.float32)
    frame = Sphere(model, "post")
    step = jax.vmap(lambda y: frame.step(y, None, 0.1, None))
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, layers, lambda _, u: step(u), x))
    x0 = jax.random.normal(jax.random.PRNGKey(0), (systems, n, d), jnp.float32)
    x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
    t = best_of(loop, x0)
    return {
        "systems": systems,
        "n": n,
        "d": d,
        "layers": layers,
        "dtype": "float32",
        "seconds": t,
        "system_steps_per_second": systems * layers / t,
        "pairs_per_second": systems * n * n * layers / t,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--small", action="store_true", help="CPU sizes: seconds")
    ap.add_argument("--out", default=None, help="the results file (default results/gpu.json)")
    args = ap.parse_args(argv)
    size = SIZES["small" if args.small else "full"]
    dev = device()
    print(f"device: {dev['platform']} ({dev['kind']}) x {dev['count']}, jax {dev['jax']}")
    load0 = os.getloadavg()[0]
    out = {"device": dev, "small": args.small}
    out["dense_field"] = r = dense_field(size["dense_n"])
    print(f"dense field   n = {r['n']:>10,}: {r['pairs_per_second']:.3e} pairs/s")
    out["circle_step"] = r = circle_step(size["circle_n"])
    print(
        f"circle field  n = {r['n']:>10,}: {r['pairs_per_second']:.3e} pairs/s "
        f"({r['tokens_per_second']:.3e} tokens/s, {r['modes']} modes, "
        f"{r['max_abs_vs_dense_rows']:.1e} from dense rows)"
    )
    out["phase_step"] = r = phase_step(size["systems"], size["layers"])
    print(
        f"phase diagram {r['systems']} x n = {r['n']}, d = {r['d']}: "
        f"{r['pairs_per_second']:.3e} pairs/s ({r['system_steps_per_second']:.3e} system-steps/s)"
    )
    out["load_avg_1min"] = [load0, os.getloadavg()[0]]
    out["date"] = time.strftime("%Y-%m-%d %H:%M")
    path = (
        Path(args.out) if args.out else RESULTS / ("gpu_small.json" if args.small else "gpu.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
