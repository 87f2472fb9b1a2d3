"""Property-based numerics: random model families x kernels x masks x frames against the
plain-numpy oracle of ``tests/reference.py`` (loops and Taylor ``expm``, no attnflow code).

Hypothesis draws a family (``Attention`` with a square or rectangular head,
``MultiHeadAttention`` with one to three heads, ``IsotropicAttention``, a ``Block`` with
or without a ``FeedForward``), any kernel of ``attnflow.kernels.KERNELS`` with drawn
parameters, a mask (none, causal, window, ALiBi with one slope or one per head, RoPE alone
or around a causal or ALiBi mask, StreamingLLM's sink-plus-window), small random weights
and tokens (sizes from a short fixed list: shapes drive compilation) and a frame and
method, and checks in float64:

1. ``model.attention(x)`` head by head against ``reference.kernel_weights`` to 1e-12, and
   ``model.vector_field(x)``; the invariants of every row-stochastic kernel (rows sum to
   one, entries >= 0) and of every mask (the dropped entries are exactly 0, under every
   kernel);
2. a few Euler layers (``method="euler"``) and Euler steps of the ODE (``"euler-ode"``)
   in the original frame, and the layer-norm layers (``post``, ``pre``, ``peri``,
   ``ngpt``) and ODE steps of the sphere frame, against numpy to 1e-11 at every save;
3. the rescaled frame with the model's rescaling matrix W (``V``, the identity, the sum
   of the heads' ``V_h``): ``x = e^{tW} z`` (Taylor ``expm``) at every save of an
   ``euler-ode`` run, ``x^k = (I + dt W)^k z^k`` of a layer run, and the tokens of both
   against numpy (the original frame's layers; the rescaled ODE's own Euler steps).

What the library refuses is asserted to be a ``ValueError`` naming the argument: any mask
with ``differential``; ALiBi or RoPE with ``linear`` and ``linearnorm`` (weights that are
the logits themselves: a bias or a rotation makes them negative, and linearnorm's row sum
can pass through 0); an odd head size with ``differential`` or RoPE (at first use); the
rescaled frame for one head whose rows need not sum to one (``frame='original'``). Draws
whose numpy run does not stay within ``|x| < 100`` (usa and linear blow up in finite
time) are discarded, not compared; ``traj.attention(k)`` is checked against numpy at the saved
tokens.

The default tests run few examples at small sizes (about 30 s on one core, less with the
suite's compilation cache warm); the ``slow`` ones more examples, larger sizes, and the
adaptive solver against the numpy RK4 in both frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import reference as ref
from hypothesis import HealthCheck, assume, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow import kernels as K
from attnflow import masks

FAMILIES = ("Attention", "MultiHeadAttention", "IsotropicAttention", "Block", "Block+FeedForward")
# sizes: a short list each (every new shape is a new program to compile)
SMALL = {"ns": (2, 5, 7), "ds": (1, 2, 4), "heads": (1, 2)}
LARGE = {"ns": (2, 3, 4, 6, 7, 12), "ds": (1, 2, 3, 4, 6), "heads": (1, 2, 3)}
ROPE_BASES = (10.0, 10000.0)  # a static field: each base is a program of its own
DT, LAYERS = 0.125, 3
TS = DT * np.arange(LAYERS + 1)
# the kernels whose field is smooth in the tokens, so that RK4 keeps its order (the
# adaptive test also leaves out relu feed-forward layers), and does not blow up in finite
# time (usa and linear can)
SMOOTH = (
    "softmax",
    "qknorm",
    "ssmax",
    "sigmoid",
    "linearnorm",
    "stickbreaking",
    "differential",
    "offbyone",
    "prenorm",
    "sink",
    "qknorm_sink",
    "sinkhorn",
)


def _settings(n: int) -> Any:
    return settings(
        max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


# ------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    """One drawn model and its tokens; the arrays follow from ``seed`` and the scales."""

    family: str
    kernel: str
    params: tuple  # ((name, value), ...): the kernel's parameters
    mask: Any  # the reference's spelling (reference.mask_keep)
    n: int
    d: int
    p: int  # head size (queries and keys)
    heads: int
    beta: float
    qk_scale: float
    v_scale: float
    x_scale: float
    activation: str
    seed: int

    def arrays(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        h, p, d = self.heads, self.p, self.d
        if self.family == "IsotropicAttention":
            Q = Kk = V = np.eye(d)[None]
        else:
            Q = self.qk_scale * rng.normal(size=(h, p, d)) / math.sqrt(d)
            Kk = self.qk_scale * rng.normal(size=(h, p, d)) / math.sqrt(d)
            V = self.v_scale * rng.normal(size=(h, d, d)) / math.sqrt(d)
        return {
            "Q": Q,
            "K": Kk,
            "V": V,
            "x": self.x_scale * rng.normal(size=(self.n, d)),
            "W1": 0.5 * rng.normal(size=(3, d)),
            "b1": 0.2 * rng.normal(size=3),
            "W2": 0.5 * rng.normal(size=(d, 3)),
            "b2": 0.2 * rng.normal(size=d),
        }

    @property
    def rope(self) -> bool:
        return isinstance(self.mask, tuple) and self.mask[0] == "rope"


def _kernel_params(kernel: str, p: int) -> st.SearchStrategy:
    gains = st.one_of(st.none(), st.tuples(*[st.floats(0.5, 1.5)] * p))
    if kernel == "ssmax":
        return st.tuples(st.tuples(st.just("s"), st.floats(0.5, 2.0)))
    if kernel == "sink":
        return st.tuples(st.tuples(st.just("b"), st.floats(-2.0, 2.0)))
    if kernel == "qknorm":
        return st.tuples(st.tuples(st.just("wq"), gains), st.tuples(st.just("wk"), gains))
    if kernel == "qknorm_sink":
        return st.tuples(
            st.tuples(st.just("wq"), gains),
            st.tuples(st.just("wk"), gains),
            st.tuples(st.just("b"), st.floats(-2.0, 2.0)),
        )
    if kernel == "differential":
        return st.tuples(st.tuples(st.just("lam"), st.floats(0.0, 0.6)))
    if kernel == "entmax":  # alpha and iters are static: a short list
        return st.tuples(st.tuples(st.just("alpha"), st.sampled_from((1.5, 2.0, 3.0))))
    if kernel == "sinkhorn":
        return st.tuples(st.tuples(st.just("iters"), st.sampled_from((1, 3))))
    return st.just(())


def _masks(heads: int) -> st.SearchStrategy:
    slope = st.floats(0.0, 1.0)
    slopes = slope if heads == 1 else st.one_of(slope, st.tuples(*[slope] * heads))
    alibi = st.builds(lambda s: ("alibi", s), slopes)
    small = st.sampled_from((0, 1, 2))
    return st.one_of(
        st.none(),
        st.just("causal"),
        st.builds(lambda w: ("window", w), small),
        alibi,
        st.builds(
            lambda b, m: ("rope", b, m),
            st.sampled_from(ROPE_BASES),
            st.one_of(st.none(), st.just("causal"), alibi),
        ),
        st.builds(lambda s, w: ("sinkwindow", s, w), small, small),
    )


@st.composite
def cases(draw, ns, ds, heads, kernels=K.KERNELS, activations=("relu", "gelu", "tanh")) -> Case:
    family = draw(st.sampled_from(FAMILIES))
    kernel = draw(st.sampled_from(kernels))
    d = draw(st.sampled_from(ds))
    h = draw(st.sampled_from(heads)) if family == "MultiHeadAttention" else 1
    p = d if family == "IsotropicAttention" else draw(st.sampled_from(sorted({d, 2})))
    return Case(
        family=family,
        kernel=kernel,
        params=draw(_kernel_params(kernel, p)),
        mask=draw(_masks(h)),
        n=draw(st.sampled_from(ns)),
        d=d,
        p=p,
        heads=h,
        beta=draw(st.floats(0.2, 2.0)),
        qk_scale=draw(st.floats(0.3, 1.5)),
        v_scale=draw(st.floats(0.1, 1.0)),
        x_scale=draw(st.floats(0.3, 2.0)),
        activation=draw(st.sampled_from(activations)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


# ------------------------------------------------------------------ the library's model
def _mask_object(spec: Any) -> Any:
    if spec is None:
        return None
    if spec == "causal":
        return masks.Causal()
    kind = spec[0]
    if kind == "window":
        return masks.Window(spec[1])
    if kind == "alibi":
        return masks.ALiBi(np.asarray(spec[1], np.float64))
    if kind == "rope":
        return masks.RoPE(spec[1], _mask_object(spec[2]))
    return masks.SinkWindow(spec[1], spec[2])


def _kernel_object(case: Case) -> Any:
    if not case.params:  # the named kernel's defaults
        return case.kernel
    p = dict(case.params)
    gains = {k: None if p.get(k) is None else np.asarray(p[k]) for k in ("wq", "wk")}
    if case.kernel == "ssmax":
        return K.SSMax(s=p["s"])
    if case.kernel == "sink":
        return K.Sink(b=p["b"])
    if case.kernel == "qknorm":
        return K.QKNorm(**gains)
    if case.kernel == "qknorm_sink":
        return K.QKNormSink(**gains, b=p["b"])
    if case.kernel == "differential":
        return K.Differential(lam=p["lam"])
    if case.kernel == "entmax":
        return K.Entmax(alpha=p["alpha"])
    if case.kernel == "sinkhorn":
        return K.Sinkhorn(iters=p["iters"])
    return case.kernel


def build(case: Case) -> Any:
    A = case.arrays()
    common = {"beta": case.beta, "kernel": _kernel_object(case), "mask": _mask_object(case.mask)}
    if case.family == "MultiHeadAttention":
        return af.MultiHeadAttention(A["Q"], A["K"], A["V"], **common)
    if case.family == "IsotropicAttention":
        return af.IsotropicAttention(case.d, **common)
    head = af.Attention(A["Q"][0], A["K"][0], A["V"][0], rectangular=case.p != case.d, **common)
    if case.family == "Attention":
        return head
    if case.family == "Block":
        return af.Block(head)
    ffn = af.FeedForward(A["W1"], A["b1"], A["W2"], A["b2"], activation=case.activation)
    return af.Block(head, ffn)


def refusal(case: Case) -> tuple[str, str] | None:
    """``(when, message pattern)`` of a combination the library refuses, else ``None``:
    at construction (``"build"``) or at first use (``"use"``)."""
    if case.kernel == "differential" and case.mask is not None:
        return "build", r"kernel 'differential' takes no mask.*use mask=None"
    if case.kernel in ("linear", "linearnorm") and _mask_name(case.mask).startswith(
        ("alibi", "rope")
    ):
        return "build", rf"kernel '{case.kernel}' takes no mask that biases or turns the logits"
    if case.kernel == "differential" and case.p % 2:
        return "use", r"'differential' splits the head.*head size p must be even"
    if case.rope and case.p % 2:
        return "use", r"RoPE rotates 2-planes.*dimension must be even"
    return None


def _mask_name(spec: Any) -> str:
    if spec is None or isinstance(spec, str):
        return str(spec)
    return spec[0] if spec[0] != "rope" else f"rope({_mask_name(spec[2])})"


def build_or_refuse(case: Case) -> Any:
    """The model, or ``None`` after asserting the refusal at construction."""
    why = refusal(case)
    if currently_in_test_context():  # the coverage: pytest --hypothesis-show-statistics
        for what in (case.family, case.kernel, f"mask {_mask_name(case.mask)}"):
            event(what)
        if why is not None:
            event(f"refused: {why[1]}")
    if why is not None and why[0] == "build":
        with pytest.raises(ValueError, match=why[1]):
            build(case)
        return None
    return build(case)


# --------------------------------------------------------------------- numpy oracle
def _head_mask(spec: Any, h: int) -> Any:
    """Head ``h``'s mask: its own ALiBi slope where there is one per head."""
    if isinstance(spec, tuple) and spec[0] == "alibi" and isinstance(spec[1], tuple):
        return ("alibi", spec[1][h])
    if isinstance(spec, tuple) and spec[0] == "rope":
        return ("rope", spec[1], _head_mask(spec[2], h))
    return spec


