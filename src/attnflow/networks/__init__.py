"""Trained networks and real checkpoints: what is a network rather than a particle system.

- ``encoder``: the forward pass of a trained post-LayerNorm encoder (BERT, ALBERT) in JAX,
  every layer and head recorded; ``forward``: ``attnflow.forward_pass(checkpoint, texts)``.
- ``corpus`` and ``_sentence_store``: the reference sentences the encoder studies read,
  and the resumable per-sentence store of their results.
- ``_decoder``, ``_decoder_model``, ``_decoder_task``, ``_decoder_heads``: the small causal
  decoder of the long-context study (task, network, training, evaluation, its heads as
  attnflow models); ``_longcontext_task``: the one-head needle task and model (tier A);
  ``_retrieval_model``: the max-retrieval task and network; ``_readout``: what a trained
  network's attention rows show.
- ``_training`` and ``_checkpoint``: the one resumable training loop and its checkpoint
  files.

Every head of these networks computes its attention through the dynamics' kernels and
masks (``attnflow.dynamics.kernels``, ``attnflow.masks``): the logits ``beta <q_i, k_j>``
of the kernel's prepared queries and keys, the mask's dropped entries ``-inf``, then
``kernel.weights``, the same code as a particle model's ``attention``
(``networks._attention.head_weights``).

The questions asked of the networks (which sizes are read, the verdicts, the statistics,
the heads census) are studies: ``attnflow.studies`` imports from here, never the reverse.

The names below are loaded from their modules on first use, so importing one module of
the package does not import the others (nor the encoder's tokenizer).
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .encoder import EncoderOutput, encode, encoder_forward
    from .forward import ForwardPass, forward_pass

__all__ = ["EncoderOutput", "encode", "encoder_forward", "ForwardPass", "forward_pass"]

_LAZY = {
    "EncoderOutput": ".encoder",
    "encode": ".encoder",
    "encoder_forward": ".encoder",
    "ForwardPass": ".forward",
    "forward_pass": ".forward",
}


def __getattr__(name: str) -> _typing.Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
