"""The sphere phase diagram: attnflow (all betas and systems in one compiled call) against
a plain numpy loop of the same post-LN scheme (numpy vectorised over the systems of one
beta, a Python loop over betas and layers: the authors' phase-diagrams.py, on the CPU).

Both compute, for n = 32 tokens uniform on S^{d-1}, Q = K = V = I, post-LN layers
x <- N(x + dt softmax(beta x x^T) x), dt = 0.1, t1 = 30, the fraction of ordered pairs
with <x_i, x_j> > 0.999 every 5 layers (61 saves). The machine is shared: the 1-minute
load average is recorded before and after each timing.

Run:  python benchmarks/bench_sphere.py [--quick] [--full] [--span]
      --full adds attnflow alone at the target size (90 betas x 1,024 systems, d = 2 and
      d = 128, float32 and float64).
      --span times only d = 128 (float32, every 9th of the figure's 90 betas, 1,024
      systems) in the span of each start (the default) against R^d (in_span=False),
      alternated, best of 2 after a compiling call each, into results/sphere_span.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402
from _common import RESULTS, machine  # noqa: E402

from attnflow.studies.sphere import phase_diagram  # noqa: E402

N, DT, T1, EVERY, THR = 32, 0.1, 30.0, 5, 0.999


def numpy_phase(betas, systems, d, t1=T1, dtype=np.float64, seed=0):
    """The same scheme in numpy: one beta at a time, vectorised over systems."""
    rng = np.random.default_rng(seed)
    layers = int(round(t1 / DT))
    off = ~np.eye(N, dtype=bool)
    out = np.zeros((len(betas), layers // EVERY + 1))
    for i, beta in enumerate(betas):
        x = rng.normal(size=(systems, N, d)).astype(dtype)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        for k in range(layers + 1):
            if k % EVERY == 0:
                G = x @ np.swapaxes(x, 1, 2)
                out[i, k // EVERY] = np.mean(G[:, off] > THR)
            if k == layers:
                break
            L = beta * (x @ np.swapaxes(x, 1, 2))
            P = np.exp(L - L.max(-1, keepdims=True))
            P /= P.sum(-1, keepdims=True)
            x = x + DT * (P @ x)
            x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return out


def timed(fn):
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t, (load0, os.getloadavg()[0])


def span() -> None:
    betas = np.linspace(0.1, 9, 90)[::9]
    kw = dict(d=128, systems=1024, save_every=EVERY, dtype=np.float32)
    runs = {"span": None, "rd": False}
    fractions = {k: phase_diagram(betas, **kw, in_span=v).fraction for k, v in runs.items()}
    best = {k: float("inf") for k in runs}
    loads = [os.getloadavg()[0]]
    for _ in range(2):
        for k, v in runs.items():
            _, t, _ = timed(lambda v=v: phase_diagram(betas, **kw, in_span=v))
            best[k] = min(best[k], t)
    loads.append(os.getloadavg()[0])
    out = dict(
        betas=betas.tolist(),
        systems=1024,
        span_s=round(best["span"], 2),
        rd_s=round(best["rd"], 2),
        speedup=round(best["rd"] / best["span"], 2),
        max_fraction_difference=float(np.abs(fractions["span"] - fractions["rd"]).max()),
        load_1min=loads,
    )
    print(json.dumps(out))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sphere_span.json").write_text(
        json.dumps({"machine": machine(), **out}, indent=1) + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--span", action="store_true")
    args = ap.parse_args()
    if args.span:
        span()
        return
    nb, systems = (4, 32) if args.quick else (10, 128)
    betas = np.linspace(0.1, 9, nb)
    rows = []
    for d in (2, 128):
        for dtype in (np.float64, np.float32):
            name = np.dtype(dtype).name
            pd, t_first, l1 = timed(
                lambda: phase_diagram(betas, d=d, systems=systems, save_every=EVERY, dtype=dtype)
            )
            pd2, t_af, l2 = timed(
                lambda: phase_diagram(
                    betas + 1e-3, d=d, systems=systems, save_every=EVERY, dtype=dtype, seed=1
                )
            )
            ref, t_np, l3 = timed(lambda: numpy_phase(betas, systems, d, dtype=dtype))
            row = dict(
                d=d,
                dtype=name,
                betas=nb,
                systems=systems,
                attnflow_first_call_s=round(t_first, 2),
                attnflow_s=round(t_af, 2),
                numpy_s=round(t_np, 2),
                ratio=round(t_np / t_af, 2),
                load_1min=[round(v, 2) for v in (*l1, *l2, *l3)],
                final_fraction_attnflow=pd.fraction[:, -1].round(3).tolist(),
                final_fraction_numpy=ref[:, -1].round(3).tolist(),
            )
            print(json.dumps(row))
            rows.append(row)
    full = []
    if args.full:
        betas = np.linspace(0.1, 9, 90)
        for d in (2, 128):
            for dtype in (np.float32, np.float64):
                _, t, ld = timed(
                    lambda: phase_diagram(betas, d=d, systems=1024, save_every=EVERY, dtype=dtype)
                )
                row = dict(
                    d=d,
                    dtype=np.dtype(dtype).name,
                    betas=90,
                    systems=1024,
                    seconds=round(t, 1),
                    load_1min=[round(v, 2) for v in ld],
                )
                print(json.dumps(row))
                full.append(row)
    RESULTS.mkdir(exist_ok=True)
    name = "sphere_quick.json" if args.quick else "sphere.json"
    (RESULTS / name).write_text(
        json.dumps({"machine": machine(), "reduced": rows, "full": full}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
