"""The max-retrieval study: data, the head against numpy, training resume, reuse, and the
quick pipeline (figure script and CLI)."""

from __future__ import annotations

import dataclasses
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import binomtest

from attnflow.studies import retrieval as R


@pytest.fixture(autouse=True)
def _standard_dtype_promotion():
    """optax's Adam raises a Python float to its int32 step count (bias correction), which
    the suite's strict dtype promotion refuses: training runs under JAX's standard rule."""
    with jax.numpy_dtype_promotion("standard"):
        yield


TINY = R.RetrievalConfig(
    width=8, depth=1, max_steps=30, eval_every=10, val_sets=64, batch=16, checkpoint_every=10
)


def test_sample_sets_target_is_the_class_of_the_max():
    items, query, target, top = (np.asarray(a) for a in R.sample_sets(jax.random.key(0), 50, 7))
    assert items.shape == (50, 7, 11) and query.shape == (50, 1) and items.dtype == np.float32
    np.testing.assert_array_equal(top, items[:, :, 0].argmax(1))
    np.testing.assert_array_equal(target, items[np.arange(50), top, 1:].argmax(1))
    assert np.all(items[:, :, 1:].sum(-1) == 1)


def test_sets_do_not_depend_on_the_x64_mode():
    was = jax.config.jax_enable_x64
    try:
        got = []
        for x64 in (True, False):
            jax.config.update("jax_enable_x64", x64)
            got.append([np.asarray(a) for a in R.sample_sets(jax.random.key(7), 4, 9)])
    finally:
        jax.config.update("jax_enable_x64", was)
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def _np_head(model, items, query, kernel):
    """The head in float64 numpy, keys and values formed per item (no regrouping)."""
    e = np.asarray(jax.vmap(model.item_mlp)(items), np.float64)
    u = np.asarray(model.query_mlp(query), np.float64)
    Wq, Wk, Wv = (np.asarray(w, np.float64) for w in (model.Wq, model.Wk, model.Wv))
    p = Wq.shape[0]

    def rms(x):
        return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True))

    def sm(z):
        return np.exp(z - z.max()) / np.exp(z - z.max()).sum()

    et, ut = (rms(e), rms(u)) if kernel == "prenorm" else (e, u)
    q, k = Wq @ ut, et @ Wk.T
    if kernel == "qknorm":
        q, k = rms(q), rms(k)
    L = q @ k.T / math.sqrt(p)
    if kernel in ("softmax", "qknorm", "prenorm"):
        P = sm(L)
    elif kernel == "stickbreaking":  # the query after every item: the last item first
        s = 1 / (1 + np.exp(-L))
        P = np.array([s[j] * np.prod(1 - s[j + 1 :]) for j in range(len(s))])
    elif kernel == "differential":  # halves of the head, lam = 0.2
        h = p // 2
        P = sm(k[:, :h] @ q[:h] / math.sqrt(p)) - 0.2 * sm(k[:, h:] @ q[h:] / math.sqrt(p))
    else:
        raise ValueError(kernel)
    return P, P @ (e @ Wv.T)


@pytest.mark.parametrize(
    "kernel", ["softmax", "stickbreaking", "differential", "qknorm", "prenorm"]
)
def test_head_matches_numpy(kernel):
    params = (("lam", 0.2),) if kernel == "differential" else ()
    cfg = dataclasses.replace(TINY, kernel=kernel, width=16, kernel_params=params)
    model = R.RetrievalModel(cfg, jax.random.key(3))
    items, query, _, _ = R.sample_sets(jax.random.key(4), 1, 12)
    P, L, out = R.head_weights(model, items[0], query[0], kernel)
    want_P, want_out = _np_head(model, items[0], query[0], kernel)
    np.testing.assert_allclose(np.asarray(P), want_P, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(out), want_out, rtol=2e-4, atol=1e-5)


