"""The long-context study: the needle-or-null data, the head against numpy, the statistics
against independent numpy computations, the decision rule on constructed inputs, the
dispersion cap, a quick training, the bit-for-bit resume and the command line."""

from __future__ import annotations

import dataclasses
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.networks import _longcontext_task as T
from attnflow.networks._readout import AttentionReadout
from attnflow.studies import longcontext as LC


@pytest.fixture(autouse=True)
def _standard_dtype_promotion():
    """optax raises a Python float to its int32 step count, which the suite's strict dtype
    promotion refuses: the study runs under JAX's standard rule."""
    with jax.numpy_dtype_promotion("standard"):
        yield


TINY = T.NeedleConfig(
    variant="qknorm+sink+gate",
    keys=16,
    values=4,
    width=8,
    hidden=8,
    batch=8,
    n_train=8,
    max_steps=40,
    eval_every=10,
    val_sets=32,
    checkpoint_every=10,
    warmup=5,
)


# -------------------------------------------------------------------------- data
def test_needles_are_present_exactly_once_or_absent_with_their_answers():
    k, v, q, present, pos, target = (
        np.asarray(a) for a in T.sample_needles(jax.random.key(3), 4000, 12, 20, 5)
    )
    assert k.dtype == v.dtype == q.dtype == target.dtype == np.int32 and k.shape == (4000, 12)
    hits = (k == q[:, None]).sum(1)
    np.testing.assert_array_equal(hits, present.astype(int))  # once, or not at all
    rows = np.flatnonzero(present)
    np.testing.assert_array_equal(k[rows, pos[rows]], q[rows])
    np.testing.assert_array_equal(target[rows], v[rows, pos[rows]])
    assert np.all(target[~present] == 5)  # NULL: one more class
    assert k.min() >= 0 and k.max() < 20 and v.min() >= 0 and v.max() < 5
    # present with probability 1/2: within 4 standard deviations of 2000
    assert abs(int(present.sum()) - 2000) < 4 * math.sqrt(1000)


def test_needles_do_not_depend_on_the_x64_mode():
    was = bool(jax.config.read("jax_enable_x64"))
    try:
        got = []
        for x64 in (True, False):
            jax.config.update("jax_enable_x64", x64)
            got.append([np.asarray(a) for a in T.sample_needles(jax.random.key(1), 5, 9, 11, 3)])
    finally:
        jax.config.update("jax_enable_x64", was)
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)


def _np_head(model, keys, vals, query, variant):
    """The head in float64 numpy, keys and values formed per item."""
    f = {
        n: np.asarray(getattr(model, n), np.float64)
        for n in ("key_embed", "value_embed", "Wq", "Wk", "Wv", "Wo")
    }
    u = f["key_embed"][query]
    q, k = u @ f["Wq"].T, f["key_embed"][keys] @ f["Wk"].T
    if variant.startswith("qknorm"):

        def rms(x):
            return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True))

        q = rms(q) * np.asarray(model.kernel.wq, np.float64)
        k = rms(k) * np.asarray(model.kernel.wk, np.float64)
    L = np.einsum("bp,bnp->bn", q, k) / math.sqrt(q.shape[-1])
    if variant == "ssmax":
        L = float(model.kernel.s) * math.log(keys.shape[1]) * L
    b = float(model.kernel.b) if "sink" in variant else -np.inf
    top = np.maximum(L.max(-1, keepdims=True), b)
    e = np.exp(L - top)
    P = e / (e.sum(-1, keepdims=True) + np.exp(b - top))
    o = np.einsum("bn,bnp->bp", P, f["value_embed"][vals] @ f["Wv"].T)
    if model.Wg is not None:
        o = o / (1 + np.exp(-(u @ np.asarray(model.Wg, np.float64).T + np.asarray(model.bg))))
    return P, L, u + o @ f["Wo"].T


