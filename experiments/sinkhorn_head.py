"""A family of one's own through every analysis: a Sinkhorn-normalised head.

``SinkhornAttention`` weighs the values with the Sinkhorn projection of
``exp(beta q k^T)`` (Sander et al., Sinkformers, 2022): one class, subclassing
``attnflow.AbstractAttentionSystem``, and nothing inside attnflow changes. It simulates
in both frames, saves and loads, and ``track_rank``, ``dispersion``, ``observe_limit``
and ``predict_regime`` all read its own attention. Copy it and change ``weights``.

    python experiments/sinkhorn_head.py [--quick]
"""

import argparse
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402


class SinkhornAttention(af.AbstractAttentionSystem):
    """One head whose weights are `iters` Sinkhorn steps of exp(beta q k^T)."""

    Q: jax.Array
    K: jax.Array
    V: jax.Array
    beta: jax.Array
    propagator: af.Propagator
    iters: int = eqx.field(static=True)
    family = "SinkhornAttention"  # registers the family: saved runs load back

    def __init__(self, Q, K, V, *, beta=1.0, iters=5):
        self.Q, self.K, self.V = (jnp.asarray(a) for a in (Q, K, V))
        self.beta = jnp.asarray(beta, self.V.dtype)
        self.iters = iters
        self.propagator = af.Propagator(self.V)  # e^{tV}: the rescaled frame

    d = property(lambda self: self.V.shape[-1])
    dtype = property(lambda self: self.V.dtype)
    rows_sum_to_one = property(lambda self: True)

    def query_key_maps(self):
        return self.Q, self.K

    def logits_qk(self, q, k):
        return self.beta * q @ k.T

    def weights(self, q, k):
        L = self.logits_qk(q, k)
        for _ in range(self.iters):
            L = L - jax.nn.logsumexp(L, axis=0, keepdims=True)
            L = L - jax.nn.logsumexp(L, axis=1, keepdims=True)
        return jnp.exp(L)

    def log_bound(self, q, k):  # what is exponentiated: |logits| <= beta |q| |k|
        qn, kn = (jnp.max(jnp.linalg.norm(a, axis=-1)) for a in (q, k))
        return jnp.nan_to_num(jnp.log(self.beta * qn * kn), nan=jnp.inf)

    def value_map(self, u):
        return u @ self.V.T

    def describe(self):
        return {"family": "SinkhornAttention", "beta": float(self.beta), "iters": self.iters}

    def arrays(self):
        return {"Q": self.Q, "K": self.K, "V": self.V, "beta": self.beta}

    @classmethod
    def from_saved(cls, description, arrays):
        return cls(
            arrays["Q"], arrays["K"], arrays["V"], beta=arrays["beta"], iters=description["iters"]
        )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="a Sinkhorn head through every analysis")
    ap.add_argument("--quick", action="store_true", help="a shorter run (t1 = 2)")
    args = ap.parse_args(argv)
    t1 = 2.0 if args.quick else 6.0
    rng = np.random.default_rng(0)
    I = np.eye(2)
    model = SinkhornAttention(I, I, np.diag([1.0, 0.5]), beta=2.0)
    x0 = rng.normal(size=(8, 2))
    traj = af.simulate(model, x0, t1, ts=np.linspace(0, t1, 31))  # rescaled frame
    orig = af.simulate(model, x0, t1, ts=np.linspace(0, t1, 31), frame="original")
    print("frames agree to", float(np.abs(np.asarray(traj.x) - np.asarray(orig.x)).max()))
    path = Path(tempfile.mkdtemp()) / "sinkhorn_run.npz"
    traj.save(path)
    print("loads back as  ", type(af.Trajectory.load(path).model).__name__)
    P = np.asarray(model.attention(traj.x[-1]))
    rank = af.track_rank(traj)
    print(
        "leaders        ",
        rank.leaders,
        " column mass = model's own:",
        bool(np.allclose(rank.column_mass, P.sum(0))),
    )
    print("dispersion     ", af.dispersion(traj, k=-1).summary())
    print("observed       ", af.observe_limit(traj).label)
    print("predicted      ", af.predict_regime(model).reason[:72], "...")
    return {"leaders": [int(i) for i in rank.leaders], "label": str(af.observe_limit(traj).label)}


if __name__ == "__main__":
    main()
