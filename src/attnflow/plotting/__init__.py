"""Presentation: house style, hulls and level sets, GIF movies (``draw``). The set-ups
that the figures simulate live in ``attnflow.studies.setups`` and are re-exported here.
matplotlib is imported lazily."""

from ..studies.setups import MOVIE_CASES, euler_saves, simulate_tokens
from .draw import (
    LABEL_COLORS,
    STYLE,
    animate,
    box_section,
    data_box,
    draw_hull,
    draw_level,
    draw_trajectories,
    edge_on_view,
    hull_measure,
    hull_vertices,
    movie,
    use_style,
)

__all__ = [
    "STYLE",
    "use_style",
    "simulate_tokens",
    "euler_saves",
    "hull_vertices",
    "hull_measure",
    "draw_hull",
    "box_section",
    "draw_level",
    "draw_trajectories",
    "data_box",
    "edge_on_view",
    "LABEL_COLORS",
    "MOVIE_CASES",
    "animate",
    "movie",
]