@pytest.mark.parametrize("variant", ["softmax", "qknorm+sink+gate", "ssmax"])
def test_head_matches_numpy_formed_per_item(variant):
    cfg = dataclasses.replace(TINY, variant=variant)
    model = T.NeedleModel(cfg, jax.random.key(2))
    if variant == "qknorm+sink+gate":  # gains and sink away from their initial values
        model = eqx.tree_at(
            lambda m: (m.kernel.wq, m.kernel.b),
            model,
            (jnp.linspace(0.5, 2.0, 8, dtype=jnp.float32), jnp.float32(1.5)),
        )
    keys, vals, query, *_ = T.sample_needles(jax.random.key(4), 6, 10, 16, 4)
    _, P, L, _ = T.head(model, keys, vals, query)
    want_P, want_L, _ = _np_head(
        model, np.asarray(keys), np.asarray(vals), np.asarray(query), variant
    )
    np.testing.assert_allclose(np.asarray(L), want_L, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(P), want_P, rtol=2e-5, atol=1e-7)


def test_the_gate_is_gated_attentions_gate():
    import attnflow as af

    model = T.NeedleModel(TINY, jax.random.key(0))
    u = np.asarray(model.key_embed[:5], np.float64)
    head = af.Attention(np.eye(8), np.eye(8), np.eye(8))
    gated = af.GatedAttention(head, np.asarray(model.Wg, np.float64), np.asarray(model.bg))
    np.testing.assert_allclose(
        np.asarray(model.gate(model.key_embed[:5])),
        np.asarray(gated.gate(jnp.asarray(u))),
        rtol=1e-6,
    )


# -------------------------------------------------------------------- statistics
def _readout(P, L, needle, present, correct, sink=None):
    """A readout of explicit rows (``P`` ``(m, n)`` over the keys, ``L`` their logits)."""
    P, L = np.asarray(P, np.float64), np.asarray(L, np.float64)
    m, n = P.shape
    s = np.zeros(m) if sink is None else np.asarray(sink, np.float64)
    ent = -(P * np.log(np.where(P > 0, P, 1))).sum(1) - s * np.log(np.where(s > 0, s, 1))
    idx = np.arange(m)
    nm = np.where(present, P[idx, needle], 0.0)
    others = np.where(np.arange(n)[None] == np.asarray(needle)[:, None], -np.inf, L)
    gap = np.where(present, L[idx, needle] - others.max(1), 0.0)

    def r(x):
        return np.asarray(x, np.float32).reshape(1, 1, m)

    return AttentionReadout(
        n,
        np.asarray(correct),
        np.asarray(present),
        np.full(m, n),
        r(ent),
        r(np.zeros(m)),
        r(s),
        r(nm),
        r(L.max(1) - L.min(1)),
        r(gap),
        r(np.ones(m)),
    )


