"""The long-context decoder's trained heads as particle systems, for
``attnflow.networks._decoder``.

Contract. ``decoder_heads(model, config)`` gives every trained head as a
``attnflow.io.trained_head.TrainedHead`` in the convention of
``attnflow.io.checkpoints`` (the tokens are the layer's normalised attention input
``u``; ``Q_h = W_Q[r_h]``, ``K_h = W_K[r_h]`` ``(p, d)``, ``V_h = W_O[:, r_h] W_V[r_h]``,
``beta = 1/sqrt(p)``, causal, the learned QK-norm gains per head) and
``head_model(model, config, layer, head)`` the head's own attnflow model: ``Attention``
under ``Causal()`` with the decoder's kernel (``Softmax``, ``QKNorm(wq, wk)``,
``Sink(b)``, ``QKNormSink(wq, wk, b)``: the learned values), wrapped in
``GatedAttention(head, W_g^h, b_g^h)`` where the decoder gates it (head-wise, from the
same ``u``: exactly the decoder's head, residual and normalisation aside).

What the long-context study asks of each head through the dynamics
(``heads_through_dynamics``) is in ``attnflow.studies._decoder_dynamics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..io.trained_head import TrainedHead
from ._decoder_task import DecoderConfig

if TYPE_CHECKING:
    from ._decoder_model import Decoder

__all__ = ["decoder_heads", "head_model"]


def head_arrays(model: Decoder, layer: int, head: int) -> dict[str, Any]:
    lay = model.layers[layer]
    p = lay.Wq.shape[0] // model.heads
    r = slice(head * p, (head + 1) * p)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    kernel = lay.kernels[head]
    out: dict[str, Any] = dict(
        Q=f64(lay.Wq[r]),
        K=f64(lay.Wk[r]),
        W_O_h=f64(lay.Wo[:, r]),
        W_V_h=f64(lay.Wv[r]),
        wq=f64(kernel.wq) if hasattr(kernel, "wq") else None,
        wk=f64(kernel.wk) if hasattr(kernel, "wk") else None,
        b=float(kernel.b) if hasattr(kernel, "b") else None,
        Wg=None if lay.Wg is None else f64(lay.Wg[head]),
        bg=None if lay.bg is None else float(lay.bg[head]),
        p=p,
    )
    out["V"] = out["W_O_h"] @ out["W_V_h"]
    return out


def decoder_heads(model: Decoder, config: DecoderConfig) -> list[TrainedHead]:
    """Every head of the decoder as a ``TrainedHead`` (float64; layer-major order)."""
    heads = []
    for layer in range(config.layers):
        for h in range(config.heads):
            a = head_arrays(model, layer, h)
            heads.append(
                TrainedHead(
                    layer=layer,
                    head=h,
                    Q=a["Q"],
                    K=a["K"],
                    V=a["V"],
                    beta=float(model.beta),
                    W_O_h=a["W_O_h"],
                    W_V_h=a["W_V_h"],
                    source=f"recall decoder {config.key()}",
                    layout="llama",
                    model_type="recall-decoder",
                    causal=True,
                    q_norm=a["wq"],
                    k_norm=a["wk"],
                    qk_norm_scope=None if a["wq"] is None else "head",
                    qk_norm_width=None if a["wq"] is None else (a["p"], a["p"]),
                )
            )
    return heads


def head_model(model: Decoder, config: DecoderConfig, layer: int, head: int) -> Any:
    """One head's own attnflow model (see the module docstring), in JAX's working
    precision."""
    from ..dynamics.gated import GatedAttention
    from ..dynamics.kernels import QKNorm, QKNormSink, Sink, Softmax
    from ..dynamics.kernels.masks import Causal
    from ..dynamics.model import Attention

    dt = jax.dtypes.canonicalize_dtype(np.float64)
    a = head_arrays(model, layer, head)
    qknorm, sink, gate = config.parts
    cast = lambda x: np.asarray(x, dt)  # noqa: E731
    if qknorm:
        kernel = (
            QKNormSink(cast(a["wq"]), cast(a["wk"]), cast(a["b"]))
            if sink
            else QKNorm(cast(a["wq"]), cast(a["wk"]))
        )
    else:
        kernel = Sink(cast(a["b"])) if sink else Softmax()
    att = Attention(
        cast(a["Q"]),
        cast(a["K"]),
        cast(a["V"]),
        beta=float(model.beta),
        rectangular=True,
        kernel=kernel,
        mask=Causal(),
    )
    if gate:
        return GatedAttention(att, cast(a["Wg"])[None, :], cast([a["bg"]]))
    return att
