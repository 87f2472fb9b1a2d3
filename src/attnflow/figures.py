"""Run the figure scripts of ``experiments/`` (what ``attnflow figures`` does).

Each ``experiments/fig_*.py`` defines ``make(out_dir: Path, quick: bool = False) -> dict``
returning at least ``{"figures": [paths]}`` and writes its own sidecar JSON with every
parameter. The runner imports them in name order, runs them with a progress bar, and
writes ``index.json`` (what was made, how long it took, versions) into the output folder.
Figures are computed in float64: the runner turns x64 on, as scripts may and the library
never does.
"""

from __future__ import annotations

import importlib.util
import json
import time
import traceback
from pathlib import Path

__all__ = ["find_experiments", "list_figures", "run_figures"]


def find_experiments(path: str | Path | None = None) -> Path:
    """The ``experiments/`` folder: ``path`` if given, else ``./experiments``, else the
    one beside the source tree (an editable install)."""
    candidates = []
    if path is not None:
        candidates.append(Path(path))
    candidates.append(Path.cwd() / "experiments")
    candidates.append(Path(__file__).resolve().parents[2] / "experiments")
    for c in candidates:
        if c.is_dir() and any(c.glob("fig_*.py")):
            return c
    raise ValueError(
        "no experiments/ folder with fig_*.py scripts found; run from the attnflow "
        "repository or pass --experiments DIR."
    )


def list_figures(exp_dir: Path) -> list[str]:
    """Names of the figure scripts (``fig_polytope`` for ``fig_polytope.py``), sorted."""
    return sorted(p.stem for p in exp_dir.glob("fig_*.py"))


def _load(exp_dir: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"attnflow_experiments.{name}",
                                                  exp_dir / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "make"):
        raise ValueError(f"{name}.py defines no make(out_dir, quick) function.")
    return mod


def run_figures(out_dir: str | Path = "figures", *, only: list[str] | None = None,
                quick: bool = False, experiments: str | Path | None = None,
                progress: bool = True) -> dict:
    """Run the figure scripts; return ``{"figures": {name: result}, "failed": {...}}``.

    Args:
        out_dir: where figures and sidecars go (created).
        only: names (with or without the ``fig_`` prefix) to run; default all.
        quick: small versions (seconds each), as the tests use.
        experiments: the folder of scripts (see ``find_experiments``).
        progress: show a progress bar over the scripts.
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib

    matplotlib.use("Agg")
    from tqdm.auto import tqdm

    from .trajectory import run_metadata

    exp_dir = find_experiments(experiments)
    names = list_figures(exp_dir)
    if only:
        wanted = [o if o.startswith("fig_") else f"fig_{o}" for o in only]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise ValueError(f"unknown figure(s) {unknown}; known: {names}.")
        names = [n for n in names if n in wanted]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, {}
    bar = tqdm(names, desc="attnflow figures", unit="fig", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        try:
            res = _load(exp_dir, name).make(out, quick=quick)
            res = dict(res or {})
            res["seconds"] = round(time.perf_counter() - t0, 2)
            res["figures"] = [str(p) for p in res.get("figures", [])]
            results[name] = res
        except Exception as exc:  # keep going: one broken script must not hide the rest
            failed[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    index = {"quick": quick, "figures": results, "failed": failed,
             "versions": run_metadata()}
    (out / ("index_quick.json" if quick else "index.json")).write_text(
        json.dumps(index, indent=2, default=str))
    return index
