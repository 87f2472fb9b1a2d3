"""The long-context decoder (Tier B): the recall task's data, the forward pass against a
float64 numpy reference for every variant, causality, the learned sink, training
(accuracy, bit-for-bit resume, reuse), the readout against numpy, and the heads as
particle systems."""

from __future__ import annotations

import dataclasses
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.dynamics.kernels import QKNorm
from attnflow.networks import _decoder as D
from attnflow.networks._decoder_model import forward as _forward
from attnflow.networks._decoder_task import ALL_VARIANTS, BOS, NULL, sample_batch


@pytest.fixture(autouse=True)
def _standard_dtype_promotion():
    """optax raises a Python float to its int32 step count, which the suite's strict dtype
    promotion refuses: the tests run under JAX's standard rule, as the study does."""
    with jax.numpy_dtype_promotion("standard"):
        yield


QUICK = D.DecoderConfig.quick("plain")
forward = eqx.filter_jit(_forward)  # q, scale and block are static
loss = eqx.filter_jit(D._loss)


def _f64(model):
    return jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, model)


def _perturbed(config, seed=0):
    """A float64 decoder whose every parameter is moved off its initial value (gains,
    sink logits, gate biases, convolution taps), so that each one counts."""
    model = _f64(D.Decoder(config, jax.random.key(seed)))
    leaves, tree = jax.tree.flatten(model)
    rng = np.random.default_rng(seed)
    leaves = [a + rng.normal(0, 0.4, a.shape) if eqx.is_inexact_array(a) else a for a in leaves]
    return jax.tree.unflatten(tree, leaves)


# ======================================================================= the task
def _check_sequences(cfg, length, b=40, seed=0):
    batch = sample_batch(jax.random.key(seed), cfg, b, length)
    tok, tgt, pres, needle = (np.asarray(a) for a in batch)
    assert tok.dtype == tgt.dtype == needle.dtype == np.int32 and tok.shape == (b, length)
    K, V, q, P = cfg.keys, cfg.values, cfg.queries, cfg.pairs
    is_key = (tok >= 2) & (tok < 2 + K)
    is_val = (tok >= 2 + K) & (tok < 2 + K + V)
    for s in range(b):
        t = tok[s]
        assert t[0] == BOS and np.all(t[1:] != BOS) and np.all(t != NULL)
        ctx = slice(1, length - q)
        kpos = np.flatnonzero(is_key[s, ctx]) + 1
        assert len(kpos) == P and len(set(t[kpos])) == P  # P distinct keys
        np.testing.assert_array_equal(np.flatnonzero(is_val[s, ctx]) + 1, kpos + 1)
        assert np.all(is_key[s, length - q :])  # the queries are keys, distinct
        queries = t[length - q :]
        assert len(set(queries)) == q
        assert pres[s].sum() == q // 2  # exactly half absent
        for j, key in enumerate(queries):
            where = kpos[t[kpos] == key]
            assert pres[s, j] == (len(where) == 1)
            if pres[s, j]:
                assert needle[s, j] == where[0] + 1 and tgt[s, j] == t[where[0] + 1]
            else:
                assert needle[s, j] == -1 and tgt[s, j] == NULL
    return batch


@pytest.mark.parametrize("length", [24, 40])
def test_the_task_quick(length):
    _check_sequences(QUICK, length)


def test_the_task_at_training_and_long_lengths():
    cfg = D.DecoderConfig()
    _check_sequences(cfg, 64)
    batch = _check_sequences(cfg, 1024, b=2)
    # the filler grows: every context token that is neither key nor value is a filler
    tok = np.asarray(batch.tokens)[:, 1 : 1024 - cfg.queries]
    assert np.sum(tok >= 2 + cfg.keys + cfg.values) == 2 * (1024 - 1 - cfg.queries - 2 * cfg.pairs)


