"""Presentation: the house style, convex hulls and level sets, GIF movies (``draw``).

The set-ups that the figures and movies simulate live in ``attnflow.studies.setups`` and
are re-exported here. matplotlib is imported lazily, by the functions that draw.
"""

from ..studies.setups import MOVIE_CASES, MovieCase, euler_saves, simulate_tokens
from .draw import (
    LABEL_COLORS,
    STYLE,
    animate,
    box_section,
    data_box,
    draw_hull,
    draw_level,
    draw_levels,
    draw_trajectories,
    edge_on_view,
    hull_measure,
    hull_vertices,
    movie,
    set_box,
    use_style,
)

__all__ = [
    "simulate_tokens",
    "euler_saves",
    "MOVIE_CASES",
    "MovieCase",
    "STYLE",
    "use_style",
    "hull_vertices",
    "hull_measure",
    "draw_hull",
    "box_section",
    "draw_level",
    "draw_levels",
    "draw_trajectories",
    "data_box",
    "set_box",
    "edge_on_view",
    "LABEL_COLORS",
    "animate",
    "movie",
]
