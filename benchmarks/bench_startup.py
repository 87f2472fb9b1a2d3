"""Start-up latencies, cold and warm side by side: the command line, ``import attnflow``,
the README's ten lines in a fresh process and a session of commands (``classify
--simulate``, ``rank``, ``simulate``, one after the other in one process), each without
the compilation cache, with an empty one (the run that fills it) and with the filled one.

Every number is the wall time of a fresh process (the best of ``--repeats`` where the
run is cheap). For the ten lines and the session the child process also counts, with
``jax.monitoring`` listeners, the programs JAX compiles: ``programs`` (compilation requests),
``compiled`` (by XLA) and ``from_cache`` (read from the persistent cache), and the
seconds spent in XLA compilation or cache reads. The machine's load is recorded before
and after.

The last ten-lines row is an experiment, not what the library does: the child sets
``equinox._errors.EQX_ON_ERROR = "off"``, which removes the two host callbacks that
diffrax's checks of ``saveat.ts`` put into the adaptive solve, so that JAX caches the
solve too; it shows what a cacheable solve would give.

    python benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save

TEN_LINES = r"""
import json, os, sys, time
t0 = time.perf_counter()
import jax
from jax import monitoring

counts, seconds = {}, {"compile_or_read_s": 0.0}
def on_event(event, **kwargs):
    if "compilation_cache" in event:
        key = event.rsplit("/", 1)[-1]
        counts[key] = counts.get(key, 0) + 1
def on_duration(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        counts["programs"] = counts.get("programs", 0) + 1
        seconds["compile_or_read_s"] += duration
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)
if os.environ.get("BENCH_SOLVE_CACHEABLE"):
    import equinox._errors
    equinox._errors.EQX_ON_ERROR = "off"

jax.config.update("jax_enable_x64", True)  # float64 (optional)
import numpy as np, attnflow as af
cache = af.enable_compilation_cache()
t_import = time.perf_counter() - t0

V = af.matrices.PAPER["paper-2d"]  # eigenvalues 1.348, -0.068
model = af.Attention(Q=np.eye(2), K=np.eye(2), V=V)  # softmax attention, beta = 1
x0 = np.random.default_rng(0).uniform(-5, 5, (20, 2))  # 20 tokens in R^2
t = time.perf_counter()
traj = af.simulate(model, x0, t1=10.0, ts=np.linspace(0, 10, 101))
traj.raise_for_status()  # or inspect traj.status
t_first = time.perf_counter() - t
print(af.predict_regime(model).label, af.observe_limit(traj).label, file=sys.stderr)
print(traj.attention(-1).round(2), file=sys.stderr)  # P at t = 10: nearly Boolean
layers = af.simulate(model, x0, 10.0, method="euler", dt=0.1)  # a 100-layer transformer
t_total = time.perf_counter() - t0
hits = counts.get("cache_hits", 0)
print(json.dumps({
    "cache": None if cache is None else str(cache),
    "import_s": t_import,
    "first_simulate_s": t_first,
    "ten_lines_s": t_total,
    "programs": counts.get("programs", 0),
    "compiled": counts.get("programs", 0) - hits,
    "from_cache": hits,
    "compile_or_read_s": seconds["compile_or_read_s"],
}))
"""


# One process running a typical session of commands in turn: the programs each compiles
# (counted as in TEN_LINES), with whatever cache the environment gives.
SESSION = r"""
import contextlib, io, json, sys, time
from jax import monitoring
from attnflow.cli import main

counts = {"programs": 0, "from_cache": 0}
def on_event(event, **kwargs):
    if event.endswith("/cache_hits"):
        counts["from_cache"] += 1
def on_duration(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        counts["programs"] += 1
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)
out = {}
for args in json.loads(sys.argv[1]):
    before = dict(counts)
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
        except SystemExit as exc:
            assert exc.code == 0, (args, exc.code)
    out["attnflow " + " ".join(args)] = {
        "s": time.perf_counter() - t, **{k: counts[k] - before[k] for k in counts}
    }
