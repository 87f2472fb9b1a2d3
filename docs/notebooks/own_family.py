# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A family of one's own, through every analysis
#
# attnflow's frames, solvers, `Trajectory` and analyses are written against the model
# seam of `attnflow.dynamics.base`, never against a particular family. This notebook
# defines a family outside the package and takes it through everything: the frames,
# the solvers, saving and loading, `track_rank`, `dispersion`, `observe_limit` and
# `predict_regime`, and shows what each one refuses, and why.
#
# The family: *tied* attention, one map $A$ ($p \times d$) for queries and keys, so that
# the logits $\beta\langle A x_i, A x_j\rangle$ are symmetric and $Q^\top K = A^\top A$
# is positive semidefinite (definite when $A$ has rank $d$). It subclasses
# `AbstractKernelAttention`: the weights are a kernel of the logits under a mask, so
# every kernel and mask of attnflow comes with it for free.

# %%
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow import plotting as afp  # noqa: E402
from attnflow.dynamics.base import saved_kernel_params  # noqa: E402


class TiedAttention(af.AbstractKernelAttention):
    """One head whose queries and keys share the map A: P = kernel(beta <A x_i, A x_j>)."""

    A: jax.Array
    V: jax.Array
    beta: jax.Array
    propagator: af.Propagator
    kernel: af.kernels.AbstractKernel
    mask: af.masks.AbstractMask | None
    block: int | None = eqx.field(static=True)
    family = "TiedAttention"  # registers the family: its saved runs load back

    def __init__(
        self, A, V, *, beta=1.0, kernel="softmax", kernel_params=None, mask=None, block=None
    ):
        self.V = jnp.asarray(V)
        self.A = jnp.asarray(A, self.V.dtype)
        self.beta = jnp.asarray(beta, self.V.dtype)
        self.kernel = af.kernels.as_kernel(kernel, kernel_params).astype(self.V.dtype)
        self.mask = af.masks.check_mask(mask)
        af.kernels.check_kernel_mask(self.kernel, self.mask)
        self.block = block
        self.propagator = af.Propagator(self.V)  # e^{tV}: what the rescaled frame needs

    d = property(lambda self: self.V.shape[-1])
    dtype = property(lambda self: self.V.dtype)

    def query_key_maps(self):
        return self.A, self.A

    def value_map(self, u):
        return u @ self.V.T

    def describe(self):
        return {
            "family": self.family,
            "beta": float(self.beta),
            "kernel": self.kernel.name,
            "kernel_params": {k: np.asarray(v).tolist() for k, v in self.kernel.params().items()},
            "kernel_settings": self.kernel.settings(),
            "mask": None if self.mask is None else self.mask.describe(),
            "A": np.asarray(self.A).tolist(),
            "V": np.asarray(self.V).tolist(),
        }

    def arrays(self):
        params = {f"kernel_params.{k}": v for k, v in self.kernel.params().items()}
        return {"A": self.A, "V": self.V, "beta": self.beta, **params}

    @classmethod
    def from_saved(cls, description, arrays):
        params = {**saved_kernel_params(arrays), **description["kernel_settings"]}
        kernel = af.kernels.get(description["kernel"], **params)
        return cls(
            arrays["A"], arrays["V"], beta=arrays["beta"], kernel=kernel, mask=description["mask"]
        )


# %% [markdown]
# That is the whole family: the query and key maps, the value map, and the three
# methods that let a saved run rebuild it. The seam derives the rest (the field
# $F(x) = P(x)\, x V^\top$, the layers, the attention rows, the overflow bound, tiling
# above 2048 tokens) from the kernel.
#
# ## Predict, then every frame and solver
#
# The discrete transformer (`method="euler"`, one residual layer per step) in the
# rescaled frame $z_i = e^{-tV} x_i$, the original frame and on the sphere. The discrete
# rescaling is exact, $x^k = (I + \Delta t\, V)^k z^k$, so the first two are the same
# layers to rounding. The adaptive solver (`simulate`'s default) serves the family as
# well, at a higher compile cost; the conformance suite runs every family through it.

