"""The examples in the docstrings run and print what they say (``doctest``), module by
module; examples that write files or need a model that is not installed are marked
``# doctest: +SKIP`` in place."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import numpy as np
import pytest

import attnflow

PKG = Path(attnflow.__file__).resolve().parent
MODULES = sorted(
    ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
    for p in PKG.rglob("*.py")
    if ">>> " in p.read_text()
)


def test_the_main_functions_have_examples():
    documented = set(MODULES)
    assert TRAINING <= documented
    for module in ("attnflow.dynamics.solve", "attnflow.dynamics.meanfield"):
        assert module in documented


# the examples that train a model (seconds each) run with the slow checks
TRAINING = {
    "attnflow.studies.longcontext",
    "attnflow.networks._longcontext_task",
    "attnflow.networks._decoder",
    "attnflow.studies._decoder_dynamics",
}


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.slow) if m in TRAINING else m for m in MODULES]
)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has '>>> ' but no example doctest can find"
    with np.printoptions(legacy=False):
        for t in tests:
            runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
