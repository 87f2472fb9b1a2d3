"""Run metadata: the versions and precision every saved result records.

Below every layer (it imports no module of attnflow), so the dynamics, the sweeps, the
figure runner and the scripts all record the same fields.

``attnflow_version()`` is the package's version (``attnflow.__version__``, what a data
file's compatibility is checked against); ``build_version()`` tells commits apart: run
from a git checkout it is ``0.1.0+g<12 hex digits of the commit>``, with ``.dirty`` when
the package's own folder differs from that commit, else the plain version. Every record
of ``run_metadata`` carries it as ``"attnflow_build"``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["attnflow_version", "build_version", "git_commit", "run_metadata", "netcdf_attrs"]

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# what a git command may take before the version falls back to the plain one
GIT_TIMEOUT = 3.0


def attnflow_version() -> str:
    """The installed attnflow version (``"0+unknown"`` for a source tree never installed)."""
    try:
        return version("attnflow")
    except PackageNotFoundError:
        return "0+unknown"


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def source_digest(exclude: tuple[str, ...] = ()) -> str:
    """sha256 of the attnflow package's Python sources (relative names and bytes), in name
    order: what identifies the code that computed something, commit or not. Files whose
    relative path (with ``/``) starts with one of ``exclude`` are left out."""
    import hashlib

    pkg = _package_dir()
    h = hashlib.sha256()
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        if exclude and rel.as_posix().startswith(exclude):
            continue
        h.update(str(rel).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _checkout(package: Path) -> tuple[Path, Path] | None:
    """``(work tree, git dir)`` of the git checkout the package runs from, or ``None``
    (an installed copy: a path through ``site-packages``, or no ``.git`` above it)."""
    if {"site-packages", "dist-packages"} & set(package.parts):
        return None
    for root in package.parents:
        dot = root / ".git"
        if dot.is_dir():
            return root, dot
        if dot.is_file():  # a linked work tree: "gitdir: PATH"
            try:
                text = dot.read_text().strip()
            except OSError:
                return None
            if not text.startswith("gitdir:"):
                return None
            gitdir = Path(text.removeprefix("gitdir:").strip())
            return root, gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
    return None


def _read_ref(gitdir: Path, ref: str) -> str | None:
    """The commit ``ref`` (``refs/heads/main``) points to, from its file or
    ``packed-refs``, in ``gitdir`` or its common dir (a linked work tree's); ``None``
    when it cannot be read."""
    dirs = [gitdir]
    try:
        common = (gitdir / "commondir").read_text().strip()
        dirs.append(Path(common) if os.path.isabs(common) else (gitdir / common).resolve())
    except OSError:
        pass
    for d in dirs:
        try:
            sha = (d / ref).read_text().strip()
        except OSError:
            sha = ""
        if _SHA.match(sha):
            return sha
        try:
            packed = (d / "packed-refs").read_text().splitlines()
        except OSError:
            continue
        for line in packed:
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref and _SHA.match(parts[0]):
                return parts[0]
    return None


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or ``None`` (no git, an error, past the timeout)."""
    try:
        p = subprocess.run(
            # no optional locks: status does not refresh the index (a read, never a write)
            ["git", "--no-optional-locks", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def git_commit(package: Path | None = None) -> tuple[str, bool | None] | None:
    """``(commit, dirty)`` of the git checkout the package runs from, or ``None``.

    The commit is read from ``.git/HEAD`` and the refs (or ``packed-refs``) without
    running git, else from ``git rev-parse HEAD`` (with a timeout). ``dirty`` says whether
    the package's folder differs from the commit (``git status --porcelain`` of that
    folder, tracked and untracked files; ``None`` when git cannot tell): only the code
    counts, not the figures or docs a run writes elsewhere in the checkout.
    """
    found = _checkout(_package_dir() if package is None else package)
    if found is None:
        return None
    root, gitdir = found
    sha = None
    try:
        head = (gitdir / "HEAD").read_text().strip()
    except OSError:
        head = ""
    if head.startswith("ref:"):
        sha = _read_ref(gitdir, head.removeprefix("ref:").strip())
    elif _SHA.match(head):
        sha = head
    if sha is None:
        out = _git(root, "rev-parse", "HEAD")
        sha = out.strip() if out and _SHA.match(out.strip()) else None
    if sha is None:
        return None
    pkg = _package_dir() if package is None else package
    status = _git(root, "status", "--porcelain", "--", str(pkg))
    return sha, None if status is None else bool(status.strip())


@functools.lru_cache(maxsize=1)
def build_version() -> str:
    """The version that tells commits apart: ``"0.1.0+g<sha>"`` (12 hex digits) when the
    package runs from a git checkout, ``"0.1.0+g<sha>.dirty"`` when its folder differs
    from that commit, else ``attnflow_version()``. Computed once per process.

    Example:
        >>> build_version()  # doctest: +SKIP
        '0.1.0+g2d2ce62a1b3c.dirty'
    """
    return _build_version(attnflow_version(), git_commit())


def _build_version(plain: str, commit: tuple[str, bool | None] | None) -> str:
    if commit is None:
        return plain
    sha, dirty = commit
    # a local version label joins with "." when the version has one already
    sep = "." if "+" in plain else "+"
    return f"{plain}{sep}g{sha[:12]}{'.dirty' if dirty else ''}"


def run_metadata() -> dict:
    """Versions and precision of this process, for saved results: attnflow (and its
    ``build_version``, ``"attnflow_build"``), jax, jaxlib, diffrax, equinox, numpy, scipy,
    Python, whether x64 is on, the JAX backend."""
    import equinox
    import jax
    import numpy as np
    import scipy

    return {
        "attnflow": attnflow_version(),
        "attnflow_build": build_version(),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "diffrax": version("diffrax"),
        "equinox": equinox.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "x64": bool(jax.config.read("jax_enable_x64")),
        "backend": jax.default_backend(),
    }


def netcdf_attrs(record: dict) -> dict:
    """A record's entries as attributes of an ``xarray.Dataset`` that ``to_netcdf`` can
    write: strings, integers and floats as they are, anything else (booleans, None,
    lists, dicts) as JSON text."""
    return {
        k: v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v)
        for k, v in record.items()
    }
