"""The API reference (``docs/api/*.md``, mkdocstrings ``::: name`` blocks) covers every
public name: ``attnflow.__all__``, ``attnflow.analysis.__all__``, every kernel class and
``attnflow.masks.__all__``. A name added to the package without its reference fails here
(``mkdocs build --strict`` then checks that each block resolves)."""

from __future__ import annotations

import re
from pathlib import Path

import attnflow
import attnflow.analysis
import attnflow.kernels
import attnflow.masks

API = Path(__file__).resolve().parent.parent / "docs" / "api"
FACES = {"__version__", "kernels", "masks", "matrices", "sweep"}  # modules, each its page


def _documented() -> set[str]:
    names = set()
    for page in API.glob("*.md"):
        names |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    return {n.rsplit(".", 1)[-1] for n in names}


def _public() -> dict[str, list[str]]:
    kernel_classes = [
        name
        for name in attnflow.kernels.__all__
        if isinstance(getattr(attnflow.kernels, name), type)
        and issubclass(getattr(attnflow.kernels, name), attnflow.kernels.AbstractKernel)
    ]
    return {
        "attnflow": [n for n in attnflow.__all__ if n not in FACES],
        "attnflow.analysis": list(attnflow.analysis.__all__),
        "attnflow.kernels (kernel classes)": kernel_classes,
        "attnflow.masks": list(attnflow.masks.__all__),
    }


def test_every_public_name_has_a_reference_entry():
    documented = _documented()
    missing = {
        where: [n for n in names if n not in documented] for where, names in _public().items()
    }
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"names without a ::: block in docs/api/: {missing}"


def test_the_faces_have_their_reference_pages():
    text = "\n".join(p.read_text() for p in API.glob("*.md"))
    for module in ("attnflow.io.matrices", "attnflow.studies.sweep", "attnflow.plotting"):
        assert f"::: {module}" in text
