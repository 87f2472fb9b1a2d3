"""simulate on several devices (tests/conftest.py forces 2 host devices) and with stacked
weights, against the one-device run and the one-by-one solves."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import attnflow as af
from attnflow.dynamics._inputs import check_x0

RNG = np.random.default_rng(18)
V2 = np.array([[0.8, 0.3], [0.3, -0.4]])


def _model(V=V2, seed=0, **kw):
    rng = np.random.default_rng(seed)
    d = V.shape[0]
    return af.Attention(np.eye(d) + 0.3 * rng.standard_normal((d, d)), np.eye(d), V, **kw)


def test_two_host_devices_are_forced():
    assert len(jax.devices()) >= 2


@pytest.mark.parametrize(
    "method, frame, kw",
    [
        ("adaptive", "rescaled", {}),
        pytest.param("adaptive", "original", {}, marks=pytest.mark.slow),
        ("euler", "rescaled", {"dt": 0.1}),
    ],
)
def test_sharded_batch_equals_one_device(method, frame, kw):
    # 5 systems on 2 devices: padded to 6 with a copy of system 0, removed again
    m = _model(np.array([[0.7, 1.0], [0.0, 0.7]]) if method == "euler" else V2)
    x0 = RNG.uniform(-1, 1, (5, 8, 2))
    ts = np.linspace(0, 3, 4)
    a = af.simulate(m, x0, 3.0, ts=ts, frame=frame, method=method, **kw)
    b = af.simulate(m, x0, 3.0, ts=ts, frame=frame, method=method, devices="all", **kw)
    assert a.ok and b.ok
    assert b.solver["devices"] == [d.id for d in jax.local_devices()]
    np.testing.assert_allclose(np.asarray(b.x), np.asarray(a.x), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(b.z), np.asarray(a.z), rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(b.stats["num_steps"], a.stats["num_steps"])
    assert b.stats["num_steps"].shape == (5,)


def test_failures_stay_per_system_on_devices():
    # float64 overflow of the logits (~ 2.2^{2k} |z|^2 after k layers) for the systems of
    # size ~1 only
    m = af.Attention(np.eye(2), np.eye(2), 12.0 * np.eye(2))
    x0 = RNG.uniform(-1, 1, (3, 6, 2))
    x0[1] *= 1e-30  # this one stays within the float range up to t1
    a = af.simulate(m, x0, 50.0, method="euler", dt=0.1)
    b = af.simulate(m, x0, 50.0, method="euler", dt=0.1, devices="all")
    assert a.statuses == b.statuses and "ok" in a.statuses and "overflow" in a.statuses
    np.testing.assert_allclose(b.t_stop, a.t_stop, rtol=1e-12)


def test_jax_array_input_stays_on_device_and_is_checked_there():
    devs = jax.local_devices()[:2]
    mesh = jax.make_mesh((2,), ("batch",), devices=devs)
    x0 = RNG.uniform(-1, 1, (4, 8, 2))
    xs = jax.device_put(jnp.asarray(x0), NamedSharding(mesh, PartitionSpec("batch")))
    m = _model()
    assert check_x0(m, xs) is xs  # not copied to the host
    a = af.simulate(m, x0, 2.0, method="euler", dt=0.1)
    b = af.simulate(m, xs, 2.0, method="euler", dt=0.1, devices=devs)
    np.testing.assert_allclose(np.asarray(b.x), np.asarray(a.x), rtol=1e-12, atol=1e-13)
    x0[2, 3, 1] = np.nan
    bad = jax.device_put(jnp.asarray(x0), NamedSharding(mesh, PartitionSpec("batch")))
    with pytest.raises(ValueError, match="non-finite"):
        af.simulate(m, bad, 2.0, method="euler", dt=0.1, devices=devs)
    with pytest.raises(ValueError, match="token dimension"):
        af.simulate(m, jnp.zeros((4, 3)), 2.0)


@pytest.mark.parametrize(
    "devices, match",
    [("gpu", "devices must be"), ([], "empty"), ([1, 2], "JAX devices"), (None, None)],
)
def test_devices_argument_checked(devices, match):
    m = _model()
    x0 = RNG.uniform(-1, 1, (2, 4, 2))
    if match is None:
        d0 = jax.devices()[0]
        with pytest.raises(ValueError, match="twice"):
            af.simulate(m, x0, 1.0, devices=[d0, d0])
        with pytest.raises(ValueError, match="shard must be"):
            af.simulate(m, x0, 1.0, devices="all", shard="rows")
        return
    with pytest.raises(ValueError, match=match):
        af.simulate(m, x0, 1.0, devices=devices)


# ----------------------------------------------------------------- stacked weights
def _triples(b, d=2, seed=1):
    rng = np.random.default_rng(seed)
    Q = np.eye(d) + 0.3 * rng.standard_normal((b, d, d))
    K = np.eye(d) + 0.3 * rng.standard_normal((b, d, d))
    V = 0.5 * rng.standard_normal((b, d, d))
    return Q, K, V


@pytest.mark.parametrize(
    "method, frame, propagator, devices",
    [
        ("adaptive", "rescaled", "eig", None),
        pytest.param("adaptive", "rescaled", "eig", "all", marks=pytest.mark.slow),
        ("euler", "rescaled", "expm", "all"),  # standard coordinates: one R^k per model
        ("euler-ode", "original", "eig", None),
    ],
)
def test_stacked_triples_equal_one_by_one(method, frame, propagator, devices):
    b = 5
    Q, K, V = _triples(b)
    heads = [af.Attention(Q[i], K[i], V[i], propagator=propagator) for i in range(b)]
    stacked = af.stack(heads)
    assert stacked.stack_size == b and af.Attention(Q, K, V, propagator=propagator).stack_size == b
    x0 = RNG.uniform(-1, 1, (b, 6, 2))
    ts = np.linspace(0, 2, 5)
    kw = {"dt": 0.1} if method != "adaptive" else {}
    traj = af.simulate(stacked, x0, 2.0, ts=ts, frame=frame, method=method, devices=devices, **kw)
    assert traj.batched and traj.stacked and traj.ok
    for i, head in enumerate(heads):
        one = af.simulate(head, x0[i], 2.0, ts=ts, frame=frame, method=method, **kw)
        np.testing.assert_allclose(np.asarray(traj.x[i]), np.asarray(one.x), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(np.asarray(traj.z[i]), np.asarray(one.z), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(
            np.asarray(traj.attention(2)[i]), np.asarray(one.attention(2)), rtol=1e-12, atol=1e-14
        )
        sys_i = traj.system(i)
        assert sys_i.model.stack_size is None
        np.testing.assert_array_equal(np.asarray(sys_i.model.V), np.asarray(head.V))
        np.testing.assert_allclose(np.asarray(sys_i.x), np.asarray(one.x), rtol=1e-12, atol=1e-13)
        assert int(traj.stats["num_steps"][i]) == int(one.stats["num_steps"])


def test_stacked_shared_start_and_per_head_beta():
    Q, K, V = _triples(3, seed=4)
    beta = np.array([0.5, 1.0, 2.0])
    model = af.Attention(Q, K, V, beta=beta)
    x0 = RNG.uniform(-1, 1, (6, 2))
    traj = af.simulate(model, x0, 1.5, method="euler", dt=0.1)
    for i in range(3):
        one = af.simulate(
            af.Attention(Q[i], K[i], V[i], beta=beta[i]), x0, 1.5, method="euler", dt=0.1
        )
        np.testing.assert_allclose(np.asarray(traj.x[i]), np.asarray(one.x), rtol=1e-12, atol=1e-13)


def test_analyses_of_stacked_runs_are_those_of_each_system():
    """track_rank, dispersion and observe_limit serve a run of stacked weights system by
    system (system i with model i), equal to the runs of each model alone; predict_regime
    refuses a stacked model naming unstack. (They crashed with raw shape errors.)"""
    b = 3
    Q, K, V = _triples(b, seed=5)
    heads = [af.Attention(Q[i], K[i], V[i]) for i in range(b)]
    x0 = RNG.uniform(-1, 1, (b, 5, 2))
    ts = np.linspace(0, 3, 7)
    traj = af.simulate(af.stack(heads), x0, 3.0, ts=ts, method="euler", dt=0.1)
    rank = af.track_rank(traj)
    disp = af.dispersion(traj, k=3)
    lam = np.max(np.linalg.eigvals(V).real, axis=-1)
    np.testing.assert_allclose(rank.lambda_max, lam, rtol=1e-12)
    for i, head in enumerate(heads):
        one = af.simulate(head, x0[i], 3.0, ts=ts, method="euler", dt=0.1)
        r1 = af.track_rank(one)
        np.testing.assert_array_equal(rank.rank[i], r1.rank)
        np.testing.assert_array_equal(rank.attends_to[i], r1.attends_to)
        np.testing.assert_allclose(rank.boolean_distance[i], r1.boolean_distance, rtol=1e-12)
        d1 = af.dispersion(one, k=3)
        np.testing.assert_allclose(disp.max[i], d1.max, rtol=1e-12)
        np.testing.assert_allclose(disp.entropy[i], d1.entropy, rtol=1e-12, atol=1e-15)
        # the largest coefficient is that of the attention matrix itself
        np.testing.assert_allclose(
            disp.max[i], np.asarray(traj.attention(3)[i]).max(-1), rtol=1e-12
        )
        o, o1 = af.observe_limit(traj, system=i), af.observe_limit(one)
        assert o.label == o1.label and o.reason == o1.reason
    # a model input: a batch with one system per stacked model
    dm = af.dispersion(af.stack(heads), x=x0)
    np.testing.assert_allclose(dm.max[1], af.dispersion(heads[1], x=x0[1]).max, rtol=1e-12)
    with pytest.raises(ValueError, match=r"stacked.*\(3, n, 2\)"):
        af.dispersion(af.stack(heads), x=x0[0])
    with pytest.raises(ValueError, match="unstack"):
        af.predict_regime(af.stack(heads))


def test_stack_refuses_what_differs():
    Q, K, V = _triples(2)
    a = af.Attention(Q[0], K[0], V[0])
    with pytest.raises(ValueError, match="more than its weights"):
        af.stack([a, af.Attention(Q[1], K[1], V[1], kernel="qknorm")])
    with pytest.raises(ValueError, match="more than its weights|shape"):
        af.stack([a, af.Attention(np.eye(3), np.eye(3), np.eye(3))])
    with pytest.raises(ValueError, match="non-empty"):
        af.stack([])
    with pytest.raises(ValueError, match="one value per head"):
        af.Attention(Q, K, V, beta=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="non-finite"):
        af.Attention(Q, K, np.where(np.arange(2)[:, None, None] == 1, np.nan, V))
    st = af.stack([a, af.Attention(Q[1], K[1], V[1])])
    with pytest.raises(ValueError, match="stacks 2 models"):
        af.simulate(st, RNG.uniform(-1, 1, (3, 4, 2)), 1.0)
    traj = af.simulate(st, RNG.uniform(-1, 1, (2, 4, 2)), 1.0, method="euler", dt=0.1)
    with pytest.raises(ValueError, match="system"):
        traj.save("/tmp/never.npz")


# -------------------------------------------------------------------- token sharding
def test_token_sharded_field_and_run_equal_the_tiled_attention():
    # n = 4099 > 2048: the tiled path (blocks of query rows), 2 devices, padded to 4100
    from attnflow.dynamics._devices import TokenSharded

    rng = np.random.default_rng(5)
    n, d = 4099, 4
    A = rng.standard_normal((d, d)) / 2
    m = af.Attention(np.eye(d) + 0.1 * rng.standard_normal((d, d)), np.eye(d), (A + A.T) / 2)
    x = jnp.asarray(rng.standard_normal((n, d)))
    field = eqx.filter_jit(lambda model, x: model.vector_field(x))
    want = np.asarray(field(m, x))
    got = np.asarray(field(TokenSharded(m, jax.devices()[:2]), x))
    # an independent dense numpy field on a few rows
    X = np.asarray(x)
    L = 1.0 * (X[:7] @ np.asarray(m.Q).T) @ (X @ np.asarray(m.K).T).T
    P = np.exp(L - L.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(want[:7], (P @ X) @ np.asarray(m.V).T, rtol=1e-12, atol=1e-13)
    # equal up to rounding: XLA may order a row's sums differently once the rows are
    # split (jaxlib 0.6.1 differs in the last bit at 25 of 16,396 entries)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    a = af.simulate(m, x, 0.2, method="euler", dt=0.1)
    b = af.simulate(m, x, 0.2, method="euler", dt=0.1, devices="all", shard="tokens")
    np.testing.assert_allclose(np.asarray(b.x), np.asarray(a.x), rtol=1e-13, atol=1e-13)
    assert b.solver["shard"] == "tokens" and b.model is m


def test_token_sharding_refuses_batches_and_masks():
    m = _model()
    with pytest.raises(ValueError, match="one system"):
        af.simulate(m, RNG.uniform(-1, 1, (2, 4, 2)), 1.0, devices="all", shard="tokens")
    with pytest.raises(ValueError, match="one system"):
        af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 1.0, shard="tokens")
    with pytest.raises(ValueError, match="mask"):
        af.simulate(
            _model(mask="causal"), RNG.uniform(-1, 1, (4, 2)), 1.0, devices="all", shard="tokens"
        )


# ----------------------------------------------------------- chunks and cost order
def test_chunks_and_cost_order_give_the_same_numbers():
    # uneven systems (V = I, tokens of different spreads): chunks of 3 sorted by a cost
    # estimate (here the step counts of the plain run, reversed) return every system's
    # own solve, in the given order, on one device and on two
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    x0 = RNG.uniform(-1, 1, (7, 8, 2)) * np.linspace(0.3, 1.5, 7)[:, None, None]
    a = af.simulate(m, x0, 4.0)
    steps = np.asarray(a.stats["num_steps"])
    assert steps.max() > steps.min()
    for kw in ({"chunk": 3, "cost": -steps}, {"chunk": 3, "cost": steps, "devices": "all"}):
        b = af.simulate(m, x0, 4.0, **kw)
        np.testing.assert_allclose(np.asarray(b.z), np.asarray(a.z), rtol=1e-12, atol=1e-13)
        np.testing.assert_array_equal(b.stats["num_steps"], steps)
    with pytest.raises(ValueError, match="cost must hold one number per system"):
        af.simulate(m, x0, 4.0, cost=steps[:3])
    with pytest.raises(ValueError, match="chunk must be"):
        af.simulate(m, x0, 4.0, chunk=0)
    with pytest.raises(ValueError, match="adaptive"):
        af.simulate(m, x0, 4.0, method="euler", dt=0.1, chunk=2)