@pytest.mark.slow
def test_training_resumes_bit_for_bit_and_reuses(tmp_path):
    full = R.train(TINY, tmp_path / "a", progress=False)
    part = R.train(TINY, tmp_path / "b", progress=False, stop_after=15)
    assert not part["finished"] and (tmp_path / "b" / "checkpoint.bin").exists()
    rest = R.train(TINY, tmp_path / "b", progress=False)
    assert rest["resumed"] and rest["finished"] and rest["step"] == full["step"] == 30
    assert rest["history"] == full["history"]
    like = R.RetrievalModel(TINY, jax.random.key(0))
    a = eqx.tree_deserialise_leaves(tmp_path / "a" / "model.eqx", like)
    b = eqx.tree_deserialise_leaves(tmp_path / "b" / "model.eqx", like)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # reuse: a matching config loads, a different one in the same folder is refused
    (tmp_path / "c").mkdir()
    d = tmp_path / "c" / TINY.key()
    d.symlink_to(tmp_path / "a")
    _, rec, reused = R.load_or_train(TINY, tmp_path / "c", progress=False)
    assert reused and rec["step"] == 30
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, lr=0.5)))
    with pytest.raises(ValueError, match="another configuration"):
        R.load_or_train(TINY, tmp_path / "c", progress=False)


@pytest.mark.slow
def test_joint_evaluation_equals_one_kernel_at_a_time():
    """softmax and adaptive read together (shared embeddings, each stopping on its own
    interval) give what each gives alone: the same sets, counts and diagnostics."""
    model = R.RetrievalModel(dataclasses.replace(TINY, width=16), jax.random.key(5))
    kw = dict(min_sets=32, max_sets=96, half_width=0.2, items_per_batch=512, progress=False)
    both = R.evaluate_many(model, ("softmax", "adaptive"), [16, 64], **kw)
    for kern in ("softmax", "adaptive"):
        alone = R.evaluate(model, kern, [16, 64], **kw)
        assert both[kern]["sets"] == alone["sets"]
        assert both[kern]["accuracy"] == alone["accuracy"]
        for f in ("attention_on_max", "max_coefficient", "delta"):
            np.testing.assert_allclose(both[kern][f], alone[f], rtol=1e-5)


def test_config_checks():
    with pytest.raises(ValueError, match="evaluation"):
        R.RetrievalConfig(kernel="adaptive")
    with pytest.raises(ValueError, match="kernel"):
        R.RetrievalConfig(kernel="nope")
    with pytest.raises(ValueError, match="width"):
        R.RetrievalConfig(kernel="differential", width=7)
    assert TINY.key() != dataclasses.replace(TINY, seed=1).key()


@pytest.mark.slow
def test_quick_cli_writes_the_study_and_reuses_models(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    runner = CliRunner()
    args = ["retrieval", "--quick", "--json", "--out", str(tmp_path)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    disk = json.loads((tmp_path / "max_retrieval.json").read_text())
    assert {"sizes", "accuracy", "interval", "attention_on_max", "delta", "config"} <= set(disk)
    assert disk["sizes"] == [16, 64] and set(disk["accuracy"]) == {"softmax", "adaptive"}
    for kern in ("softmax", "adaptive"):
        for acc, (lo, hi), sets in zip(
            disk["accuracy"][kern], disk["interval"][kern], disk["sets"][kern], strict=True
        ):
            ci = binomtest(round(acc * sets), sets).proportion_ci(method="wilson")
            assert math.isclose(lo, ci.low, abs_tol=1e-12) and math.isclose(hi, ci.high)
        assert all(0 < a <= 1 for a in disk["attention_on_max"][kern])
    assert disk["training"]["softmax"]["reused"] is False and "adaptive" not in disk["training"]
    r2 = runner.invoke(app, args)
    res2 = json.loads(r2.stdout)
    assert res2["training"]["softmax"]["reused"] is True
    assert res2["accuracy"] == res["accuracy"]
    text = runner.invoke(app, args[:2] + args[3:])  # the table, reusing the models
    assert text.exit_code == 0 and "near chance" in text.stdout


def test_checkpoints_are_atomic_units_and_survive_corruption(tmp_path):
    """The checkpoint is one file written under a temporary name and renamed, the previous
    one kept: a kill mid-write leaves the last whole one; a truncated or altered file is
    named and the previous one read; a resume from either ends where an uninterrupted run
    ends, bit for bit (the batches of step s come from fold_in(base, s))."""
    from attnflow.networks import _checkpoint as C

    tree = {"a": jnp.arange(5.0), "b": jnp.ones((2, 3))}
    p = tmp_path / "c.bin"
    C.save(p, tree, {"step": 1})
    C.save(p, jax.tree.map(lambda x: 2 * x, tree), {"step": 2})
    assert C.load(p, tree)[1] == {"step": 2}
    # a kill during the write: only a temporary file appeared, the checkpoint is whole
    (tmp_path / ".c.bin.999.tmp").write_bytes(b"attnflow-checkpoint 1 partial")
    assert C.load(p, tree)[1] == {"step": 2}
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])  # truncated: named, the previous one is read
    with pytest.warns(RuntimeWarning, match=r"c\.bin is unreadable .*trying the previous"):
        back, state = C.load(p, tree)
    assert state == {"step": 1}
    np.testing.assert_array_equal(np.asarray(back["a"]), np.arange(5.0))
    p.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))  # one flipped bit: the hash says so
    with pytest.warns(RuntimeWarning, match="does not match its hash"):
        assert C.load(p, tree)[1] == {"step": 1}
    (tmp_path / "c.bin.prev").write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning) as caught:
        assert C.load(p, tree) is None
    said = [str(w.message) for w in caught]
    assert "trying the previous one" in said[0] and "training starts over" in said[1]


