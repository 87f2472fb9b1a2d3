"""Keep the programs that the site's executed examples compile, from one build to the next.

Every page and notebook that runs code runs JAX, and most of a build is XLA compiling
those programs. Before any page is executed, this hook points JAX's persistent
compilation cache (``attnflow.enable_compilation_cache``) at a directory of the docs'
own, so that a second build reads the programs instead of compiling them again:
``ATTNFLOW_DOCS_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnflow/jax-docs`` or
``~/.cache/attnflow/jax-docs`` (the test suite keeps ``jax-tests`` beside it in the same
way). It is switched on before any page runs, so before equinox is imported: then the
adaptive solves are cached too (see ``attnflow._cache``).
``ATTNFLOW_COMPILATION_CACHE=0`` turns it off (a cold build). The cache changes no
output: a program read from it is the program this build would compile.
"""

from __future__ import annotations

import os
from pathlib import Path


def on_config(config):
    from attnflow import _cache  # light: it imports no JAX until the cache is switched on

    if not _cache.cache_enabled_by_env():
        return config
    choice = os.environ.get("ATTNFLOW_DOCS_CACHE_DIR", "").strip()
    if choice:
        directory = Path(choice).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME", "").strip()
        directory = (Path(base) if base else Path.home() / ".cache") / "attnflow" / "jax-docs"
    try:
        _cache.enable_compilation_cache(directory)
    except OSError:  # no writable cache directory: build without it
        pass
    return config
