"""The documentation site loads nothing from the web: MathJax is served from the site, so
pages render their mathematics offline.

The fast checks read mkdocs.yml and the pages; the slow one builds the site (about a
minute and a half on two cores) and reads every page it wrote.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MATHJAX = DOCS / "javascripts" / "mathjax"

# a script or a stylesheet from another host (http, https or protocol-relative)
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//", re.I)
_REMOTE_STYLE = re.compile(
    r"<link\b(?=[^>]*\brel\s*=\s*[\"']?stylesheet)[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//", re.I
)


def _extra(key: str) -> list[str]:
    """The list under a top-level key of mkdocs.yml (read as text: the file holds
    !!python tags that a safe YAML loader refuses)."""
    text = (ROOT / "mkdocs.yml").read_text()
    block = re.search(rf"^{key}:\n((?:[ \t]+-[^\n]*\n)+)", text, re.M)
    if block is None:
        return []
    return [line.split("-", 1)[1].strip() for line in block.group(1).splitlines()]


def test_remote_patterns_catch_what_they_should():
    assert _REMOTE_SCRIPT.search('<script src="https://unpkg.com/mathjax@3/es5/tex.js">')
    assert _REMOTE_SCRIPT.search("<script defer src=//cdn.example/x.js>")
    assert not _REMOTE_SCRIPT.search('<script src="../javascripts/mathjax.js">')
    assert _REMOTE_STYLE.search('<link rel="stylesheet" href="https://fonts.example/css">')
    assert not _REMOTE_STYLE.search('<link rel="stylesheet" href="assets/main.css">')


def test_mkdocs_yml_loads_every_script_from_the_site():
    scripts = _extra("extra_javascript") + _extra("extra_css")
    assert "javascripts/mathjax/tex-chtml-full.js" in scripts
    for s in scripts:
        assert not re.match(r"(https?:)?//", s), f"mkdocs.yml loads {s} from the web"
        assert (DOCS / s).is_file(), f"mkdocs.yml names {s}, which docs/ does not have"


def test_vendored_mathjax_is_whole_and_small():
    """The bundle with every TeX extension (nothing is fetched on demand), the CHTML fonts
    it looks for beside it, and the licence; a few MB at most."""
    assert "Apache License" in (MATHJAX / "LICENSE").read_text()
    bundle = (MATHJAX / "tex-chtml-full.js").read_text()
    assert "MathJax" in bundle
    fonts = sorted((MATHJAX / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) >= 20 and any(f.name == "MathJax_Main-Regular.woff" for f in fonts)
    size = sum(f.stat().st_size for f in MATHJAX.rglob("*") if f.is_file())
    assert size < 3_000_000


def test_no_page_loads_a_script_from_the_web():
    pages = [*DOCS.rglob("*.md"), *DOCS.rglob("*.html")]
    assert len(pages) > 20
    for page in pages:
        text = page.read_text(errors="replace")
        assert not _REMOTE_SCRIPT.search(text), f"{page.relative_to(ROOT)} loads a web script"
        assert not _REMOTE_STYLE.search(text), f"{page.relative_to(ROOT)} loads a web style"


@pytest.mark.slow
def test_built_site_loads_nothing_from_the_web(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    site = tmp_path / "site"
    p = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    for page in pages:
        html = page.read_text(errors="replace")
        name = page.relative_to(site)
        assert not _REMOTE_SCRIPT.search(html), f"{name} loads a script from the web"
        assert not _REMOTE_STYLE.search(html), f"{name} loads a stylesheet from the web"
    # the pages load the local MathJax, and the site carries it with its fonts
    home = (site / "index.html").read_text()
    assert 'src="javascripts/mathjax/tex-chtml-full.js"' in home
    assert (
        site / "javascripts/mathjax/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff"
    ).is_file()
    # the API pages: simulate is a function (not a module) under its public name, its
    # signature is formatted one parameter a line, and rtol and atol have defaults
    api = (site / "api" / "simulation.html").read_text()
    heading = re.search(r'<h2 id="[^"]*simulate"[^>]*>(.*?)</h2>', api, re.S)
    assert heading and "doc-symbol-function" in heading.group(1)
    assert "attnflow.simulate" in heading.group(1)
    sig = re.search(r"doc-signature[^>]*>(.*?)</code>", api, re.S)
    assert sig and "\n" in re.sub(r"<[^>]+>", "", sig.group(1))
    text = re.sub(r"<[^>]+>", "", api)
    params = text.split("Integrate the self-attention", 1)[1].split("Returns:", 1)[0]
    assert re.search(r"\brtol\s*\(\s*float\s*,\s*default:\s*1e-06\s*\)", params)
    assert re.search(r"\batol\s*\(\s*float\s*,\s*default:\s*1e-09\s*\)", params)
    assert not re.search(r"\n\s*rtol, atol\s*\n", params)  # one entry each
