"""Peak memory of one vector-field evaluation at n = 262,144 and 65,536 (float32,
d = 16), with its time per pair against the machine's matmul limit; a full simulate at
n = 16,384; and the memory per device of the token-sharded field
(``simulate(..., shard="tokens")``) on 1, 2 and 4 forced host devices. Each case runs in
a fresh process: peak resident memory from ``ru_maxrss``, and XLA's own accounting of
the compiled program (``memory_analysis()``).

The attention path tiles blocks of query rows against all keys (``kernels.attend``,
``auto_block``: tiles of about 4M logits, 16 MiB in float32), so the n^2 logit matrix
(256 GiB at n = 262,144) is never formed: memory O(n d + block n).

Time per pair: the evaluation's wall time over n^2, against the machine's limit measured
in the same process: one tile of the field's own rows in plain JAX doing only what any
softmax attention must (the products q k^T and P V, the row maximum, n exponentials and
the row sum), per pair; its two products alone and the exponential alone, per pair; and
the field's rate in the flops of its products (4 n^2 d) against a 2048^3 float32 matmul.
One evaluation at n = 262,144 takes minutes, so the machine's load moves it between the
field and the limit; the ``pair`` case times the field and the same tiles in plain JAX
(``lax.map`` over blocks of query rows, then the value map) in alternation at
n = 16,384, best of 5 each: the ratio to read.

    python benchmarks/bench_memory.py            # every case (about 5 minutes idle)
    python benchmarks/bench_memory.py --cases field --n 262144   # results/memory_field.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import save

CHILD = r"""
import resource, time, json, sys
import jax, jax.numpy as jnp, numpy as np
import attnflow as af
from attnflow.dynamics.frames import make_frame
from attnflow.dynamics.terms import FlowTerm
mode, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
I = np.eye(d, dtype=np.float32)
V = (0.5 * I + 0.1 * rng.standard_normal((d, d))).astype(np.float32)
model = af.Attention(I, I, V, beta=0.25)
x = jnp.asarray(rng.uniform(-1, 1, (n, d)), jnp.float32)
field = jax.jit(lambda dyn, t, y: FlowTerm(dyn).field(t, y))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def best(f, repeats=5):
    f()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def memory(compiled):
    ma = compiled.memory_analysis()
    return {
        "temp": ma.temp_size_in_bytes / 2**20,
        "arguments": ma.argument_size_in_bytes / 2**20,
        "output": ma.output_size_in_bytes / 2**20,
    }


t0 = time.perf_counter()
if mode == "field":
    dyn = make_frame("rescaled", model)
    t = jnp.float32(0.5)
    y0 = dyn.initial_state(x)
    tc = time.perf_counter()
    compiled = field.lower(dyn, t, y0).compile()
    compile_s = time.perf_counter() - tc
    tr = time.perf_counter()
    out = compiled(dyn, t, y0)
    out.block_until_ready()
    run_s = time.perf_counter() - tr
    peak_field = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # the machine's limits, measured after the field's peak was read: a 2048^3 matmul;
    # one tile of the field's own rows in plain JAX, its two products alone and the
    # whole softmax row (products, max, n exponentials, sum): only the work any
    # implementation must do; and the exponential alone over a tile
    HI = jax.lax.Precision.HIGHEST
    a = jnp.asarray(rng.standard_normal((2048, 2048)), jnp.float32)
    gemm = jax.jit(lambda a, b: jnp.matmul(a, b, precision=HI))
    gemm_s = best(lambda: gemm(a, a).block_until_ready())
    blk = af.dynamics.kernels.auto_block(n) or n
    qb = x[:blk]
    products = jax.jit(
        lambda q, k, v: jnp.matmul(jnp.matmul(q, k.T, precision=HI), v, precision=HI)
    )

    def softmax_tile(q, k, v):
        L = jnp.matmul(0.25 * q, k.T, precision=HI)
        P = jnp.exp(L - L.max(axis=-1, keepdims=True))
        return jnp.matmul(P, v, precision=HI) / P.sum(axis=-1, keepdims=True)

    plain = jax.jit(softmax_tile)
    L = jnp.asarray(rng.standard_normal((blk, n)), jnp.float32)
    expo = jax.jit(jnp.exp)
    products_s = best(lambda: products(qb, x, x).block_until_ready(), repeats=9)
    plain_s = best(lambda: plain(qb, x, x).block_until_ready(), repeats=9)
    exp_s = best(lambda: expo(L).block_until_ready(), repeats=9)
    pairs = float(n) * n
    flops = 4.0 * pairs * d
    extra = {
        "finite": bool(jnp.all(jnp.isfinite(out))),
        "tile_rows": blk,
        "xla_mib": memory(compiled),
        "compile_seconds": compile_s,
        "field_seconds": run_s,
        "ns_per_pair": run_s / pairs * 1e9,
        "field_gflops": flops / run_s / 1e9,
        "gemm_2048_gflops": 2.0 * 2048**3 / gemm_s / 1e9,
        "plain_tile_ns_per_pair": plain_s / (blk * n) * 1e9,
        "products_ns_per_pair": products_s / (blk * n) * 1e9,
        "exp_ns": exp_s / (blk * n) * 1e9,
    }
    extra["field_over_gemm_rate"] = extra["field_gflops"] / extra["gemm_2048_gflops"]
    extra["plain_over_field"] = extra["plain_tile_ns_per_pair"] / extra["ns_per_pair"]