def test_the_data_do_not_depend_on_the_x64_mode():
    was = jax.config.read("jax_enable_x64")
    try:
        got = []
        for x64 in (True, False):
            jax.config.update("jax_enable_x64", x64)
            got.append([np.asarray(a) for a in sample_batch(jax.random.key(3), QUICK, 5, 30)])
    finally:
        jax.config.update("jax_enable_x64", was)
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_bad_configurations_are_refused_by_name():
    with pytest.raises(ValueError, match="variant"):
        D.DecoderConfig(variant="qknorm+postnorm+x")
    with pytest.raises(ValueError, match="queries must be even"):
        D.DecoderConfig(queries=5)
    with pytest.raises(ValueError, match="train_length"):
        D.DecoderConfig(train_length=20)
    with pytest.raises(ValueError, match="length"):
        D.evaluate_decoder(D.Decoder(QUICK, jax.random.key(0)), QUICK, 10, sequences=1, seed=0)


# ====================================================== forward against numpy float64
def _rms(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def _np_forward(model, tokens, scale=1.0):
    """The decoder in float64 numpy, every position: output logits and per layer and
    head ``(L, P, sink share, gate)``, written from the module docstring."""
    a = lambda x: np.asarray(x, np.float64)  # noqa: E731
    E = a(model.embed)
    n, d = len(tokens), E.shape[1]
    x = E[np.asarray(tokens)]
    beta = 1 / math.sqrt(d // model.heads)
    future = np.arange(n)[None, :] > np.arange(n)[:, None]
    parts = []
    for lay in model.layers:
        u = _rms(x, a(lay.conv_gain))
        taps = a(lay.conv)
        c = np.zeros_like(u)
        for t in range(n):
            for lag in range(taps.shape[0]):
                if t - lag >= 0:
                    c[t] += taps[lag] * u[t - lag]
        x = x + c
        u = _rms(x, a(lay.attn_gain))
        p = d // model.heads
        outs, per = [], []
        for h, kern in enumerate(lay.kernels):
            r = slice(h * p, (h + 1) * p)
            q, k, v = u @ a(lay.Wq)[r].T, u @ a(lay.Wk)[r].T, u @ a(lay.Wv)[r].T
            if hasattr(kern, "wq"):
                q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True)) * a(kern.wq)
                k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True)) * a(kern.wk)
            L = beta * scale * (q @ k.T)
            L[future] = -np.inf
            b = float(kern.b) if hasattr(kern, "b") else -np.inf
            m = np.maximum(L.max(axis=1), b)[:, None]
            e = np.exp(L - m)
            den = e.sum(axis=1, keepdims=True) + np.exp(b - m)
            P, share = e / den, (np.exp(b - m) / den)[:, 0]
            g = np.ones(n)
            if lay.Wg is not None:
                g = 1 / (1 + np.exp(-(u @ a(lay.Wg)[h] + a(lay.bg)[h])))
            outs.append(g[:, None] * (P @ v))  # the sink column carries no value
            per.append((L, P, share, g))
        parts.append(per)
        x = x + np.concatenate(outs, axis=1) @ a(lay.Wo).T
        z = _rms(x, a(lay.mlp_gain)) @ a(lay.W1).T
        gelu = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
        x = x + gelu @ a(lay.W2).T
    return _rms(x, a(model.final_gain)) @ E.T / math.sqrt(d), parts


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_forward_matches_numpy_float64(variant):
    cfg = dataclasses.replace(QUICK, variant=variant)
    model = _perturbed(cfg, seed=ALL_VARIANTS.index(variant))
    tokens = sample_batch(jax.random.key(1), cfg, 1, 27).tokens[0]
    want, want_parts = _np_forward(model, tokens, scale=1.7)
    n, q = 27, cfg.queries
    # the last layer at the answer rows only, the others in tiles of 8 rows (one padded)
    logits, parts = forward(model, tokens, q, 1.7, block=8)
    np.testing.assert_allclose(np.asarray(logits), want[n - q :], rtol=1e-11, atol=1e-12)
    for lay, want_lay in zip(parts, want_parts, strict=True):
        for rp, (L, P, share, g) in zip(lay, want_lay, strict=True):
            Lj = np.asarray(rp.L)
            np.testing.assert_array_equal(np.isinf(Lj), np.isinf(L[n - q :]))
            np.testing.assert_allclose(
                Lj[np.isfinite(Lj)], L[n - q :][np.isfinite(L[n - q :])], rtol=1e-12, atol=1e-12
            )
            np.testing.assert_allclose(np.asarray(rp.P), P[n - q :], rtol=1e-11, atol=1e-14)
            np.testing.assert_allclose(np.asarray(rp.sink), share[n - q :], rtol=1e-11, atol=1e-14)
            np.testing.assert_allclose(np.asarray(rp.gate), g[n - q :], rtol=1e-12)


