"""The figure set's style rules (`attnflow.experiments._style`): each rule caught on a
figure made to break it, a figure keeping them all passes; every figure script's drawing
keeps them (slow: it draws every figure of a quick run)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from attnflow.experiments import _plotting as H
from attnflow.experiments import _style


@pytest.fixture
def two():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="data")
    yield fig, axes
    plt.close(fig)


def test_a_figure_keeping_every_rule_passes(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.set_title(r"Clusters at $\beta = 4$")
    a.set_xlabel("Time $t$")
    b.set_ylabel("nGPT's norm")  # a name with a capital inside stays as written
    b.legend(loc="upper left")  # the line runs bottom left to top right
    fig.colorbar(a.imshow(np.eye(2), extent=(0.6, 1, 0, 0.4)), ax=a, label="Fraction")
    assert _style.problems(fig) == []


def test_missing_and_gapped_panel_letters(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    assert any("panel 1" in p and "no panel letter" in p for p in _style.problems(fig))
    H.panel_label(b, "c")
    assert any("without a gap" in p for p in _style.problems(fig))


def test_a_joined_axes_shares_its_panel_letter(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.part_of_panel(b)
    assert _style.problems(fig) == []


def test_a_title_in_lower_case_is_caught(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.set_title("clusters")
    b.set_xlabel("(b) time")  # a leading panel letter is not the first word
    found = _style.problems(fig)
    assert any("'clusters' does not start with a capital" in p for p in found)
    assert any("'(b) time' does not start" in p for p in found)


@pytest.mark.parametrize(
    "text, symbol",
    [("beta = 4", "beta"), ("at n = 32 tokens", "n ="), ("t1 < 5", "t1 <"), ("Tau", "Tau")],
)
def test_a_symbol_outside_mathtext_is_caught(two, text, symbol):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.plot([0], [0], label=text)
    a.legend(loc="lower right")
    found = [p for p in _style.problems(fig) if "outside mathtext" in p]
    assert found and symbol in found[0], found


@pytest.mark.parametrize(
    "text", [r"$\beta = 4$", "Post-LN, a = b is prose? no", r"Cost \$5", "Alphabet"]
)
def test_mathtext_and_words_that_contain_a_greek_name_pass(two, text):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.set_title(text)
    found = [p for p in _style.problems(fig) if "outside mathtext" in p]
    # "a = b" is a one-letter relation: prose that reads like a symbol is caught too
    assert bool(found) == ("a = b" in text), found


def test_a_legend_over_the_data_is_caught(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.legend(loc="center")  # the line passes through the middle
    b.scatter([0.95], [0.05], label="dot")
    b.legend(loc="lower right")
    found = _style.problems(fig)
    assert any("legend of axes 0" in p and "line 'data'" in p for p in found), found
    assert any("legend of axes 1" in p and "markers 'dot'" in p for p in found), found


def test_a_legend_outside_its_axes_covers_nothing(two):
    fig, (a, b) = two
    H.panel_label(a, "a")
    H.panel_label(b, "b")
    a.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    assert _style.problems(fig) == []


def test_a_band_under_a_legend_is_caught():
    fig, ax = plt.subplots()
    try:
        ax.fill_between([0, 1], [0, 0], [1, 1], label="band", alpha=0.3)
        ax.plot([0, 1], [2, 2], label="line")
        ax.legend(loc="lower left")
        assert any("PolyCollection" in p or "band" in p for p in _style.problems(fig))
    finally:
        plt.close(fig)


@pytest.mark.slow
def test_every_figure_script_keeps_the_style(tmp_path):
    """Every compute-then-draw script, quick, drawn from its saved data."""
    import importlib

    from attnflow.experiments import _figure as F
    from attnflow.experiments.runner import find_experiments, list_figures, run_figures

    run_figures(tmp_path, quick=True, progress=False, jobs=2)
    broken = {}
    for name in list_figures(find_experiments()):
        make = importlib.import_module(f"attnflow.experiments.{name}").make
        if not isinstance(make, F.FigureScript):
            continue
        try:
            figs = make.drawn(tmp_path, quick=True)
        except F.MissingData:  # skipped here (an optional package is missing)
            continue
        for stem, fig in figs.items():
            if not isinstance(fig, str):
                found = _style.problems(fig)
                if found:
                    broken[stem] = found
                plt.close(fig)
    assert not broken, broken
