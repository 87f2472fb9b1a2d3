"""Run the figure scripts (what ``attnflow figures`` does).

The scripts are the subpackage ``attnflow.experiments``, installed with attnflow, so the
command works from any folder; ``experiments=DIR`` (``--experiments DIR``) runs an
external folder of ``fig_*.py`` scripts instead. Each ``fig_*.py`` defines
``make(out_dir: Path, quick: bool = False) -> dict`` returning at least
``{"figures": [paths]}`` and writes its own sidecar JSON with every parameter. The runner
imports them in name order, runs them with a progress bar, and writes ``index.json``
(what was made, how long it took, versions) into the output folder. What a script prints
is kept off the progress bar: it is stored in the index (``"output"``); a script that
fails is reported on stderr with its traceback and what it printed.

A script whose inputs are unchanged since the last run into the same folder is not run
again: its saved results are reused (``"reused": true`` in the index). The inputs are the
source of the installed attnflow package and of the script, ``quick``, and the versions of
the numerical stack (``run_metadata``), hashed into the index's ``"inputs"``; a script
is run again when any of them changed, when a file it made is missing, or when it made
no file (a script that found an optional package missing). ``reuse=False``
(``attnflow figures --force``) runs every script.

``redraw=True`` (``attnflow figures --redraw``) computes nothing: each script written as
compute, then draw (``attnflow.experiments._figure``) draws again from the data it saved
in the output folder, and rewrites its figures and sidecar (the same numbers). A figure
whose data is missing, was saved by another attnflow version or by a run with the other
``quick``, or whose script is not written that way, is reported as failed with what to
run instead; the others are still drawn. JAX is not used, and ``index.json`` is left as
it was.

The index is written (atomically) as each script finishes, so a run that is stopped
or killed leaves an index of what finished, and ``only`` keeps the entries of the scripts
it did not run: the next run reuses both. SIGTERM stops a run: the scripts running are
killed and no queued script starts (the index holds what finished). A worker process
that dies (killed, out of memory) costs its script alone: the scripts it took down with
it are run again, each alone in a fresh worker; one whose worker dies again is recorded
as failed, and the run goes on. One run at a time writes into an output folder: the
lock file ``.attnflow-figures.lock`` (the pid of the run holding it) makes a second
concurrent run refuse, naming the folder and the pid; a lock left by a process that no
longer runs is taken over.

Figures are computed in float64: ``run_figures`` turns x64 on for the duration of the call
and restores the previous setting on return. Run in this process (``jobs=1``) it leaves
matplotlib's backend and rcParams as it found them; worker processes, which the runner
starts and owns (``attnflow._parallel.process_pool``: loky's, one BLAS thread each,
gone when the runner dies or is sent SIGTERM), draw with the Agg backend.

On a GPU, figures are made with XLA's deterministic ops (``_xla_flags``, in the workers
and in this process); every matmul asks for full float32 precision (``_precision``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from .. import _cache, _parallel
from .._meta import source_digest
from ._lock import LOCK, FolderBusy, folder_lock
from ._xla_flags import deterministic_here, worker_env

__all__ = [
    "find_experiments",
    "list_figures",
    "run_figures",
    "default_jobs",
    "worker_env",
    "FolderBusy",
    "LOCK",
]


def _installed() -> Path:
    """The folder of the installed ``attnflow.experiments`` subpackage."""
    return Path(__file__).resolve().parent


def find_experiments(path: str | Path | None = None) -> Path:
    """The folder of figure scripts: ``path`` if given (a folder of ``fig_*.py``
    scripts), else the installed subpackage ``attnflow.experiments``."""
    if path is None:
        return _installed()
    p = Path(path)
    if p.is_dir() and any(p.glob("fig_*.py")):
        return p
    raise ValueError(
        f"{str(p)!r} is not a folder of fig_*.py scripts; pass such a folder to "
        "--experiments, or leave the option out to run the figures installed with "
        "attnflow."
    )


def list_figures(exp_dir: Path) -> list[str]:
    """Names of the figure scripts (``fig_polytope`` for ``fig_polytope.py``), sorted."""
    return sorted(p.stem for p in exp_dir.glob("fig_*.py"))


def _load(exp_dir: Path, name: str):
    """The module of script ``name``: imported from ``attnflow.experiments`` when
    ``exp_dir`` is the installed subpackage, else loaded from ``exp_dir/name.py``."""
    if Path(exp_dir).resolve() == _installed():
        mod = importlib.import_module(f"{__package__}.{name}")
    else:
        spec = importlib.util.spec_from_file_location(
            f"attnflow_experiments.{name}", Path(exp_dir) / f"{name}.py"
        )
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {name}.py from {str(exp_dir)!r}.")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    if not hasattr(mod, "make"):
        raise ValueError(f"{name}.py defines no make(out_dir, quick) function.")
    return mod


def _init_worker() -> None:
    """Set up a worker process of the runner: x64 on, the Agg backend (the process is
    the runner's, so it may choose both)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import matplotlib

    matplotlib.use("Agg")


def _run_one(exp_dir: str, name: str, out: str, quick: bool) -> tuple:
    """Run one script's ``make``; ``(name, result, None)`` or ``(name, None, error)``.

    Module level so that a worker process can run it. Results go through JSON (as
    ``index.json`` stores them), so what a worker returns is plain data. x64 is on
    (``run_figures`` or ``_init_worker`` turned it on)."""
    t0 = time.perf_counter()
    printed = io.StringIO()  # what the script prints stays off the progress bar
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            res = _load(Path(exp_dir), name).make(Path(out), quick=quick)
        res = dict(res or {})
        res["seconds"] = round(time.perf_counter() - t0, 2)
        res["figures"] = [str(p) for p in res.get("figures", [])]
        if printed.getvalue():
            res["output"] = printed.getvalue()
        return name, json.loads(json.dumps(res, default=str)), None
    except Exception as exc:  # keep going: one broken script must not hide the rest
        said = f"\nit printed:\n{printed.getvalue()}" if printed.getvalue() else ""
        return name, None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}{said}"
    finally:
        # a worker runs script after script: keep its compiled programs under the
        # process's memory-map limit (attnflow._cache.MAX_MEMORY_REGIONS)
        _cache.release_compiled_programs()