def np_weights(case: Case, x: np.ndarray) -> np.ndarray:
    """``(heads, n, n)``: every head's attention matrix."""
    A = case.arrays()
    return np.stack(
        [
            ref.kernel_weights(
                case.kernel,
                x,
                A["Q"][h],
                A["K"][h],
                case.beta,
                mask=_head_mask(case.mask, h),
                **dict(case.params),
            )
            for h in range(case.heads)
        ]
    )


def np_attention_field(case: Case, x: np.ndarray) -> np.ndarray:
    V = case.arrays()["V"]
    P = np_weights(case, x)
    return sum(P[h] @ x @ V[h].T for h in range(case.heads))


def np_feedforward(case: Case, x: np.ndarray) -> np.ndarray:
    A = case.arrays()
    u = x @ A["W1"].T + A["b1"][None, :]
    if case.activation == "relu":
        a = np.maximum(u, 0.0)
    elif case.activation == "tanh":
        a = np.tanh(u)
    else:  # the exact GELU, u Phi(u)
        a = 0.5 * u * (1.0 + np.vectorize(math.erf)(u / math.sqrt(2.0)))
    return a @ A["W2"].T + A["b2"][None, :]


def np_field(case: Case, x: np.ndarray) -> np.ndarray:
    out = np_attention_field(case, x)
    return out + np_feedforward(case, x) if case.family == "Block+FeedForward" else out


