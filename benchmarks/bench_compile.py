"""First-call compile time of a default simulate, and no recompilation on new values.

In a fresh process: the first ``simulate`` (n = 20, d = 2, default adaptive Tsit5,
rescaled frame) is timed whole (tracing + XLA compilation + run); then new Q, K, V, x0
and t1 values of the same shapes are simulated under ``jax.log_compiles`` and the number
of compilations counted (expected 0).

    python benchmarks/bench_compile.py
"""

from __future__ import annotations

import json
import subprocess
import sys

from _common import save

CHILD = r"""
import logging, time, json, io
t0 = time.perf_counter()
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np, attnflow as af
t_import = time.perf_counter() - t0
rng = np.random.default_rng(0)
x0 = rng.uniform(-5, 5, (20, 2))
t = time.perf_counter()
traj = af.simulate(af.Attention(np.eye(2), np.eye(2), af.matrices.PAPER["paper-2d"]), x0, 5.0)
jax.block_until_ready(traj.z)
first = time.perf_counter() - t
stream = io.StringIO()
handler = logging.StreamHandler(stream)
logging.getLogger("jax").addHandler(handler)
t = time.perf_counter()
with jax.log_compiles():
    for s in range(5):
        r = np.random.default_rng(s + 1)
        V = r.standard_normal((2, 2))
        tr = af.simulate(af.Attention(np.eye(2) + 0.1 * r.standard_normal((2, 2)), np.eye(2), V),
                         r.uniform(-5, 5, (20, 2)), 3.0 + s)
        jax.block_until_ready(tr.z)
again = (time.perf_counter() - t) / 5
log = stream.getvalue()
n_compiles = log.count("Compiling")
print(json.dumps({"import_s": t_import, "first_simulate_s": first, "later_simulate_s": again,
                  "compilations_after_first": n_compiles,
                  "compiled": [l for l in log.splitlines() if "Compiling" in l][:5]}))
"""


def main():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    save("compile", json.loads(p.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
