"""One attention implementation: a trained network's head and the particle model's are the
same code (``attnflow.networks._attention``, the dynamics' kernels and masks).

- The encoder's (BERT) attention of every layer, head and sentence, padded or not, is the
  ``Softmax`` kernel of the same logits under the padding mask, and the ``attnflow.Attention``
  of the head (its biases carried by a constant coordinate), to 1e-12 in float64.
- Each causal decoder head (the long-context decoder, every kernel variant: softmax, sink,
  QK norm, QK norm with a sink) is the kernel under ``attnflow.masks.Causal`` on the same
  logits, and the head's own ``Attention`` with ``mask=Causal()``, to 1e-12 in float64.
- ``head_weights`` is ``AbstractKernelAttention.weights`` for RoPE and ALiBi too.
- No module outside ``dynamics/kernels/`` writes a softmax of attention logits.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_forward import bert_checkpoint, padded_batch

import attnflow as af
from attnflow.masks import ALiBi, Causal, Graph, RoPE
from attnflow.networks import _decoder as D
from attnflow.networks import encoder as E
from attnflow.networks._attention import head_weights, key_padding, masked_weights
from attnflow.networks._decoder_heads import head_model
from attnflow.networks._decoder_model import forward, layer_states
from attnflow.networks._decoder_task import sample_batch
from attnflow.networks.encoder import load_encoder_weights

TOL = 1e-12


def test_encoder_attention_is_the_kernels_on_the_same_logits():
    rng = np.random.default_rng(0)
    b, h, n, p = 3, 2, 6, 8
    q = rng.normal(size=(b, h, n, p)) * 2.0
    k = rng.normal(size=(b, h, n, p)) * 2.0
    keep = np.ones((b, n), bool)
    keep[1, 4:] = False
    keep[2, 1:] = False  # a sentence of one token
    P = np.asarray(E.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(keep)))
    assert P.dtype == np.float64
    L = q @ k.transpose(0, 1, 3, 2) / math.sqrt(p)
    L = np.where(keep[:, None, None, :], L, -np.inf)
    want = np.asarray(af.kernels.get("softmax").weights(jnp.asarray(L)))
    np.testing.assert_allclose(P, want, rtol=0, atol=TOL)
    assert np.all(P[1][..., 4:] == 0.0) and np.all(P[2][..., 1:] == 0.0)  # padded: exactly 0
    e = np.exp(L - L.max(-1, keepdims=True))  # plain numpy, the definition
    np.testing.assert_allclose(P, e / e.sum(-1, keepdims=True), rtol=0, atol=TOL)


def test_encoder_heads_are_the_particle_models_attention(tmp_path):
    """Each head of a synthetic BERT, layer 0: ``Attention(Q', K', V)`` on the tokens
    ``[x, 1]`` (``Q' = [W_Q^h, b_Q^h]``, ``K' = [W_K^h, b_K^h]``, ``beta = 1/sqrt(d_h)``),
    with the padding as an ``attnflow.masks.Graph``, is the encoder's ``P^h``."""
    folder, _, _ = bert_checkpoint(tmp_path / "bert")
    w = load_encoder_weights(folder)
    ids, mask, types = padded_batch()
    out = E.encoder_forward(w, ids, mask, types)
    lay = {key: np.asarray(v, np.float64) for key, v in w.layers[0].items()}
    dh = w.d // w.num_heads
    for s in range(ids.shape[0]):
        x = np.asarray(out.hidden_states[0, s])
        xh = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
        kept = int(mask[s].sum())
        for head in range(w.num_heads):
            r = slice(head * dh, (head + 1) * dh)
            Qh = np.concatenate([lay["q_w"][r], lay["q_b"][r, None]], axis=1)
            Kh = np.concatenate([lay["k_w"][r], lay["k_b"][r, None]], axis=1)
            V = np.eye(w.d + 1)
            model = af.Attention(Qh, Kh, V, beta=1 / math.sqrt(dh), rectangular=True)
            got = np.asarray(out.attentions[0, s, head])
            # the sentence alone: its own tokens, no mask
            np.testing.assert_allclose(
                got[:kept, :kept], np.asarray(model.attention(xh[:kept])), rtol=0, atol=TOL
            )
            # the padded sentence: the padding is a mask of the particle model too
            padded = af.Attention(
                Qh,
                Kh,
                V,
                beta=1 / math.sqrt(dh),
                rectangular=True,
                mask=Graph(np.broadcast_to(mask[s].astype(bool), (len(x), len(x)))),
            )
            np.testing.assert_allclose(got, np.asarray(padded.attention(xh)), rtol=0, atol=TOL)


