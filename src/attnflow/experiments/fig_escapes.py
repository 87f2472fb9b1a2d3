"""Needle and sink shares against the number of keys, each kernel beside its closed form.

The long-context account (Bertsch et al. 2026): a head retrieves one token among n only
with a logit gap that grows like log n, and does nothing only with a sink that stands
far above the rest. Closed forms, no training: a needle of logit gap g over n - 1 equal
logits gets

- softmax: ``1 / (1 + (n - 1) e^{-g})``, which halves at ``n = 1 + e^g``;
- QK norm at unit gains and head size p (logits ``<q^, k^> / sqrt(p)``): at most the
  share of the cap ``g = 2 sqrt(p)`` (11.3 at p = 32);
- ssmax (``softmax(s log(n) L)``): ``1 / (1 + (n - 1) n^{-s g})``;
- sparsemax: 1 for ``g >= 1``; hardmax: 1 for any ``g > 0``;

and a learned sink of logit b against n keys of logit 0 takes ``1 / (1 + n e^{-b})``,
which holds until ``n ~ e^b``; a gate on the output depends on the query alone (not on
n). Every point is the kernel's own weight (``attnflow.kernels``, float64) of a
constructed row; the sidecar records its largest relative distance to the closed form.

Run:  python -m attnflow.experiments.fig_escapes [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_escapes"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 5, "full": 25}
P_HEAD, S_SSMAX, SINKS = 32, 0.5, (4.0, 8.0, 12.0)


def _needle(n: int, g: float) -> np.ndarray:
    row = np.zeros((1, n))
    row[0, 0] = g
    return row


def compute(quick: bool) -> F.Data:
    """The kernels' weights of constructed rows at every n, and their closed forms."""
    H.setup()
    import jax.numpy as jnp

    from attnflow import kernels as K

    ns = np.array([16, 256, 4096]) if quick else 2 ** np.arange(4, 17)
    cap = 2 * math.sqrt(P_HEAD)
    needles = [
        ("softmax, g = 6", "softmax", {}, 6.0, lambda n: 1 / (1 + (n - 1) * math.exp(-6.0))),
        ("softmax, g = 8", "softmax", {}, 8.0, lambda n: 1 / (1 + (n - 1) * math.exp(-8.0))),
        (
            f"QK norm cap, p = {P_HEAD} (g = {cap:.1f})",
            "softmax",
            {},
            cap,
            lambda n: 1 / (1 + (n - 1) * math.exp(-cap)),
        ),
        (
            f"ssmax s = {S_SSMAX}, g = 6",
            "ssmax",
            {"s": S_SSMAX},
            6.0,
            lambda n: 1 / (1 + (n - 1) * float(n) ** (-S_SSMAX * 6.0)),
        ),
        ("sparsemax, g = 1", "sparsemax", {}, 1.0, lambda n: 1.0),
        ("hardmax, g = 0.1", "hardmax", {}, 0.1, lambda n: 1.0),
    ]
    runs, arrays = [], {"n": ns.astype(np.float64)}
    for i, (label, kernel, params, g, closed) in enumerate(needles):
        k = K.get(kernel, **params)
        got = np.array([float(k.weights(jnp.asarray(_needle(int(n), g)))[0, 0]) for n in ns])
        ref = np.array([closed(int(n)) for n in ns])
        runs.append(
            dict(
                name=label,
                kernel=k.describe(),
                gap=g,
                share=got,
                closed_form=ref,
                max_relative_difference=float(np.max(np.abs(got - ref) / ref)),
                halves_at_n=None if kernel in ("sparsemax", "hardmax") else _halves(closed),
            )
        )
        arrays[f"needle{i}"] = got
    for j, b in enumerate(SINKS):
        k = K.Sink(b=b)
        got = np.array([float(K.sink_share(jnp.zeros((1, int(n))), b)[0]) for n in ns])
        rows = [1 - float(np.asarray(k.weights(jnp.zeros((1, int(n))))).sum()) for n in ns]
        ref = 1 / (1 + ns * math.exp(-b))
        runs.append(
            dict(
                name=f"learned sink, b = {b:g}",
                kernel=k.describe(),
                sink_share=got,
                one_minus_row_sum=np.array(rows),
                closed_form=ref,
                max_relative_difference=float(np.max(np.abs(got - ref) / ref)),
                halves_at_n=math.exp(b),
            )
        )
        arrays[f"sink{j}"] = got
    side = H.sidecar(
        script="attnflow.experiments.fig_escapes",
        quick=quick,
        runs=runs,
        seeds=[],
        seeds_note="deterministic: closed-form logit rows and fixed tokens, no random draw",
        theorem="closed forms of the needle share 1/(1 + (n-1) e^{-g}), the QK-norm cap "
        "2 sqrt(p), ssmax's n^{-s g}, sparsemax's and hardmax's n-free 1, and the sink "
        "share 1/(1 + n e^{-b}).",
    )
    return F.Data(
        sidecar=side,
        arrays=arrays,
        result={"max_relative_difference": max(r["max_relative_difference"] for r in runs)},
    )


def _halves(closed) -> float | None:
    """The n at which a share falls through 1/2 (bisection on a log scale)."""
    lo, hi = 2.0, 2.0**60
    if closed(hi) > 0.5:
        return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if closed(mid) > 0.5 else (lo, mid)
    return round(hi, 1)


def draw(data: F.Data) -> dict[str, Figure]:
    """Two panels: needle shares against n, sink shares against n (matplotlib only)."""
    import matplotlib.pyplot as plt

    a, runs = data.arrays, data.sidecar["runs"]
    ns = a["n"]
    fig, axes = plt.subplots(1, 2, figsize=(6.5, 3.2))
    ax = axes[0]
    for i, run in enumerate(r for r in runs if "gap" in r):
        (line,) = ax.semilogx(ns, run["closed_form"], lw=1.0, label=run["name"])
        ax.semilogx(ns, a[f"needle{i}"], "o", ms=2.5, color=line.get_color())
    ax.set_xlabel("keys $n$")
    ax.set_ylabel("needle share")
    ax.set_ylim(-0.03, 1.05)
    ax.set_title("a needle of logit gap $g$: kernels (dots) and closed forms", pad=3)
    ax.legend(fontsize=5.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    H.panel_label(ax, "a", x=-0.12)
    ax = axes[1]
    for j, run in enumerate(r for r in runs if "gap" not in r):
        (line,) = ax.semilogx(ns, run["closed_form"], lw=1.0, label=run["name"])
        ax.semilogx(ns, a[f"sink{j}"], "o", ms=2.5, color=line.get_color())
    ax.axhline(0.5, color="0.7", lw=0.6, ls=":")
    ax.set_xlabel("keys $n$ (logits 0)")
    ax.set_ylabel("sink share")
    ax.set_ylim(-0.03, 1.05)
    ax.set_title(r"a learned sink of logit $b$: $1/(1 + n e^{-b})$", pad=3)
    ax.legend(fontsize=5.5, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    H.panel_label(ax, "b", x=-0.12)
    worst = data.result["max_relative_difference"]
    H.headline(
        fig,
        "What escapes dispersion: needle and sink shares against the number of keys",
        f"every dot is the kernel's own weight (float64); largest relative distance to "
        f"its closed form {worst:.1e}",
        y=0.995,
        sub_y=0.93,
    )
    fig.subplots_adjust(top=0.83, bottom=0.3, left=0.08, right=0.98, wspace=0.3)
    return {NAME: fig}


make = F.figure(NAME, compute, draw, rc=H.small_text(7))

if __name__ == "__main__":
    H.main(make, __doc__)
