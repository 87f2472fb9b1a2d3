"""An offline corpus of English prose: sentences of the Python language reference, as
CPython ships its text in ``pydoc_data.topics.topics`` (a dict of help topics; in
CPython 3.11, 79 topics and about 465,000 characters).

The rule, deterministic for a given text (``split_sentences``, then
``reference_corpus``):

1. Topics in sorted key order; each topic's text is cut into paragraphs at blank lines.
2. A paragraph is prose when its first line starts with an uppercase letter and none of
   its lines is indented (indented lines are code, grammar rules and nested list items)
   or is a heading underline (a line of ``*``, ``=``, ``-``, ``^`` or ``~`` only). Its
   lines are joined with single spaces.
3. A paragraph is cut into sentences after ``.``, ``!`` or ``?`` followed by white space
   and an uppercase letter (possibly after an opening quote or parenthesis).
4. A sentence is kept when it ends with ``.``, ``!`` or ``?`` (a closing quote or
   parenthesis may follow), has at least four words, contains no grammar rule (``::=``)
   and at least half of its characters are letters; repeats are dropped (first kept).
5. ``reference_corpus`` keeps the sentences whose number of word pieces, [CLS] and [SEP]
   included, lies in ``[min_tokens, max_tokens]`` (8 to 64 by default), then draws
   ``size`` of them without replacement with ``numpy.random.default_rng(seed)`` and
   returns them in corpus order.

The text depends on the Python version (the language reference changes): the corpus
records that version and a SHA-256 of the sentences chosen, so that a saved study can
tell whether it is resumed on the same corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _checks

__all__ = ["Corpus", "split_sentences", "prose_sentences", "reference_corpus"]

_UNDERLINE = re.compile(r"^[*=\-^~]+$")
_CUT = re.compile(r"(?<=[.!?])\s+(?=[\"'(\u201c]?[A-Z])")
_END = re.compile(r"[.!?][\"')\u201d]?$")


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Sentences chosen by ``reference_corpus``.

    Attributes:
        sentences: the sentences, in corpus order.
        token_counts: word pieces per sentence, [CLS] and [SEP] included.
        indices: each sentence's index among the candidates (prose sentences of the
            allowed length).
        candidates: how many sentences had the allowed length; prose: how many prose
            sentences the text has.
        seed, min_tokens, max_tokens: the draw.
        source: where the text came from; python: the Python version that shipped it.
        sha256: of the chosen sentences joined by newlines.
    """

    sentences: tuple[str, ...]
    token_counts: tuple[int, ...]
    indices: tuple[int, ...]
    candidates: int
    prose: int
    seed: int
    min_tokens: int
    max_tokens: int
    source: str
    python: str
    sha256: str

    def __len__(self) -> int:
        return len(self.sentences)

    def describe(self) -> dict[str, Any]:
        """Everything but the sentences, for metadata."""
        d = dataclasses.asdict(self)
        d.pop("sentences")
        d["size"] = len(self.sentences)
        return d


def _prose(paragraph: list[str]) -> bool:
    first = paragraph[0]
    return (
        first[:1].isupper()
        and not any(line[:1].isspace() for line in paragraph)
        and not any(_UNDERLINE.match(line.strip()) for line in paragraph)
    )


