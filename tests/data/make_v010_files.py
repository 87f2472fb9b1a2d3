"""Write the trajectory files of attnflow 0.1.0 that tests/test_trajectory_io.py reads.

These files record the layout ``Trajectory.save`` wrote in version 0.1.0 (the JSON
metadata flat, ``"format": 1``, the model's weights both in the JSON and as arrays), so
that the loader of every later version can be tested against files it did not write. The
script was run once, with the code of 0.1.0 (before the layout changed):

    git archive 34008d4 src | tar -x -C /tmp/v010
    PYTHONPATH=/tmp/v010/src .venv/bin/python tests/data/make_v010_files.py

It writes ``tests/data/trajectory_v0_1_0/<case>.npz`` and ``expected.json``: for each
file, what the run held in memory when it was written (sha256 digests of its arrays, the
model's arrays and description, its statuses and statistics, the last attention matrix),
and the metadata JSON as written. It refuses to run with a version that writes another
layout (the files would no longer be the old ones).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import attnflow as af  # noqa: E402

OUT = Path(__file__).resolve().parent / "trajectory_v0_1_0"
RNG = np.random.default_rng(20260101)


def digest(a) -> dict:
    """dtype, shape and sha256 of an array's bytes (C order)."""
    a = np.asarray(a)
    return {
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(),
    }


def mat(d: int, scale: float = 0.6) -> np.ndarray:
    return RNG.normal(size=(d, d)) * scale


def cases() -> dict:
    """name -> (trajectory to save, extra metadata keys)."""
    out = {}
    # one head, rescaled frame (modal coordinates), adaptive
    m = af.Attention(mat(2), mat(2), np.array([[1.1, 0.3], [-0.2, 0.4]]), beta=1.5)
    out["attention_rescaled_adaptive"] = (
        af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 1.5, ts=[0.0, 0.5, 1.5]),
        {"seed": 1},
    )
    # original frame, the discrete transformer
    m = af.Attention(mat(3), mat(3), mat(3))
    out["original_euler"] = (
        af.simulate(
            m,
            RNG.uniform(-1, 1, (4, 3)),
            1.0,
            ts=[0.0, 0.5, 1.0],
            frame="original",
            method="euler",
            dt=0.25,
        ),
        {},
    )
    # a defective V (no modal basis): standard coordinates, the layer maps R^k kept
    m = af.Attention(np.eye(2), np.eye(2), np.array([[1.0, 1.0], [0.0, 1.0]]))
    out["jordan_rescaled_euler"] = (
        af.simulate(m, RNG.uniform(-1, 1, (3, 2)), 1.0, ts=[0.0, 0.5, 1.0], method="euler", dt=0.1),
        {},
    )
    # the sphere, pre-layer-norm layers
    m = af.Attention(mat(3), mat(3), mat(3), beta=2.0)
    out["sphere_euler_prenorm"] = (
        af.simulate(
            m,
            RNG.normal(size=(4, 3)),
            1.0,
            ts=[0.0, 0.5, 1.0],
            frame="sphere",
            method="euler",
            dt=0.25,
            layernorm="pre",
        ),
        {},
    )
    # a batch of three systems
    m = af.Attention(np.eye(2), np.eye(2), np.diag([1.0, 0.5]))
    out["batch_adaptive"] = (
        af.simulate(m, RNG.uniform(-1, 1, (3, 4, 2)), 1.0, ts=[0.0, 0.5, 1.0]),
        {"seed": 2},
    )
    # stacked weights: 0.1.0 saves one system of the stack at a time
    ms = [af.Attention(mat(2), mat(2), mat(2)) for _ in range(2)]
    stacked = af.simulate(af.stack(ms), RNG.uniform(-1, 1, (2, 4, 2)), 1.0, ts=[0.0, 1.0])
    out["stacked_system1"] = (stacked.system(1), {"system": 1})
    # several heads
    QS, KS, VS = (RNG.normal(size=(2, 2, 2)) * 0.5 for _ in range(3))
    m = af.MultiHeadAttention(QS, KS, VS, beta=0.5)
    out["multihead_euler"] = (
        af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 0.5, ts=[0.0, 0.5], method="euler", dt=0.1),
        {},
    )
    # a transformer block: causal attention and a feed-forward layer
    W1, b1, W2, b2 = (
        RNG.normal(size=(3, 2)),
        RNG.normal(size=3),
        RNG.normal(size=(2, 3)),
        0.1 * RNG.normal(size=2),
    )
    m = af.Block(
        af.Attention(mat(2), mat(2), mat(2), mask="causal"), af.FeedForward(W1, b1, W2, b2)
    )
    out["block_original_euler"] = (
        af.simulate(
            m,
            RNG.uniform(-1, 1, (4, 2)),
            0.5,
            ts=[0.0, 0.5],
            frame="original",
            method="euler",
            dt=0.1,
        ),
        {},
    )
    # a kernel with a parameter, under a causal mask
    m = af.Attention(
        mat(2), mat(2), mat(2), kernel="ssmax", kernel_params={"s": 2.0}, mask="causal"
    )
    out["ssmax_causal"] = (
        af.simulate(m, RNG.uniform(-1, 1, (5, 2)), 1.0, ts=[0.0, 0.5, 1.0]),
        {},
    )
    # the isotropic family
    m = af.IsotropicAttention(2, beta=2.0)
    out["isotropic_original"] = (
        af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 1.0, ts=[0.0, 1.0], frame="original"),
        {},
    )
    # failures: the step limit (one system), and an overflowing batch (NaN-filled saves)
    m = af.Attention(np.eye(2), np.eye(2), np.diag([2.0, 1.0]), beta=2.0)
    out["failed_max_steps"] = (
        af.simulate(m, RNG.uniform(-1, 1, (4, 2)), 3.0, ts=[0.0, 1.0, 3.0], max_steps=4),
        {},
    )
    m = af.Attention(np.eye(2), np.eye(2), np.diag([3.0, -0.5]))
    x0 = RNG.uniform(-1, 1, (2, 4, 2)) * np.array([1.0, 1e140])[:, None, None]
    out["batch_overflow_euler"] = (
        af.simulate(m, x0, 40.0, ts=[0.0, 20.0, 40.0], method="euler", dt=0.5),
        {},
    )
    # extra keys of every JSON kind
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    out["extra_keys"] = (
        af.simulate(m, RNG.uniform(-1, 1, (3, 2)), 0.5),
        {
            "seed": 7,
            "note": "kept",
            "command": "attnflow simulate",
            "scale": 0.5,
            "x0": None,
            "tags": [1, 2],
            "nested": {"a": 1.5},
        },
    )
    return out


