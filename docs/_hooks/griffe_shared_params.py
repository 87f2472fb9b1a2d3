"""A griffe extension for the API pages: a docstring entry that documents several
parameters at once (``rtol, atol: tolerances ...``, the Google style this package uses) is
split into one entry per parameter, each with the type and default of the signature.
Without it the entry matches no parameter, so the page shows it without a type and as
required."""

from __future__ import annotations

import logging
import re
from typing import Any

import griffe

_SHARED = re.compile(r"^\s+\w+(?:, \w+)+:", re.M)


def _split(obj: griffe.Object) -> None:
    docstring = obj.docstring
    if docstring is None or docstring.parser is None:
        return
    if not _SHARED.search(docstring.value):
        return
    try:
        params = obj.parameters  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return
    # parsed here, quietly: the page renders the parsed docstring kept by griffe, and its
    # complaints about the entry being split would fail a --strict build
    log = logging.getLogger("griffe")
    disabled, log.disabled = log.disabled, True
    try:
        sections = docstring.parsed
    finally:
        log.disabled = disabled
    for section in sections:
        if section.kind is not griffe.DocstringSectionKind.parameters:
            continue
        entries: list[griffe.DocstringParameter] = []
        for entry in section.value:
            names = [n.strip() for n in entry.name.split(",")]
            if len(names) < 2 or not all(n in params for n in names):
                entries.append(entry)
                continue
            for name in names:
                p = params[name]
                entries.append(
                    griffe.DocstringParameter(
                        name,
                        description=entry.description,
                        annotation=p.annotation,
                        value=p.default,
                    )
                )
        section.value[:] = entries


class SharedParams(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        stack: list[griffe.Object | griffe.Alias] = [pkg]
        while stack:
            obj = stack.pop()
            if isinstance(obj, griffe.Alias):
                continue
            if obj.is_function or obj.is_class:
                _split(obj)
            stack.extend(obj.members.values())