def input_key(exp_dir: Path, name: str, quick: bool, package: str, versions: dict) -> str:
    """The inputs of one script's results: the package digest, the script's source,
    ``quick`` and the versions (see the module docstring)."""
    h = hashlib.sha256(package.encode())
    h.update((Path(exp_dir) / f"{name}.py").read_bytes())
    # the commit (attnflow_build) is not an input: the package digest holds the code
    versions = {k: v for k, v in versions.items() if k != "attnflow_build"}
    h.update(json.dumps({"quick": bool(quick), "versions": versions}, sort_keys=True).encode())
    return h.hexdigest()


def _previous_index(out: Path, quick: bool) -> dict:
    """The index of the last run in ``out`` (``{}`` if none can be read)."""
    try:
        index = json.loads((out / ("index_quick.json" if quick else "index.json")).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _section(index: dict, key: str, known: set[str]) -> dict:
    """The entries of ``index[key]`` (a dict of script names) of the ``known`` scripts."""
    part = index.get(key)
    return {k: v for k, v in part.items() if k in known} if isinstance(part, dict) else {}


def _reusable(index: dict, keys: dict[str, str]) -> dict:
    """The results in an earlier run's ``index`` whose inputs equal ``keys[name]`` and
    whose files all exist."""
    previous = index.get("figures")
    if not isinstance(previous, dict):
        return {}
    ok = {}
    for name, res in previous.items():
        files = res.get("figures") if isinstance(res, dict) else None
        if (
            files
            and name in keys
            and res.get("inputs") == keys[name]
            and all(Path(f).is_file() for f in [*files, *([res["data"]] if "data" in res else [])])
        ):
            ok[name] = {**res, "reused": True}
    return ok


def _previous_seconds(index: dict) -> dict:
    """Seconds per script in an earlier run's ``index``."""
    try:
        return {k: float(v.get("seconds", 0.0)) for k, v in index["figures"].items()}
    except (KeyError, TypeError, AttributeError, ValueError):
        return {}


def _expected_seconds(exp_dir: Path, names: list[str], quick: bool, index: dict) -> dict:
    """Each script's expected seconds: its own ``SECONDS = {"quick": s, "full": s}`` (the
    times measured on a 2-core machine, two jobs), else what the earlier run of
    ``index`` took, else 0."""
    before = _previous_seconds(index)
    expected = {}
    for name in names:
        declared = getattr(_load(exp_dir, name), "SECONDS", None)
        try:
            expected[name] = float(declared["quick" if quick else "full"])  # pyright: ignore
        except (TypeError, KeyError, ValueError):
            expected[name] = before.get(name, 0.0)
    return expected


def _long_scripts(exp_dir: Path, names: list[str]) -> dict[str, str]:
    """The scripts that declare ``LONG = "why"`` (a study of an hour or more, such as
    training a model per kernel): left out of a full run unless named with ``only``."""
    out = {}
    for name in names:
        why = getattr(_load(exp_dir, name), "LONG", None)
        if why:
            out[name] = f"not run: {why} (run it with --only {name.removeprefix('fig_')})"
    return out


def _exclusive_scripts(exp_dir: Path, names: list[str]) -> set[str]:
    """The scripts that declare ``EXCLUSIVE = True``: they parallelise over the machine's
    cores themselves (a large batch on XLA's threads, a sweep's own process pool), so
    the runner gives them the machine alone; their ``SECONDS`` is their time alone."""
    return {n for n in names if getattr(_load(exp_dir, n), "EXCLUSIVE", False) is True}


def _unavailable_scripts(exp_dir: Path, names: list[str]) -> dict[str, str]:
    """The scripts that declare ``REQUIRES`` (optional modules) of which one is not
    installed, with why: skipped before the start, never counted in the progress."""
    from ._figure import missing

    out = {}
    for name in names:
        requires = getattr(_load(exp_dir, name), "REQUIRES", ())
        why = missing(tuple(requires)) if requires else None
        if why:
            out[name] = why
    return out


def _run_pool(
    exp_dir: Path,
    names: list[str],
    out: Path,
    quick: bool,
    workers: int,
    record: Callable[[str, dict | None, str | None], None],
) -> None:
    """Run ``names`` in worker processes, ``workers`` at a time (in order; nothing waits
    in the pool's queue, so a stop leaves nothing to start), calling ``record`` as each
    finishes. A worker's death takes the scripts running beside it down: they are run
    again, each alone in a fresh worker; one that dies alone is recorded as failed."""
    pending = deque(names)
    lost: list[str] = []
    while pending:
        lost += _pool_round(exp_dir, pending, out, quick, workers, record)
        for name in lost:  # each alone: a death is then its own
            if not _pool_round(exp_dir, deque([name]), out, quick, 1, record):
                continue
            record(
                name,
                None,
                "WorkerDied: the worker process running it died (killed, or out of memory); "
                "the other scripts went on",
            )
        lost = []


def _pool_round(exp_dir, pending: deque, out, quick, workers, record) -> list[str]:
    """One pool of ``workers`` running ``pending`` (consumed) until it is empty or a
    worker dies; returns the scripts lost with a dead worker."""
    pool = _parallel.process_pool(
        min(workers, len(pending)), initializer=_init_worker, env=worker_env()
    )
    running: dict = {}
    lost: list[str] = []
    try:
        with _parallel.shutdown_on_sigterm(pool):
            while pending or running:
                while pending and len(running) < workers:
                    name = pending.popleft()
                    running[pool.submit(_run_one, str(exp_dir), name, str(out), quick)] = name
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for fut in done:
                    name = running.pop(fut)
                    try:
                        record(*fut.result())
                    except BrokenProcessPool:
                        lost.append(name)
                        broken = True
                if broken:
                    lost += running.values()
                    running.clear()
                    break
    except BaseException:
        _parallel.kill_workers(pool)  # SIGTERM, Ctrl-C: what runs dies, nothing starts
        raise
    if lost:
        _parallel.kill_workers(pool)
    else:
        pool.shutdown(wait=True)
    return lost


def default_jobs() -> int:
    """Worker processes for ``run_figures``: one per core this process may use."""
    return _parallel.available_cores()


def run_figures(
    out_dir: str | Path = "figures",
    *,
    only: list[str] | None = None,
    quick: bool = False,
    experiments: str | Path | None = None,
    progress: bool = True,
    jobs: int | None = None,
    reuse: bool = True,
    redraw: bool = False,
) -> dict:
    """Run the figure scripts; return ``{"figures": {name: result}, "failed": {...},
    "skipped": {name: why}}``.

    Args:
        out_dir: where figures and sidecars go (created).
        only: names (with or without the ``fig_`` prefix) to run; default all but the
            scripts that declare ``LONG`` (studies of an hour or more: the max-retrieval
            training), which a full run lists under ``"skipped"``; ``--quick`` runs them
            all.
        quick: small versions (seconds each), as the tests use.
        experiments: the folder of scripts (see ``find_experiments``).
        progress: show a progress bar over the scripts.
        jobs: scripts run at once, each in a worker process (a fresh interpreter, one
            BLAS thread each; a worker runs several scripts one after the other).
            Default: one per core. With 1, everything runs in this process. Much of a
            quick run is single-threaded XLA compilation, so two workers on two cores
            nearly halve it. In a full run the scripts that declare ``EXCLUSIVE = True``
            (they use every core themselves) run first, one at a time with nothing
            beside them; then the others, the longest first, by the ``SECONDS`` each
            script declares (else by an earlier run's ``index.json``).
        reuse: reuse the saved results of scripts whose inputs are unchanged (see the
            module docstring); False runs every script.
        redraw: compute nothing: draw every selected figure again from the data saved
            in ``out_dir`` (see the module docstring); ``jobs`` and ``reuse`` are
            ignored. The result has ``"redraw": true``.

    x64 is on for the duration of the call (figures are computed in float64); the
    previous setting is restored on return. In this process, matplotlib's backend is
    left alone (the scripts close every figure they draw) and the scripts see
    matplotlib's default rcParams, as a worker does; the caller's are restored on
    return. Worker processes draw with Agg.

    Example:
        >>> index = run_figures("figures", quick=True, only=["origin"])  # doctest: +SKIP
        >>> again = run_figures("figures", quick=True, redraw=True)  # doctest: +SKIP
        >>> again["figures"]["fig_origin"]["redrawn"]  # doctest: +SKIP
        True
    """
    if redraw:
        return _redraw_figures(
            out_dir, only=only, quick=quick, experiments=experiments, progress=progress
        )
    import jax

    x64 = bool(jax.config.read("jax_enable_x64"))
    jax.config.update("jax_enable_x64", True)
    try:
        return _run_figures(
            out_dir,
            only=only,
            quick=quick,
            experiments=experiments,
            progress=progress,
            jobs=jobs,
            reuse=reuse,
        )
    finally:
        jax.config.update("jax_enable_x64", x64)


def _select(exp_dir: Path, only: list[str] | None, quick: bool) -> tuple[list[str], dict]:
    """The scripts to run (``only``, else all but the ``LONG`` ones) and the skipped."""
    names = list_figures(exp_dir)
    if only:
        wanted = [o if o.startswith("fig_") else f"fig_{o}" for o in only]
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise ValueError(f"unknown figure(s) {unknown}; known: {names}.")
        names = [n for n in names if n in wanted]
    skipped = {} if (only or quick) else _long_scripts(exp_dir, names)
    return [n for n in names if n not in skipped], skipped


def _redraw_one(exp_dir: Path, name: str, out: Path, quick: bool) -> tuple:
    """Redraw one script from its saved data; ``(name, result, None)`` or ``(name, None,
    error)``."""
    t0 = time.perf_counter()
    try:
        make = _load(exp_dir, name).make
        redraw = getattr(make, "redraw", None)
        if redraw is None:
            raise ValueError(
                f"{name} computes and draws in one make(), so it cannot be redrawn; run it "
                f"without --redraw: attnflow figures{' --quick' if quick else ''} --only "
                f"{name.removeprefix('fig_')}"
            )
        res = dict(redraw(out, quick=quick))
        res["seconds"] = round(time.perf_counter() - t0, 2)
        res["figures"] = [str(p) for p in res.get("figures", [])]
        return name, json.loads(json.dumps({**res, "redrawn": True}, default=str)), None
    except Exception as exc:  # keep going: one missing data file must not hide the rest
        return name, None, f"{type(exc).__name__}: {exc}"


def _redraw_figures(out_dir, *, only, quick, experiments, progress) -> dict:
    import matplotlib
    from tqdm.auto import tqdm

    exp_dir = find_experiments(experiments)
    names, skipped = _select(exp_dir, only, quick)
    out = Path(out_dir)
    results, failed = {}, {}
    # what the last run in out_dir skipped (Skipped in compute) has no data to redraw
    before = _previous_index(out, quick).get("skipped", {})
    before = before if isinstance(before, dict) else {}
    for name in [n for n in names if n in before]:
        skipped[name] = f"skipped when computed: {before[name]}"
        names.remove(name)
    t_all = time.perf_counter()
    with matplotlib.rc_context():  # as in a run in this process: the defaults, restored
        matplotlib.rc_file_defaults()
        for name in tqdm(names, desc="attnflow figures --redraw", unit="fig", disable=not progress):
            name, res, err = _redraw_one(exp_dir, name, out, quick)
            if err is None:
                results[name] = res
            else:
                failed[name] = err
    return {
        "quick": quick,
        "redraw": True,
        "jobs": 1,
        "seconds": round(time.perf_counter() - t_all, 2),
        "figures": results,
        "failed": failed,
        "skipped": skipped,
    }


def _run_figures(out_dir, *, only, quick, experiments, progress, jobs, reuse) -> dict:
    exp_dir = find_experiments(experiments)
    names, skipped = _select(exp_dir, only, quick)
    # a script that needs an optional module that is not installed is known before the
    # start: it is skipped, and neither run nor counted in the progress
    skipped.update(_unavailable_scripts(exp_dir, names))
    names = [n for n in names if n not in skipped]
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1; got {jobs}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out):
        return _run_locked(out, exp_dir, names, skipped, quick, progress, jobs, reuse)


