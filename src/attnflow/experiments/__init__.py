"""The figure scripts, installed with the package: what ``attnflow figures`` runs.

Each ``fig_<name>.py`` defines ``make(out_dir, quick=False) -> dict`` (at least
``{"figures": [paths]}``) and writes PNG + PDF and a sidecar JSON with every parameter into
``out_dir``. Run them all with ``attnflow figures [--quick] [--out figures]``, or one
alone::

    python -m attnflow.experiments.fig_polytope [--quick] [--out figures]
    python -m attnflow.experiments.agreement_study --quick

``_plotting`` holds the scripts' shared bookkeeping (saving, sidecars, command line);
``agreement_study`` is a sweep that writes a table, not a figure, so the runner skips it.
Output folders are relative to the working directory (``figures/`` by default).

Importing this package imports nothing else: the scripts load matplotlib and JAX when
they run.
"""