def record(traj) -> dict:
    """What the run held in memory: the test compares a reload against it."""
    model = traj.model
    arrays = {
        name: digest(getattr(traj, name))
        for name in ("ts", "x", "state", "reached", "t_stop", "x0")
    }
    if traj.has_z:
        arrays["z"] = digest(traj.z)
    kernel = getattr(model, "kernel", None)
    if kernel is None:  # a Block: the kernel of its attention
        kernel = getattr(getattr(model, "attn", None), "kernel", None)
    mask = getattr(model, "mask", None)
    if mask is None and hasattr(model, "attn"):
        mask = getattr(model.attn, "mask", None)
    return {
        "type": type(model).__name__,
        "arrays": arrays,
        "values": {  # readable copies of two of them
            "ts": np.asarray(traj.ts).tolist(),
            "state_last": np.asarray(traj.state)[..., -1, :, :].tolist(),
        },
        "attention_last": digest(traj.attention(-1)),
        "attention_last_values": np.asarray(traj.attention(-1)).tolist(),
        "statuses": [str(s) for s in traj.statuses],
        "status": str(traj.status),
        "frame": traj.frame,
        "coords": traj.coords,
        "batched": traj.batched,
        "t1": traj.t1,
        "solver": traj.solver,
        "stats": {
            k: {"python": type(v).__name__, "value": np.asarray(v).tolist(), **digest(v)}
            for k, v in traj.stats.items()
        },
        "model_arrays": {k: digest(v) for k, v in model.arrays().items()},
        "describe": json.loads(json.dumps(model.describe())),
        "kernel": None
        if kernel is None
        else {
            "name": kernel.name,
            "params": {k: np.asarray(v).tolist() for k, v in kernel.params().items()},
        },
        "mask": None if mask is None else mask.describe(),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    expected = {"attnflow": af.__version__, "files": {}}
    for name, (traj, extra) in cases().items():
        path = traj.save(OUT / f"{name}.npz", **extra)
        with np.load(path) as f:
            meta = json.loads(str(f["metadata"]))
        if meta.get("format") != 1 or "format_version" in meta:
            sys.exit(
                "this attnflow writes another layout than 0.1.0; run the script with the "
                "code of 0.1.0 (see its docstring)."
            )
        expected["files"][name] = {"extra": extra, "run": record(traj), "metadata": meta}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(
        f"wrote {len(expected['files'])} files to {OUT} ({total / 1e3:.1f} kB with expected.json)"
    )


if __name__ == "__main__":
    main()
