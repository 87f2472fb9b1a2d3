"""GPU-safe numbers: every matmul of the fields and the analyses asks for full float32
precision (``precision=HIGHEST`` on each ``dot_general`` of the traced program: GPUs run
float32 products in TF32 otherwise), and the figures runner starts its workers with
XLA's deterministic GPU ops."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

import attnflow as af
from attnflow.analysis import _rank_numerics, hardmax
from attnflow.analysis.dispersion import _qk_stats
from attnflow.dynamics import kernels
from attnflow.dynamics.fields.circle import choose_field
from attnflow.dynamics.frames import make_frame
from attnflow.dynamics.terms import FlowTerm, layer_term
from attnflow.experiments import runner

HIGHEST = jax.lax.Precision.HIGHEST


def _dots(jaxpr) -> list:
    """The ``precision`` of every ``dot_general`` in a program, its sub-programs too
    (``pjit``, ``scan``, ``while``, ``cond``, ``shard_map``, custom rules)."""
    found = []

    def walk(j: Jaxpr) -> None:
        for eqn in j.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(eqn.params.get("precision"))
            for p in eqn.params.values():
                for q in p if isinstance(p, (list, tuple)) else (p,):
                    if isinstance(q, ClosedJaxpr):
                        walk(q.jaxpr)
                    elif isinstance(q, Jaxpr):
                        walk(q)

    walk(jaxpr.jaxpr)
    return found


def assert_highest(fn, *args) -> int:
    """Every product of ``fn(*args)`` traced at HIGHEST; returns how many there are."""
    found = _dots(jax.make_jaxpr(fn)(*args))
    assert found, "no matmul traced: the walk found no dot_general"
    low = [p for p in found if p is None or any(q != HIGHEST for q in p)]
    assert not low, f"{len(low)} of {len(found)} products below HIGHEST: {low}"
    return len(found)


RNG = np.random.default_rng(0)
D = 4
I4 = np.eye(D, dtype=np.float32)
V4 = (0.5 * I4 + 0.1 * RNG.standard_normal((D, D))).astype(np.float32)
X = jnp.asarray(RNG.standard_normal((24, D)), jnp.float32)


def _model(kernel: str, **kw):
    return af.Attention(I4, I4, V4, beta=0.5, kernel=kernel, **kw)


@pytest.mark.parametrize("kernel", kernels.KERNELS)
def test_the_field_of_every_kernel_asks_for_full_precision(kernel):
    """float32, each built-in kernel, through the term a solver integrates, in every
    frame that takes it (the rescaled frame needs rows that sum to one)."""
    model = _model(kernel)
    frames = ["original", "sphere"] + (["rescaled"] if model.rows_sum_to_one else [])
    for name in frames:
        fr = make_frame(name, model)
        y = fr.initial_state(X)
        assert_highest(lambda y, fr=fr: FlowTerm(fr).field(jnp.float32(0.3), y), y)


def test_tiled_masked_and_gradient_paths_ask_for_full_precision():
    """The tiled path (blocks of query rows), a causal mask, standard rescaled
    coordinates (``e^{tV}`` by ``expm``) and the gradient's products."""
    q = k = v = jnp.asarray(RNG.standard_normal((64, D)), jnp.float32)
    soft = kernels.get("softmax")
    assert_highest(lambda q: kernels.attend_with(soft, q, k, 0.5, v, block=16), q)
    causal = _model("softmax", mask="causal")
    assert_highest(causal.vector_field, X)
    fr = make_frame("rescaled", af.Attention(I4, I4, V4, beta=0.5, propagator="expm"))
    assert_highest(lambda y: FlowTerm(fr).field(jnp.float32(0.3), y), fr.initial_state(X))
    model = _model("softmax")
    assert_highest(jax.grad(lambda x: jnp.sum(model.vector_field(x) ** 2)), X)


def test_multi_head_circle_and_gated_fields_ask_for_full_precision():
    heads = RNG.standard_normal((2, D, D)).astype(np.float32)
    mha = af.MultiHeadAttention(heads, heads, heads * 0.1, beta=0.5)
    assert_highest(mha.vector_field, X)
    plane = af.Attention(
        np.eye(2, dtype=np.float32),
        np.eye(2, dtype=np.float32),
        np.eye(2, dtype=np.float32),
        beta=4.0,
    )
    circle, how = choose_field(plane, 8, prefer="circle")
    assert how["field"] == "circle"
    t = jnp.linspace(0, 6.0, 8, dtype=jnp.float32)
    assert_highest(circle.vector_field, jnp.stack([jnp.cos(t), jnp.sin(t)], -1))


def test_the_analyses_ask_for_full_precision():
    """What the analyses compute in JAX: dispersion's rows, the rank statistics, the
    hardmax logits (everything else in ``attnflow.analysis`` is numpy, float64)."""
    model = _model("softmax")
    rows = jnp.arange(X.shape[0])

    def disp(x):
        q, k = model.queries_keys(x)
        return _qk_stats(model, x, q, k, rows, 1, 8)

    assert_highest(disp, X)
    assert_highest(lambda x: _rank_numerics.traj_stats(model, x, False), X[None])
    assert_highest(lambda x: hardmax._head_logits(model, x), X[None])


def test_figure_workers_start_with_deterministic_gpu_ops(monkeypatch):
    """The flag reaches a worker's environment (a fresh interpreter), added to the
    caller's own XLA_FLAGS; a setting the caller made is kept."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    env = runner.worker_env()
    assert env["XLA_FLAGS"].split() == [
        "--xla_cpu_enable_fast_math=false",
        "--xla_gpu_deterministic_ops=true",
    ]
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")
    assert runner.worker_env()["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false"
    monkeypatch.delenv("XLA_FLAGS")
    from attnflow import _parallel

    with _parallel.process_pool(1, env=runner.worker_env()) as pool:
        # os.getenv, not os.environ.get: that method would carry this process's mapping
        seen = pool.submit(os.getenv, "XLA_FLAGS").result(timeout=120)
    assert seen == "--xla_gpu_deterministic_ops=true"


def test_a_layer_and_its_clock_ask_for_full_precision():
    """Residual layers in standard rescaled coordinates: the step and ``R^k``, the flow
    matrix the layer loop carries (``LayerTerm.tick``)."""
    fr = make_frame("rescaled", _model("softmax"), coords="standard")
    term = layer_term(fr, 0.25, jnp.float32)
    assert term.carries_flow

    def one(y):
        setup = term.setup()
        clock = term.tick(setup, term.start(setup))
        return term.step(setup, clock, y), clock[1]

    assert_highest(one, fr.initial_state(X))
