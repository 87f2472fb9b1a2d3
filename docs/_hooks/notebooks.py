"""Render the notebooks of ``docs/notebooks/`` as pages of the site, executed at build time.

Each ``docs/notebooks/<name>.py`` is a jupytext "percent" script (``# %%`` code cells,
``# %% [markdown]`` cells whose lines start with ``#``): it runs as a plain Python script,
and jupytext opens it as a notebook. Its page is ``docs/notebooks/<name>.md``, a stub that
holds only the marker comment ``<!-- notebook: <name>.py -->``; when the site is built,
this hook replaces the stub's markdown by the script, converted:

- a markdown cell becomes its markdown, the leading ``# `` of each line removed;
- a code cell becomes a ``python exec="on"`` block of markdown-exec, one session per
  notebook, so the cells run in order and each shows what it printed;
- a code cell tagged ``figure`` (``# %% tags=["figure"]``) must leave its matplotlib figure
  in ``fig``: the page shows the cell's source, then the figure as inline SVG (lines
  marked ``markdown-exec: hide`` draw it and close it; they are not shown).

The script itself is copied to the site beside its page, for download. A cell that
raises fails the build (``mkdocs build --strict``), as any executed example does.
``tests/test_notebooks.py`` runs the scripts and checks the numbers their text states.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FOLDER = "notebooks"
_CELL = re.compile(r"^# %%(?P<rest>.*)$")
_TAGS = re.compile(r"tags\s*=\s*(\[[^\]]*\])")
_MARKER = re.compile(r"<!-- notebook: (?P<script>[\w.-]+\.py) -->")
# the same SVG bytes at every build: no date, element ids from a fixed salt
_SHOW_FIGURE = """
import io as _nb_io  # markdown-exec: hide
import matplotlib as _nb_mpl  # markdown-exec: hide
import matplotlib.pyplot as _nb_plt  # markdown-exec: hide
_nb_buffer = _nb_io.StringIO()  # markdown-exec: hide
_nb_opts = dict(format="svg", bbox_inches="tight", metadata={"Date": None})  # markdown-exec: hide
with _nb_mpl.rc_context({"svg.hashsalt": "NAME"}):  # markdown-exec: hide
    fig.savefig(_nb_buffer, **_nb_opts)  # markdown-exec: hide
_nb_plt.close(fig)  # markdown-exec: hide
print(_nb_buffer.getvalue()[_nb_buffer.getvalue().index("<svg"):])  # markdown-exec: hide
"""


def cells(text: str) -> list[tuple[str, list[str], str]]:
    """``[(kind, tags, body)]`` of a percent script: kind ``"markdown"`` or ``"code"``; the
    jupytext header (the ``# ---`` block at the top) and text before the first cell are
    dropped."""
    out: list[tuple[str, list[str], list[str]]] = []
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            rest = m["rest"]
            kind = "markdown" if re.search(r"\[(markdown|md)\]", rest) else "code"
            t = _TAGS.search(rest)
            tags = json.loads(t[1]) if t else []
            out.append((kind, tags, []))
        elif out:
            out[-1][2].append(line)
    result = []
    for kind, tags, lines in out:
        if kind == "markdown":
            lines = [re.sub(r"^# ?", "", ln) if ln.startswith("#") else ln for ln in lines]
        body = "\n".join(lines).strip("\n")
        if body.strip():
            result.append((kind, tags, body))
    return result


def to_markdown(name: str, text: str) -> str:
    """The page of the notebook ``name`` (its stem) with source ``text``."""
    session = f"notebook-{name}"
    parts: list[str] = []
    for kind, tags, body in cells(text):
        if kind == "markdown":
            if not parts:  # the title, then where the page comes from
                title, _, body = body.partition("\n")
                parts.append(title)
                parts.append(
                    f'!!! note "A notebook"\n'
                    f"    This page is the script `docs/notebooks/{name}.py`, run when the "
                    f"site is built: every output below is what its cells printed or drew. "
                    f"It runs as it is (`python docs/notebooks/{name}.py`), and "
                    f"[jupytext](https://jupytext.readthedocs.io) opens it as a notebook "
                    f'(`pip install -e ".[notebooks]"`, then `jupytext --to notebook {name}.py`, '
                    f"or open it in Jupyter). Download: [{name}.py]({name}.py)."
                )
            if body.strip():
                parts.append(body.strip("\n"))
        elif "figure" in tags:
            code = body + "\n" + _SHOW_FIGURE.strip("\n").replace("NAME", name)
            parts.append(
                f'```python exec="on" source="above" html="1" session="{session}"\n{code}\n```'
            )
        else:
            parts.append(
                f'```python exec="on" source="above" result="text" session="{session}"\n{body}\n```'
            )
    return "\n\n".join(parts) + "\n"


def on_page_markdown(markdown, page, config, files):
    m = _MARKER.search(markdown)
    if m is None or not page.file.src_uri.startswith(f"{FOLDER}/"):
        return markdown
    script = Path(page.file.abs_src_path).parent / m["script"]
    if not script.is_file():
        raise FileNotFoundError(f"{page.file.src_uri}: no notebook {m['script']} beside it")
    return to_markdown(script.stem, script.read_text(encoding="utf-8"))
