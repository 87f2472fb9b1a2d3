"""How generic is the hyperplane theorem? Its spectral hypothesis over real Ginibre matrices.

For V a d x d real Ginibre matrix (iid N(0, 1) entries), the fraction for which the
eigenvalue of largest modulus is real, positive and simple (the spectral hypothesis of
the hyperplane theorem of Geshkovski, Letrouit, Polyanskiy, Rigollet 2023), with 95%
Wilson intervals, against d on a log axis; the same with the full good-triple condition
<Q phi_1, K phi_1> > 0 for Q, K independent Ginibre matrices (about half of it; with
Q = K = I the condition always holds, so that curve is the first one). Marked: the exact
values 1/2 (d = 1) and 1/(2 sqrt 2) (d = 2), and the paper's "about 14%" at d = 128.

Everything is computed by ``attnflow.ginibre_fraction`` (seed 0). If ``--results DIR``
holds complete sweeps written by ``attnflow ginibre --out DIR`` (one subdirectory per d)
with at least as many samples as the default, they are used instead (the sidecar says
which).

Writes into out_dir: ginibre_fraction.png, ginibre_fraction.pdf, ginibre_fraction.json
(every parameter, the versions and every number plotted).

Run:  python -m attnflow.experiments.fig_ginibre [--quick] [--out figures] [--results DIR]
      [--redraw]

The look is ``draw`` (matplotlib only, from the sidecar's estimates); the numbers are
``compute``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAME = "ginibre_fraction"
# seconds on a 2-core machine, quick (two jobs) and full (alone: EXCLUSIVE)
SECONDS = {"quick": 2, "full": 72}
# the long dimensions run in a process pool of one worker per core
EXCLUSIVE = True
SEED = 0
LEVEL = 0.95
INTERVAL = "wilson"
DIMS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DIMS_QUICK = [1, 2, 4, 8, 16, 32]
PAPER_D, PAPER_FRACTION = 128, 0.14


def samples_for(d: int, quick: bool) -> int:
    """Samples per dimension: 20,000 up to d = 64 (+-0.7% or better), 6,000 at d = 128
    (+-0.9% around 14%), 1,500 at d = 256 (+-1.6%); about 110 s of one idle core
    (``geev`` costs ~6 ms at d = 128 and ~35 ms at d = 256), about one minute with a
    worker per core. Tighter intervals: ``attnflow ginibre --samples N --out DIR``, then
    ``--results DIR`` here."""
    if quick:
        return 1000
    return 20_000 if d <= 64 else (6000 if d <= 128 else 1500)


def _sample_groups(results: list[dict]) -> str:
    """'20,000 ($d\\leq 64$), 12,000 ($d=128$), ...' for the title (``results``: the
    sidecar's estimates)."""
    groups: list[list] = []
    for e in results:
        if groups and groups[-1][0] == e["samples"]:
            groups[-1][1].append(e["d"])
        else:
            groups.append([e["samples"], [e["d"]]])
    parts = []
    for k, (n, ds) in enumerate(groups):
        if len(groups) == 1:
            where = "per $d$"
        elif len(ds) == 1:
            where = f"($d={ds[0]}$)"
        elif k == 0:
            where = f"($d\\leq {ds[-1]}$)"
        else:
            where = f"(${ds[0]}\\leq d\\leq {ds[-1]}$)"
        parts.append(f"{n:,} {where}")
    return ", ".join(parts)


def _saved(results: Path | None, d: int, want: int):
    """A complete saved sweep for this d (seed 0, default tolerance) with >= want samples."""
    if results is None:
        return None
    from attnflow.studies import ginibre as G
    from attnflow.studies import sweep as S

    path = results / f"d{d:05d}"
    try:
        man = S.read_manifest(path)
    except ValueError:
        return None
    cfg = man.get("config", {})
    if (
        man.get("name") != "ginibre"
        or cfg.get("d") != d
        or man.get("seed") != SEED
        or cfg.get("version") != G.KERNEL_VERSION
        or man.get("size", 0) < want
        or cfg.get("tol") != d * float(np.finfo(np.float64).eps)
    ):
        return None
    try:
        data = S.merge(path)
    except ValueError:  # incomplete
        return None
    est = G.summarize(
        data.arrays,
        d=d,
        seed=SEED,
        tol=cfg["tol"],
        backend=cfg["backend"],
        level=LEVEL,
        interval=INTERVAL,
    )
    return est, str(path)


def draw(data: F.Data) -> dict[str, Figure]:
    """The curve from the sidecar's estimates (matplotlib only)."""
    import matplotlib.pyplot as plt

    ests = data.sidecar["results"]
    dims = [e["d"] for e in ests]
    ds = np.array(dims)
    frac = np.array([e["fraction"] for e in ests])
    err = np.array(
        [[e["fraction"] - e["low"] for e in ests], [e["high"] - e["fraction"] for e in ests]]
    )
    good = [e["good_ginibre"] for e in ests]
    gfrac = np.array([g["fraction"] for g in good])
    gerr = np.array(
        [[g["fraction"] - g["low"] for g in good], [g["high"] - g["fraction"] for g in good]]
    )
    fig, ax = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
    ax.errorbar(
        ds,
        frac,
        yerr=err,
        fmt="o-",
        color="C0",
        ms=5,
        lw=1.3,
        capsize=3,
        label=r"spectral hypothesis: $\lambda_1$ real, $>0$, simple"
        "\n"
        r"(= good triples with $Q=K=I$)",
    )
    ax.errorbar(
        ds,
        gfrac,
        yerr=gerr,
        fmt="s--",
        color="C2",
        ms=4,
        lw=1.1,
        capsize=3,
        label=r"good triples, $Q,K$ Ginibre too: "
        r"$\langle Q\phi_1, K\phi_1\rangle>0$",
    )
    exact_d = [d for d in (1, 2) if d in dims]
    exact_v = {1: 0.5, 2: 1 / (2 * math.sqrt(2))}
    ax.plot(
        exact_d,
        [exact_v[d] for d in exact_d],
        "kx",
        ms=9,
        mew=1.6,
        label=r"exact: $1/2$ ($d=1$), $1/(2\sqrt{2})$ ($d=2$)",
    )
    ax.plot(
        [PAPER_D],
        [PAPER_FRACTION],
        marker="*",
        color="C3",
        mfc="none",
        mew=1.3,
        ms=17,
        ls="none",
        zorder=5,
        label=r"Geshkovski et al. (2023): $\approx 14\%$ at $d=128$",
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(DIMS)
    ax.set_xticklabels([str(d) for d in DIMS])
    ax.set_xlim(0.8, 330)
    ax.set_ylim(0, 0.56)
    ax.set_xlabel(r"dimension $d$")
    ax.set_ylabel("fraction of real Ginibre matrices")
    ax.set_title(
        "How generic is the hyperplane theorem?  (real Ginibre $V$, "
        f"{int(LEVEL * 100)}% Wilson intervals)\nsamples: {_sample_groups(ests)}",
        fontsize=9.5,
    )
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = [2, 3, 0, 1]  # the two estimates first, then the exact and published values
    ax.legend(
        [handles[i] for i in order], [labels[i] for i in order], loc="upper right", frameon=False
    )
    return {NAME: fig}


def compute(quick: bool, results: Path | None = None, workers: int | None = None) -> F.Data:
    """The estimate of every dimension (computed, or read from saved sweeps).

    Args:
        quick: the small run (d <= 32, 1,000 samples each).
        results: a directory of saved sweeps (``attnflow ginibre --out``) to reuse.
        workers: worker processes (None: one per core for long dimensions).

    Returns:
        the sidecar (every parameter, the versions and every estimate) as ``Data``.
    """
    import jax

    import attnflow
    from attnflow._meta import run_metadata

    results = Path(results) if results is not None else None
    dims = DIMS_QUICK if quick else DIMS
    rows = []
    t_all = time.perf_counter()
    for d in dims:
        n = samples_for(d, quick)
        t0 = time.perf_counter()
        saved = _saved(results, d, n)
        if saved is not None:
            est, source = saved
        else:
            est = attnflow.ginibre_fraction(
                d, n, seed=SEED, level=LEVEL, interval=INTERVAL, workers=workers
            )
            source = "computed"
        rows.append({"estimate": est, "source": source, "seconds": time.perf_counter() - t0})
        # progress on stderr: `attnflow figures --json` keeps stdout for its JSON
        print(
            f"{est.summary()}  [{source}, {rows[-1]['seconds']:.1f} s]", file=sys.stderr, flush=True
        )

    ests = [r["estimate"] for r in rows]
    import matplotlib as mpl

    side = {
        "script": "attnflow.experiments.fig_ginibre",
        "quick": quick,
        "x64": bool(jax.config.read("jax_enable_x64")),
        "dtype": "float64 (numpy LAPACK geev)",
        "seed": SEED,
        "seeds": [SEED],
        "seeds_note": "ginibre_fraction(d, n, seed=SEED): every sample's matrix",
        "level": LEVEL,
        "interval": INTERVAL,
        "d": dims,
        "samples": {str(e.d): e.samples for e in ests},
        "tolerance": "decision tolerance tol * ||V||_F with tol = d * eps (eps = 2**-52); "
        "borderline = within 1000 times that",
        "ensemble": "V, Q, K with iid N(0, 1) entries; streams as documented in "
        "attnflow.studies.ginibre",
        "paper": {
            "d": PAPER_D,
            "fraction": PAPER_FRACTION,
            "source": "Geshkovski, Letrouit, Polyanskiy, Rigollet 2023 "
            "(arXiv 2305.05465): about 14% at d = 128",
        },
        "exact": {"1": 0.5, "2": 1 / (2 * math.sqrt(2))},
        "results": [
            {**r["estimate"].to_dict(), "source": r["source"], "seconds": round(r["seconds"], 3)}
            for r in rows
        ],
        "seconds_total": round(time.perf_counter() - t_all, 2),
        "versions": {**run_metadata(), "matplotlib": mpl.__version__},
        "command": ("python -m attnflow.experiments.fig_ginibre" + (" --quick" if quick else "")),
    }
    return F.Data(sidecar=side, result={"results": side["results"]})


class _Make(F.FigureScript):
    """``make(out_dir, quick=False, results=None, workers=None)``: the framework's make
    with this script's two options handed to ``compute``, and its PNG at full
    resolution in quick runs too."""

    def __call__(
        self,
        out_dir: str | os.PathLike[str],
        quick: bool = False,
        results: Path | None = None,
        workers: int | None = None,
    ) -> dict[str, Any]:
        self.compute = functools.partial(compute, results=results, workers=workers)
        return super().__call__(out_dir, quick)

    def _draw(self, data: F.Data, out: Path) -> list[Path]:
        return [p for stem, fig in self.draw(data).items() for p in H.save(fig, out, stem)]


# rc: `attnflow figures` runs every script in one process, so the rc parameters hold for
# this figure only
make = _Make(
    NAME,
    compute,
    draw,
    rc={"font.size": 10, "axes.titlesize": 10.5, "legend.fontsize": 8.5},
    compact=False,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small run (seconds)")
    ap.add_argument("--out", type=Path, default=Path("figures"), help="output directory")
    ap.add_argument("--redraw", action="store_true", help="draw from the data saved in --out")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="directory of saved sweeps (attnflow ginibre --out) to reuse",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: one per core for long dimensions)",
    )
    args = ap.parse_args()
    H.use_agg()  # run on its own, the script owns its process
    if args.redraw:
        out = make.redraw(args.out, quick=args.quick)
    else:
        out = make(args.out, quick=args.quick, results=args.results, workers=args.workers)
    for f in [*out["figures"], out["json"]]:
        print(f)


if __name__ == "__main__":
    main()
