"""Fit the value matrix V by gradient descent so that the tokens reach a target.

The tokens of one head, ``dx_i/dt = sum_j P_ij V x_j``, start at ``x0``; the loss is the
squared distance of ``x(t1)`` to a target configuration (here: the end state of a
reference head with a known V). ``attnflow.solve`` is differentiated with
``equinox.filter_grad`` and optax's Adam updates V only (Q and K stay fixed).

    python experiments/fit_value_matrix.py            # 300 steps
    python experiments/fit_value_matrix.py --quick    # 40 steps

Prints the loss at the start and the end, and how far the fitted V is from the
reference one (the loss can be small with V not unique: only x(t1) is matched).
"""

from __future__ import annotations

import argparse

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import attnflow as af  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 steps instead of 300")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    d, n, t1 = 2, 8, 2.0
    I = np.eye(d)
    x0 = jnp.asarray(rng.normal(size=(n, d)))
    V_true = np.array([[0.5, -0.4], [0.4, 0.2]])
    target = af.solve(af.Attention(I, I, V_true), x0, t1, frame="original").ys[-1]

    # the model is the trainable object; only V is updated (Q, K and beta are held)
    model = af.Attention(I, I, np.zeros((d, d)))
    trainable = eqx.tree_at(lambda m: m.V, jax.tree_util.tree_map(lambda _: False, model), True)
    opt = optax.adam(0.05)
    state = opt.init(eqx.filter(model, trainable))

    def loss(m):
        x1 = af.solve(m, x0, t1, frame="original", solver=af.LayerSolver(0.1)).ys[-1]
        return jnp.mean((x1 - target) ** 2)

    @eqx.filter_jit
    def step(m, state):
        diff, static = eqx.partition(m, trainable)
        value, grads = eqx.filter_value_and_grad(lambda p: loss(eqx.combine(p, static)))(diff)
        updates, state = opt.update(grads, state)
        return eqx.apply_updates(m, updates), state, value

    steps = 40 if args.quick else 300
    first = float(loss(model))
    for _ in range(steps):
        model, state, _ = step(model, state)
    last = float(loss(model))
    out = {
        "steps": steps,
        "loss_start": first,
        "loss_end": last,
        "V_fitted": np.asarray(model.V).round(4).tolist(),
        "V_error": float(np.abs(np.asarray(model.V) - V_true).max()),
    }
    print(f"loss {first:.3e} -> {last:.3e} in {steps} steps; fitted V {out['V_fitted']}")
    return out


if __name__ == "__main__":
    main()