def test_readout_stats_against_numpy():
    rng = np.random.default_rng(0)
    L = rng.normal(size=(40, 30)) * 3
    P = np.exp(L - L.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    present = rng.random(40) < 0.5
    needle = rng.integers(0, 30, 40)
    correct = rng.random(40) < 0.7
    st = LC.readout_stats(_readout(P, L, needle, present, correct))
    ent = -(P * np.log(P)).sum(1)
    for half, m in (("all", np.ones(40, bool)), ("present", present), ("absent", ~present)):
        assert st["count"][half] == m.sum() and st["correct"][half] == (correct & m).sum()
        np.testing.assert_allclose(st["heads"][half]["entropy"][0][0], ent[m].mean(), rtol=1e-6)
        np.testing.assert_allclose(
            st["heads"][half]["entropy_norm"][0][0], ent[m].mean() / math.log(30), rtol=1e-6
        )
    idx = np.flatnonzero(present)
    np.testing.assert_allclose(
        st["heads"]["present"]["needle_mass"][0][0], P[idx, needle[idx]].mean(), rtol=1e-5
    )
    spread = L.max(1) - L.min(1)
    cap = 1 / (1 + 29 * np.exp(-spread[idx]))
    np.testing.assert_allclose(st["heads"]["present"]["cap"][0][0], cap.mean(), rtol=1e-5)
    assert st["cap_check"]["cap_ok"] and st["cap_check"]["floor_ok"]
    assert st["cap_check"]["max_excess"] <= 0
    from scipy.stats import binomtest

    ci = binomtest(int((correct & present).sum()), int(present.sum())).proportion_ci(
        method="wilson"
    )
    assert st["interval"]["present"] == pytest.approx([ci.low, ci.high], abs=1e-12)


def test_the_cap_check_fails_a_needle_above_its_cap():
    """A row whose needle weighs more than 1/(1 + (n-1) e^{-spread}) cannot be a kernel's
    row: the check says so."""
    L = np.array([[2.0, 0.0, 0.0, 0.0]])
    honest = np.exp(L) / np.exp(L).sum()
    forged = np.array([[0.9, 0.04, 0.03, 0.03]])  # cap at spread 2: 1/(1 + 3 e^-2) = 0.711
    ok = LC.readout_stats(_readout(honest, L, [0], [True], [True]))["cap_check"]
    bad = LC.readout_stats(_readout(forged, L, [0], [True], [True]))["cap_check"]
    assert ok["cap_ok"] and abs(ok["max_excess"]) < 1e-6  # equal logits: the cap is attained
    assert not bad["cap_ok"] and bad["max_excess"] == pytest.approx(
        0.9 - 1 / (1 + 3 * math.exp(-2)), rel=1e-5
    )


def test_halving_length_interpolates_on_log_n():
    # 0.8 -> 0.6 -> 0.2: half (0.4) is reached halfway between 256 and 1024 in log n
    assert LC.halving_length([64, 256, 1024], [0.8, 0.6, 0.2]) == pytest.approx(512.0)
    t = (0.9 - 0.45) / (0.9 - 0.3)
    want = math.exp(math.log(64) + t * (math.log(128) - math.log(64)))
    assert LC.halving_length([64, 128], [0.9, 0.3]) == pytest.approx(want)
    assert LC.halving_length([64, 256, 1024], [0.9, 0.8, 0.5]) is None  # not reached
    assert LC.halving_length([64, 256], [0.5, 0.25]) == pytest.approx(256.0)  # exactly half


def test_fit_line_r2_against_a_closed_form():
    x = np.linspace(0, 1, 7)
    fit = LC.fit_line(x, 0.3 - 2.0 * x)
    assert fit["r2"] == pytest.approx(1.0) and fit["slope"] == pytest.approx(-2.0)
    # x = (-1, 0, 1), y = (-1, 1, 0): cov = 1, var x = 2/3 * 3/3 ... r = 1/2 exactly
    xs, ys = np.array([-1.0, 0.0, 1.0]), np.array([-1.0, 1.0, 0.0])
    r = np.sum((xs - xs.mean()) * (ys - ys.mean())) / math.sqrt(
        np.sum((xs - xs.mean()) ** 2) * np.sum((ys - ys.mean()) ** 2)
    )
    assert r == pytest.approx(0.5)
    assert LC.fit_line(xs, ys)["r2"] == pytest.approx(0.25)
    assert LC.fit_line([1, 1, 1], [0, 1, 2])["r2"] is None


def test_seed_intervals_against_the_textbook_formulas():
    """The mean's t interval from its formula, Welch's interval of a difference against
    scipy's own Welch test, and the cases without spread."""
    from scipy import stats

    from attnflow._stats import mean_interval, welch_difference

    x = np.array([0.61, 0.55, 0.70, 0.58, 0.64])
    y = np.array([0.40, 0.52, 0.31, 0.45])
    r = mean_interval(x)
    half = stats.t.ppf(0.975, 4) * x.std(ddof=1) / math.sqrt(5)
    assert r["interval"] == pytest.approx([x.mean() - half, x.mean() + half], abs=1e-14)
    ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)  # pyright: ignore
    w = welch_difference(x, y)
    assert w["difference"] == pytest.approx(x.mean() - y.mean(), abs=1e-15)
    assert w["interval"] == pytest.approx([ci.low, ci.high], abs=1e-12)
    # one group without spread: the other's spread alone, on m - 1 degrees of freedom
    w = welch_difference(x, [0.2, 0.2, 0.2])
    half = stats.t.ppf(0.975, 4) * x.std(ddof=1) / math.sqrt(5)
    assert w["interval"] == pytest.approx([x.mean() - 0.2 - half, x.mean() - 0.2 + half], abs=1e-12)
    # no spread: the point itself; one value: no interval
    assert mean_interval([1.0, 1.0])["interval"] == [1.0, 1.0]
    assert mean_interval([0.3])["interval"] is None
    assert welch_difference([1.0, 1.0], [0.0, 0.0])["interval"] == [1.0, 1.0]
    assert welch_difference([1.0], [0.0, 0.1])["interval"] is None
    # across seeds clips to [0, 1]
    assert LC.across_seeds([1.0, 0.9, 1.0])["interval"][1] == 1.0
    with pytest.raises(ValueError, match="finite"):
        mean_interval([0.1, float("nan")])