def np_layer(case: Case, x: np.ndarray, dt: float) -> np.ndarray:
    """One residual layer: the attention sub-step, then the feed-forward one."""
    y = x + dt * np_attention_field(case, x)
    return y + dt * np_feedforward(case, y) if case.family == "Block+FeedForward" else y


def np_rescaling(case: Case) -> np.ndarray:
    """The rescaling matrix W of the rescaled frame: V, I, or the sum of the V_h."""
    return case.arrays()["V"].sum(axis=0)


def _normalize(u: np.ndarray) -> np.ndarray:
    r = np.sqrt(np.sum(u * u, axis=1, keepdims=True))
    return np.where(r > 0, u / np.where(r > 0, r, 1.0), 0.0)


def np_run(case: Case, frame: str, method: str, layernorm: str = "post") -> np.ndarray:
    """The tokens at ``TS`` of forward Euler (layers or the ODE) in ``frame``."""
    y = np.array(case.arrays()["x"], np.float64)
    if frame == "sphere":
        y = _normalize(y)
    W = np_rescaling(case)
    out = []
    for k in range(LAYERS + 1):
        if frame == "rescaled":  # y is z; x = e^{tW} z
            E = ref.expm(k * DT * W)
            out.append(y @ E.T)
        else:
            out.append(_normalize(y) if frame == "sphere" else y.copy())
        if k == LAYERS:
            break
        if frame == "original":
            y = np_layer(case, y, DT) if method == "euler" else y + DT * np_field(case, y)
        elif frame == "rescaled":  # the ODE dz/dt = e^{-tW} F(e^{tW} z) - W z
            F = np_field(case, y @ E.T)
            y = y + DT * (np.linalg.solve(E, F.T).T - y @ W.T)
        elif method == "euler-ode":  # dy_i/dt = |y_i| Proj_{x_i} F(x)_i, x = N(y)
            x = _normalize(y)
            g = np_field(case, x)
            tangent = g - np.sum(x * g, axis=1, keepdims=True) * x
            y = y + DT * np.sqrt(np.sum(y * y, axis=1, keepdims=True)) * tangent
        elif layernorm == "post":
            y = _normalize(np_layer(case, y, DT))
        elif layernorm == "pre":
            y = y + DT * np_field(case, _normalize(y))
        elif layernorm == "peri":
            y = y + DT * _normalize(np_field(case, _normalize(y)))
        elif layernorm == "mix":  # post on the first quarter of the layers, pre after
            if k < round(0.25 * LAYERS):
                y = _normalize(np_layer(case, y, DT))
            else:
                y = y + DT * np_field(case, _normalize(y))
        elif layernorm == "scaled":  # pre, the normalised stream over sqrt(depth)
            y = y + DT * np_field(case, _normalize(y) / np.sqrt(k + 1))
        else:  # ngpt
            y = _normalize(y + 0.2 * DT * _normalize(np_field(case, y)))
    return np.array(out)


