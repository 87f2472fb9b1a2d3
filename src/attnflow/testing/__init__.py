"""The public conformance kit: a user holds an extension (a model family, a kernel, a mask)
against plain numpy built from its declared pieces, the way the project's own suite holds
every built-in one.

``check_model(model, x)``
    the attention (each head) and the field ``dx/dt``; the declared facts (rows summing to
    one, the keys each row keeps, bilinear logits); every number an analysis derives
    (dispersion's cap, spread and entropy per row over the kept keys, log-masses, argmax,
    the hardmax cells where the logits are declared bilinear); the gradient of every
    array leaf against central differences through ``attnflow.solve`` in each frame the
    model serves (original always; rescaled with a propagator and rows summing to one;
    the sphere); a save and load round trip; stacking, where the family supports it;
    and every analysis either serving the model or refusing it by name.
``check_kernel(kernel)``
    the kernel's registration and declared facts against its weights (rows summing to
    one, row-wise rows, masked keys weighing 0, bilinear logits), the weights of a
    built-in kernel against numpy, then ``check_model`` of one head with it (and under a
    causal mask, when it takes one).
``check_mask(mask)``
    the mask's registration and saved form (a JSON round trip rebuilds it), every row
    keeping a key, the rows of a tile equal to the rows of the whole, ``positional``
    against its bias and turn, then ``check_model`` of one head under it.

Each raises ``AssertionError`` naming the check and the numbers that disagree when the
extension is wrong, and ``ValueError`` naming the argument when it cannot be checked
(float64 off, tokens of the wrong shape). They return ``None`` when everything holds.
Gradients and numbers are compared in float64: turn it on first,
``jax.config.update("jax_enable_x64", True)`` (the library never flips the flag).
``attnflow.testing._reference`` is the plain numpy the kit compares with.
"""

from __future__ import annotations

from ._extensions import check_kernel, check_mask
from ._kit import check_model

__all__ = ["check_model", "check_kernel", "check_mask"]
