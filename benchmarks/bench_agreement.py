"""The agreement study's solves: a loop of compiled calls against stacked calls.

The 216 triples of ``python -m attnflow.experiments.agreement_study`` (24 per family,
seed 0; d from 2 to 4; 16 tokens uniform in [-5, 5]^d; Tsit5, rtol 1e-6, atol 1e-9, at
most 20,000 steps; ``t1 = 12 / |lambda_1|``, ``60 / c`` in the original frame for
V = -cI) are solved

- ``loop``: one ``simulate`` per triple, as the study does;
- ``stacked``: grouped by (d, frame, propagator method) into 9 stacked calls. A stacked
  call has one ``t1``, so each V is scaled to the common horizon ``T`` (12 or 60):
  ``(Q, K, (t1 / T) V)`` on ``[0, T]`` is the same trajectory in the time ``t / (t1 / T)``,
  and the rescaled coordinates ``z`` agree; ``chunk`` as given (``one``: one vmapped loop
  per call; ``1``: every system its own loop).

Each variant runs in a fresh process (the study is one process: compilation counts),
twice in a row, so that both the cold and the warm time are recorded; the total of the
solvers' step counts and the load average are recorded too.

    python benchmarks/bench_agreement.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _common import save

CHILD = r"""
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import attnflow as af
from attnflow.experiments.agreement_study import FAMILIES, draw
from attnflow.studies.sweep import rng as sample_rng

mode = sys.argv[1]
rows = []
for i in range(24 * len(FAMILIES)):
    g = sample_rng(0, i)
    Q, K, V, scale = draw(FAMILIES[i % len(FAMILIES)], g)
    origin = af.predict_regime(Q, K, V).structure.kind == "scalar-negative"
    t1 = (60.0 if origin else 12.0) / scale
    rows.append((Q, K, V, t1, origin, g.uniform(-5, 5, (16, V.shape[0]))))
frame = lambda origin: "original" if origin else "rescaled"


def loop():
    steps = 0
    for Q, K, V, t1, origin, x0 in rows:
        tr = af.simulate(af.Attention(Q, K, V), x0, t1, ts=np.linspace(0, t1, 49),
                         frame=frame(origin), max_steps=20000)
        steps += int(tr.stats["num_steps"])
    return steps


def stacked(chunk):
    groups = {}
    for i, (Q, K, V, t1, origin, x0) in enumerate(rows):
        key = (V.shape[0], origin, af.Attention(Q, K, V).propagator.method)
        groups.setdefault(key, []).append(i)
    steps = 0
    for (d, origin, method), idx in groups.items():
        T = 60.0 if origin else 12.0
        model = af.stack([af.Attention(rows[i][0], rows[i][1], rows[i][2] * (rows[i][3] / T),
                                       propagator=method) for i in idx])
        tr = af.simulate(model, np.stack([rows[i][5] for i in idx]), T,
                         ts=np.linspace(0, T, 49), frame=frame(origin), max_steps=20000,
                         chunk=chunk)
        steps += int(np.asarray(tr.stats["num_steps"]).sum())
    return steps, len(groups)


out = {"mode": mode}
for name in ("cold_seconds", "warm_seconds"):
    t = time.perf_counter()
    if mode == "loop":
        out["steps"] = loop()
    else:
        out["steps"], out["calls"] = stacked(None if mode == "one" else int(mode))
    out[name] = time.perf_counter() - t
print(json.dumps(out))
"""


def child(mode: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=3600
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    load = [os.getloadavg()[0]]
    out = {}
    for mode in ("loop", "1", "one", "8"):
        out[mode if mode == "loop" else f"stacked_chunk_{mode}"] = child(mode)
        load.append(os.getloadavg()[0])
    out["load_avg_1min_before_and_after_each"] = load
    save("agreement", out)


if __name__ == "__main__":
    main()
