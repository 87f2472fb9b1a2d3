"""``attnflow ginibre``: how generic the hyperplane theorem is over real Ginibre matrices.

With ``--out`` the sweep is resumable: one shard folder per dimension. Every folder is
checked before any dimension is computed (a file in the way, no permission, a sweep with
other parameters already there), so a long run never stops half-way on its last folder.
"""

from __future__ import annotations

from pathlib import Path

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "How generic the hyperplane theorem is (real Ginibre matrices)."


def _shard(name: str, value: str) -> None:
    from ..studies.sweep import parse_shard

    parse_shard(value)


def check_sweep_dirs(
    out: Path, ds: list[int], samples: int, *, seed: int, tol: float | None, backend: str
) -> None:
    """Refuse, before any work, a shard folder of ``out`` that the sweep of some d could
    not use: a path that is not a folder or cannot be written, or a folder holding a
    sweep with other parameters.

    Args:
        out: the ``--out`` folder.
        ds: the dimensions.
        samples: matrices per dimension.
        seed: the seed.
        tol: the decision tolerance (None: the default).
        backend: the backend name.

    Raises:
        CLIError: the first folder that cannot be used, named.
    """
    from ..studies import ginibre as G
    from ..studies import sweep as S

    _checks.output_dir("--out", out)
    for x in ds:
        sub = G._subdir(out, x)
        want = G.ginibre_sweep(x, samples, seed=seed, tol=tol, backend=backend).identity()
        try:
            _checks.output_dir("--out", sub)
            if (sub / S.MANIFEST).is_file():
                stored = S.read_manifest(sub)
                diff = [k for k in want if stored.get(k) != want[k]]
                if diff:
                    detail = "; ".join(
                        f"{k}: stored {stored.get(k)!r}, asked {want[k]!r}" for k in diff
                    )
                    raise ValueError(
                        f"{str(sub)!r} holds a different sweep ({detail}); use the same "
                        f"parameters to resume it, or another output directory."
                    )
        except ValueError as exc:
            msg = str(exc)
            raise common.CLIError(msg if msg.startswith("--out") else f"--out: {msg}") from None


def ginibre(
    d: str = opt.d_list(
        "2,4,8,...,256",
        help="dimensions: a comma list; '2,4,8,...,256' continues a progression of three terms",
    ),
    samples: int = typer.Option(
        1000,
        "--samples",
        callback=opt.checked(_checks.integer, lo=1),
        help="Ginibre matrices per dimension",
    ),
    seed: int = opt.seed(help="seed (the numbers do not depend on how the work is split)"),
    out: Path | None = opt.out_dir(
        None,
        help="shard directory: makes the sweep resumable (rerun to continue after a crash)",
    ),
    shard: str | None = typer.Option(
        None,
        "--shard",
        callback=opt.checked(_shard),
        help="i/N: run only the i-th of N slices (job arrays), then --merge",
    ),
    merge: bool = typer.Option(False, "--merge", help="only combine the shards in --out"),
    workers: int = typer.Option(
        0,
        "--workers",
        callback=opt.checked(_checks.integer, lo=0),
        help="worker processes (0: one per core when the run is long, else 1)",
    ),
    level: float = typer.Option(
        0.95,
        "--level",
        callback=opt.checked(_checks.number, lo=0.0, hi=1.0, lo_open=True, hi_open=True),
        help="confidence level of the intervals",
    ),
    interval: opt.Interval = typer.Option(
        opt.Interval("wilson"), "--interval", help="confidence interval of the fractions"
    ),
    tol: float | None = typer.Option(
        None,
        "--tol",
        callback=opt.checked(_checks.positive),
        help="relative decision tolerance (times ||V||_F; default d * eps)",
    ),
    backend: opt.Backend = typer.Option(
        opt.Backend("numpy"),
        "--backend",
        help="numpy (LAPACK, process workers) or jax (sharded over JAX devices)",
    ),
    progress: bool = opt.progress(),
    as_json: bool = opt.as_json(),
):
    """How generic is the hyperplane theorem: the fraction of real Ginibre matrices whose
    eigenvalue of largest modulus is real, positive and simple, with 95% intervals, and
    the fractions of good triples (Q = K = I; Q, K Ginibre). The paper reports about 14%
    at d = 128. Always computes in float64.

    \b
    Example:
      attnflow ginibre --d 2,4,8,...,256 --samples 4000 --out runs/ginibre --progress
    """
    from ..studies.ginibre import ginibre_curve
    from ._parse import parse_dims

    interval_s, backend_s = common.value(interval), common.value(backend)
    ds = parse_dims(d)
    common.setup_jax(True)
    if out is not None and not merge:
        check_sweep_dirs(out, ds, samples, seed=seed, tol=tol, backend=backend_s)
    study = ginibre_curve(
        ds,
        samples,
        seed=seed,
        level=level,
        interval=interval_s,
        tol=tol,
        backend=backend_s,
        workers=1 if backend_s == "jax" else (workers or None),
        out=out,
        shard=shard,
        merge_only=merge,
        progress=progress,
    )
    if as_json:
        common.emit_json(study.to_dict())
        return
    for run in study.runs or []:
        typer.echo(
            f"d = {run['d']:4d}: {len(run['computed'])} shards computed, "
            f"{len(run['skipped'])} already on disk, {run['missing']} of "
            f"{run['n_shards']} still missing ({run['seconds']:.1f} s)"
        )
    if not study.complete:
        typer.echo(
            f"incomplete: run the other --shard slices into {out}, then "
            f"`attnflow ginibre ... --out {out} --merge`."
        )
        return
    for est in study.results:
        typer.echo(est.summary())
