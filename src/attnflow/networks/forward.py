"""``forward_pass(checkpoint, texts)``: a trained encoder's forward pass, one entry per text.

Contract: ``forward_pass`` tokenises ``texts`` with the checkpoint's tokenizer and runs
``attnflow.networks.encoder.encode`` once on the padded batch; entry ``i`` is text ``i``
alone, its padding cut off: ``hidden`` ``(layers + 1, n_i, d)`` (the embeddings, then
every layer's output), ``attention`` ``(layers, heads, n_i, n_i)`` (rows sum to one over
the text's own tokens), ``tokens`` (the ``n_i`` word pieces, ``[CLS] ... [SEP]``) and
``pooled`` (the checkpoint's declared sentence embedding, ``None`` without one). Padding
changes nothing on a text's own tokens (``encoder_forward``), so each entry is the
forward pass of that text alone. float64 under x64, JAX's default float otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from jaxtyping import Float

__all__ = ["ForwardPass", "forward_pass"]


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardPass:
    """One text's forward pass (``forward_pass``).

    Attributes:
        hidden: ``(layers + 1, n, d)``: the embeddings, then every layer's output.
        attention: ``(layers, heads, n, n)``: ``P^h`` of every layer and head.
        tokens: the ``n`` tokens as strings.
        pooled: ``(d,)`` the declared sentence embedding, or ``None``.
    """

    hidden: Float[np.ndarray, "Lp1 n d"]
    attention: Float[np.ndarray, "L h n n"]
    tokens: tuple[str, ...]
    pooled: Float[np.ndarray, " d"] | None = None


def forward_pass(
    checkpoint: str | Path,
    texts: str | Sequence[str],
    *,
    tokenizer_from: str | Path | None = None,
) -> list[ForwardPass]:
    """The forward pass of a BERT or ALBERT encoder on each text.

    Args:
        checkpoint: ``"minilm"`` or a path to a BERT-style ``.safetensors`` file or its
            folder (``attnflow.io.checkpoints.resolve_checkpoint``), or weights already
            loaded (``load_encoder_weights``; then ``tokenizer_from`` names the
            checkpoint whose ``tokenizer.json`` to use).
        texts: one text or a list of texts (each whole, at most the model's positions).

    Returns:
        One ``ForwardPass`` per text, in order: ``hidden``, ``attention``, ``tokens``,
        ``pooled``.

    Raises:
        ValueError: naming the argument (no text, an empty text, an unknown checkpoint,
            no ``tokenizer.json`` beside it).

    Example:
        >>> import attnflow as af  # doctest: +SKIP
        >>> f = af.forward_pass("minilm", ["The cat sat.", "Tokens cluster."])  # doctest: +SKIP
        >>> f[0].tokens, f[0].hidden.shape, f[0].attention.shape  # doctest: +SKIP
        (('[CLS]', 'the', 'cat', 'sat', '.', '[SEP]'), (7, 6, 384), (6, 12, 6, 6))
    """
    from .encoder import encode

    if isinstance(texts, str):
        texts = [texts]
    out = encode(checkpoint, list(texts), tokenizer_from=tokenizer_from)
    mask = np.asarray(out.attention_mask, bool)
    hidden = np.asarray(out.hidden_states)
    attention = np.asarray(out.attentions)
    pooled = None if out.pooled is None else np.asarray(out.pooled)
    tokens = out.tokens or ()
    entries = []
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())  # right-padded: the text's tokens come first
        entries.append(
            ForwardPass(
                hidden=hidden[:, i, :n],
                attention=attention[:, i, :, :n, :n],
                tokens=tuple(tokens[i]),
                pooled=None if pooled is None else pooled[i],
            )
        )
    return entries