def test_causality():
    """Changing a token changes no output before it (dense and tiled layers)."""
    cfg = dataclasses.replace(QUICK, variant="qknorm+sink+gate")
    model = _perturbed(cfg, 5)
    tokens = sample_batch(jax.random.key(2), cfg, 1, 30).tokens[0]
    changed = tokens.at[17].set((tokens[17] + 1) % cfg.vocab)
    a, pa = forward(model, tokens, 30, block=8)  # every row an answer; tiles of 8 rows
    b, pb = forward(model, changed, 30, block=8)
    np.testing.assert_array_equal(np.asarray(a)[:17], np.asarray(b)[:17])
    assert not np.allclose(np.asarray(a)[17:], np.asarray(b)[17:])
    for la, lb in zip(pa, pb):
        for ra, rb in zip(la, lb):
            np.testing.assert_array_equal(np.asarray(ra.P)[:17], np.asarray(rb.P)[:17])


def test_the_sink_enters_only_the_denominator():
    cfg = dataclasses.replace(QUICK, variant="qknorm+sink")
    model = _perturbed(cfg, 7)
    tokens = sample_batch(jax.random.key(4), cfg, 1, 24).tokens[0]
    _, parts = forward(model, tokens, 24)
    for lay in parts:
        for rp in lay:
            L, P, s = (np.asarray(a) for a in (rp.L, rp.P, rp.sink))
            np.testing.assert_allclose(P.sum(-1) + s, 1.0, rtol=1e-13)  # the sink's share
            e = np.exp(L - L.max(-1, keepdims=True))  # the ratios are softmax's
            np.testing.assert_allclose(
                P / P.sum(-1, keepdims=True), e / e.sum(-1, keepdims=True), rtol=1e-12
            )

    # the head's output is sum_j P_j v_j and nothing for the sink: with the sink far
    # below every logit the decoder is the same decoder under QK norm alone (numpy)
    drowned = eqx.tree_at(
        lambda m: [k.b for lay in m.layers for k in lay.kernels],
        model,
        replace_fn=lambda b: b * 0 - 80.0,
    )
    plain = eqx.tree_at(
        lambda m: [lay.kernels for lay in m.layers],
        model,
        [tuple(QKNorm(k.wq, k.wk) for k in lay.kernels) for lay in model.layers],
    )
    a, _ = forward(drowned, tokens, 24)
    np.testing.assert_allclose(np.asarray(a), _np_forward(plain, tokens)[0], rtol=1e-11, atol=1e-12)


