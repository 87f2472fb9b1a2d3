"""Agreement study: predicted regime (from V's spectrum) against the observed limit.

For each family below, random triples (Q, K, V) are drawn that satisfy (or, for the last
four, violate) a theorem's hypotheses; each is simulated from 16 tokens uniform in
[-5, 5]^d (float64, adaptive Tsit5, rtol 1e-6) for a time scaled to its leading
eigenvalue, ``t1 = 12 / |lambda_1|`` (``60 / c`` for V = -cI, in the original frame), and
``observe_limit`` measures where the tokens went. The table counts, per family, the
predicted and observed labels and the agreement among the runs that converged.

families (hypotheses hold)                 families (a hypothesis fails)
  polytope       V = cI, Q^T K = S SPD       complex-leading   rotation-dominated V
  polytope-ns    V = cI, sym(Q^T K) SPD      negative-leading  lambda_1 < 0
  hyperplanes    lambda_1 simple, real > 0   jordan            leading Jordan block
  subspace       paranormal, Q^T K SPD       qk-indefinite     V = cI, Q^T K indefinite
  origin         V = -cI, Q^T K = sI

It is a sweep (``attnflow.sweep``): resumable, sharded; rerun to continue after a crash.

    python -m attnflow.experiments.agreement_study [--per-family 24] [--quick]
        [--out results/agreement] [--table figures/agreement.md]

Both output paths are relative to the working directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from attnflow.analysis.regimes import Label
from attnflow.dynamics.trajectory import Status

FAMILIES = [
    "polytope",
    "polytope-ns",
    "hyperplanes",
    "subspace",
    "origin",
    "complex-leading",
    "negative-leading",
    "jordan",
    "qk-indefinite",
]
# the saved arrays hold positions in these lists (the enums' order)
LABELS = [str(lab) for lab in Label]
STATUS = [str(s) for s in Status]


def _basis(rng, d):
    """A random, reasonably conditioned change of basis."""
    while True:
        S = np.eye(d) + 0.4 * rng.standard_normal((d, d))
        if np.linalg.cond(S) < 8:
            return S


def _spd(rng, d):
    A = rng.standard_normal((d, d))
    return A @ A.T / d + 0.3 * np.eye(d)


def _qk_with(rng, d, M):
    """Q random, K = Q^{-T} M, so that Q^T K = M."""
    Q = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    return Q, np.linalg.solve(Q.T, M)


def _block(re, im):
    return np.array([[re, im], [-im, re]])


def draw(family: str, rng: np.random.Generator):
    """One triple (Q, K, V) of ``family`` and its time scale ``|lambda_1|``."""
    if family in ("polytope", "polytope-ns", "qk-indefinite"):
        d = int(rng.integers(2, 4))
        c = rng.uniform(0.5, 2.0)
        M = _spd(rng, d)
        if family == "polytope-ns":
            A = rng.standard_normal((d, d))
            M = M + 0.5 * (A - A.T)  # symmetric part stays SPD
        if family == "qk-indefinite":
            w, U = np.linalg.eigh(M)
            w[0] = -abs(w[0]) - 0.3
            M = (U * w) @ U.T
        Q, K = _qk_with(rng, d, M)
        return Q, K, c * np.eye(d), c
    if family == "origin":
        d = int(rng.integers(2, 4))
        c = rng.uniform(0.5, 2.0)
        Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        s = rng.uniform(0.5, 2.0)
        return Q, s * Q, -c * np.eye(d), c  # Q^T K = s I
    if family == "hyperplanes":
        d = int(rng.integers(2, 5))
        lam = rng.uniform(0.8, 2.0)
        D = np.zeros((d, d))
        D[0, 0] = lam
        i = 1
        while i < d:
            if d - i >= 2 and rng.random() < 0.4:
                r, th = rng.uniform(0.1, 0.85) * lam, rng.uniform(0.2, 3.0)
                D[i : i + 2, i : i + 2] = _block(r * np.cos(th), r * np.sin(th))
                i += 2
            else:
                D[i, i] = rng.uniform(-0.85, 0.85) * lam
                i += 1
        S = _basis(rng, d)
        V = S @ D @ np.linalg.inv(S)
        phi = S[:, 0]
        while True:
            Q = np.eye(d) + 0.5 * rng.standard_normal((d, d))
            K = np.eye(d) + 0.5 * rng.standard_normal((d, d))
            if (Q @ phi) @ (K @ phi) > 0.2 * np.linalg.norm(Q @ phi) * np.linalg.norm(K @ phi):
                return Q, K, V, lam
    if family == "subspace":
        d = int(rng.integers(3, 5))
        k = int(rng.integers(2, d))
        lam = rng.uniform(0.8, 2.0)
        D = np.zeros((d, d))
        D[:k, :k] = lam * np.eye(k)
        for i in range(k, d):
            D[i, i] = rng.uniform(-0.85, 0.85) * lam
        S = _basis(rng, d)
        Q, K = _qk_with(rng, d, _spd(rng, d))
        return Q, K, S @ D @ np.linalg.inv(S), lam
    if family == "complex-leading":
        d = int(rng.integers(2, 4))
        r, th = rng.uniform(0.8, 2.0), rng.uniform(0.3, 2.8)
        D = np.zeros((d, d))
        D[:2, :2] = _block(r * np.cos(th), r * np.sin(th))
        for i in range(2, d):
            D[i, i] = rng.uniform(-0.8, 0.8) * r
        S = _basis(rng, d)
        return np.eye(d), np.eye(d), S @ D @ np.linalg.inv(S), r
    if family == "negative-leading":
        d = int(rng.integers(2, 4))
        lam = rng.uniform(0.8, 2.0)
        D = np.diag([-lam] + [rng.uniform(-0.8, 0.8) * lam for _ in range(d - 1)])
        S = _basis(rng, d)
        return np.eye(d), np.eye(d), S @ D @ np.linalg.inv(S), lam
    if family == "jordan":
        d = int(rng.integers(2, 4))
        lam = rng.uniform(0.8, 2.0)
        D = np.zeros((d, d))
        D[:2, :2] = [[lam, 1.0], [0.0, lam]]
        for i in range(2, d):
            D[i, i] = rng.uniform(-0.8, 0.8) * lam
        S = _basis(rng, d)
        return np.eye(d), np.eye(d), S @ D @ np.linalg.inv(S), lam
    raise ValueError(f"unknown family {family!r}")


def _run(Q, K, V, g: np.random.Generator, n: int, t1: float, origin: bool, max_steps: int):
    """Simulate one triple from ``n`` tokens uniform in [-5, 5]^d, drawn from ``g``, to
    ``t1`` (49 saves), in the original frame for ``origin``, else the rescaled one."""
    import attnflow as af

    x0 = g.uniform(-5, 5, (n, V.shape[0]))
    return af.simulate(
        af.Attention(Q, K, V),
        x0,
        t1,
        ts=np.linspace(0, t1, 49),
        frame="original" if origin else "rescaled",
        max_steps=max_steps,
    )


def kernel(config, start, stop, seed):
    """Sweep kernel: samples ``start .. stop - 1`` (family = index mod #families)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import attnflow as af
    from attnflow.studies.sweep import rng as sample_rng

    fams = config["families"]
    out = {k: [] for k in ("family", "pred", "obs", "status", "n_clusters", "d", "t1", "steps")}
    for i in range(start, stop):
        fam = fams[i % len(fams)]
        g = sample_rng(seed, i)
        Q, K, V, scale = draw(fam, g)
        d = V.shape[0]
        pred = af.predict_regime(Q, K, V)
        origin = pred.structure.kind == "scalar-negative"
        t1 = (60.0 if origin else 12.0) / scale
        traj = _run(Q, K, V, g, config["n"], t1, origin, config["max_steps"])
        obs = af.observe_limit(traj)
        out["family"].append(FAMILIES.index(fam))
        out["pred"].append(LABELS.index(pred.label))
        out["obs"].append(LABELS.index(obs.label))
        out["status"].append(STATUS.index(traj.statuses[0]))
        out["n_clusters"].append(-1 if obs.n_clusters is None else obs.n_clusters)
        out["d"].append(d)
        out["t1"].append(t1)
        out["steps"].append(int(traj.stats["num_steps"]))
    return {k: np.asarray(v) for k, v in out.items()}


THEOREM_FAMILIES = FAMILIES[:5]


def recheck(arrays, seed: int, n: int, max_steps: int, factor: float = 2.0) -> dict:
    """Rerun the theorem-family samples that had not converged with ``factor`` x t1."""
    import attnflow as af
    from attnflow.studies.sweep import rng as sample_rng

    out = {}
    nc = LABELS.index(Label.NOT_CONVERGED)
    for i in np.flatnonzero((arrays["obs"] == nc) & (arrays["family"] < len(THEOREM_FAMILIES))):
        fam = FAMILIES[int(arrays["family"][i])]
        g = sample_rng(seed, int(i))
        Q, K, V, scale = draw(fam, g)
        origin = fam == "origin"
        t1 = factor * (60.0 if origin else 12.0) / scale
        traj = _run(Q, K, V, g, n, t1, origin, max_steps)
        out[int(i)] = (fam, af.observe_limit(traj).label, traj.status)
    return out


def table(arrays, rechecked: dict | None = None) -> str:
    fam, pred, obs, status = (arrays[k] for k in ("family", "pred", "obs", "status"))
    rechecked = rechecked or {}
    lines = [
        "| family | runs | predicted | observed | converged | agree (of converged) | "
        "not converged, rerun with 2 t1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for f, name in enumerate(FAMILIES):
        sel = fam == f
        if not sel.any():
            continue

        def counts(a, sel=sel):
            u, c = np.unique(a[sel], return_counts=True)
            return ", ".join(f"{LABELS[x]} {n}" for x, n in zip(u, c))

        conv = sel & (obs != LABELS.index(Label.NOT_CONVERGED)) & (status == 0)
        agree = conv & (pred == obs)
        if name in THEOREM_FAMILIES:
            ag = f"{agree.sum()} / {conv.sum()}"
            re = [v for i, v in rechecked.items() if v[0] == name]
            rr = "; ".join(f"{v[1]} ({v[2]})" for v in re) if re else "-"
        else:
            ag, rr = "no theorem: observed geometry recorded", "-"
        lines.append(
            f"| {name} | {sel.sum()} | {counts(pred)} | {counts(obs)} | "
            f"{conv.sum()} | {ag} | {rr} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    ap.add_argument("--per-family", type=int, default=24)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=20_000)
    ap.add_argument("--out", default="results/agreement")
    ap.add_argument("--table", default="figures/agreement.md")
    ap.add_argument("--quick", action="store_true", help="2 per family")
    args = ap.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)  # also for the reruns in this process
    import attnflow.studies.sweep as sw

    per = 2 if args.quick else args.per_family
    config = {"families": FAMILIES, "n": args.n, "max_steps": args.max_steps}
    sweep = sw.Sweep(
        "agreement",
        kernel,
        config,
        size=per * len(FAMILIES),
        seed=args.seed,
        shard_size=len(FAMILIES),
        unit="run",
    )
    out_dir = Path(args.out + ("-quick" if args.quick else ""))
    report = sw.run(sweep, out_dir, progress=True)
    data = sw.merge(out_dir, expect=sweep)
    text = table(data.arrays, recheck(data.arrays, args.seed, args.n, 5 * args.max_steps))
    print(text)
    print(json.dumps(report.to_dict()))
    if not args.quick:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        from attnflow.io.files import temporary_name, write_atomic, write_text

        write_text(
            Path(args.table),
            "# Agreement study: predicted vs observed limit\n\n"
            f"Command: `python -m attnflow.experiments.agreement_study --per-family {per} "
            f"--seed {args.seed}` (n = {args.n} tokens, float64, Tsit5 rtol 1e-6, "
            f"t1 = 12/|lambda_1|, 60/c for V = -cI).\n\n" + text + "\n",
        )
        arrays: dict[str, Any] = {**data.arrays, "manifest": json.dumps(data.manifest)}
        npz = Path(args.table).with_suffix(".npz")
        write_atomic(npz, lambda f: np.savez(f, **arrays), temporary_name(npz))


if __name__ == "__main__":
    main()
