"""What the README and the docs name exists: files and folders of the repository, figure
images, subcommands of ``attnflow``, and no page cites a file or word from outside the
repository (files that are not part of it, issue numbers of the project's tracker)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _subcommands() -> set[str]:
    import typer.main

    from attnflow.cli import app

    group = typer.main.get_command(app)
    return set(getattr(group, "commands", {}))


def test_the_readme_lists_every_subcommand_and_only_those():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"attnflow --help\s+#(.*?)\n\s+attnflow simulate", text, re.S)
    assert block, "the README's command-line block is missing"
    listed = {w.strip(" #,\n") for w in re.split(r"[,\s#]+", block.group(1)) if w.strip(" #,")}
    assert listed == _subcommands()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(page):
    """Every `src/...`, `tests/...`, `benchmarks/...`, `figures/...`, `experiments/...`
    or `docs/...` path in code spans, and every linked image or page, exists."""
    text = page.read_text()
    missing = []
    for path in re.findall(r"`((?:src|tests|benchmarks|experiments|docs)/[\w./-]+)`", text):
        if "*" not in path and not (ROOT / path).exists():
            missing.append(path)
    for path in re.findall(r"\]\(([^)#:]+\.(?:png|gif|md|py))\)", text):
        base = ROOT if page.name == "README.md" else page.parent
        target = (base / path).resolve()
        if not target.exists() and not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_what_is_outside_the_repository(page):
    text = page.read_text()
    bad = re.findall(r"REFERENCES\.md|shared/|\bissue \d+\b|\(issue \d+", text, re.I)
    assert not bad, f"{page.name} cites {bad}"
