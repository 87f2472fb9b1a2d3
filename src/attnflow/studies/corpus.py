"""Moved: the reference corpus is ``attnflow.networks.corpus`` (trained networks and
what they read live in ``attnflow.networks``). This module re-exports its public names so
that code written against ``attnflow.studies.corpus`` keeps working."""

from ..networks.corpus import Corpus, prose_sentences, reference_corpus, split_sentences

__all__ = ["Corpus", "split_sentences", "prose_sentences", "reference_corpus"]