def _f64(model):
    return jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, model)


def _perturbed(config, seed=0):
    model = _f64(D.Decoder(config, jax.random.key(seed)))
    leaves, tree = jax.tree.flatten(model)
    rng = np.random.default_rng(seed)
    leaves = [a + rng.normal(0, 0.4, a.shape) if eqx.is_inexact_array(a) else a for a in leaves]
    return jax.tree.unflatten(tree, leaves)


@pytest.mark.parametrize("variant", ["plain", "sink", "qknorm", "qknorm+sink+gate"])
def test_causal_decoder_heads_are_the_kernel_with_the_causal_mask(variant):
    """Every head of every layer at every position (``forward`` with ``q = n``: each row
    an answer row) against the kernel under ``Causal()``, three ways."""
    config = D.DecoderConfig.quick(variant)
    model = _perturbed(config)
    tokens = sample_batch(jax.random.key(3), config, 1, config.train_length).tokens[0]
    n = tokens.shape[0]
    _, parts = forward(model, tokens, n)
    states = layer_states(model, tokens)
    beta = jnp.asarray(model.beta, jnp.float64)
    for layer, (lay, u) in enumerate(zip(model.layers, states)):
        p = lay.Wq.shape[0] // model.heads
        for h, kernel in enumerate(lay.kernels):
            P = np.asarray(parts[layer][h].P)
            assert P.dtype == np.float64 and P.shape == (n, n)
            assert np.all(np.triu(P, 1) == 0.0)  # causal: exactly 0 above the diagonal
            # the kernel under Causal() on the decoder's own logits
            want, _ = masked_weights(kernel, parts[layer][h].L, Causal())
            np.testing.assert_allclose(P, np.asarray(want), rtol=0, atol=TOL)
            # the kernel and Causal() from the queries and keys, as a particle model has them
            q = u @ lay.Wq[h * p : (h + 1) * p].T
            k = u @ lay.Wk[h * p : (h + 1) * p].T
            P2, _ = head_weights(kernel, q, k, beta, mask=Causal())
            np.testing.assert_allclose(P, np.asarray(P2), rtol=0, atol=TOL)
            # the head's own attnflow model (Attention under Causal() with its kernel)
            one = head_model(model, config, layer, h)
            np.testing.assert_allclose(P, np.asarray(one.attention(u)), rtol=0, atol=TOL)


@pytest.mark.parametrize(
    "mask", [None, Causal(), RoPE(100.0, Causal()), ALiBi(0.3), key_padding(np.arange(7) < 5)]
)
@pytest.mark.parametrize("kernel", ["softmax", "qknorm", "ssmax"])
def test_head_weights_is_the_attention_models(kernel, mask):
    rng = np.random.default_rng(1)
    d, n = 4, 7
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    x = rng.normal(size=(n, d))
    model = af.Attention(Q, K, V, beta=0.7, kernel=kernel, mask=mask)
    P, L = head_weights(model.kernel, x @ Q.T, x @ K.T, 0.7, mask=mask)
    np.testing.assert_allclose(np.asarray(P), np.asarray(model.attention(x)), rtol=0, atol=TOL)
    np.testing.assert_array_equal(np.isinf(np.asarray(L)), ~np.asarray(model.kept_keys(x)))


def test_no_softmax_of_attention_logits_outside_the_kernels():
    """The networks, studies, io and analyses never compute attention weights themselves:
    no call of a ``softmax`` (``jax.nn.softmax``, a ``softmax`` of one's own) outside
    ``dynamics/kernels/``. Allowed: ``log_softmax`` of class logits in the training losses
    (a cross-entropy, not attention) and the conformance kit's independent numpy
    references (``attnflow.testing``), which must not share the kernels' code."""
    root = Path(af.__file__).resolve().parent
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("dynamics/kernels/", "testing/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if re.fullmatch(r"_?softmax(_parts|_rows)?", name or ""):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(f)}")
    assert not found, found
