"""Shared helpers of the benchmark scripts: timing, results files, machine facts."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Smallest wall time of ``fn()`` over ``repeats`` runs, after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def machine() -> dict:
    import jax
    import numpy as np

    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "devices": [str(d) for d in jax.devices()],
        "x64": bool(jax.config.jax_enable_x64),
        "load_avg_1min": os.getloadavg()[0],
    }


def save(name: str, result: dict) -> Path:
    """Write ``benchmarks/results/<name>.json`` and print it."""
    RESULTS.mkdir(exist_ok=True)
    result = {**result, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M")}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=float))
    print(json.dumps(result, indent=2, default=float))
    return path
