"""Peak resident memory of a vector-field evaluation at n = 65,536 (float32, d = 16), and
of a full simulate at n = 16,384, each in a fresh process (ru_maxrss).

The attention path tiles blocks of query rows against all keys (kernels.attend), so
the 65,536^2 logit matrix (16 GiB in float32) is never formed.

    python benchmarks/bench_memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import save

CHILD = r"""
import resource, time, json, sys
import jax, jax.numpy as jnp, numpy as np
import attnflow as af
from attnflow.dynamics.frames import Continuous, make_frame
mode, n, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
I = np.eye(d, dtype=np.float32)
V = (0.5 * I + 0.1 * rng.standard_normal((d, d))).astype(np.float32)
model = af.Attention(I, I, V, beta=0.25)
x = jnp.asarray(rng.uniform(-1, 1, (n, d)), jnp.float32)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if mode == "field":
    dyn = make_frame("rescaled", model)
    field = jax.jit(lambda dyn, t, y: Continuous().field(dyn, t, y))
    out = field(dyn, jnp.float32(0.5), dyn.initial_state(x))
    out.block_until_ready()
    extra = {"finite": bool(jnp.all(jnp.isfinite(out)))}
else:
    traj = af.simulate(model, x, 1.0, method="euler", dt=0.25)
    jax.block_until_ready(traj.z)
    extra = {"status": traj.status, "layers": 4}
el = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": mode, "n": n, "d": d, "seconds": el, "peak_rss_mib": peak / 1024,
                  "rss_before_mib": base / 1024, **extra}))
"""


def child(mode, n, d):
    p = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(n), str(d)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    out = {"field_65536": child("field", 65536, 16), "simulate_16384": child("simulate", 16384, 16)}
    out["field_65536"]["under_2_GiB"] = out["field_65536"]["peak_rss_mib"] < 2048
    save("memory", out)


if __name__ == "__main__":
    main()
