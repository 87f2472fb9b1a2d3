"""Moved: ``forward_pass`` is ``attnflow.networks.forward`` (also ``attnflow.forward_pass``).
This module re-exports it so that code written against ``attnflow.studies.forward``
keeps working."""

from ..networks.forward import ForwardPass, forward_pass

__all__ = ["ForwardPass", "forward_pass"]
