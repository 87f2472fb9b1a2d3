"""The figure set's style rules, checked on a drawn matplotlib figure.

``problems(fig)`` lists, in words, every place where ``fig`` breaks one of these rules
(an empty list: none). The tests draw every figure and require an empty list.
``tidy(fig)``, which ``_plotting.save`` applies to every figure before writing it, makes
the typographic part of rules 2 and 3 hold without each script spelling it out: it
capitalises the first letter of titles and labels, and sets in mathtext the spelled-out
Greek letters and the plain relations of one-letter symbols to a number or a symbol
(``n = 32``, ``Q = K = V = I``). What it cannot rewrite safely (a relation to an
expression, a panel letter, a legend over the data) is left for ``problems`` to report.

1. **Panel letters.** A figure of two or more panels labels every panel with a bold
   ``(a)``, ``(b)``, ... (``_plotting.panel_label``), the letters running from ``a``
   without a gap. A panel is a visible 2-d or 3-d axes that draws something (a line,
   a collection, an image or a patch); colour bars are not panels, and an axes joined to
   another's panel (``_plotting.part_of_panel``: the small multiples of one panel, a
   marginal histogram) shares its letter.
2. **Sentence case.** Titles (of axes, of the figure, the first line of a headline),
   axis and colour-bar labels start with a capital letter, a digit, a symbol in
   mathtext or a panel letter. A first word that is a name with a capital inside it
   (``nGPT``) or with a digit or underscore in it (``fig_modes``) is left as written.
3. **Mathtext for every symbol.** Outside ``$...$``, no text of the figure (legends
   included) spells out a Greek letter (``beta``) or writes a one-letter symbol in a
   relation (``n = 32``, ``t1 = 5``, ``dt = 0.1``, ``x <= 1``): those are written ``$\\beta$``,
   ``$n = 32$``.
4. **Legends off the data.** A legend drawn inside its axes covers no line, marker,
   band or image of that axes (3-d axes are not checked).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["problems", "tidy", "PART_OF_PANEL"]

PART_OF_PANEL = "part-of-panel"
"""The ``gid`` of an axes that shares the panel letter of another (see rule 1)."""

GREEK = (
    "alpha beta gamma delta epsilon zeta theta iota kappa lambda mu nu xi rho sigma "
    "tau upsilon phi chi psi omega"
).split()
_GREEK = re.compile(r"(?<![\w\\])(" + "|".join(GREEK) + r")(?![\w])", re.IGNORECASE)
# a one-letter symbol (with digits, a star or a prime) or dt, not inside a word
_SYMBOL = r"(?<![\w\\.'-])(?:dt|[A-Za-z][0-9]*[*']?)"
_OP = r"(?:=|<=|>=|<|>|≤|≥|≈)"
# a symbol in a relation: "n = 32", "t1 < 2"
_RELATION = re.compile(_SYMBOL + r"\s*" + _OP + r"\s*(?=[\w\-.(+$√])")
# a mathtext span (an escaped \$ is not a delimiter)
_SPANS = re.compile(r"(?<!\\)(\$[^$]*\$)")
_LETTER = re.compile(r"^\(([a-z])\)$")
_LEADING_LETTER = re.compile(r"^\(([a-z])\)\s+")


def _outside_math(text: str) -> str:
    """``text`` with every ``$...$`` span replaced by a space."""
    return _SPANS.sub(" ", text)


def _sentence_case(text: str) -> bool:
    """Whether ``text`` starts as rule 2 asks."""
    t = _LEADING_LETTER.sub("", text.strip())
    if not t or t[0] in "$0123456789(-+–−|[" or not t[0].isalpha():
        return True
    if t[0].isupper():
        return True
    word = re.split(r"[\s:,;/]", t, maxsplit=1)[0]
    return any(c.isupper() or c.isdigit() or c == "_" for c in word[1:])


def _symbols(text: str) -> list[str]:
    """The spelled-out symbols of ``text`` outside mathtext (rule 3)."""
    plain = _outside_math(text)
    found = [m.group(1) for m in _GREEK.finditer(plain)]
    found += [m.group(0).strip() for m in _RELATION.finditer(plain)]
    return found


# a chain of symbols set equal to a number or a one-letter symbol: "Q = K = V = I"
_CHAIN = re.compile(
    r"((?:" + _SYMBOL + r"\s*" + _OP + r"\s*)+)(-?\d[\d.,]*\d|-?\d|[A-Za-z](?![\w(]))"
)
_MATH_OP = {"<=": r"\leq", ">=": r"\geq", "≤": r"\leq", "≥": r"\geq", "≈": r"\approx"}


def _math_relation(m: re.Match[str]) -> str:
    body = m.group(1) + m.group(2)
    body = re.sub(r"\s*(<=|>=|≤|≥|≈|=|<|>)\s*", lambda o: f" {_MATH_OP.get(o[1], o[1])} ", body)
    body = re.sub(r"\b([A-Za-z])(\d+)\b", r"\1_{\2}", body)  # t1 -> t_{1}
    body = re.sub(r"([A-Za-z])\*", r"\1^*", body)  # k* -> k^*
    return "$" + body.replace("dt", "\\mathrm{d}t").strip() + "$"


# after a mathtext span, a plain relation to a number: "$c$ = 4" -> "$c = 4$"
_AFTER = re.compile(r"^\s*(=|<|>)\s*(-?\d[\d.,]*\d|-?\d)(?![\w.])")
_LONE = re.compile(r"([b-zB-HJ-Z][*']?)(?=$|[\s,:;=<>])")


def _tidy_text(text: str, capital: bool) -> str:
    """``text`` with rule 3's symbols set in mathtext outside its ``$...$`` spans, and
    its first letter capitalised when ``capital`` (rule 2)."""
    parts = _SPANS.split(text)
    for i in range(0, len(parts), 2):  # the even parts are outside mathtext
        plain = _CHAIN.sub(_math_relation, parts[i])
        parts[i] = _GREEK.sub(lambda g: "$\\" + g[1].lower() + "$", plain)
    parts = _SPANS.split("".join(parts))
    for i in range(1, len(parts) - 1, 2):  # a span and the plain text after it
        m = _AFTER.match(parts[i + 1])
        if m:
            parts[i] = f"{parts[i][:-1]} {m[1]} {m[2]}$"
            parts[i + 1] = parts[i + 1][m.end() :]
    text = "".join(parts)
    lone = _LONE.match(text)
    if lone:  # a lone letter first (the label "t", "d = ..."): a symbol, not a word
        text = f"${lone[1].replace('*', '^*')}${text[len(lone[1]) :]}"
    if capital and not _sentence_case(text):
        lead = _LEADING_LETTER.match(text.strip())
        head = lead.group(0) if lead else ""
        rest = text.strip()[len(head) :]
        text = head + rest[:1].upper() + rest[1:]
    return text


def _titles(ax: Axes) -> list[Any]:
    """The three title texts of ``ax`` (matplotlib names only the centre one)."""
    return [ax.title, ax._left_title, ax._right_title]  # pyright: ignore[reportAttributeAccessIssue]


def _texts(fig: Figure) -> list[tuple[str, Any, bool]]:
    """``(where, Text, needs sentence case)`` of every text of ``fig``: what ``tidy``
    sets and ``problems`` reads."""
    out: list[tuple[str, Any, bool]] = []
    supt = fig.get_suptitle()
    for i, t in enumerate(fig.texts):
        if t.get_text() == supt:
            out.append(("the figure's title", t, True))
        else:  # a headline's first line is a title; other figure texts are notes
            out.append((f"figure text {t.get_text()[:30]!r}", t, i == 0))
    for k, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        name = "a colour bar" if ax.get_label() == "<colorbar>" else f"axes {k}"
        out += [(f"{name}'s title", t, True) for t in _titles(ax)]
        axes = (ax.xaxis, ax.yaxis, *([ax.zaxis] if ax.name == "3d" else []))  # pyright: ignore[reportAttributeAccessIssue]
        out += [(f"{name}'s axis label", a.get_label(), True) for a in axes]
        out += [(f"{name}'s text", t, False) for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            out += [(f"{name}'s legend", t, False) for t in legend.get_texts()]
            out.append((f"{name}'s legend title", legend.get_title(), False))
    return out


def tidy(fig: Figure) -> None:
    """Apply the typographic part of rules 2 and 3 to every title, label and legend
    entry of ``fig``, in place (module docstring). Idempotent.

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots()
        >>> _ = ax.set_title("clusters at beta = 4, n = 32")
        >>> tidy(fig); print(ax.get_title())
        Clusters at $\\beta = 4$, $n = 32$
        >>> plt.close(fig)
    """
    for _, t, capital in _texts(fig):  # on the Text: set_title would reset its font
        if t.get_text():
            t.set_text(_tidy_text(t.get_text(), capital))


def _is_panel(ax: Axes) -> bool:
    if not ax.get_visible() or ax.get_label() == "<colorbar>":
        return False
    if ax.name == "3d":
        return True
    return bool(ax.lines or ax.collections or ax.images or ax.patches)


def _panel_letter(ax: Axes) -> str | None:
    for t in ax.texts:
        m = _LETTER.match(t.get_text().strip())
        if m and t.get_visible():
            return m.group(1)
    for loc in ("left", "center", "right"):
        m = _LEADING_LETTER.match(ax.get_title(loc).strip())
        if m:
            return m.group(1)
    return None


def _inside(box: Any, pts: Any) -> Any:
    """Which points (rows of ``pts``, display coordinates) lie in ``box``."""
    import numpy as np

    pts = np.asarray(pts, float).reshape(-1, 2)
    return (
        (pts[:, 0] >= box.x0)
        & (pts[:, 0] <= box.x1)
        & (pts[:, 1] >= box.y0)
        & (pts[:, 1] <= box.y1)
    )


def _covered(ax: Axes, renderer: Any) -> list[str]:
    """What data of ``ax`` its legend covers (rule 4)."""
    import numpy as np
    from matplotlib.collections import PathCollection

    legend = ax.get_legend()
    if legend is None or not legend.get_visible() or ax.name == "3d":
        return []
    box = legend.get_window_extent(renderer)
    frame = ax.get_window_extent(renderer)
    inside = box.intersection(box, frame)
    if inside is None or inside.width * inside.height < 0.5 * box.width * box.height:
        return []  # a legend outside its axes covers nothing of them
    clip = frame.frozen()
    hits = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        path = line.get_transform().transform_path(line.get_path())
        verts = np.asarray(path.vertices, float)
        pts = verts[np.all(np.isfinite(verts), axis=1)]
        pts = pts[_inside(clip, pts)]
        drawn = line.get_linestyle() not in ("None", "", " ", "none")  # not markers only
        if _inside(box, pts).any() or (drawn and path.intersects_bbox(box, filled=False)):
            hits.append(f"line {line.get_label()!r}")
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):
            offsets = np.asarray(coll.get_offsets(), float)
            if offsets.size == 0:
                continue
            pts = coll.get_offset_transform().transform(offsets)
            pts = pts[np.all(np.isfinite(pts), axis=1)]
            if _inside(box, pts).any():
                hits.append(f"markers {coll.get_label()!r}")
            continue
        trans = coll.get_transform()
        for path in coll.get_paths():
            p = trans.transform_path(path)
            if np.asarray(p.vertices).size and p.intersects_bbox(box, filled=True):
                hits.append(f"{type(coll).__name__} {coll.get_label()!r}")
                break
    for image in ax.images:
        extent = image.get_window_extent(renderer)
        if image.get_visible() and extent.overlaps(box):
            hits.append("an image")
    return hits


def problems(fig: Figure) -> list[str]:
    """Every break of the figure set's style rules in ``fig`` (module docstring), in words.

    Args:
        fig: a drawn figure.

    Returns:
        One sentence per problem; empty when ``fig`` keeps every rule.

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> import matplotlib.pyplot as plt
        >>> fig, ax = plt.subplots()
        >>> _ = ax.plot([0, 1], [0, 1]); _ = ax.set_xlabel("beta")
        >>> problems(fig)  # doctest: +NORMALIZE_WHITESPACE
        ["axes 0's axis label 'beta' does not start with a capital letter, a digit or
        mathtext", "axes 0's axis label 'beta' spells out beta outside mathtext"]
        >>> plt.close(fig)
    """
    out: list[str] = []
    panels = [ax for ax in fig.axes if _is_panel(ax) and ax.get_gid() != PART_OF_PANEL]
    if len(panels) >= 2:
        letters = []
        for k, ax in enumerate(panels):
            letter = _panel_letter(ax)
            if letter is None:
                out.append(f"panel {k} ({ax.get_title() or 'untitled'!r}) has no panel letter")
            else:
                letters.append(letter)
        if letters and sorted(letters) != [chr(ord("a") + i) for i in range(len(letters))]:
            out.append(f"the panel letters {sorted(letters)} do not run from (a) without a gap")
    for where, t, titled in _texts(fig):
        text = t.get_text()
        if not t.get_visible() or not text.strip() or _LETTER.match(text.strip()):
            continue
        if titled and not _sentence_case(text):
            out.append(
                f"{where} {text!r} does not start with a capital letter, a digit or mathtext"
            )
        found = list(dict.fromkeys(_symbols(text)))
        if found:
            out.append(f"{where} {text!r} spells out {', '.join(found)} outside mathtext")
    fig.draw_without_rendering()  # places legends ("best") and texts
    renderer = fig.canvas.get_renderer()  # pyright: ignore[reportAttributeAccessIssue]
    for k, ax in enumerate(fig.axes):
        hits = _covered(ax, renderer)
        if hits:
            out.append(f"the legend of axes {k} ({ax.get_title()!r}) covers " + ", ".join(hits))
    return out
