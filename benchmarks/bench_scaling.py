"""Cost against the number of tokens and against the batch size, with fitted exponents.

1. One vector-field evaluation (rescaled frame, modal coordinates, float32, d = 16) for
   n = 256 ... 65,536 (tiled attention above 2048 tokens): expected growth n^2.
2. A batched simulate (n = 32, d = 2, t1 = 10, adaptive, float64) for b = 1 ... 1024
   systems: expected growth b^1 once the batch fills the machine.

Writes benchmarks/results/scaling.json and benchmarks/scaling.png.

    python benchmarks/bench_scaling.py [--max-n 65536]
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import RESULTS, best_of, save  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow.dynamics.frames import make_frame  # noqa: E402
from attnflow.dynamics.terms import FlowTerm  # noqa: E402


def fit(xs, ys):
    """Slope and intercept of log y against log x (least squares)."""
    s, c = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(s), float(c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-n", type=int, default=65536)
    ap.add_argument("--max-b", type=int, default=1024)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    d = 16
    I = np.eye(d, dtype=np.float32)
    V = (0.5 * I + 0.05 * rng.standard_normal((d, d))).astype(np.float32)
    model = af.Attention(I, I, V, beta=0.25)
    field = jax.jit(lambda dyn, t, y: FlowTerm(dyn).field(t, y))
    ns, tn = [], []
    n = 256
    while n <= args.max_n:
        x = jnp.asarray(rng.uniform(-1, 1, (n, d)), jnp.float32)
        dyn = make_frame("rescaled", model)
        y = dyn.initial_state(x)
        t = jnp.float32(0.5)
        reps = 5 if n <= 4096 else (2 if n <= 16384 else 1)
        el = best_of(lambda: field(dyn, t, y).block_until_ready(), repeats=reps, warmup=1)
        ns.append(n)
        tn.append(el)
        print(f"n = {n:6d}: {el * 1e3:10.2f} ms per field evaluation", flush=True)
        n *= 4 if n < 4096 else 2
    big = [i for i, n in enumerate(ns) if n >= 1024]
    slope_n, c_n = fit(np.array(ns)[big], np.array(tn)[big])

    bs, tb = [], []
    Vb = af.matrices.PAPER["paper-2d"]
    mb = af.Attention(np.eye(2), np.eye(2), Vb)
    b = 1
    while b <= args.max_b:
        xs = rng.uniform(-1, 1, (b, 32, 2))
        el = best_of(lambda: jax.block_until_ready(af.simulate(mb, xs, 10.0).z), repeats=2)
        bs.append(b)
        tb.append(el)
        print(f"b = {b:5d}: {el:8.3f} s per batched simulate", flush=True)
        b *= 4
    big = [i for i, b in enumerate(bs) if b >= 16]
    slope_b, c_b = fit(np.array(bs)[big], np.array(tb)[big])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(6.5, 2.8), constrained_layout=True)
    a1.loglog(ns, tn, "o-", label="measured")
    xx = np.array([ns[0], ns[-1]], float)
    a1.loglog(xx, np.exp(c_n) * xx**slope_n, "--", label=f"fit $n^{{{slope_n:.2f}}}$")
    a1.axvline(af.kernels.DENSE_MAX_N, color="0.6", lw=0.8)
    a1.set(
        xlabel="tokens $n$", ylabel="s per field evaluation", title="vector field ($d=16$, float32)"
    )
    a1.legend(fontsize=8)
    a2.loglog(bs, tb, "o-", label="measured")
    xx = np.array([bs[0], bs[-1]], float)
    a2.loglog(xx, np.exp(c_b) * xx**slope_b, "--", label=f"fit $b^{{{slope_b:.2f}}}$")
    a2.set(
        xlabel="systems $b$",
        ylabel="s per batched simulate",
        title="batch ($n=32$, $d=2$, $t_1=10$)",
    )
    a2.legend(fontsize=8)
    fig.savefig(RESULTS.parent / "scaling.png", dpi=150)
    save(
        "scaling",
        {
            "n": ns,
            "seconds_per_field": tn,
            "exponent_n (n >= 1024)": slope_n,
            "batch": bs,
            "seconds_per_simulate": tb,
            "exponent_b (b >= 16)": slope_b,
        },
    )


if __name__ == "__main__":
    main()