print(json.dumps(out))
"""
SESSION_COMMANDS = [
    ["classify", "--V", "paper-2d", "--simulate"],
    ["rank", "--V", "paper-2d"],
    ["simulate", "--V", "paper-2d", "--json"],
]


def session(env: dict[str, str]) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", SESSION, json.dumps(SESSION_COMMANDS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def _attnflow() -> list[str]:
    """The ``attnflow`` console script next to this Python, else ``python -m attnflow``."""
    script = Path(sys.executable).with_name("attnflow")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "attnflow"]


def wall(cmd: list[str], env: dict[str, str], repeats: int) -> dict:
    """Wall times of ``cmd`` in fresh processes: best and median of ``repeats``."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        times.append(time.perf_counter() - t)
        if p.returncode != 0:
            raise RuntimeError(f"{cmd}: {p.stderr}")
    return {"best_s": min(times), "median_s": statistics.median(times), "runs": len(times)}


def ten_lines(env: dict[str, str]) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", TEN_LINES], capture_output=True, text=True, env=env, timeout=600
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs of each cheap command")
    args = ap.parse_args()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="attnflow-bench-startup-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNFLOW_", "JAX_"))}
    off = {**base, "ATTNFLOW_COMPILATION_CACHE": "0"}

    def cached(name: str) -> dict[str, str]:
        return {**base, "ATTNFLOW_CACHE_DIR": str(tmp / name)}

    af = _attnflow()
    r = args.repeats
    out: dict = {"command": "python benchmarks/bench_startup.py --repeats " + str(r)}
    try:
        out["cli"] = {
            "attnflow --version": wall([*af, "--version"], off, r),
            "attnflow --help": wall([*af, "--help"], off, r),
            "attnflow simulate --help": wall([*af, "simulate", "--help"], off, r),
            "attnflow simulate --frame bad (usage error)": _usage_error(af, off, r),
            "attnflow classify --V paper-2d": wall([*af, "classify", "--V", "paper-2d"], off, r),
        }
        out["import"] = {
            "python -c pass": wall([sys.executable, "-c", "pass"], off, r),
            "import attnflow": wall([sys.executable, "-c", "import attnflow"], off, r),
            "import attnflow; attnflow.simulate": wall(
                [sys.executable, "-c", "import attnflow; attnflow.simulate"], off, r
            ),
            "import jax": wall([sys.executable, "-c", "import jax"], off, r),
        }
        sim = [*af, "simulate", "--n", "8", "--t1", "5", "--json"]
        out["cli_simulate"] = {
            "no cache (--no-cache)": wall([*af, "--no-cache", *sim[1:]], base, 2),
            "empty cache (fills it)": wall(sim, cached("cli"), 1),
            "warm cache": wall(sim, cached("cli"), 2),
        }
        out["ten_lines"] = {
            "no cache": ten_lines(off),
            "empty cache (fills it)": ten_lines(cached("ten")),
            "warm cache": ten_lines(cached("ten")),
            "warm cache, again": ten_lines(cached("ten")),
        }
        out["session"] = {
            "no cache": session(off),
            "empty cache (fills it)": session(cached("session")),
            "warm cache": session(cached("session")),
        }
        experiment = {**cached("cacheable"), "BENCH_SOLVE_CACHEABLE": "1"}
        ten_lines(experiment)  # fills the cache
        out["ten_lines"]["warm cache, solve made cacheable (experiment)"] = ten_lines(experiment)
        out["cache_entries"] = {
            name: len(list((tmp / name).glob("*-cache")))
            for name in ("cli", "ten", "session", "cacheable")
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_avg_before"] = load_before
    out["load_avg_after"] = os.getloadavg()
    save("startup", out)


def _usage_error(af: list[str], env: dict[str, str], repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        p = subprocess.run([*af, "simulate", "--frame", "bad"], capture_output=True, env=env)
        times.append(time.perf_counter() - t)
        assert p.returncode == 2, p.stderr
    return {"best_s": min(times), "median_s": statistics.median(times), "runs": len(times)}


if __name__ == "__main__":
    main()