def _table(base, qk, cand, *, lengths=(256, 1024)):
    """Per-seed accuracies: each argument gives, per length, the mean of three seeds
    spread by -+0.01."""

    def seeds(means):
        return {n: [m - 0.01, m, m + 0.01] for n, m in zip(lengths, means)}

    return {"softmax": seeds(base), "qknorm": seeds(qk), "qknorm+sink": seeds(cand)}


def test_the_rule_passes_and_fails_where_it_must():
    def run(cand, base=(0.8, 0.7), qk=(0.4, 0.3)):
        return LC.decide(_table(base, qk, cand), baseline="softmax", candidates=("qknorm+sink",))

    closes = run((0.71, 0.61))  # 77.5% of both gaps, well above QK norm
    assert closes["cost_lengths"] == [256, 1024] and not closes["no_cost"]
    assert closes["goes_away"] and closes["passed_by"] == ["qknorm+sink"]
    row = closes["candidates"]["qknorm+sink"]["per_length"]
    assert row[0]["closed_fraction"] == pytest.approx(0.31 / 0.4)
    assert not run((0.69, 0.59))["goes_away"]  # 72.5%: short of 75%
    short = run((0.8, 0.3))  # closed at 4x only: every length with a cost is required
    assert not short["goes_away"]
    assert short["candidates"]["qknorm+sink"]["closed_at"] == [256]
    # a length without a cost (QK norm within noise of the baseline) is not judged
    partial = run((0.8, 0.3), qk=(0.4, 0.695))
    assert partial["cost_lengths"] == [256] and partial["goes_away"]
    # 75% of a gap in the means is not enough when the seeds scatter over it
    t = _table((0.8, 0.7), (0.4, 0.3), (0.71, 0.61))
    t["qknorm+sink"][256] = [0.2, 0.71, 1.0, 0.93]
    assert not LC.decide(t, baseline="softmax", candidates=("qknorm+sink",))["goes_away"]
    none = run((0.8, 0.7), qk=(0.795, 0.7))
    assert none["no_cost"] and not none["goes_away"]
    with pytest.raises(ValueError, match="qknorm\\+gate"):
        LC.decide(_table((1, 1), (1, 1), (1, 1)), baseline="softmax")
    one = _table((0.8, 0.7), (0.4, 0.3), (0.7, 0.6))
    one["qknorm"][256] = [0.4]
    with pytest.raises(ValueError, match="two per variant"):
        LC.decide(one, baseline="softmax", candidates=("qknorm+sink",))


# --------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def quick_models(tmp_path_factory):
    cache = tmp_path_factory.mktemp("lc") / "models"
    with jax.numpy_dtype_promotion("standard"):
        out = {
            v: T.load_or_train(T.NeedleConfig.quick(v), cache / "A", progress=False)
            for v in ("softmax", "qknorm+sink")
        }
    return cache, out