# ------------------------------------------------------------------------ the checks
def _close(got: Any, want: np.ndarray, rtol: float, what: str) -> None:
    """Entry-wise to ``rtol``, relative to the entry or to the array's largest entry."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def bounded(xs: np.ndarray) -> bool:
    """Whether the numpy run stays in a bounded region (the unnormalised kernels, usa and
    linear, can blow up in finite time; such draws are discarded, not compared)."""
    with np.errstate(all="ignore"):
        return bool(np.all(np.isfinite(xs)) and np.max(np.abs(xs)) < 1e2)


def _refused_at_use(case: Case, call: Any) -> bool:
    why = refusal(case)
    if why is None:
        return False
    with pytest.raises(ValueError, match=why[1]):
        call()
    return True


def _close_attention(traj: Any, case: Case) -> None:
    """``traj.attention(k)`` is the numpy attention of the saved tokens ``traj.x[k]``."""
    for k in (0, LAYERS):
        P = np.asarray(traj.attention(k), np.float64)
        want = np_weights(case, np.asarray(traj.x[k], np.float64))
        _close(P if P.ndim == 3 else P[None], want, 1e-12, f"traj.attention({k})")


def check_attention(case: Case) -> None:
    model = build_or_refuse(case)
    if model is None:
        return
    x = case.arrays()["x"]
    if _refused_at_use(case, lambda: model.attention(x)):
        _refused_at_use(case, lambda: model.vector_field(x))
        return
    P = np.asarray(model.attention(x), np.float64)
    P = P if P.ndim == 3 else P[None]
    want = np_weights(case, x)
    _close(P, want, 1e-12, "attention")
    _close(model.vector_field(x), np_field(case, x), 1e-12, "vector_field")

    n = case.n
    for h in range(case.heads):
        keep = ref.mask_keep(_head_mask(case.mask, h), n)
        if case.kernel == "selective":  # causal always
            keep &= np.tril(np.ones((n, n), bool))
        assert np.all(P[h][~keep] == 0.0), "a dropped entry is not exactly 0"
        if not K.row_stochastic(case.kernel):
            continue
        np.testing.assert_allclose(P[h].sum(axis=-1), 1.0, rtol=0, atol=1e-13)
        assert np.all(P[h] >= 0.0), "a row-stochastic kernel gave a negative weight"


def check_layers(case: Case, frame: str, method: str, layernorm: str) -> None:
    model = build_or_refuse(case)
    if model is None:
        return
    x0 = case.arrays()["x"]
    kw = {"layernorm": layernorm} if frame == "sphere" and method == "euler" else {}

    def run():
        return af.simulate(model, x0, TS[-1], ts=TS, frame=frame, method=method, dt=DT, **kw)

    if _refused_at_use(case, run):
        return
    with np.errstate(all="ignore"):
        want = np_run(case, frame, method, layernorm)
    assume(bounded(want))
    traj = run()
    assert traj.status == "ok", traj.status
    _close(traj.x, want, 1e-11, f"{frame} {method} tokens")
    _close_attention(traj, case)


def check_rescaled(case: Case, method: str) -> None:
    model = build_or_refuse(case)
    if model is None:
        return
    x0 = case.arrays()["x"]

    def run():
        return af.simulate(model, x0, TS[-1], ts=TS, frame="rescaled", method=method, dt=DT)

    one_head = case.family in ("Attention", "IsotropicAttention")
    if one_head and not K.row_stochastic(case.kernel):  # refused first, by the frame
        with pytest.raises(ValueError, match="not row-stochastic.*frame='original'"):
            run()
        return
    if _refused_at_use(case, run):
        return
    with np.errstate(all="ignore"):
        want = np_run(case, "original" if method == "euler" else "rescaled", method)
    assume(bounded(want))
    traj = run()
    assert traj.status == "ok", traj.status
    x, z = np.asarray(traj.x), np.asarray(traj.z)
    W = np_rescaling(case)
    # the propagator is accurate to rounding times the condition of W's eigenbasis
    cond = float(np.linalg.cond(np.linalg.eig(W)[1]))
    for k in range(LAYERS + 1):
        if method == "euler":
            M = np.linalg.matrix_power(np.eye(case.d) + DT * W, k)
        else:
            M = ref.expm(k * DT * W)
        _close(x[k], z[k] @ M.T, 1e-13 * max(10.0, cond), f"x = M z at save {k}")
    _close(x, want, 1e-12 * max(10.0, cond), f"rescaled {method} tokens")
    _close_attention(traj, case)


def check_adaptive(case: Case, frame: str) -> None:
    """The adaptive solver at tight tolerances against the numpy RK4 of the field."""
    model = build_or_refuse(case)
    if model is None:
        return
    x0 = case.arrays()["x"]
    one_head = case.family in ("Attention", "IsotropicAttention")
    if frame == "rescaled" and one_head and not K.row_stochastic(case.kernel):
        frame = "original"

    def run():
        return af.simulate(model, x0, TS[-1], ts=TS, frame=frame, rtol=1e-11, atol=1e-11)

    if _refused_at_use(case, run):
        return
    with np.errstate(all="ignore"):
        want = ref.rk4(lambda t, y: np_field(case, y), x0, TS, DT / 32)
    assume(bounded(want))
    traj = run()
    assert traj.status == "ok", traj.status
    _close(traj.x, want, 1e-8, f"adaptive, {frame} frame")


# -------------------------------------------------------------------------- the tests
EVERY_MASK = (
    None,
    "causal",
    ("window", 1),
    ("alibi", 0.3),
    ("alibi", (0.3, 0.05)),
    ("rope", 10.0, None),
    ("rope", 10000.0, "causal"),
    ("rope", 10.0, ("alibi", 0.2)),
    ("sinkwindow", 1, 2),
)


def _every_case(family: str, kernel: str, mask: Any, d: int) -> Case:
    heads = 2 if family == "MultiHeadAttention" else 1
    if isinstance(mask, tuple) and mask[0] == "alibi" and isinstance(mask[1], tuple):
        mask = mask if heads == 2 else ("alibi", mask[1][0])
    return Case(family, kernel, (), mask, 6, d, d, heads, 0.9, 1.0, 0.5, 1.0, "gelu", 5)


@pytest.mark.parametrize("family", ["Attention", "MultiHeadAttention"])
def test_every_kernel_and_mask_is_taken_or_refused_by_name(family):
    """The refusal table, whole: every kernel under every mask, odd and even head size,
    is built (construction only, nothing is compiled) or refused as ``refusal`` says."""
    for kernel in K.KERNELS:
        for mask in EVERY_MASK:
            for d in (1, 2):
                case = _every_case(family, kernel, mask, d)
                why = refusal(case)
                if why is not None and why[0] == "build":
                    with pytest.raises(ValueError, match=why[1]):
                        build(case)
                else:
                    build(case)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Attention", "MultiHeadAttention", "Block+FeedForward"])
def test_every_kernel_and_mask_matches_numpy(family):
    """Every kernel under every mask once, at one size, through ``check_attention``."""
    for kernel in K.KERNELS:
        for mask in EVERY_MASK:
            for d in (1, 4):
                check_attention(_every_case(family, kernel, mask, d))


@_settings(20)
@given(case=cases(**SMALL))
def test_attention_matches_numpy(case):
    check_attention(case)


@_settings(6)
@given(
    case=cases(**SMALL),
    frame=st.sampled_from(("original", "sphere")),
    method=st.sampled_from(("euler", "euler-ode")),
    layernorm=st.sampled_from(af.dynamics.frames.LAYERNORMS),
)
def test_euler_layers_match_numpy(case, frame, method, layernorm):
    check_layers(case, frame, method, layernorm)


@_settings(5)
@given(case=cases(**SMALL), method=st.sampled_from(("euler", "euler-ode")))
def test_rescaled_frame_is_the_original_rescaled(case, method):
    check_rescaled(case, method)


@pytest.mark.slow
@_settings(300)
@given(case=cases(**LARGE))
def test_attention_matches_numpy_long(case):
    check_attention(case)


@pytest.mark.slow
@_settings(100)
@given(
    case=cases(**LARGE),
    frame=st.sampled_from(("original", "sphere")),
    method=st.sampled_from(("euler", "euler-ode")),
    layernorm=st.sampled_from(af.dynamics.frames.LAYERNORMS),
)
def test_euler_layers_match_numpy_long(case, frame, method, layernorm):
    check_layers(case, frame, method, layernorm)


@pytest.mark.slow
@_settings(80)
@given(case=cases(**LARGE), method=st.sampled_from(("euler", "euler-ode")))
def test_rescaled_frame_is_the_original_rescaled_long(case, method):
    check_rescaled(case, method)


@pytest.mark.slow
@_settings(20)
@given(
    case=cases(**SMALL, kernels=SMOOTH, activations=("gelu", "tanh")),
    frame=st.sampled_from(("original", "rescaled")),
)
def test_adaptive_solver_matches_numpy_rk4(case, frame):
    check_adaptive(case, frame)
