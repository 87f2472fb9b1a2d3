"""Ginibre eigenvalue throughput: ginibre_fraction against a plain numpy.linalg.eigvals loop.

Measured side by side in one run, interleaved round by round (so that load from other
processes hits both sides alike); the ratio reported is the median over rounds of
(ours / loop) within a round (best-of-rounds times and CPU times are saved too):

1. per-matrix time of ``attnflow.ginibre_fraction(d, n, workers=1)`` -- everything:
   generating V, eigenvalues, decisions, eigenvectors and Q, K for the samples that pass,
   intervals -- against a plain Python loop ``for A in mats: numpy.linalg.eigvals(A)``
   over pre-generated matrices (generation not timed), at several d; with two of its
   parts timed alone (``numpy.linalg.eigvals`` on the stacked batch, generating V);
2. device scaling: the same study with ``workers=2`` against ``workers=1`` (warm pool);
3. for reference, the JAX backend (``jnp.linalg.eigvals`` sharded by
   ``sweep.map_devices``) with 1 vs 2 forced host devices, each in its own subprocess
   (``XLA_FLAGS=--xla_force_host_platform_device_count=N`` must be set before JAX starts).

One BLAS thread per process (``OPENBLAS_NUM_THREADS=1`` etc., set here before numpy is
imported, and in every worker), so that one process = one core on both sides.

Device scaling needs idle cores: with the machine busy, the scheduler gives this
session a fixed share however many processes it runs (the "cores busy" column shows it).

Run:  python benchmarks/bench_ginibre.py [--quick] [--only loop|workers|jax] [--json F]
"""

from __future__ import annotations

import os

for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

_JAX_CHILD = r"""
import os, sys, time, json
import jax
jax.config.update("jax_enable_x64", True)
from attnflow.studies.ginibre import ginibre_fraction
d, n, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ginibre_fraction(d, max(4, n // 8), seed=99, backend="jax")  # compile
ts, cpu = [], []
for r in range(rounds):
    t, c = time.perf_counter(), time.process_time()
    ginibre_fraction(d, n, seed=r, backend="jax")
    ts.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
print(json.dumps({"devices": len(jax.devices()), "seconds": ts, "cpu": cpu}))
"""


def _samples(d: int, seconds: float) -> int:
    from attnflow.studies.ginibre import _seconds_per_matrix

    return int(min(200_000, max(16, seconds / _seconds_per_matrix(d))))


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _generate_V(seed: int, d: int, start: int, stop: int):
    from attnflow.studies._ginibre_kernel import generate_V as gen

    return gen(seed, d, start, stop)


def plain_loop(mats: np.ndarray) -> tuple[float, float]:
    """(wall, cpu) seconds of a plain loop of numpy.linalg.eigvals."""
    t, c = time.perf_counter(), time.process_time()
    for A in mats:
        np.linalg.eigvals(A)
    return time.perf_counter() - t, time.process_time() - c


def ours(d: int, n: int, seed: int, workers: int) -> tuple[float, float]:
    """(wall, cpu of this process) seconds of ginibre_fraction."""
    from attnflow import ginibre_fraction

    t, c = time.perf_counter(), time.process_time()
    ginibre_fraction(d, n, seed=seed, workers=workers)
    return time.perf_counter() - t, time.process_time() - c


