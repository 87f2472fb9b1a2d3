"""QK norm at long context, with a sink or a gate: accuracy, entropy and sink mass
against the length read, per variant, for each tier of ``attnflow.studies.longcontext``.

  fig_longcontext.{png,pdf}  one row per tier: (a) accuracy against n (log axis) for
                             present (solid; mean of the seeds with its 95% t
                             interval across seeds) and absent (dashed) queries;
                             (b) the entropy of the answer rows over log n;
                             (c) the sink mass (first token plus learned sink column);
                             (d) accuracy against sink mass over every model and length,
                             with the R^2 of accuracy on sink mass and on entropy
  longcontext.json           the study's result (``LongContextResult``)
  fig_longcontext.json       the sidecar (versions, the verdicts, runtime)

The trained models are kept in ``<out>/longcontext_models/`` (reused when their
configuration matches). Tier B is drawn when ``attnflow.networks._decoder`` is installed.
Five training seeds per variant (``SEEDS``); ``--quick``: tier A's tiny configurations,
two seeds.

Run:  python -m attnflow.experiments.fig_longcontext [--quick] [--out figures] [--redraw]
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "fig_longcontext"
# seconds on a 2-core machine (two jobs), quick and full: the runner starts the longest first
SECONDS = {"quick": 80, "full": 4200}
LONG = "trains the long-context models of both tiers, five seeds each: about 70 min on two cores"
SEEDS = {"quick": 2, "full": 5}


def _tiers() -> tuple[str, ...]:
    return ("A", "B") if importlib.util.find_spec("attnflow.networks._decoder") else ("A",)


def arrays_of(data: dict[str, Any], tiers: Sequence[str]) -> dict[str, Any]:
    """What ``draw`` reads, from a ``LongContextResult``'s ``data`` (see ``compute``)."""
    arrays: dict[str, Any] = {"tiers": np.asarray(list(tiers))}
    for t in tiers:
        tier = data["tiers"][t]
        plain = tier["summary"]["plain"]
        names = list(plain)
        arrays[f"{t}_variants"] = np.asarray(names)
        arrays[f"{t}_lengths"] = np.asarray(data["settings"][f"tier_{t}"]["lengths"])

        def col(half: str, key: str, plain: dict = plain, names: list = names) -> np.ndarray:
            return np.asarray(
                [[np.nan if x is None else x for x in plain[v][half][key]] for v in names], float
            )

        arrays[f"{t}_acc_present"] = col("present", "accuracy")
        arrays[f"{t}_acc_absent"] = col("absent", "accuracy")
        arrays[f"{t}_iv_present"] = np.asarray(
            [
                [[np.nan, np.nan] if iv is None else iv for iv in plain[v]["present"]["interval"]]
                for v in names
            ],
            float,
        )
        arrays[f"{t}_seeds_present"] = np.asarray(
            [
                [
                    [np.nan if x is None else x for x in row]
                    for row in plain[v]["present"]["per_seed"]
                ]
                for v in names
            ],
            float,
        )
        arrays[f"{t}_entropy"] = col("all", "entropy_norm")
        arrays[f"{t}_sink"] = col("all", "total_sink")
        fits = tier["fits"]["all"]
        arrays[f"{t}_points"] = np.asarray(fits["points"], float).reshape(-1, 3)
        arrays[f"{t}_r2"] = np.asarray(
            [
                np.nan if fits[k]["r2"] is None else fits[k]["r2"]
                for k in ("sink_mass", "entropy_norm")
            ],
            float,
        )
    return arrays


def compute(quick: bool, out_dir: str | os.PathLike[str] = "figures") -> F.Data:
    """Train or reuse every model of each tier, read it, decide (``run_study``).

    Returns:
        the sidecar (versions, the verdicts, the study's path) and, for ``draw``, per
        tier ``t``: ``t_variants``, ``t_lengths``, ``t_acc_present``, ``t_acc_absent``
        (variants x lengths; the mean of the seeds), ``t_iv_present`` (variants x
        lengths x 2; the 95% t interval across seeds), ``t_seeds_present`` (variants x
        lengths x seeds),
        ``t_entropy``, ``t_sink`` (all queries), ``t_points`` (sink mass, normalised
        entropy, accuracy of every model and length) and ``t_r2`` (of accuracy on sink
        mass and on entropy; NaN where undefined).
    """
    H.setup()
    from attnflow.studies import longcontext as LC

    out = Path(out_dir)
    # --quick draws tier A only: the decoder's quick models take minutes, not seconds
    # (their path is tested in tests/test_longcontext.py and tests/test_decoder.py)
    tiers = ("A",) if quick else _tiers()
    seeds = SEEDS["quick" if quick else "full"]
    res = LC.run_study(
        tiers,
        quick=quick,
        seeds=seeds,
        cache_dir=out / "longcontext_models",
        out=out,
        progress=not quick,
    )
    arrays = arrays_of(res.data, tiers)
    side = H.sidecar(
        script="attnflow.experiments.fig_longcontext",
        quick=quick,
        runs=[],
        seeds=res.data["settings"]["seeds"],
        seeds_note="training seeds of every variant (intervals are across them); every model "
        "is read on the same sets (settings.eval_seed in longcontext.json)",
        study=str(out / "longcontext.json"),
        verdicts={t: res.verdict(t) for t in tiers},
        cap={t: res.data["tiers"][t]["cap"] for t in tiers},
    )
    return F.Data(
        sidecar=side, arrays=arrays, result={"verdicts": {t: res.verdict(t) for t in tiers}}
    )


