"""Figure scripts as compute, then draw (``attnflow.experiments._figure``) and
``attnflow figures --redraw``: a redraw computes nothing, writes the same sidecar numbers
and the same pictures, and a figure without usable saved data fails saying what to run.

The framework's contracts are checked on a tiny external script (no simulation); one
quick run of two installed figures (fig_origin, fig_subspace) through the command line
checks the real thing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attnflow.cli import main
from attnflow.experiments import _figure as F
from attnflow.experiments.runner import run_figures

TINY = """
import numpy as np
from attnflow.experiments import _figure as F
from attnflow.experiments import _plotting as H

import sys, types
NAME = "fig_tiny"
# what draw was given, for the test (the runner loads the file afresh each time)
SEEN = sys.modules.setdefault("_tiny_seen", types.ModuleType("_tiny_seen")).__dict__
SEEN.setdefault("seen", [])

def compute(quick):
    x = np.linspace(0.0, 1.0, 5 if quick else 9) ** 2
    side = H.sidecar(script="tiny", quick=quick, runs=[{"name": "r", "seed": 3,
                     "top": np.float64(x[-1]), "pair": (1, 2), "bad": float("nan")}])
    return F.Data(sidecar=side, arrays={"x": x, "label": np.array(["a", "b"])},
                  result={"n": int(x.size)})

def draw(data):
    import matplotlib.pyplot as plt
    SEEN["seen"].append(data)
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(data.arrays["x"], color={STYLE!r})
    return {NAME: fig, NAME + "_b": plt.figure(figsize=(1, 1))}

make = F.figure(NAME, compute, draw)
"""

OPTIONS = """
from pathlib import Path
import numpy as np
from attnflow.experiments import _figure as F

NAME = "fig_opts"

def compute(quick, out_dir):
    if (Path(out_dir) / "skip").exists():
        raise F.Skipped("no model here")
    return F.Data(sidecar={"quick": quick, "figures": []}, arrays={"x": np.arange(3.0)},
                  result={"folder": str(out_dir)})

def draw(data):
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(2, 1))
    return {NAME: fig, NAME + ".md": f"| x |\\n| {data.arrays['x'].sum():g} |\\n"}

make = F.figure("opts_data", compute, draw, out_dir=True, full_dpi=True,
                sidecar_stem=lambda quick: "opts" + ("_quick" if quick else ""))
"""

PLAIN = """
from pathlib import Path
def make(out_dir, quick=False):
    p = Path(out_dir) / "plain.txt"
    p.write_text("x")
    return {"figures": [p]}
