"""The cost of an adaptive step when attention is sharp, against the bare vector field.

The case of the scale-out issue: n = 1024 tokens of norm 2 in d = 64, V = Q = K = I,
beta = 1, float64, the rescaled frame (modal coordinates), Tsit5, rtol 1e-6, atol 1e-9.
The tokens gather about one direction, so the logits grow like beta e^{2t}: ~3e3 at t = 4,
~4e4 at t = 5.5. Two windows are timed: a smooth one (t in [0, 2]) and a sharp one
(t in [4, 5.5], started from the state a solve reached at 4). For each window:

- the bare field: one jitted call of ``FlowTerm(frame).field(t, y)`` at the window's
  start state (not a jitted loop of evaluations at a fixed state: XLA hoists part of
  the field out of such a loop);
- attnflow's solve (``_solve_adaptive``, the program ``simulate`` runs), and the same
  ``diffrax.diffeqsolve`` with parts removed: no overflow event, one save stream, no
  saved times but the end; its cost per field evaluation is the wall time over
  ``6 * steps + 1`` (Tsit5 evaluates the field six times a step, the first stage reused).

Run:  python benchmarks/bench_sharp.py [--quick]
"""

from __future__ import annotations

import argparse
import os

import jax

jax.config.update("jax_enable_x64", True)
import diffrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import best_of, save  # noqa: E402

import attnflow  # noqa: E402
from attnflow.dynamics.frames import make_frame  # noqa: E402
from attnflow.dynamics.solvers import ICOEFF, PCOEFF  # noqa: E402
from attnflow.dynamics.solvers import _adaptive_batch as _solve_adaptive  # noqa: E402
from attnflow.dynamics.solvers import log_limit as _log_limit  # noqa: E402
from attnflow.dynamics.terms import FlowTerm  # noqa: E402

BETA = 1.0
SMOOTH, SHARP = (0.0, 2.0), (4.0, 5.5)


def variant(frame, y0, t0, t1, ts, *, event: bool, streams: int):
    """``_solve_adaptive``'s diffeqsolve, with the overflow event and the save streams
    as options (``streams``: 2 = saved times and the stop state, 1 = saved times, 0 =
    the end state only)."""
    flow = FlowTerm(frame)
    term = diffrax.ODETerm(lambda t, y, args: flow.field(t, y))
    log_limit = _log_limit(y0.dtype)

    def overflow(t, y, args, **kwargs):
        return (flow.log_bound(t, y) > log_limit) | ~jnp.all(jnp.isfinite(y))

    if streams == 2:
        saveat = diffrax.SaveAt(subs=(diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True)))
    elif streams == 1:
        saveat = diffrax.SaveAt(ts=ts)
    else:
        saveat = diffrax.SaveAt(t1=True)
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=t0,
        t1=t1,
        dt0=None,
        y0=y0,
        saveat=saveat,
        stepsize_controller=diffrax.PIDController(
            rtol=1e-6, atol=1e-9, pcoeff=PCOEFF, icoeff=ICOEFF
        ),
        event=diffrax.Event(overflow) if event else None,
        max_steps=10_000,
        throw=False,
    )
    return sol.ys, sol.stats["num_steps"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="n = 256 (a smoke run)")
    args = ap.parse_args()
    n, d = (256, 64) if args.quick else (1024, 64)
    repeats = 3 if args.quick else 7
    eye = np.eye(d)
    model = attnflow.Attention(eye, eye, eye, beta=BETA)
    rng = np.random.default_rng(0)
    # tokens of norm 2 about one direction: the cluster they form keeps a norm of order 1,
    # so the logits grow like beta e^{2t} (random directions would cluster near 0)
    x0 = np.eye(d)[0] + 0.3 * rng.normal(size=(n, d))
    x0 = 2 * x0 / np.linalg.norm(x0, axis=1, keepdims=True)
    frame = make_frame("rescaled", model)
    load = [os.getloadavg()[0]]

    # the state at SHARP[0] (the rescaled state z, in modal coordinates for V = I: z itself)
    traj = attnflow.simulate(model, x0, SHARP[0], rtol=1e-6, atol=1e-9)
    y_sharp = jnp.asarray(frame.initial_state(jnp.asarray(np.asarray(traj.z[-1]))))
    y_smooth = jnp.asarray(frame.initial_state(jnp.asarray(x0)))
    windows = {"smooth": (*SMOOTH, y_smooth), "sharp": (*SHARP, y_sharp)}
    one_field = jax.jit(lambda t, y: FlowTerm(frame).field(t, y))

    rows = {}
    for name, (t0, t1, y) in windows.items():
        t0a, t1a = jnp.asarray(t0), jnp.asarray(t1)
        logits = np.asarray(model.logits(np.asarray(traj.x[-1] if name == "sharp" else x0)))
        t_field = best_of(lambda: one_field(t0a, y).block_until_ready(), repeats=repeats)
        ts = jnp.linspace(t0, t1, 11)
        runs = {
            "attnflow (_solve_adaptive)": None,
            "event + 2 streams": dict(event=True, streams=2),
            "no event, 2 streams": dict(event=False, streams=2),
            "event, 1 stream": dict(event=True, streams=1),
            "no event, end state only": dict(event=False, streams=0),
        }
        out = {}
        for label, opts in runs.items():
            if opts is None:
                # _solve_adaptive starts at t = 0: it runs on the smooth window only
                if name != "smooth":
                    continue
                fn = jax.jit(
                    lambda y: _solve_adaptive(
                        FlowTerm(frame),
                        y[None],
                        ts,
                        t1a,
                        1e-6,
                        1e-9,
                        solver_name="tsit5",
                        max_steps=10_000,
                        progress=False,
                    )
                )
                res = fn(y)
                steps = int(res[5]["num_steps"][0])
                t = best_of(lambda: jax.block_until_ready(fn(y)), repeats=repeats)
            else:
                fn = eqx.filter_jit(lambda y, o=opts: variant(frame, y, t0a, t1a, ts, **o))
                steps = int(fn(y)[1])
                t = best_of(lambda: jax.block_until_ready(fn(y)), repeats=repeats)
            evals = 6 * steps + 1
            out[label] = dict(
                steps=steps,
                seconds=t,
                ms_per_eval=1e3 * t / evals,
                ratio_to_field=t / evals / t_field,
            )
            print(name, label, out[label], flush=True)
        rows[name] = dict(
            t0=t0,
            t1=t1,
            max_logit=float(np.max(logits)),
            field_ms=1e3 * t_field,
            solves=out,
        )
        print(name, "field", 1e3 * t_field, "ms; max logit", rows[name]["max_logit"], flush=True)
    load.append(os.getloadavg()[0])
    save(
        "sharp_quick" if args.quick else "sharp",
        dict(n=n, d=d, beta=BETA, rtol=1e-6, atol=1e-9, windows=rows, load_1min=load),
    )


if __name__ == "__main__":
    main()
