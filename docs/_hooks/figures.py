"""Serve the repository's figures/ folder with the site, without copying it into docs/.

The gallery pages link ``figures/<name>.png``; this hook adds every PNG and GIF of the
repository's ``figures/`` folder (and ``figures/movies/``) to the site's files, read in
place at build time. Nothing is downloaded and nothing is written into ``docs/``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

SUFFIXES = {".png", ".gif", ".svg"}


def on_files(files, config):
    root = Path(config["config_file_path"]).resolve().parent
    figures = root / "figures"
    if not figures.is_dir():
        return files
    for path in sorted(figures.rglob("*")):
        if path.suffix.lower() not in SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if files.get_file_from_path(rel) is None:
            files.append(File(rel, str(root), config["site_dir"], config["use_directory_urls"]))
    return files