"""


def untimed(side: dict) -> dict:
    assert "runtime_seconds" not in side  # wall times are kept out of sidecars
    return side


def pixels(path: Path) -> np.ndarray:
    import matplotlib.image as mi

    return mi.imread(path)


@pytest.fixture
def tiny(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "fig_tiny.py").write_text(TINY.replace("{STYLE!r}", repr("C0")))
    return exp


def test_draw_sees_the_same_data_computed_or_redrawn(tiny, tmp_path):
    out = tmp_path / "out"
    index = run_figures(out, quick=True, experiments=tiny, jobs=1, progress=False)
    assert not index["failed"], index["failed"]
    res = index["figures"]["fig_tiny"]
    assert res["n"] == 5 and Path(res["data"]).name == "fig_tiny.quick.npz"
    assert [Path(p).name for p in res["figures"]] == [
        "fig_tiny.png",
        "fig_tiny.pdf",
        "fig_tiny_b.png",
        "fig_tiny_b.pdf",
    ]
    side = json.loads((out / "fig_tiny.json").read_text())
    # the sidecar names the files inside the output folder
    assert side["figures"] == [Path(p).name for p in res["figures"]]
    assert side["runs"][0]["bad"] == "nan"
    assert side["runs"][0]["top"] == 1.0 and side["runs"][0]["pair"] == [1, 2]
    png = pixels(out / "fig_tiny.png")
    for p in res["figures"]:
        Path(p).unlink()

    again = run_figures(out, quick=True, experiments=tiny, progress=False, redraw=True)
    assert not again["failed"] and again["redraw"] is True
    assert again["figures"]["fig_tiny"]["redrawn"] is True
    assert all(Path(p).is_file() for p in again["figures"]["fig_tiny"]["figures"])
    assert np.array_equal(pixels(out / "fig_tiny.png"), png)
    assert untimed(json.loads((out / "fig_tiny.json").read_text())) == untimed(side)

    # draw got the JSON view of the sidecar and the arrays bit for bit, both times
    import sys

    computed, redrawn = sys.modules["_tiny_seen"].seen[-2:]
    for data in (computed, redrawn):
        assert data.quick is True and data.sidecar["runs"][0]["pair"] == [1, 2]
        assert data.sidecar["runs"][0]["bad"] == "nan"
        assert type(data.sidecar["runs"][0]["top"]) is float
        np.testing.assert_array_equal(data.arrays["x"], np.linspace(0.0, 1.0, 5) ** 2)
        assert data.arrays["label"].tolist() == ["a", "b"]
    assert computed.sidecar == redrawn.sidecar


def test_redraw_without_usable_data_fails_naming_the_figure(tiny, tmp_path):
    out = tmp_path / "out"

    def redraw(quick: bool, only: list[str] | None = None) -> dict:
        return run_figures(
            out, quick=quick, only=only, experiments=tiny, progress=False, redraw=True
        )

    index = redraw(True)  # nothing saved yet
    why = index["failed"]["fig_tiny"]
    assert "fig_tiny" in why and "fig_tiny.quick.npz is missing" in why
    assert "run it without --redraw: attnflow figures --quick --only tiny" in why

    run_figures(out, quick=True, experiments=tiny, jobs=1, progress=False)
    why = redraw(False)["failed"]["fig_tiny"]
    assert "full run" in why and "fig_tiny.quick.npz: add --quick" in why

    # data saved by another attnflow version
    path = F.data_path(out, "fig_tiny", True)
    meta, arrays = F.read_data(path)
    assert meta["quick"] is True and meta["sidecar"]["runs"][0]["seed"] == 3
    F.write_data(path, arrays, {**meta, "attnflow": "0.0.1"})
    why = redraw(True)["failed"]["fig_tiny"]
    assert "written by attnflow 0.0.1" in why and "without --redraw" in why

    # a script that computes and draws in one make() cannot be redrawn
    (tiny / "fig_plain.py").write_text(PLAIN)
    why = redraw(True, only=["plain"])["failed"]["fig_plain"]
    assert "cannot be redrawn" in why and "--only plain" in why


def test_registration_options(tmp_path):
    """out_dir handed to compute, text files, full-resolution quick PNGs, another sidecar
    stem, the hint naming the module, and Skipped writing nothing."""
    exp, out = tmp_path / "exp", tmp_path / "out"
    exp.mkdir()
    (exp / "fig_opts.py").write_text(OPTIONS)
    res = run_figures(out, quick=True, experiments=exp, jobs=1, progress=False)
    res = res["figures"]["fig_opts"]
    assert res["folder"] == str(out) and Path(res["json"]).name == "opts_quick.json"
    assert [Path(p).name for p in res["figures"]] == ["fig_opts.png", "fig_opts.pdf", "fig_opts.md"]
    assert (out / "fig_opts.md").read_text() == "| x |\n| 3 |\n"
    assert pixels(out / "fig_opts.png").shape[1] >= 400  # 2 in at 200 dpi (90 dpi: < 200)
    (out / "fig_opts.md").unlink()
    again = run_figures(out, quick=True, experiments=exp, progress=False, redraw=True)
    assert not again["failed"] and (out / "fig_opts.md").read_text() == "| x |\n| 3 |\n"
    why = run_figures(out, experiments=exp, progress=False, redraw=True)["failed"]["fig_opts"]
    assert "opts_data.full.npz is missing" in why and "--only opts --out" in why

    skip = tmp_path / "skip_out"
    skip.mkdir()
    (skip / "skip").touch()
    res = run_figures(skip, quick=True, experiments=exp, jobs=1, progress=False)
    assert res["skipped"] == {"fig_opts": "no model here"} and not res["figures"]
    assert sorted(p.name for p in skip.iterdir()) == ["index_quick.json", "skip"]
    # nothing to redraw: the redraw says skipped (why), not failed
    again = run_figures(skip, quick=True, experiments=exp, progress=False, redraw=True)
    assert not again["failed"] and not again["figures"]
    assert again["skipped"] == {"fig_opts": "skipped when computed: no model here"}


def test_bad_arrays_are_refused_naming_the_key(tmp_path):
    def compute(quick):
        return F.Data(sidecar={"quick": quick}, arrays={"ok": [1.0], "bad": [{"a": 1}]})

    with pytest.raises(ValueError, match=r"Data.arrays\['bad'\] has dtype object"):
        F.figure("fig_x", compute, lambda data: {})(tmp_path)


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["figures", *args])
    return int(exc.value.code or 0)


def test_cli_redraw_of_installed_figures(tmp_path, capsys):
    """Quick fig_origin and fig_subspace, then --redraw: same numbers, same pixels."""
    out = tmp_path / "figs"
    only = ["--only", "origin", "--only", "subspace"]
    assert cli("--quick", *only, "--out", str(out), "--jobs", "1", "--json") == 0
    names = ("fig_origin", "fig_subspace")
    sides = {n: json.loads((out / f"{n}.json").read_text()) for n in names}
    pngs = {n: pixels(out / f"{n}.png") for n in names}
    for n in names:
        (out / f"{n}.png").unlink()
    # the saved arrays are the ones the sidecar's numbers were measured on
    with np.load(out / "fig_origin.quick.npz") as a:
        run = sides["fig_origin"]["runs"][0]
        assert a["d2_radius"][-1] == run["radius_T"] and a["d2_spread"][-1] == run["spread_T"]
        np.testing.assert_array_equal(
            np.linalg.norm(a["d2_x"], axis=-1).max(axis=1), a["d2_radius"]
        )
    with np.load(out / "fig_subspace.quick.npz") as a:
        assert a["fit"][0] == sides["fig_subspace"]["runs"][0]["G_rate_measured"]
    capsys.readouterr()

    assert cli("--quick", "--redraw", *only, "--out", str(out), "--json") == 0
    index = json.loads(capsys.readouterr().out)
    assert index["redraw"] is True and set(index["figures"]) == set(names)
    for n in names:
        assert untimed(json.loads((out / f"{n}.json").read_text())) == untimed(sides[n])
        assert np.array_equal(pixels(out / f"{n}.png"), pngs[n]), n

    # no saved data of a full run: exit 1, the figure named, what to run
    assert cli("--redraw", "--only", "origin", "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "fig_origin: FAILED" in err and "add --quick" in err and "without --redraw" in err
    assert cli("--redraw", "--force", "--out", str(out)) == 2
