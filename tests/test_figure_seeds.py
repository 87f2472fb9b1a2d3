"""Every committed figure sidecar states the seeds it used: ``seeds`` (a list of seeds,
or a count of random starts drawn from a stated generator) at the top level or in
``settings``; a figure without randomness states ``seeds: []`` and says why in
``seeds_note``. The scripts state them once, through ``_plotting.sidecar(seeds=...)``
(or their own sidecar dict)."""

import json
from pathlib import Path

import pytest

FIGURES = Path(__file__).resolve().parents[1] / "figures"
SIDECARS = sorted(FIGURES.glob("*.json"))


def _seeds(side: dict):
    if "seeds" in side:
        return side["seeds"], side.get("seeds_note")
    settings = side.get("settings")
    if isinstance(settings, dict) and "seeds" in settings:
        return settings["seeds"], settings.get("seeds_note")
    raise KeyError("seeds")


def test_there_are_sidecars():
    assert len(SIDECARS) >= 30


@pytest.mark.parametrize("path", SIDECARS, ids=lambda p: p.stem)
def test_every_sidecar_records_its_seeds(path):
    side = json.loads(path.read_text())
    assert isinstance(side, dict), path.name
    try:
        seeds, note = _seeds(side)
    except KeyError:
        pytest.fail(f"{path.name} records no seeds (top level or settings)")
    if isinstance(seeds, list):
        assert all(isinstance(s, int) and not isinstance(s, bool) for s in seeds), seeds
        if not seeds:  # no randomness: say so
            assert isinstance(note, str) and note, f"{path.name}: seeds [] without a seeds_note"
    else:
        assert isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1, seeds


def test_the_shared_helper_writes_the_seeds_after_seed():
    from attnflow.experiments import _plotting as H

    side = H.sidecar(script="s", quick=True, runs=[], seeds=[3, 4], seeds_note="why")
    keys = list(side)
    assert keys[keys.index("seed") + 1 : keys.index("seed") + 3] == ["seeds", "seeds_note"]
    assert side["seeds"] == [3, 4] and side["seeds_note"] == "why"
    assert "seeds" not in H.sidecar(script="s", quick=True, runs=[])