def _run_locked(out, exp_dir, names, skipped, quick, progress, jobs, reuse) -> dict:
    import matplotlib

    from .._meta import run_metadata
    from ..io.files import write_text
    from ._progress import WorkProgress

    versions = run_metadata()
    package = source_digest()
    keys = {n: input_key(exp_dir, n, quick, package, versions) for n in names}
    previous = _previous_index(out, quick)  # read once: reuse and the order
    reused = _reusable(previous, keys) if reuse else {}
    # the scripts that use every core first, one at a time, then the others on the
    # workers, the longest first: a long script started last would run alone at the end
    expected = _expected_seconds(exp_dir, names, quick, previous)
    exclusive = set() if quick else _exclusive_scripts(exp_dir, names)  # quick ones are small
    order = sorted(
        (n for n in names if n not in reused), key=lambda n: (n not in exclusive, -expected[n])
    )
    results, failed = dict(reused), {}
    t_all = time.perf_counter()
    bar = WorkProgress(
        order,
        expected,
        1 if jobs == 1 or len(order) <= 1 else min(jobs, len(order)),
        done=len(reused),
        total_figures=len(names),
        disable=not progress,
        exclusive=exclusive,
        skipped=skipped,
    )

    index_path = out / ("index_quick.json" if quick else "index.json")
    known = set(list_figures(exp_dir))

    def index_now() -> dict:
        """This run's results over the earlier index's entries of the scripts this run
        has not (yet) run: what the folder holds now."""
        before, before_failed, before_skipped = (
            _section(previous, key, known) for key in ("figures", "failed", "skipped")
        )
        mine = {n: r for n, r in results.items() if not r.get("skipped")}
        said = {n: r["skipped"] for n, r in results.items() if r.get("skipped")}
        now_skipped = {**skipped, **said}
        done = set(results) | set(failed) | set(now_skipped)
        figures = {**{k: v for k, v in before.items() if k not in done}, **mine}
        return {
            "quick": quick,
            "jobs": jobs,
            "seconds": round(time.perf_counter() - t_all, 2),
            "figures": {n: figures[n] for n in sorted(figures)},
            "failed": {**{k: v for k, v in before_failed.items() if k not in done}, **failed},
            "skipped": {
                **{k: v for k, v in before_skipped.items() if k not in done},
                **now_skipped,
            },
            "versions": versions,
        }

    def record(name, res, err):
        if err is None:
            results[name] = {**res, "inputs": keys[name]}
        else:
            failed[name] = err.splitlines()[0]
            print(err, file=sys.stderr)
        bar.finished(name, skipped=bool(err is None and res.get("skipped")), failed=err is not None)
        write_text(index_path, json.dumps(index_now(), indent=2, default=str))

    try:
        if not order:
            pass
        elif jobs == 1 or len(order) <= 1:
            deterministic_here()
            # rcParams as a fresh worker has them (the caller's own settings must not reach
            # the figures), and as the caller had them again on return
            with matplotlib.rc_context():
                matplotlib.rc_file_defaults()
                for name in order:
                    record(*_run_one(str(exp_dir), name, str(out), quick))
        else:
            # spawned workers, one BLAS thread each, that exit if this process dies; SIGTERM
            # stops them with it. The exclusive scripts each with the machine to itself.
            alone = [n for n in order if n in exclusive]
            if alone:
                _run_pool(exp_dir, alone, out, quick, 1, record)
            rest = [n for n in order if n not in exclusive]
            if rest:
                _run_pool(exp_dir, rest, out, quick, min(jobs, len(rest)), record)
    finally:
        bar.close()
    results = {n: results[n] for n in names if n in results}
    # a script whose compute raised Skipped (e.g. a model that is not installed)
    skipped.update({n: r["skipped"] for n, r in results.items() if r.get("skipped")})
    results = {n: r for n, r in results.items() if n not in skipped}
    write_text(index_path, json.dumps(index_now(), indent=2, default=str))
    return {
        "quick": quick,
        "jobs": jobs,
        "seconds": round(time.perf_counter() - t_all, 2),
        "figures": results,
        "failed": failed,
        "skipped": skipped,
        "versions": versions,
    }
