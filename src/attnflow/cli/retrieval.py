"""``attnflow retrieval``: the max-retrieval experiment of Velickovic et al., per kernel."""

from __future__ import annotations

from pathlib import Path

import typer

from . import _common as common
from . import _options as opt
from ._options import KERNELS

SHORT_HELP = "Max retrieval: one head trained at n = 16, read at n = 16 ... 16384."


def retrieval(
    kernels: str | None = typer.Option(
        None,
        "--kernels",
        help=f"comma list of attention kernels, of: {', '.join(KERNELS)} (adaptive reads "
        f"the softmax-trained model); default: all (with --quick: softmax,adaptive)",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="tiny widths, steps and sizes (seconds; for tests)"
    ),
    out: Path = typer.Option(
        Path("figures"),
        "--out",
        help="folder of max_retrieval.json; trained models in <out>/max_retrieval_models",
    ),
    max_steps: int | None = typer.Option(
        None, "--max-steps", min=1, help="cap the training steps (changes the config)"
    ),
    as_json: bool = opt.as_json(),
):
    """Train one attention head per kernel to retrieve the class of the max-priority item
    of a set of 16 (or reuse a saved model whose configuration matches), then evaluate
    it at n = 16, 32, ..., 16384 with 95% Wilson intervals and the head's diagnostics
    (attention on the true max item, largest coefficient, logit spread delta, the softmax
    bound). Writes <out>/max_retrieval.json. Arithmetic is float32.

    \b
    Example:
      attnflow retrieval --kernels softmax,adaptive --quick --json"""
    from ..experiments import fig_max_retrieval as F

    names = None if kernels is None else tuple(kernels.split(","))
    if names is not None:
        bad = [k for k in names if k not in KERNELS]
        if bad or not names:
            raise common.CLIError(f"--kernels must be a comma list of {', '.join(KERNELS)}.")
    common.setup_cache()
    res = F.run(out, quick=quick, kernels=names, progress=not as_json, max_steps=max_steps)
    if as_json:
        common.emit_json(res)
        return
    sizes = res["sizes"]
    typer.echo(f"{'kernel':>14} " + " ".join(f"{n:>7d}" for n in sizes))
    for kern, acc in res["accuracy"].items():
        typer.echo(f"{kern:>14} " + " ".join(f"{100 * a:7.1f}" for a in acc))
    typer.echo("accuracy in %; attention on the max item and delta in the JSON.")
    if quick:
        typer.echo(
            "--quick: tiny models trained for a few steps, so these accuracies are near "
            "chance and say nothing about the kernels; drop --quick for the study."
        )
    typer.echo(f"wrote {Path(out) / 'max_retrieval.json'}")