# %%
A = np.array([[1.0, 0.3], [0.0, 0.8]])
model = TiedAttention(A, np.eye(2))
regime = af.predict_regime(model)
print("predicted:", regime.label, "-", regime.reason)

x0 = np.random.default_rng(3).uniform(-3, 3, (24, 2))
ts = np.linspace(0.0, 10.0, 51)
layers = {  # 100 residual layers of step 0.1, integrated in each frame
    frame: af.simulate(model, x0, 10.0, ts=ts, frame=frame, method="euler", dt=0.1)
    for frame in ("rescaled", "original", "sphere")
}
rescaled = layers["rescaled"]  # z = e^{-tV} x, read by the analyses below
for frame, traj in layers.items():
    print(f"layers, {frame:9s}: status {traj.status}, {int(traj.stats['num_steps'])} layers")
x_r, x_o = np.asarray(layers["rescaled"].x), np.asarray(layers["original"].x)
gap = float(np.abs(x_r - x_o).max() / np.abs(x_o).max())
print(f"the layers in the two frames agree to {gap:.1e} (relative to the largest coordinate)")

# %% [markdown]
# ## Save and load
#
# `Trajectory.save` writes the model's `arrays()` bit for bit and its `describe()` as
# JSON; `Trajectory.load` finds the family by the name it registered.

# %%
path = Path(tempfile.mkdtemp(prefix="attnflow-family-")) / "tied.npz"
rescaled.save(path, note="a family of one's own")
back = af.Trajectory.load(path)
print(
    type(back.model).__name__,
    back.model.describe() == model.describe(),
    np.array_equal(np.asarray(back.z), np.asarray(rescaled.z)),
)

# %% [markdown]
# ## Every analysis
#
# The analyses ask the seam for what they need (the attention rows, their argmax and
# log-masses, the value matrix), so they serve the new family unchanged.

# %%
rank = af.track_rank(rescaled)
print(rank.summary())
print(af.dispersion(rescaled, k=-1).summary())
observed = af.observe_limit(rescaled)
print("observed:", observed.label, "-", observed.reason)
P = np.asarray(model.attention(rescaled.x[-1]))
print(
    "leaders:",
    rank.leaders,
    "| column masses are the model's own:",
    bool(np.allclose(rank.column_mass, P.sum(axis=0))),
)

# %% [markdown]
# The tokens end on the boundary of a polygon, as the polytope theorem says for
# $V = I$ and $Q^\top K = A^\top A$ positive definite: `observe_limit` finds 4 limit
# points, and `track_rank` 4 leaders.

# %% [markdown]
# ## What is refused, and why
#
# The same family with another kernel or a mask: each analysis either serves it or
# refuses it with a message that names what is missing.

# %%
sig = TiedAttention(A, np.eye(2), kernel="sigmoid")  # rows need not sum to one
try:
    af.simulate(sig, x0, 2.0)  # the rescaled frame needs row-stochastic attention
except ValueError as err:
    print("rescaled frame refused:", err)
run = af.simulate(sig, x0, 2.0, frame="original", method="euler", dt=0.1)
print("original frame:", run.status, "| predict_regime:", af.predict_regime(sig).label)
print("  ", af.predict_regime(sig).reason)
causal = TiedAttention(A, np.eye(2), mask="causal")
print("causal mask | predict_regime:", af.predict_regime(causal).label)
print("  ", af.predict_regime(causal).reason)

# %% tags=["figure"]
z = np.asarray(rescaled.z)
with afp.use_style():
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 3.2), layout="constrained")
    afp.draw_trajectories(left, z)
    afp.draw_hull(left, z[-1], color="C0", lw=1.0)
    left.set_aspect("equal")
    left.set_xlabel("$z_1$")
    left.set_ylabel("$z_2$")
    left.set_title(f"TiedAttention, V = I: {observed.label}")
    im = right.imshow(P, cmap="Greys", vmin=0, vmax=1)
    right.set_title(f"attention at t = 10: {len(rank.leaders)} leaders")
    right.set_xlabel("key $j$")
    right.set_ylabel("query $i$")
    fig.colorbar(im, ax=right, shrink=0.8)
