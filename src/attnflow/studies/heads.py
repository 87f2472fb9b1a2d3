"""Real trained heads against the theorems: every head of a BERT-style checkpoint tested
(``analyze_heads``), and each head's dynamics run from the model's own input embeddings
(``head_dynamics``). Loading the heads and embeddings is ``attnflow.io.checkpoints``;
its names are importable from here as well, and so is ``reduced_triple``
(``_head_reduction``).

A head ``(Q_h, K_h, V_h, beta)`` in the convention of ``attnflow.io.checkpoints``
(``Q_h, K_h`` are ``(d_h, d)``, ``V_h = W_O[:, r_h] @ W_V[r_h, :]`` is ``(d, d)`` of rank
``<= d_h``, ``beta = 1/sqrt(d_h)``). ``attnflow.Attention(Q_h, K_h, V_h, beta=beta,
rectangular=True)`` runs the query and key maps as they are (the logits only involve
``Q_h^T K_h``, a ``(d, d)`` matrix of rank ``<= d_h``). Consequences worth knowing:

- ``V_h`` has the eigenvalue 0 with multiplicity ``>= d - d_h``; the other eigenvalues
  are those of the ``(d_h, d_h)`` matrix ``W_V[r_h] W_O[:, r_h]``. The leading one may
  still be real, positive, simple and dominant: the hyperplane theorem can apply.
- ``sym(Q_h^T K_h)`` has rank ``<= 2 d_h < d``, so it is never positive definite: the
  polytope and paranormal ("subspace") theorems can never apply to a head with
  ``d_h < d``; only "hyperplanes" or "unclassified" are possible.
- ``beta > 0`` multiplies every logit and changes no hypothesis (the sign of
  ``<Q phi_1, K phi_1>`` and the definiteness of ``Q^T K`` are scale-free); it is
  recorded and used in the dynamics.

The four hypotheses on lambda_1 (real, positive, simple, dominant) are those of
``attnflow.analysis.regimes.leading_eigenvalue``, the one decision that
``predict_regime`` and the Ginibre study use too.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

from .. import _checks
from ..analysis.regimes import LABELS, Regime
from ..dynamics.trajectory import Status
from ..io.checkpoints import (
    MINILM_INSTALL,
    MINILM_PACKAGE,
    HeadWeights,
    bert_embeddings,
    input_embeddings,
    load_bert_heads,
    load_embedding_weights,
    load_tokenizer,
    read_config,
    read_safetensors,
    resolve_checkpoint,
    tokenize,
    write_safetensors,
)
from ..io.layouts import TrainedHead, load_heads
from ._head_layout import head_regime as _head_regime
from ._head_reduction import reduced_triple

__all__ = [
    "HeadReport",
    "HeadsAnalysis",
    "HeadRun",
    "DEFAULT_SENTENCES",
    "analyze_heads",
    "reduced_triple",
    "choose_t1",
    "head_dynamics",
    # loading (attnflow.io.checkpoints), importable from here too
    "HeadWeights",
    "MINILM_PACKAGE",
    "MINILM_INSTALL",
    "resolve_checkpoint",
    "read_safetensors",
    "write_safetensors",
    "read_config",
    "load_bert_heads",
    "load_embedding_weights",
    "load_tokenizer",
    "tokenize",
    "bert_embeddings",
    "input_embeddings",
]

#: Sentences of the dynamics study. Any text works; these four tokenise to 10 tokens each
#: with the MiniLM tokenizer ([CLS] + 8 word pieces + [SEP]), so that they integrate as
#: one batch (one compilation instead of one per length).
DEFAULT_SENTENCES = (
    "The cat sat on the warm mat.",
    "Attention is all that you really need.",
    "Tokens move like particles over time.",
    "Clusters emerge in self-attention dynamics.",
)


# ================================================================ analysis of heads
@dataclasses.dataclass(frozen=True)
class HeadReport:
    """What the theorems need to know about one head (``analyze_heads``).

    Attributes:
        layer, head: indices.
        lambda1: V_h's eigenvalue of largest modulus (complex).
        lambda1_abs: its modulus; lambda2_abs: the largest modulus outside lambda1's
            numerical cluster (for a complex lambda1 that is its conjugate).
        real, positive, simple, dominant: the four spectral hypotheses of the hyperplane
            theorem, decided with the tolerances of ``attnflow.analysis.regimes``.
        spectral: all four hold (the hypothesis counted by ``ginibre_fraction``).
        qk_phi1: ``<Q phi_1, K phi_1>`` for the unit eigenvector phi_1 when lambda1 is real
            and simple (else None); its sign is what the theorem needs.
        qk_pd: whether sym(Q^T K) is positive definite (never, when d_h < d).
        label, theorem, reason: ``predict_regime`` of the head as its layout runs it
            (``TrainedHead.attention()``: its mask, positions and kernel): a theorem's
            label only for unmasked, position-free softmax; a causal, rotary or
            QK-normed head is "unclassified", the reason saying so.
        beta: the head's inverse temperature (recorded; it changes no label).
        rank_V: numerical rank of V_h; n_positive: eigenvalues with positive real part.
        logit_bound: for a head with learned QK-norm gains (Llama-style layouts: Qwen3,
            OLMo-2), ``B`` with every logit in ``[-B, B]`` whatever the tokens
            (``TrainedHead.logit_bound``; per head ``beta p max|w_q| max|w_k|``,
            ``attnflow.kernels.qknorm_logit_bound``), else None; logit_spread: ``2 B``,
            the most a row of logits can spread, a cap that the softmax dynamics of the
            theorems (whose logits grow without bound) do not have.
    """

    layer: int
    head: int
    lambda1: complex
    lambda1_abs: float
    lambda2_abs: float
    real: bool
    positive: bool
    simple: bool
    dominant: bool
    spectral: bool
    qk_phi1: float | None
    qk_pd: bool
    label: str
    theorem: str | None
    reason: str
    beta: float
    rank_V: int
    n_positive: int
    logit_bound: float | None = None
    logit_spread: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _report(hw: HeadWeights, rtol: float, reduce: bool = True) -> tuple[HeadReport, Regime]:
    Q, K, V, _ = reduced_triple(hw) if reduce else (hw.Q, hw.K, hw.V, hw.d)
    reg = _head_regime(hw, Q, K, V, rtol)
    st = reg.structure
    lead = st.leading  # the four hypotheses on lambda_1, as predict_regime decided them
    w = reg.eigenvalues
    l1 = complex(lead.lambda1)
    real, simple = bool(lead.real), bool(lead.simple)
    qk = None
    if real and simple:
        if st.phi1 is not None:
            phi = st.phi1
        else:  # lambda1 real and simple but not dominant or not positive
            ev, S = np.linalg.eig(V)
            phi = np.real(S[:, int(np.argmin(np.abs(ev - l1)))])
            phi = phi / np.linalg.norm(phi)
        qk = float((Q @ phi) @ (K @ phi))
    pd = next((h.holds for h in reg.hypotheses if h.name.startswith("sym(Q^T K)")), None)
    if pd is None:
        M = Q.T @ K
        scale = float(np.linalg.norm(Q, 2) * np.linalg.norm(K, 2))
        pd = bool(np.linalg.eigvalsh((M + M.T) / 2).min() > rtol * max(scale, 1e-300))
    sv = np.linalg.svd(V, compute_uv=False)
    rank = int((sv > hw.d * np.finfo(float).eps * sv[0]).sum()) if sv[0] > 0 else 0
    bound = hw.logit_bound() if isinstance(hw, TrainedHead) else None
    rep = HeadReport(
        layer=hw.layer,
        head=hw.head,
        lambda1=l1,
        lambda1_abs=abs(l1),
        lambda2_abs=float(lead.lambda2_abs),
        real=real,
        positive=bool(lead.positive),
        simple=simple,
        dominant=bool(lead.dominant),
        spectral=bool(lead.spectral),
        qk_phi1=qk,
        qk_pd=bool(pd),
        label=reg.label,
        theorem=reg.theorem,
        reason=reg.reason,
        beta=float(hw.beta),
        rank_V=rank,
        n_positive=int((np.real(w) > lead.tol).sum()),
        logit_bound=bound,
        logit_spread=None if bound is None else 2.0 * bound,
    )
    return rep, reg


@dataclasses.dataclass(frozen=True)
class HeadsAnalysis:
    """Every head of a checkpoint against the theorems (``analyze_heads``).

    Attributes:
        heads: one ``HeadReport`` per (layer, head), in order.
        counts: ``{label: number of heads}`` over ``attnflow.analysis.regimes.LABELS``.
        hypotheses: heads meeting each hypothesis: ``spectral`` (lambda1 real, positive,
            simple, dominant), ``spectral_and_qk`` (the hyperplane theorem's hypotheses;
            its label only where the head is plain softmax), ``spectral_not_qk``,
            ``qk_pd`` (sym(Q^T K) positive definite),
            ``lambda1_complex``, ``lambda1_negative``, ``lambda1_real_positive``.
        checkpoint, num_layers, num_heads, d_model, d_head, beta, rtol: the setting.
        reduced: whether each head was decided on its ``reduced_triple`` (same answer).
    """

    heads: tuple
    counts: dict
    hypotheses: dict
    checkpoint: str
    num_layers: int
    num_heads: int
    d_model: int
    d_head: int
    beta: float
    rtol: float
    reduced: bool = True
    architecture: str = ""  # TrainedHead.describe() of the first head: layout and extras

    def to_dict(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "heads": [h.to_dict() for h in self.heads],
            "counts": dict(self.counts),
            "hypotheses": dict(self.hypotheses),
            "checkpoint": self.checkpoint,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "beta": self.beta,
            "rtol": self.rtol,
            "reduced": self.reduced,
        }

    def grid(self) -> np.ndarray:
        """``(num_layers, num_heads)`` array of labels (object dtype)."""
        g = np.full((self.num_layers, self.num_heads), "", dtype=object)
        layers = sorted({h.layer for h in self.heads})
        for h in self.heads:
            g[layers.index(h.layer), h.head] = h.label
        return g

    def table(self) -> str:
        """The per-head table and the counts, as plain text."""
        lines = [
            f"checkpoint: {self.checkpoint}",
            f"{self.num_layers} layers x {self.num_heads} heads, d_model = "
            f"{self.d_model}, d_head = {self.d_head}, beta = 1/sqrt({self.d_head}) = "
            f"{self.beta:.4g} (changes no label)",
            *([f"architecture: {self.architecture}"] if self.architecture else []),
            f"{'L':>2} {'H':>2} {'lambda_1':>19} {'|lambda_2|':>10} {'R':>1}{'+':>1}"
            f"{'S':>1}{'D':>1} {'<Qphi,Kphi>':>12}  {'label':<12} reason",
        ]
        for h in self.heads:
            l1 = h.lambda1
            lam = (
                f"{l1.real:+.4f}"
                if h.real
                else f"{l1.real:+.4f}{'+' if l1.imag >= 0 else '-'}{abs(l1.imag):.4f}i"
            )
            flags = "".join("x" if f else "." for f in (h.real, h.positive, h.simple, h.dominant))
            qk = f"{h.qk_phi1:+.4g}" if h.qk_phi1 is not None else "-"
            why = h.reason.split(". (")[0]
            spread = "" if h.logit_spread is None else f" [QK norm: spread <= {h.logit_spread:.4g}]"
            lines.append(
                f"{h.layer:2d} {h.head:2d} {lam:>19} {h.lambda2_abs:10.4f} {flags} "
                f"{qk:>12}  {h.label:<12} {why}{spread}"
            )
        lines.append("flags: R real, + positive, S simple, D dominant (lambda_1 > |lambda_2|)")
        lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        hy = self.hypotheses
        n = len(self.heads)
        lines.append(
            f"hypotheses: spectral (lambda_1 real, positive, simple, dominant) "
            f"{hy['spectral']} of {n}; of these <Q phi_1, K phi_1> > 0 (hyperplane theorem) "
            f"{hy['spectral_and_qk']}, <= 0 {hy['spectral_not_qk']}; sym(Q^T K) positive "
            f"definite {hy['qk_pd']} of {n} (polytope and paranormal theorems); lambda_1 "
            f"complex {hy['lambda1_complex']}, real negative {hy['lambda1_negative']}, real "
            f"positive {hy['lambda1_real_positive']}."
        )
        spreads = [h.logit_spread for h in self.heads if h.logit_spread is not None]
        if spreads:
            lines.append(
                f"QK norm: {len(spreads)} of {n} heads have learned gains; the logits of a "
                f"row spread over at most 2B = {min(spreads):.4g} to {max(spreads):.4g} "
                f"(B = beta sqrt(w_q w_k) max|g_q| max|g_k|, w the widths normalised "
                f"together, p per head): no softmax row gets harder than that."
            )
        return "\n".join(lines)


def analyze_heads(
    checkpoint: str | Path | Sequence[HeadWeights] = "minilm",
    *,
    num_heads: int | None = None,
    rtol: float = 1e-8,
    reader: str = "auto",
    reduce: bool = True,
) -> HeadsAnalysis:
    """Test every head of a checkpoint against the clustering theorems.

    Args:
        checkpoint: ``"minilm"``, a path (see ``resolve_checkpoint``) in any layout of
            ``attnflow.io.layouts`` (BERT, ALBERT, GPT-2, Llama-style), or heads already
            loaded with ``load_heads`` or ``load_bert_heads``.
        num_heads: heads per layer when there is no ``config.json``.
        rtol: relative tolerance of every decision (``predict_regime``).
        reader: see ``read_safetensors``.
        reduce: decide each head on the orthogonally equivalent ``(r + 1)``-dimensional
            triple of ``reduced_triple`` (same answer, 129 instead of 384 dimensions for
            MiniLM: the whole table in about a second rather than 15 s or, with two
            BLAS threads on a busy machine, minutes); ``False`` runs ``predict_regime``
            on the ``d``-dimensional triple itself.

    Returns:
        A ``HeadsAnalysis``: per head the leading eigenvalue of V_h, the four spectral
        hypotheses, ``<Q phi_1, K phi_1>``, the predicted label and its reason; the
        counts per label and per hypothesis. ``beta`` is recorded, never used in a label.
    """
    rtol = _checks.number("rtol", rtol, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if isinstance(checkpoint, (str, Path)):
        heads = load_heads(checkpoint, num_heads=num_heads, reader=reader)
        source = str(resolve_checkpoint(checkpoint))
        name = "minilm" if str(checkpoint).strip().lower() == "minilm" else source
        name = f"{name} ({source})" if name == "minilm" else name
    else:
        heads = list(checkpoint)
        if not heads or not all(isinstance(h, HeadWeights) for h in heads):
            raise ValueError(
                "checkpoint must be 'minilm', a path, or a non-empty list of HeadWeights."
            )
        name = heads[0].source or "<HeadWeights>"
    reports = tuple(_report(h, rtol, reduce)[0] for h in heads)
    counts = {lab: sum(r.label == lab for r in reports) for lab in LABELS}
    hyp = {
        "spectral": sum(r.spectral for r in reports),
        "spectral_and_qk": sum(r.spectral and (r.qk_phi1 or 0) > 0 for r in reports),
        "spectral_not_qk": sum(r.spectral and not (r.qk_phi1 or 0) > 0 for r in reports),
        "qk_pd": sum(r.qk_pd for r in reports),
        "lambda1_complex": sum(not r.real for r in reports),
        "lambda1_negative": sum(r.real and r.lambda1.real < 0 for r in reports),
        "lambda1_real_positive": sum(r.positive for r in reports),
    }
    return HeadsAnalysis(
        heads=reports,
        counts=counts,
        hypotheses=hyp,
        checkpoint=name,
        num_layers=len({h.layer for h in heads}),
        num_heads=len({h.head for h in heads}),
        d_model=heads[0].d,
        d_head=heads[0].d_head,
        beta=float(heads[0].beta),
        rtol=float(rtol),
        reduced=bool(reduce),
        architecture=heads[0].describe() if isinstance(heads[0], TrainedHead) else "",
    )


# ======================================================================= dynamics
def choose_t1(lambda1_abs: float, *, horizon: float = 20.0, t1_max: float = 80.0) -> float:
    """``min(horizon / |lambda_1|, t1_max)``: the logits of the leading mode grow by about
    ``e^{2 horizon}`` (rescaled frame) before the run ends."""
    if not (lambda1_abs > 0 and math.isfinite(lambda1_abs)):
        return float(t1_max)
    return float(min(horizon / lambda1_abs, t1_max))


@dataclasses.dataclass(frozen=True, eq=False)
class HeadRun:
    """One head's dynamics from real embeddings (``head_dynamics``).

    Attributes:
        layer, head, predicted: the head and its predicted label.
        observed: ``observe_limit`` label per sentence; reasons: its sentences.
        n_clusters: per sentence (None where not meaningful).
        statuses: solver status per sentence (``"ok"`` or a failure code).
        methods: how each sentence was integrated (``"adaptive"``, or ``"euler dt=..."``
            after a fallback); num_steps: solver steps per sentence.
        t1, frame, method, dt: the solve; propagator: ``model.propagator.method``.
        seconds: wall time of the solves (compile included).
        levels0, levels: for a simple lambda1 (else None), per sentence the initial and
            final levels ``phi_1*(z_i)`` ``(n,)`` (phi_1* the left eigenvector with
            ``phi_1*(phi_1) = 1``, |phi_1| = 1).
        boolean_distance: per sentence, the distance of the final attention matrix to
            the nearest Boolean one (``attnflow.boolean_distance``).
        leaders: per sentence, the tokens receiving attention at the end (column mass of
            the final P above 0.5; ``attnflow.analysis.rank.leaders_of``).
        trajectories: the ``Trajectory`` objects (kept when ``keep=True``), else None.
        fallback: what was retried and why (``None`` if nothing was).
    """

    layer: int
    head: int
    predicted: str
    observed: tuple
    reasons: tuple
    n_clusters: tuple
    statuses: tuple
    methods: tuple
    num_steps: tuple
    t1: float
    frame: str
    method: str
    dt: float | None
    propagator: str
    seconds: float
    levels0: tuple
    levels: tuple
    boolean_distance: tuple
    leaders: tuple
    trajectories: tuple | None = None
    fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "trajectories"
        }
        d["agree"] = [o == self.predicted for o in self.observed]
        return d


def head_dynamics(
    head: HeadWeights,
    x0s: Sequence[Float[np.ndarray, "n d"]],
    *,
    t1: float | None = None,
    horizon: float = 20.0,
    t1_max: float = 80.0,
    saves: int = 41,
    frame: str = "auto",
    method: str = "adaptive",
    dt: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_steps: int = 4000,
    chunk: int | None = 1,
    euler_dt: float | None = None,
    tol: float | None = None,
    keep: bool = False,
    label: str | None = None,
) -> HeadRun:
    """Run one head's particle system from each initial state and observe the limit.

    Args:
        head: a ``HeadWeights``.
        x0s: initial states, each ``(n, d)`` (e.g. ``input_embeddings(...)[k]["x0"]``);
            states of equal ``n`` are integrated as one batch.
        t1: final time; default ``choose_t1(|lambda_1|, horizon, t1_max)``.
        saves: saved times in ``[0, t1]`` (``observe_limit`` compares the last two).
        frame: ``"rescaled"``, ``"original"`` or ``"auto"``: rescaled when the
            propagator has an eigen-decomposition, original otherwise (an ``expm`` per
            field evaluation in d = 384 is slow; ``observe_limit`` converts frames).
        method, dt, rtol, atol, max_steps: passed to ``attnflow.simulate``. The default
            budget of 4000 adaptive steps is a few seconds per system in d = 384; sharp
            switching of attention (complex lambda_1 over long t1) can need more.
        chunk: systems per adaptive loop (``attnflow.simulate``'s ``chunk``). The
            default 1 gives every sentence its own loop: in one vmapped loop the
            sentences of a head took 47 to 4000 steps, and 59% of the batched work of
            the MiniLM figure was masked waste. ``None``: one loop per batch.
        euler_dt: if the adaptive solver stops at ``max_steps``, those systems are rerun
            with ``method="euler"`` (the discrete transformer, a model in its own right)
            and this step (default ``t1 / 4000``); recorded in ``methods`` and
            ``fallback``; the statuses are those of the final runs.
        tol: clustering tolerance of ``observe_limit``.
        keep: keep the trajectories (memory: saves x n x d per sentence).
        label: the predicted label (computed when None).

    Needs x64 for meaningful horizons (the caller turns it on: the library never does).
    """
    import jax.numpy as jnp

    from ..analysis.observe import observe_limit
    from ..analysis.rank import boolean_distance, leaders_of
    from ..dynamics.simulate import simulate

    if not isinstance(head, HeadWeights):
        raise ValueError(f"head must be a HeadWeights; got {type(head).__name__}.")
    arrs = [np.asarray(x, np.float64) for x in x0s]
    if not arrs or any(a.ndim != 2 or a.shape[1] != head.d for a in arrs):
        raise ValueError(f"x0s must be a non-empty list of (n, {head.d}) arrays.")
    if saves < 2:
        raise ValueError(f"saves must be at least 2; got {saves}.")
    if frame not in ("auto", "rescaled", "original"):
        raise ValueError(f"frame must be 'auto', 'rescaled' or 'original'; got {frame!r}.")
    w = np.linalg.eigvals(head.W_V_h @ head.W_O_h)  # the nonzero spectrum of V_h
    lam_abs = float(np.abs(w).max()) if w.size else 0.0
    if t1 is None:
        t1 = choose_t1(lam_abs, horizon=horizon, t1_max=t1_max)
    t1 = float(t1)
    if label is None:
        label = _head_regime(head, *reduced_triple(head)[:3], rtol=1e-8).label
    model = head.attention()
    fr = frame
    if fr == "auto":
        fr = "rescaled" if model.propagator.method in ("eig", "eigh") else "original"
    ts = np.linspace(0.0, t1, saves)
    if method == "euler":
        if dt is None:
            raise ValueError("dt is required with method='euler'.")
        ts = np.unique(np.clip(np.rint(ts / dt) * dt, 0, t1))

    obs_l, rsn, ncl, sts, lev0, lev, bd, lead, trajs, meths, steps = (
        list[Any]([None] * len(arrs)) for _ in range(11)
    )
    fallback = []
    start = time.perf_counter()
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(arrs):
        groups.setdefault(a.shape[0], []).append(i)

    def run(idx, meth, step):
        tts = ts if meth != "euler" else np.unique(np.clip(np.rint(ts / step) * step, 0, t1))
        x0 = np.stack([arrs[i] for i in idx])
        traj = simulate(
            model,
            x0,
            t1,
            ts=tts,
            frame=fr,
            method=meth,
            dt=step,
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            chunk=None if meth == "euler" else chunk,  # the layers take no chunks
        )
        return traj

    for n, idx in groups.items():
        traj = run(idx, method, dt)
        todo = [k for k, s in enumerate(traj.statuses) if s == Status.MAX_STEPS]
        results = {k: (traj, k) for k in range(len(idx))}
        for i in idx:
            meths[i] = method if method != "euler" else f"euler dt={dt:.4g}"
        if todo and method != "euler":
            step = euler_dt if euler_dt is not None else t1 / 4000
            sub = [idx[k] for k in todo]
            traj2 = run(sub, "euler", step)
            fallback.append(
                f"{len(todo)} system(s) of n = {n} hit max_steps = {max_steps} "
                f"with {method}; rerun with euler dt = {step:.4g}"
            )
            for j, k in enumerate(todo):
                results[k] = (traj2, j)
                meths[idx[k]] = f"euler dt={step:.4g}"
        for k, i in enumerate(idx):
            tr, j = results[k]
            obs = observe_limit(tr, tol=tol, system=j)
            obs_l[i], rsn[i], ncl[i] = obs.label, obs.reason, obs.n_clusters
            sts[i] = tr.statuses[j]
            steps[i] = int(np.asarray(tr.stats["num_steps"]).reshape(-1)[j])
            last = int(np.flatnonzero(np.asarray(tr.reached[j]))[-1])
            if "phi1_left" in obs.details:
                phi = np.asarray(obs.details["phi1_left"], np.float64)
                lev0[i] = arrs[i] @ phi
                lev[i] = np.asarray(tr.z[j][last], np.float64) @ phi
            P = np.asarray(model.attention(jnp.asarray(tr.x[j][last])), np.float64)
            bd[i] = float(boolean_distance(P))
            lead[i] = tuple(int(c) for c in leaders_of(P))
            trajs[i] = (tr, j) if keep else None
    seconds = time.perf_counter() - start
    return HeadRun(
        layer=head.layer,
        head=head.head,
        predicted=label,
        observed=tuple(obs_l),
        reasons=tuple(rsn),
        n_clusters=tuple(ncl),
        statuses=tuple(sts),
        methods=tuple(meths),
        num_steps=tuple(steps),
        t1=t1,
        frame=fr,
        method=method,
        dt=dt,
        propagator=model.propagator.method,
        seconds=seconds,
        levels0=tuple(lev0),
        levels=tuple(lev),
        boolean_distance=tuple(bd),
        leaders=tuple(lead),
        trajectories=tuple(trajs) if keep else None,
        fallback="; ".join(fallback) or None,
    )
