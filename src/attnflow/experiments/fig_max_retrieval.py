"""Max retrieval (Velickovic et al. 2024): accuracy and attention on the maximum item
against the set size, for one head trained at n = 16 with each attention kernel.

  fig_max_retrieval.{png,pdf}  (a) accuracy with 95% Wilson intervals against n (log
                               axis), the paper's softmax and adaptive numbers as
                               crosses; (b) the mean attention weight on the true maximum
                               item against n, with the mean softmax bound
                               1/(1 + (n-1) e^{-delta}) of the softmax head (dashed)
  max_retrieval.json           sizes, accuracy, interval, attention_on_max, delta per
                               kernel, config (the study's dictionary)
  fig_max_retrieval.json       the sidecar (versions, runtime)
  fig_max_retrieval.quick.npz  the curves drawn (``.full.npz`` for a full run), from
                               which ``--redraw`` draws again without the models

The trained models are kept in ``<out>/max_retrieval_models/`` (reused when their
configuration matches; see ``attnflow.studies.retrieval``). The full run trains 11
models at width 128 and evaluates 12 rows at n = 16 ... 16,384; see docs/retrieval.md
for its cost (61 minutes measured on two cores). ``--quick``: width 16, 40 steps,
n = 16 and 64, softmax and adaptive only.

Run:  python -m attnflow.experiments.fig_max_retrieval [--quick] [--out figures] [--redraw]

The look is ``draw`` (matplotlib only, from the saved data); the numbers are ``compute``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_max_retrieval"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 4, "full": 3600}
# left out of a full `attnflow figures` run (attnflow.experiments.runner): it trains a head
# per kernel; `attnflow retrieval` or `attnflow figures --only max_retrieval` runs it
LONG = "trains one head per kernel, about an hour on two cores"
KERNELS = (
    "softmax",
    "adaptive",
    "qknorm",
    "ssmax",
    "sigmoid",
    "linear",
    "linearnorm",
    "stickbreaking",
    "selective",
    "differential",
    "offbyone",
    "prenorm",
)
QUICK_KERNELS = ("softmax", "adaptive")
# one training seed per kernel (RetrievalConfig.seed) and the evaluation sets' seed
SEEDS = {
    "seeds": [0, 12345],
    "seeds_note": "one model per kernel: training from jax.random.key(0) (RetrievalConfig.seed: "
    "the weights; key(0 + 1000003): the batches); evaluation at n: fold_in(key(12345 + n), "
    "batch)",
}


def quick_setup() -> dict:
    """The ``--quick`` configuration: tiny widths, steps and sizes (seconds)."""
    return dict(
        base=dict(
            width=16,
            depth=1,
            max_steps=40,
            eval_every=20,
            val_sets=256,
            batch=32,
            checkpoint_every=20,
        ),
        sizes=[16, 64],
        eval_kwargs=dict(min_sets=64, max_sets=128, half_width=0.5),
    )


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    kernels: tuple[str, ...] | None = None,
    progress: bool = True,
    max_steps: int | None = None,
) -> dict:
    """Train or reuse, evaluate, write ``max_retrieval.json``; returns the dictionary."""
    import dataclasses

    from attnflow.studies import retrieval as R

    out_dir = Path(out_dir)
    kernels = tuple(kernels or (QUICK_KERNELS if quick else KERNELS))
    if quick:
        q = quick_setup()
        base = R.RetrievalConfig(**q["base"])
        sizes, ev = q["sizes"], q["eval_kwargs"]
    else:
        base, sizes, ev = R.RetrievalConfig(), list(R.SIZES), {}
    if max_steps is not None:
        base = dataclasses.replace(base, max_steps=int(max_steps))
    res = R.run_study(
        kernels,
        out_dir / "max_retrieval_models",
        base=base,
        sizes=sizes,
        eval_kwargs=ev,
        progress=progress,
    )
    res["quick"] = bool(quick)
    res.update(SEEDS)
    H.write_json(out_dir, "max_retrieval", H.jsonable(res), compact=True)
    return res


def compute(quick: bool, out_dir: str | os.PathLike[str] = "figures") -> F.Data:
    """Train or reuse a head per kernel and evaluate it (``run``).

    Args:
        quick: the small version (``quick_setup``: softmax and adaptive, width 16).
        out_dir: where the study keeps its models (``max_retrieval_models/``) and writes
            ``max_retrieval.json``; ``make`` passes its own output folder.

    Returns:
        the sidecar (versions, runtime, the study's path) and, for ``draw``: ``sizes``,
        ``kernels`` (names, in the study's order), per kernel ``{kernel}_accuracy``,
        ``{kernel}_interval`` (``(sizes, 2)``) and ``{kernel}_attention`` (on the max
        item), ``bound`` (the softmax head's bound, when trained), ``width``, and the
        paper's points ``paper_{name}_n`` and ``paper_{name}_accuracy``.
    """
    H.setup()
    res = run(Path(out_dir), quick=quick, progress=not quick)
    arrays: dict[str, Any] = {
        "sizes": np.asarray(res["sizes"]),
        "kernels": np.asarray(list(res["accuracy"])),
        "width": np.asarray(res["config"]["width"]),
    }
    for kern in res["accuracy"]:
        arrays[f"{kern}_accuracy"] = np.asarray(res["accuracy"][kern], float)
        arrays[f"{kern}_interval"] = np.asarray(res["interval"][kern], float)
        arrays[f"{kern}_attention"] = np.asarray(res["attention_on_max"][kern], float)
    if "softmax" in res["bound"]:
        arrays["bound"] = np.asarray(res["bound"]["softmax"], float)
    for name in ("softmax", "adaptive"):
        pts = res["paper"][name]
        arrays[f"paper_{name}_n"] = np.asarray([int(k) for k in pts])
        arrays[f"paper_{name}_accuracy"] = np.asarray(list(pts.values()), float)
    side = H.sidecar(
        script="attnflow.experiments.fig_max_retrieval",
        quick=quick,
        runs=[],
        **SEEDS,
        study=str(Path(out_dir) / "max_retrieval.json"),
    )
    return F.Data(sidecar=side, arrays=arrays, result={"accuracy": res["accuracy"]})


def draw(data: F.Data) -> dict[str, Figure]:
    """Accuracy and attention on the max item against n, from ``compute``'s data
    (matplotlib only).

    Args:
        data: what ``compute`` returned (or its saved copy).

    Returns:
        ``{NAME: figure}``.
    """
    import matplotlib.pyplot as plt

    a = data.arrays
    sizes, kernels = a["sizes"], [str(k) for k in a["kernels"]]
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.2))
    fig.subplots_adjust(left=0.08, right=0.8, bottom=0.15, top=0.8, wspace=0.3)
    cmap = plt.get_cmap("tab20")
    for i, kern in enumerate(kernels):
        c = cmap(i % 20)
        acc, iv = a[f"{kern}_accuracy"], a[f"{kern}_interval"]
        axes[0].plot(sizes, 100 * acc, "-o", ms=2.5, lw=1, color=c, label=kern)
        axes[0].fill_between(sizes, 100 * iv[:, 0], 100 * iv[:, 1], color=c, alpha=0.2, lw=0)
        axes[1].plot(sizes, a[f"{kern}_attention"], "-o", ms=2.5, lw=1, color=c)
    for name, mk in (("softmax", "x"), ("adaptive", "+")):
        axes[0].plot(
            a[f"paper_{name}_n"],
            a[f"paper_{name}_accuracy"],
            mk,
            color="k",
            ms=5,
            label=f"paper {name}",
        )
    if "bound" in a:
        axes[1].plot(sizes, a["bound"], "--", color="0.4", lw=1, label="bound")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Items $n$")
    axes[0].set_ylabel("accuracy (%)")
    axes[1].set_ylabel("attention on the max item")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=5.5, loc="center left", bbox_to_anchor=(2.55, 0.5), frameon=False)
    H.panel_label(axes[0], "a")
    H.panel_label(axes[1], "b")
    first = kernels[0]
    acc = a[f"{first}_accuracy"]
    H.headline(
        fig,
        "One head trained at n = 16 to retrieve the max: accuracy falls with n",
        f"{first}: {100 * acc[0]:.1f}% at n = {sizes[0]}, "
        f"{100 * acc[-1]:.1f}% at n = {sizes[-1]}; "
        f"width {a['width']}, {'quick run' if data.quick else 'full run'}",
        sub_y=0.925,
    )
    return {NAME: fig}


class _Study(F.FigureScript):
    """``make`` whose ``compute`` keeps the trained models in the output folder."""

    def __call__(self, out_dir: str | os.PathLike[str], quick: bool = False) -> dict[str, Any]:
        self.compute = functools.partial(compute, out_dir=out_dir)
        return super().__call__(out_dir, quick)


make = _Study(NAME, compute, draw)

if __name__ == "__main__":
    H.main(make, __doc__)