def bench_vs_loop(dims, rounds, seconds):
    rows = []
    for d in dims:
        n = _samples(d, seconds)
        mats = np.random.default_rng(12345).standard_normal((n, d, d))
        plain_loop(mats[: max(1, n // 10)])
        ours(d, max(1, n // 10), 999, 1)  # warm up both
        ref, mine, stacked, gen = [], [], [], []
        for r in range(rounds):
            ref.append(plain_loop(mats))
            mine.append(ours(d, n, r, 1))
            stacked.append(_timed(np.linalg.eigvals, mats))
            gen.append(_timed(_generate_V, r, d, 0, n))
        ref, mine = np.array(ref), np.array(mine)
        row = {
            "d": d,
            "samples": n,
            "rounds": rounds,
            "loop_us": 1e6 * float(np.min(ref[:, 0])) / n,
            "ours_us": 1e6 * float(np.min(mine[:, 0])) / n,
            "ratio_min_wall": float(np.min(mine[:, 0]) / np.min(ref[:, 0])),
            "ratio_median_wall": float(np.median(mine[:, 0]) / np.median(ref[:, 0])),
            "ratio_min_cpu": float(np.min(mine[:, 1]) / np.min(ref[:, 1])),
            "ratio_paired_median": float(np.median(mine[:, 0] / ref[:, 0])),
            "ratio_paired_median_cpu": float(np.median(mine[:, 1] / ref[:, 1])),
            "stacked_eigvals_us": 1e6 * min(stacked) / n,
            "generate_V_us": 1e6 * min(gen) / n,
            "wall": {"loop": ref[:, 0].tolist(), "ours": mine[:, 0].tolist()},
            "cpu": {"loop": ref[:, 1].tolist(), "ours": mine[:, 1].tolist()},
        }
        rows.append(row)
        print(
            f"d={d:4d} n={n:7d}: loop {row['loop_us']:10.2f} us/matrix, "
            f"ginibre_fraction {row['ours_us']:10.2f} us/matrix (best of {rounds}); "
            f"ratio: median of paired rounds {row['ratio_paired_median']:.3f} (cpu "
            f"{row['ratio_paired_median_cpu']:.3f}), best/best {row['ratio_min_wall']:.3f}; "
            f"parts: stacked eigvals {row['stacked_eigvals_us']:.2f}, generating V "
            f"{row['generate_V_us']:.2f} us/matrix",
            flush=True,
        )
    return rows


def _proc_cpu(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _timed_cores(d: int, n: int, seed: int, workers: int) -> tuple[float, float]:
    """(wall seconds, cores used = CPU seconds of this process and its workers / wall)."""
    from attnflow import _parallel

    pids = [os.getpid()] + _parallel.worker_pids(_parallel.shared_pool(2))
    c0 = sum(_proc_cpu(p) for p in pids)
    wall, _ = ours(d, n, seed, workers)
    return wall, (sum(_proc_cpu(p) for p in pids) - c0) / wall


def bench_workers(dims, rounds, seconds):
    rows = []
    ours(dims[0], 64, 998, 2)  # start the pool (spawn + imports, once per process)
    for d in dims:
        n = _samples(d, seconds)
        ours(d, max(16, n // 10), 997, 2)
        one, two = [], []
        load = os.getloadavg()[0]
        for r in range(rounds):
            one.append(_timed_cores(d, n, r, 1))
            two.append(_timed_cores(d, n, r, 2))
        k1 = int(np.argmin([w for w, _ in one]))
        k2 = int(np.argmin([w for w, _ in two]))
        row = {
            "d": d,
            "samples": n,
            "rounds": rounds,
            "one_s": one[k1][0],
            "two_s": two[k2][0],
            "cores_one": one[k1][1],
            "cores_two": two[k2][1],
            "speedup_min": one[k1][0] / two[k2][0],
            "speedup_median": statistics.median(w for w, _ in one)
            / statistics.median(w for w, _ in two),
            "load_before": load,
            "load_after": os.getloadavg()[0],
            "wall": {"one": [w for w, _ in one], "two": [w for w, _ in two]},
        }
        rows.append(row)
        print(
            f"d={d:4d} n={n:6d}: 1 worker {row['one_s']:.2f} s ({row['cores_one']:.2f} "
            f"cores busy), 2 workers {row['two_s']:.2f} s ({row['cores_two']:.2f} cores "
            f"busy) (best of {rounds}); speed-up {row['speedup_min']:.2f}x (medians "
            f"{row['speedup_median']:.2f}x; load {load:.1f} -> {row['load_after']:.1f})",
            flush=True,
        )
    return rows


def bench_jax_devices(d, rounds, seconds):
    n = _samples(d, seconds)
    out, busy = {}, {}
    for ndev in (1, 2):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={ndev}")
        res = subprocess.run(
            [sys.executable, "-c", _JAX_CHILD, str(d), str(n), str(rounds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rec = json.loads(res.stdout.strip().splitlines()[-1])
        k = int(np.argmin(rec["seconds"]))
        out[ndev] = rec["seconds"][k]
        busy[ndev] = rec["cpu"][k] / rec["seconds"][k]  # cores kept busy on average
    row = {
        "d": d,
        "samples": n,
        "one_device_s": out[1],
        "two_devices_s": out[2],
        "speedup": out[1] / out[2],
        "cores_busy_one": busy[1],
        "cores_busy_two": busy[2],
    }
    print(
        f"jax backend d={d} n={n}: 1 device {out[1]:.2f} s, 2 forced devices "
        f"{out[2]:.2f} s (best of {rounds}), speed-up {row['speedup']:.2f}x; cpu/wall "
        f"{busy[1]:.2f} and {busy[2]:.2f}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=str, default=None, help="write the numbers here")
    ap.add_argument(
        "--only", choices=["loop", "workers", "jax"], default=None, help="run one section only"
    )
    args = ap.parse_args()
    rounds, seconds = (3, 0.3) if args.quick else (9, 1.0)
    dims = [2, 8, 32, 128] if args.quick else [2, 8, 32, 64, 128, 256]
    load0 = os.getloadavg()
    print(
        f"cores {len(os.sched_getaffinity(0))}, load average {load0[0]:.2f}, "
        f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}",
        flush=True,
    )
    res = {}
    if args.only in (None, "loop"):
        res["vs_loop"] = bench_vs_loop(dims, rounds, seconds)
    if args.only in (None, "workers"):
        res["workers"] = bench_workers(
            [d for d in dims if d >= 64] or dims[-1:], rounds, 2 * seconds
        )
    if args.only in (None, "jax"):
        res["jax_devices"] = bench_jax_devices(128 if not args.quick else 32, rounds, seconds)
    import jax

    res["meta"] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "load_before": load0,
        "load_after": os.getloadavg(),
        "quick": args.quick,
        "command": "python benchmarks/bench_ginibre.py" + (" --quick" if args.quick else ""),
    }
    print(f"load average after: {res['meta']['load_after'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