def draw(data: F.Data) -> dict[str, Figure]:
    """The figure from ``compute``'s data (matplotlib only)."""
    import matplotlib.pyplot as plt

    a = data.arrays
    tiers = [str(t) for t in a["tiers"]]
    height = 2.5 * len(tiers) + 1.0
    fig, axes = plt.subplots(len(tiers), 4, figsize=(9.6, height), squeeze=False)
    fig.subplots_adjust(
        left=0.07, right=0.83, bottom=0.5 / height, top=1 - 0.75 / height, wspace=0.45, hspace=0.5
    )
    cmap = plt.get_cmap("tab10")
    for row, t in enumerate(tiers):
        ax = axes[row]
        n = a[f"{t}_lengths"]
        for i, v in enumerate(str(x) for x in a[f"{t}_variants"]):
            c = cmap(i % 10)
            ax[0].plot(n, 100 * a[f"{t}_acc_present"][i], "-o", ms=2.5, lw=1, color=c, label=v)
            iv = a[f"{t}_iv_present"][i]
            ax[0].fill_between(n, 100 * iv[:, 0], 100 * iv[:, 1], color=c, alpha=0.15, lw=0)
            seeds = a[f"{t}_seeds_present"][i]  # one dot per seed, offset per variant
            shift = 2.0 ** (0.07 * (i - (len(a[f"{t}_variants"]) - 1) / 2))
            xs = np.repeat(n[:, None] * shift, seeds.shape[1], axis=1)
            ax[0].plot(xs.ravel(), 100 * seeds.ravel(), ".", ms=2, color=c, alpha=0.6)
            ax[0].plot(n, 100 * a[f"{t}_acc_absent"][i], "--", lw=1, color=c)
            ax[1].plot(n, a[f"{t}_entropy"][i], "-o", ms=2.5, lw=1, color=c)
            ax[2].plot(n, a[f"{t}_sink"][i], "-o", ms=2.5, lw=1, color=c)
        pts = a[f"{t}_points"]
        ax[3].plot(pts[:, 0], 100 * pts[:, 2], "o", ms=2.5, color="0.3", alpha=0.6)
        r2 = a[f"{t}_r2"]
        ax[3].set_title(f"$R^2$: sink {_r2(r2[0])}, entropy {_r2(r2[1])}", fontsize=7)
        for k in range(3):
            ax[k].set_xscale("log", base=2)
            ax[k].set_xlabel("length $n$")
        ax[0].set_ylabel(f"tier {t}: accuracy (%)")
        ax[1].set_ylabel(r"entropy / $\log n$")
        ax[2].set_ylabel("sink mass")
        ax[3].set_xlabel("sink mass")
        ax[3].set_ylabel("accuracy (%)")
        handles, labels = ax[0].get_legend_handles_labels()
        ax[3].legend(
            handles,
            labels,
            fontsize=5.5,
            loc="center left",
            bbox_to_anchor=(1.04, 0.5),
            frameon=False,
        )
        for k in range(4):  # a row per tier: (a)-(d), then (e)-(h)
            H.panel_label(ax[k], "abcdefgh"[4 * row + k])
    H.headline(
        fig,
        "QK norm at long context, with a sink or a gate",
        "trained at one length, read at 1x-256x it; present queries solid (mean of "
        f"{len(data.sidecar['seeds'])} seeds, dots the seeds, 95% t band across seeds), "
        f"absent dashed; {'quick run' if data.quick else 'full run'}",
        sub_y=1 - 0.3 / height,
    )
    return {NAME: fig}


def _r2(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.2f}"


make = F.figure(NAME, compute, draw, out_dir=True)

if __name__ == "__main__":
    H.main(make, __doc__)