@pytest.mark.slow
def test_training_resumes_bit_for_bit_from_a_corrupted_checkpoint(tmp_path):
    full = R.train(TINY, tmp_path / "a", progress=False)
    R.train(TINY, tmp_path / "b", progress=False, stop_after=25)  # checkpoints at 10, 20, 25
    ck = tmp_path / "b" / "checkpoint.bin"
    ck.write_bytes(ck.read_bytes()[:100])  # the kill corrupted the newest: resume from 20
    with pytest.warns(RuntimeWarning, match="trying the previous one"):
        rest = R.train(TINY, tmp_path / "b", progress=False)
    assert rest["resumed"] and rest["finished"] and rest["history"] == full["history"]
    like = R.RetrievalModel(TINY, jax.random.key(0))
    a = eqx.tree_deserialise_leaves(tmp_path / "a" / "model.eqx", like)
    b = eqx.tree_deserialise_leaves(tmp_path / "b" / "model.eqx", like)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not ck.exists() and not (tmp_path / "b" / "checkpoint.bin.prev").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checkpoint_every", 0),
        ("val_sets", 0),
        ("patience", 0),
        ("lr", float("nan")),
        ("lr", 0.0),
        ("lr", -1e-3),
        ("min_delta", float("inf")),
        ("warmup", -1),
        ("seed", 1.5),
        ("batch", True),
    ],
)
def test_every_config_field_is_checked_up_front(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        R.RetrievalConfig(**{field: value})


def test_a_config_round_trips_through_its_dict():
    """``RetrievalConfig(**cfg.to_dict())`` is ``cfg`` (``kernel_params`` comes back as a
    dict, which was accepted and then failed deep in training as an unhashable field)."""
    cfg = R.RetrievalConfig(kernel="differential", width=8, kernel_params=(("lam", 0.2),))
    back = R.RetrievalConfig(**cfg.to_dict())
    assert back == cfg and hash(back) == hash(cfg) and back.key() == cfg.key()
    assert R.RetrievalConfig(**{**TINY.to_dict(), "kernel_params": {}}) == TINY
    with pytest.raises(ValueError, match="kernel_params must be a mapping"):
        R.RetrievalConfig(kernel_params=(0.2,))


def test_a_diverging_training_stops_and_records_nothing_finished(tmp_path):
    cfg = dataclasses.replace(TINY, lr=1e30, schedule="constant")
    with pytest.raises(FloatingPointError, match="diverged: the loss is"):
        R.train(cfg, tmp_path / "x", progress=False)
    assert not (tmp_path / "x" / "train.json").exists()
    assert not (tmp_path / "x" / "model.eqx").exists()