def test_quick_training_reaches_its_accuracy_and_reads_under_the_cap(quick_models):
    """The quick configuration trains in seconds to >= 95% on present and absent queries
    at its training length; every read row keeps its needle under the dispersion cap."""
    _, models = quick_models
    for variant, (model, record, reused) in models.items():
        assert not reused and record["finished"]
        assert record["validation"]["present"] >= 0.95, (variant, record["validation"])
        assert record["validation"]["absent"] >= 0.95, (variant, record["validation"])
        cfg = T.NeedleConfig.quick(variant)
        r = T.evaluate(model, cfg, 64, sequences=128, seed=1)
        assert r.shape == (1, 1, 128)
        st = LC.readout_stats(r)
        assert st["cap_check"]["cap_ok"] and st["cap_check"]["floor_ok"]
        if variant == "qknorm+sink":  # the sink's share is what each row lacks
            _, P, _, _ = T.head(
                model,
                *T.sample_needles(
                    jax.random.fold_in(jax.random.key(1 + 64), 0), 128, 64, cfg.keys, cfg.values
                )[:3],
            )
            np.testing.assert_allclose(r.sink_mass[0, 0], 1 - np.asarray(P).sum(1), atol=2e-6)


def test_training_resumes_bit_for_bit(tmp_path):
    full = T.train(TINY, tmp_path / "a", progress=False)
    part = T.train(TINY, tmp_path / "b", progress=False, stop_after=15)
    assert not part["finished"] and (tmp_path / "b" / "checkpoint.bin").exists()
    rest = T.train(TINY, tmp_path / "b", progress=False)
    assert rest["resumed"] and rest["finished"] and rest["step"] == full["step"]
    assert rest["history"] == full["history"]
    assert (tmp_path / "a" / "model.eqx").read_bytes() == (
        tmp_path / "b" / "model.eqx"
    ).read_bytes()
    assert not (tmp_path / "b" / "checkpoint.bin").exists()
    # reuse: a matching config loads; another one under the same name is refused
    d = tmp_path / "c" / TINY.key()
    d.parent.mkdir()
    d.symlink_to(tmp_path / "a")
    _, rec, reused = T.load_or_train(TINY, tmp_path / "c", progress=False)
    assert reused and rec["history"] == full["history"]
    (d / "config.json").write_text(json.dumps(dict(TINY.to_dict(), lr=0.5)))
    with pytest.raises(ValueError, match="another configuration"):
        T.load_or_train(TINY, tmp_path / "c", progress=False)


def test_config_checks():
    with pytest.raises(ValueError, match="variant"):
        T.NeedleConfig(variant="sink")
    with pytest.raises(ValueError, match="gate"):
        T.NeedleConfig(gate="channel")
    with pytest.raises(ValueError, match="keys"):
        T.NeedleConfig(keys=1)
    assert TINY.key() != dataclasses.replace(TINY, seed=1).key()
    assert T.NeedleConfig(variant="qknorm+sink+gate").kernel_name == "qknorm_sink"
    for bad in (0, [], [1, 1], [-1], True):
        with pytest.raises(ValueError, match="seeds"):
            LC.run_study(("A",), seeds=bad, cache_dir="unused")
    with pytest.raises(ValueError, match="tiers"):
        LC.run_study(("C",), cache_dir="unused")
    with pytest.raises(ValueError, match="'plain'"):  # tier B's baseline, not tier A's
        LC.run_study(("A",), variants=("softmax", "plain"), cache_dir="unused")
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="eval_seed"):
            LC.run_study(("A",), eval_seed=bad, cache_dir="unused")  # pyright: ignore
        with pytest.raises(ValueError, match="descriptive_seeds"):
            LC.run_study(("A",), descriptive_seeds=bad, cache_dir="unused")  # pyright: ignore