# ================================================================== training
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The quick qknorm+sink+gate decoder, trained once into a cache."""
    cache = tmp_path_factory.mktemp("decoders")
    cfg = D.DecoderConfig.quick("qknorm+sink+gate")
    with jax.numpy_dtype_promotion("standard"):
        model, record = D.load_or_train_decoder(cfg, cache, progress=False)
    return cfg, model, record, cache


# slow: training the quick decoder costs 25 s; the default suite checks its forward pass,
# readout and loss against numpy, and the tier-A training and resume in test_longcontext
@pytest.mark.slow
def test_quick_training_reaches_its_accuracy(trained):
    cfg, model, record, cache = trained
    assert record["finished"] and not record["reused"] and record["step"] <= cfg.max_steps
    assert record["accuracy_present"] >= 0.95 and record["accuracy_absent"] >= 0.95
    assert model.embed.dtype == jnp.float32  # trained in float32 whatever the x64 mode
    out = D.evaluate_decoder(model, cfg, cfg.train_length, sequences=200, seed=99)  # fresh data
    assert out.correct[out.present].mean() >= 0.9 and out.correct[~out.present].mean() >= 0.9
    # the record's per-head numbers are the readout's on the validation set
    val = D.evaluate_decoder(
        model, cfg, cfg.train_length, sequences=cfg.val_sequences, seed=cfg.seed + D.VALIDATION_SEED
    )
    head = record["heads"][3]
    assert head["layer"] == 1 and head["head"] == 1
    assert head["first_mass"] == pytest.approx(val.first_mass[1, 1].mean(), rel=1e-6)
    assert head["sink"] == (max(head["first_mass"], head["sink_mass"]) > D.SINK_THRESHOLD)
    assert head["sink_logit"] == pytest.approx(float(model.layers[1].kernels[1].b))
    assert len(head["wq"]) == cfg.head_size and record["sink_formed"] == any(
        h["sink"] for h in record["heads"]
    )
    # reuse
    again, rec2 = D.load_or_train_decoder(cfg, cache, progress=False)
    assert rec2["reused"] and rec2["step"] == record["step"]
    for x, y in zip(jax.tree.leaves(model), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# slow: training the quick decoder costs 25 s; the default suite checks its forward pass,
# readout and loss against numpy, and the tier-A training and resume in test_longcontext
@pytest.mark.slow
def test_a_cached_model_of_another_configuration_is_refused(trained, tmp_path):
    cfg, _, _, cache = trained
    folder = tmp_path / cfg.key()
    folder.symlink_to(cache / cfg.key())
    other = tmp_path / "other"
    other.mkdir()
    for f in ("model.eqx", "train.json"):
        (other / f).symlink_to(cache / cfg.key() / f)
    (other / "config.json").write_text(json.dumps(dict(cfg.to_dict(), lr=0.5)))
    moved = tmp_path / "b"
    moved.mkdir()
    (moved / cfg.key()).symlink_to(other)
    with pytest.raises(ValueError, match="another configuration"):
        D.load_or_train_decoder(cfg, moved, progress=False)


# slow: training the quick decoder costs 25 s; the default suite checks its forward pass,
# readout and loss against numpy, and the tier-A training and resume in test_longcontext
@pytest.mark.slow
def test_training_resumes_bit_for_bit(trained, tmp_path):
    """A run killed after a checkpoint, and one killed between two (its newest checkpoint
    lost), resume to the bits of the uninterrupted run."""
    cfg, model, full, _ = trained
    stop = full["step"] - 25
    part = D.train_decoder(cfg, tmp_path, progress=False, stop_after=stop)
    assert not part["finished"] and part["step"] == stop
    if (tmp_path / "checkpoint.bin.prev").exists():  # resume from the one before
        (tmp_path / "checkpoint.bin").unlink()
    rest = D.train_decoder(cfg, tmp_path, progress=False)
    assert rest["resumed"] and rest["finished"] and rest["step"] == full["step"]
    assert rest["history"] == full["history"] and rest["history_split"] == full["history_split"]
    again = eqx.tree_deserialise_leaves(tmp_path / "model.eqx", D.Decoder(cfg, jax.random.key(0)))
    for x, y in zip(jax.tree.leaves(model), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_loss_is_on_the_answers_only():
    cfg = dataclasses.replace(QUICK, variant="qknorm+gate")
    model = _perturbed(cfg, 3)
    batch = sample_batch(jax.random.key(8), cfg, 3, 24)
    got = float(loss(model, batch, cfg.queries))
    ce = []
    for s in range(3):
        logits = _np_forward(model, batch.tokens[s])[0][-cfg.queries :]
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        ce.append(lse - logits[np.arange(cfg.queries), np.asarray(batch.targets[s])])
    assert got == pytest.approx(np.mean(ce), rel=1e-12)


# ==================================================================== readout
def test_the_readout_against_numpy():
    """Every field of the readout against numpy, at a length read in two tiles of 512
    query rows (the second padded)."""
    cfg = dataclasses.replace(QUICK, variant="sink+gate")
    model = _perturbed(cfg, 11)
    n, q = 600, cfg.queries
    out = D.evaluate_decoder(model, cfg, n, sequences=2, seed=5, logit_scale=1.4)
    assert out.shape == (2, 2, 2 * q) and out.length == n
    batch = sample_batch(jax.random.fold_in(jax.random.key(5), 0), cfg, 2, n)  # one chunk
    for s in range(2):
        logits, parts = _np_forward(model, batch.tokens[s], scale=1.4)
        target, present, needle = (np.asarray(a[s]) for a in batch[1:])
        cols = slice(s * q, (s + 1) * q)
        np.testing.assert_array_equal(out.correct[cols], logits[-q:].argmax(-1) == target)
        np.testing.assert_array_equal(out.present[cols], present)
        np.testing.assert_array_equal(out.visible[cols], np.arange(n - q, n) + 1)
        for i, lay in enumerate(parts):
            for h, (L, P, share, g) in enumerate(lay):
                L, P, share, g = L[-q:], P[-q:], share[-q:], g[-q:]
                vis = np.isfinite(L)
                logp = np.log(np.where(P > 0, P, 1))
                ent = -np.sum(P * logp, -1) - share * np.log(share)
                spread = np.where(vis, L, -np.inf).max(-1) - np.where(vis, L, np.inf).min(-1)
                nm, gap = np.zeros(q), np.zeros(q)
                for j in np.flatnonzero(present):
                    nm[j] = P[j, needle[j]]
                    gap[j] = L[j, needle[j]] - np.max(np.delete(L[j][vis[j]], needle[j]))
                want = dict(
                    entropy=ent,
                    first_mass=P[:, 0],
                    sink_mass=share,
                    needle_mass=nm,
                    logit_spread=spread,
                    needle_gap=gap,
                    gate=g,
                )
                for f, w in want.items():
                    got = getattr(out, f)[i, h, cols]
                    np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12, err_msg=f)


@pytest.mark.slow
def test_4096_tokens_are_read_in_chunks_and_tiles():
    """Sequence 0 read among five (chunks of four, tiles of 512 rows) is sequence 0 read
    alone."""
    cfg = D.DecoderConfig(variant="qknorm+sink")
    model = _perturbed(cfg, 2)
    out = D.evaluate_decoder(model, cfg, 4096, sequences=5, seed=2)
    q = cfg.queries
    assert out.shape == (2, 2, 5 * q) and out.visible.max() == 4096
    assert np.all(out.first_mass + out.sink_mass <= 1 + 1e-12)
    assert np.all(out.entropy <= math.log(4097) + 1e-9)
    one = D.evaluate_decoder(model, cfg, 4096, sequences=1, seed=2)
    np.testing.assert_array_equal(one.correct, out.correct[:q])
    for f in ("entropy", "needle_mass", "logit_spread", "gate"):
        np.testing.assert_allclose(getattr(one, f), getattr(out, f)[..., :q], rtol=1e-12)


# ======================================================================= heads
@pytest.mark.parametrize(
    "variant", ["plain", pytest.param("qknorm+sink+gate", marks=pytest.mark.slow)]
)
def test_heads_through_dynamics(variant):
    cfg = dataclasses.replace(QUICK, variant=variant)
    model = D.Decoder(cfg, jax.random.key(1))
    from attnflow.studies._decoder_dynamics import heads_through_dynamics

    out = heads_through_dynamics(model, cfg, sequences=2, horizon=2.0, saves=5)
    assert [(h["layer"], h["head"]) for h in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    json.dumps(out)  # plain JSON
    lay = model.layers[0]
    p = cfg.head_size
    V = np.asarray(lay.Wo[:, p:], np.float64) @ np.asarray(lay.Wv[p:], np.float64)
    h = out[1]
    assert h["triple"]["lambda1_abs"] == pytest.approx(np.abs(np.linalg.eigvals(V)).max(), rel=1e-6)
    assert h["regime"]["label"] == "unclassified"
    assert ("gate" if "gate" in variant else "mask") in h["regime"]["reason"]
    sim = h["simulation"]
    assert sim["statuses"] == ["ok", "ok"] and len(sim["leaders"]) == 2
    assert 0 < sim["dispersion_start"]["max"] <= 1 and 0 <= sim["dispersion_end"]["first_mass"] <= 1
    if "gate" in variant:
        assert h["gated"] and all(o["label"] is None for o in sim["observed"])
