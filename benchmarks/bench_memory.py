"""Peak resident memory of a vector-field evaluation at n = 65,536 (float32, d = 16), and
of a full simulate at n = 16,384, each in a fresh process (ru_maxrss); and the memory per
device of the token-sharded field (``simulate(..., shard="tokens")``) on 1, 2 and 4
forced host devices, from XLA's own accounting of the compiled per-device program.

The attention path tiles blocks of query rows against all keys (kernels.attend), so
the 65,536^2 logit matrix (16 GiB in float32) is never formed.

    python benchmarks/bench_memory.py
"""

from __future__ import annotations

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
t0 = time.perf_counter()
if mode == "field":
    dyn = make_frame("rescaled", model)
    out = field(dyn, jnp.float32(0.5), dyn.initial_state(x))
    out.block_until_ready()
    extra = {"finite": bool(jnp.all(jnp.isfinite(out)))}
elif mode == "tokens":  # the field with the query rows sharded over D host devices
    from attnflow.dynamics._devices import TokenSharded
    D = int(sys.argv[4])
    dyn = make_frame("rescaled", TokenSharded(model, jax.devices()[:D]))
    y0 = dyn.initial_state(x)
    compiled = field.lower(dyn, jnp.float32(0.5), y0).compile()
    ma = compiled.memory_analysis()
    out = compiled(dyn, jnp.float32(0.5), y0)
    out.block_until_ready()
    ref = field(make_frame("rescaled", model), jnp.float32(0.5), y0)
    extra = {
        "devices": D,
        "per_device_mib": {  # XLA's accounting of the compiled per-device program
            "temp": ma.temp_size_in_bytes / 2**20,
            "arguments": ma.argument_size_in_bytes / 2**20,
            "output": ma.output_size_in_bytes / 2**20,
        },
        "tile_rows": af.dynamics.kernels.auto_block(n),
        "max_abs_diff_vs_one_device": float(jnp.max(jnp.abs(out - ref))),
    }
else:
    traj = af.simulate(model, x, 1.0, method="euler", dt=0.25)
    jax.block_until_ready(traj.z)
    extra = {"status": traj.status, "layers": 4}
el = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
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


def main():
    out = {"field_65536": child("field", 65536, 16), "simulate_16384": child("simulate", 16384, 16)}
    out["field_65536"]["under_2_GiB"] = out["field_65536"]["peak_rss_mib"] < 2048
    for n in (16384, 65536):
        for D in (1, 2, 4):
            out[f"tokens_{n}_{D}dev"] = child("tokens", n, 16, D)
    save("memory", out)


if __name__ == "__main__":
    main()