def test_quick_cli_end_to_end(quick_models, tmp_path, capsys):
    """The command line reuses the cached quick models, reads them, writes a result that
    loads back, and says that the rule needs the variants it was not given."""
    from typer.testing import CliRunner

    from attnflow.cli import app

    cache, _ = quick_models
    args = [
        "longcontext",
        "--quick",
        "--tier",
        "A",
        "--seeds",
        "1",
        "--variants",
        "softmax,qknorm+sink",
        "--cache",
        str(cache),
        "--out",
        str(tmp_path),
        "--json",
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    back = LC.LongContextResult.load(tmp_path / "longcontext.json")
    assert back.data == res
    assert [m["reused"] for m in res["models"]] == [True, True]
    # the second run reads nothing again: the kept readings are the same numbers
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    twice = json.loads(again.stdout)
    assert [m["readings_reused"] for m in twice["models"]] == [True, True]
    assert [m["readings"] for m in twice["models"]] == [m["readings"] for m in res["models"]]
    assert twice["tiers"] == res["tiers"]
    # the rule's readings only: softmax's reading is as it was (it has no scaled one); for
    # the QK-norm model it is another reading, read afresh, with the same plain numbers
    plain = CliRunner().invoke(app, [*args, "--descriptive-seeds", "0", "--file", "plain.json"])
    assert plain.exit_code == 0, plain.output
    only = json.loads(plain.stdout)
    assert [m["readings_reused"] for m in only["models"]] == [True, False]
    assert [list(m["readings"]) for m in only["models"]] == [["plain"], ["plain"]]
    assert [m["readings"]["plain"] for m in only["models"]] == [
        m["readings"]["plain"] for m in res["models"]
    ]
    assert (tmp_path / "plain.json").exists()
    tier = res["tiers"]["A"]
    assert tier["decision"] is None and "qknorm" in tier["verdict"]
    lengths = res["settings"]["tier_A"]["lengths"]
    assert lengths == [16, 64, 256, 1024]
    summary = tier["summary"]["plain"]["softmax"]
    assert summary["all"]["total"] == [512] * 4
    assert set(tier["summary"]["scaled"]) == {"qknorm+sink"}
    assert tier["cap"]["cap_ok"]
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args[:-1] + ["--variants", "nope"])
    assert exit_.value.code == 2 and "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_study_of_every_tier_a_variant_decides(tmp_path):
    res = LC.run_study(
        ("A",), quick=True, seeds=2, cache_dir=tmp_path / "m", out=tmp_path, progress=False
    )
    d = res.data["tiers"]["A"]["decision"]
    acc = res.data["tiers"]["A"]["summary"]["plain"]["softmax"]["present"]
    assert acc["seeds"] == [0, 1] and len(acc["per_seed"][0]) == 2
    assert acc["accuracy"][1] == pytest.approx(np.mean(acc["per_seed"][1]), abs=1e-15)
    assert set(d) == {"all", "present", "absent"}
    assert set(d["all"]["candidates"]) == {"qknorm+sink", "qknorm+gate"}
    assert isinstance(res.verdict("A"), str)
    for m in res.data["models"]:
        assert m["record"]["validation"]["all"] >= 0.95, m["variant"]


@pytest.mark.slow
def test_quick_tier_b_plumbing(tmp_path):
    pytest.importorskip("attnflow.networks._decoder")
    res = LC.run_study(("B",), quick=True, seeds=1, cache_dir=tmp_path / "m", progress=False)
    tier = res.data["tiers"]["B"]
    assert tier["decision"] is not None and tier["cap"]["cap_ok"]
    assert all("heads" in m for m in res.data["models"])


@pytest.mark.slow
def test_training_killed_mid_run_resumes_bit_for_bit(tmp_path):
    """A real SIGKILL (no handler, no ``finally``) part-way through a training: the rerun
    resumes from the newest whole checkpoint and ends with the bytes of an uninterrupted
    run."""
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    cfg = dataclasses.replace(TINY, max_steps=60, checkpoint_every=5)
    whole = T.train(cfg, tmp_path / "whole", progress=False)
    part = tmp_path / "killed"
    script = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        from pathlib import Path
        from attnflow.networks import _longcontext_task as T
        cfg = T.NeedleConfig(**{cfg.to_dict()!r})
        T.train(cfg, Path({str(part)!r}), progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    try:
        while not (part / "checkpoint.bin").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.time() < deadline, "the training never started"
            time.sleep(0.01)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_early = not (part / "train.json").exists()
    rest = T.train(cfg, part, progress=False)
    assert rest["finished"] and rest["history"] == whole["history"]
    assert rest["resumed"] or not killed_early
    assert (part / "model.eqx").read_bytes() == (tmp_path / "whole" / "model.eqx").read_bytes()
