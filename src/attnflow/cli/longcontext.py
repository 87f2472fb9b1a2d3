"""``attnflow longcontext``: the long-context test of QK norm with a sink or a gate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "QK norm with a sink or a gate at long context: train at n, read at up to 256 n."

if TYPE_CHECKING:
    Tier = opt.Choice
else:
    Tier = opt._choices("Tier", ("A", "B", "both"))


def longcontext(
    quick: bool = typer.Option(
        False, "--quick", help="tiny models and few sets (seconds a model; for tests)"
    ),
    tier: Tier = typer.Option(
        Tier("both"),
        "--tier",
        help="A: one head, needle or null; B: the small causal decoder; both",
    ),
    seeds: int = typer.Option(
        5,
        "--seeds",
        callback=opt.checked(_checks.integer, lo=1),
        help="seeds per variant (the rule's intervals are across seeds: two or more)",
    ),
    first_seed: int = typer.Option(
        0,
        "--first-seed",
        callback=opt.checked(_checks.integer, lo=0),
        help="the seeds are first-seed, first-seed + 1, ... (fresh seeds for a confirmatory run)",
    ),
    variants: str | None = typer.Option(
        None,
        "--variants",
        help="comma list of variants to train (default: all of each tier; the decision "
        "rule needs the baseline, qknorm, qknorm+sink and qknorm+gate)",
    ),
    out: Path = opt.out_dir(Path("figures"), "folder of longcontext.json"),
    cache: Path | None = typer.Option(
        None,
        "--cache",
        help="folder of the trained models (default: <out>/longcontext_models); finished "
        "models are reused, interrupted trainings resumed",
    ),
    retrain: bool = typer.Option(
        False, "--retrain", help="train again even where a finished model is cached"
    ),
    descriptive_seeds: int = typer.Option(
        2,
        "--descriptive-seeds",
        callback=opt.checked(_checks.integer, lo=0),
        help="how many of the seeds (the first) also get the readings outside the rule: "
        "QK-norm logits scaled by log(n)/log(n0), tier B's heads through the dynamics "
        "(0: the rule's readings only)",
    ),
    eval_seed: int = typer.Option(
        12345,
        "--eval-seed",
        callback=opt.checked(_checks.integer, lo=0),
        help="the seed of the sets every model is read on",
    ),
    file: str = typer.Option("longcontext.json", "--file", help="the result's file name in --out"),
    as_json: bool = opt.as_json(),
):
    """Train each variant (softmax or plain, qknorm, qknorm+sink, qknorm+gate,
    qknorm+sink+gate; tier A also ssmax) at one length, read it at 1x to 256x that length
    (QK-norm variants also with their logits times log(n)/log(n_train)), summarise across
    seeds (mean, 95% t interval), and apply the rule of docs/longcontext.md: does a sink
    or a gate take away the QK-norm cost? Writes <out>/longcontext.json. Arithmetic is
    float32.

    \b
    Example:
      attnflow longcontext --tier A --quick --seeds 1 --json"""
    tiers = ("A", "B") if common.value(tier) == "both" else (common.value(tier),)
    names = None if variants is None else tuple(v for v in variants.split(",") if v)
    if names is not None and not names:
        raise common.CLIError("--variants must be a comma list of variant names.")
    if cache is not None:
        _checks.output_dir("--cache", cache)
    if not file.endswith(".json") or "/" in file or "\\" in file:
        raise common.CLIError(f"--file must be a file name ending in .json; got {file!r}.")
    common.setup_cache()  # before JAX is imported: the quiet XLA log level
    from ..studies import longcontext as LC

    try:
        res = LC.run_study(
            tiers,
            quick=quick,
            seeds=list(range(first_seed, first_seed + seeds)),
            cache_dir=cache if cache is not None else Path(out) / "longcontext_models",
            out=out,
            filename=file,
            variants=names,
            descriptive_seeds=descriptive_seeds,
            eval_seed=eval_seed,
            retrain=retrain,
            progress=not as_json,
        )
    except ValueError as exc:
        if "variant" in str(exc) or "tier" in str(exc):
            raise common.CLIError(str(exc)) from None
        raise
    if as_json:
        common.emit_json(res.data)
        return
    for t in tiers:
        summary = res.data["tiers"][t]["summary"]["plain"]
        lengths = res.data["settings"][f"tier_{t}"]["lengths"]
        k = len(res.data["settings"]["seeds"])
        typer.echo(
            f"tier {t}: accuracy % (present / absent), mean of {k} seed(s), at n = {lengths}"
        )
        for variant, s in summary.items():
            cells = [
                f"{_pct(p)}/{_pct(a)}"
                for p, a in zip(s["present"]["accuracy"], s["absent"]["accuracy"])
            ]
            typer.echo(f"  {variant:>17} " + " ".join(f"{c:>11}" for c in cells))
        typer.echo(f"  verdict: {res.verdict(t)}")
    if quick:
        typer.echo("--quick: tiny models; these numbers say nothing about the variants.")
    typer.echo(f"wrote {Path(out) / file}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"