elif mode == "pair":  # the field against the same tiles in plain JAX, interleaved
    HI = jax.lax.Precision.HIGHEST
    dyn = make_frame("rescaled", model)
    t, y0 = jnp.float32(0.5), dyn.initial_state(x)
    blk = af.dynamics.kernels.auto_block(n) or n
    Vj = jnp.asarray(V)

    def plain(x):
        def tile(q):
            L = jnp.matmul(0.25 * q, x.T, precision=HI)
            P = jnp.exp(L - L.max(axis=-1, keepdims=True))
            return jnp.matmul(P, x, precision=HI) / P.sum(axis=-1, keepdims=True)

        u = jax.lax.map(tile, x.reshape(n // blk, blk, d)).reshape(n, d)
        return jnp.matmul(u, Vj.T, precision=HI)

    plain = jax.jit(plain)
    fns = {"field": lambda: field(dyn, t, y0).block_until_ready(),
           "plain": lambda: plain(x).block_until_ready()}
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(5):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    ns = {k: min(v) / n / n * 1e9 for k, v in times.items()}
    extra = {"tile_rows": blk, "field_ns_per_pair": ns["field"],
             "plain_ns_per_pair": ns["plain"], "plain_over_field": ns["plain"] / ns["field"],
             "seconds_each": times}
elif mode == "tokens":  # the field with the query rows sharded over D host devices
    from attnflow.dynamics._devices import TokenSharded
    D = int(sys.argv[4])
    dyn = make_frame("rescaled", TokenSharded(model, jax.devices()[:D]))
    y0 = dyn.initial_state(x)
    compiled = field.lower(dyn, jnp.float32(0.5), y0).compile()
    out = compiled(dyn, jnp.float32(0.5), y0)
    out.block_until_ready()
    ref = field(make_frame("rescaled", model), jnp.float32(0.5), y0)
    extra = {
        "devices": D,
        "per_device_mib": memory(compiled),  # XLA's accounting of the per-device program
        "tile_rows": af.dynamics.kernels.auto_block(n),
        "max_abs_diff_vs_one_device": float(jnp.max(jnp.abs(out - ref))),
    }
else:
    traj = af.simulate(model, x, 1.0, method="euler", dt=0.25)
    jax.block_until_ready(traj.z)
    extra = {"status": traj.status, "layers": 4}
el = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if mode == "field":
    peak = peak_field
print(json.dumps({"mode": mode, "n": n, "d": d, "seconds": el, "peak_rss_mib": peak / 1024,
                  "rss_before_mib": base / 1024, **extra}))
"""


def child(mode, n, d, devices=1):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(n), str(d), str(devices)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cases", default="field,pair,simulate,tokens", help="comma-separated")
    ap.add_argument("--n", type=int, nargs="*", default=[262144, 65536], help="field sizes")
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    out: dict = {"loadavg_before": loadavg()}
    if "field" in cases:
        for n in args.n:
            r = child("field", n, 16)
            r["under_2_GiB"] = r["peak_rss_mib"] < 2048
            out[f"field_{n}"] = r
    if "pair" in cases:
        out["pair_16384"] = child("pair", 16384, 16)
    if "simulate" in cases:
        out["simulate_16384"] = child("simulate", 16384, 16)
    if "tokens" in cases:
        for n in (16384, 65536):
            for D in (1, 2, 4):
                out[f"tokens_{n}_{D}dev"] = child("tokens", n, 16, D)
    out["loadavg_after"] = loadavg()
    everything = cases >= {"field", "pair", "simulate", "tokens"} and args.n == [262144, 65536]
    save("memory" if everything else "memory_" + "_".join(sorted(cases)), out)


if __name__ == "__main__":
    main()