def split_sentences(text: str) -> list[str]:
    """The prose sentences of ``text`` by rules 2 to 4 of the module docstring (no
    repeats removed; ``prose_sentences`` does that over several texts).

    Args:
        text: plain text, paragraphs separated by blank lines.

    Returns:
        The sentences, in order.

    Example:
        >>> text = "Title\\n*****\\n\\nIt is short. It has two\\nsentences here.\\n"
        >>> split_sentences(text + "\\n   code = 1\\n")
        ['It has two sentences here.']
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str; got {type(text).__name__}.")
    out: list[str] = []
    para: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.strip():
            para.append(line.rstrip())
            continue
        if para and _prose(para):
            joined = " ".join(p.strip() for p in para)
            for s in _CUT.split(re.sub(r"\s+", " ", joined)):
                s = s.strip()
                letters = sum(c.isalpha() for c in s)
                if (
                    _END.search(s)
                    and len(s.split()) >= 4
                    and "::=" not in s
                    and letters >= 0.5 * len(s)
                ):
                    out.append(s)
        para = []
    return out


def prose_sentences(texts: dict[str, str] | None = None) -> list[str]:
    """Every prose sentence of ``texts`` (default ``pydoc_data.topics.topics``), topics in
    sorted key order, repeats dropped (the first kept)."""
    if texts is None:
        from pydoc_data.topics import topics  # CPython's language reference

        texts = dict(topics)
    if not isinstance(texts, dict) or not all(isinstance(v, str) for v in texts.values()):
        raise ValueError("texts must be a dict of {topic: text} strings.")
    seen: set[str] = set()
    out = []
    for key in sorted(texts):
        for s in split_sentences(texts[key]):
            if s not in seen:
                seen.add(s)
                out.append(s)
    return out


def _wordpiece_counter(checkpoint: str) -> Callable[[Sequence[str]], list[int]]:
    from ..io.checkpoints import load_tokenizer, resolve_checkpoint

    tok = load_tokenizer(resolve_checkpoint(checkpoint))
    return lambda batch: [len(e.ids) for e in tok.encode_batch(list(batch))]


def reference_corpus(
    size: int = 96,
    *,
    seed: int = 0,
    min_tokens: int = 8,
    max_tokens: int = 64,
    checkpoint: str = "minilm",
    count_tokens: Callable[[Sequence[str]], list[int]] | None = None,
    texts: dict[str, str] | None = None,
) -> Corpus:
    """Draw ``size`` sentences of the language reference (module docstring, rule 5).

    Args:
        size: sentences to draw (at most the number of candidates).
        seed: seed of the draw (``numpy.random.default_rng``).
        min_tokens, max_tokens: allowed word pieces per sentence, [CLS] and [SEP]
            included.
        checkpoint: whose tokenizer counts the word pieces (``"minilm"`` or a path).
        count_tokens: instead of the tokenizer, a function of a list of sentences
            returning their token counts (tests).
        texts: ``{topic: text}`` instead of ``pydoc_data.topics.topics``.

    Returns:
        A ``Corpus``.

    Raises:
        ValueError: naming ``size`` when fewer sentences qualify, or a bad bound.

    Example:
        >>> c = reference_corpus(4, count_tokens=lambda b: [len(s.split()) + 2 for s in b])
        >>> len(c), c.min_tokens <= min(c.token_counts) and max(c.token_counts) <= c.max_tokens
        (4, True)
    """
    size = _checks.integer("size", size, lo=1)
    seed = _checks.integer("seed", seed, lo=0)
    lo = _checks.integer("min_tokens", min_tokens, lo=1)
    hi = _checks.integer("max_tokens", max_tokens, lo=lo)
    sents = prose_sentences(texts)
    count = count_tokens if count_tokens is not None else _wordpiece_counter(checkpoint)
    counts = [int(c) for c in count(sents)]
    if len(counts) != len(sents):
        raise ValueError("count_tokens must return one count per sentence.")
    keep = [i for i, c in enumerate(counts) if lo <= c <= hi]
    if size > len(keep):
        raise ValueError(
            f"size = {size} sentences asked for, but only {len(keep)} of the {len(sents)} "
            f"prose sentences have {lo} to {hi} tokens; ask for fewer or widen the bounds."
        )
    pick = np.sort(np.random.default_rng(seed).choice(len(keep), size=size, replace=False))
    chosen = tuple(sents[keep[i]] for i in pick)
    return Corpus(
        sentences=chosen,
        token_counts=tuple(counts[keep[i]] for i in pick),
        indices=tuple(int(i) for i in pick),
        candidates=len(keep),
        prose=len(sents),
        seed=seed,
        min_tokens=lo,
        max_tokens=hi,
        source="pydoc_data.topics.topics" if texts is None else "texts",
        python=f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
        sha256=hashlib.sha256("\n".join(chosen).encode()).hexdigest(),
    )
