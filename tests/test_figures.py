"""`attnflow figures` and `attnflow animate`: figure scripts run, write PNG + PDF + a
sidecar JSON with every parameter, and movies are GIFs with many frames.

The scripts are the installed subpackage ``attnflow.experiments``. The quick run of every
script is marked slow; a fast subset, the helpers, a wheel's contents (and a figure drawn
from it outside the checkout) and the runner's manners in a notebook run in the default
suite.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The nine figures of the phase-figures issue (attnflow/experiments/fig_<name>.py).
ISSUE_FIGURES = [
    "polytope",
    "hyperplanes",
    "subspace",
    "origin",
    "conjecture",
    "leaders",
    "paper128",
    "ginibre",
    "phase_diagram",
]
# Scripts built on attnflow/experiments/_plotting.py: their sidecars share these keys.
SIDECAR_SCRIPTS = [
    "polytope",
    "hyperplanes",
    "subspace",
    "origin",
    "conjecture",
    "paper128",
    "phase_diagram",
]
REQUIRED = {
    "script",
    "quick",
    "seed",
    "n",
    "d",
    "t1",
    "Q",
    "K",
    "V",
    "solver",
    "tolerances",
    "x64",
    "versions",
    "figures",
    "runs",
}


def run(*args, timeout=1800):
    return subprocess.run(
        [sys.executable, "-m", "attnflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def gif_frames(path) -> int:
    from PIL import Image

    with Image.open(path) as im:
        return im.n_frames


def check_index(index: dict, names: list[str]) -> None:
    """Every named script ran, wrote a PNG and a PDF (non-empty) and its sidecar."""
    assert not index["failed"], index["failed"]
    for name in names:
        res = index["figures"][f"fig_{name}"]
        paths = [Path(p) for p in res["figures"]]
        assert paths and all(p.exists() and p.stat().st_size > 0 for p in paths), name
        for ext in (".png", ".pdf"):
            assert any(p.suffix == ext for p in paths), (name, ext)
        stems = {p.stem for p in paths if p.suffix == ".png"}
        assert stems == {p.stem for p in paths if p.suffix == ".pdf"}, name
        assert Path(res["json"]).exists(), name
        json.loads(Path(res["json"]).read_text())


def _keys(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _keys(v)


def check_sidecar(path: Path, quick: bool = True) -> dict:
    side = json.loads(Path(path).read_text())
    missing = REQUIRED - set(side)
    assert not missing, (path, missing)
    assert side["x64"] is True and side["versions"]["jax"] and side["quick"] is quick
    assert side["runs"] and "runtime_seconds" not in side
    timed = [k for k in _keys(side) if k == "seconds" or k.endswith("_seconds")]
    assert not timed, (path, timed)  # wall times go to the index, not the sidecar
    for run_ in side["runs"]:
        for key in ("seed", "n", "d", "t1", "Q", "K", "V", "solver", "tolerances"):
            assert key in run_, (path, key)
    return side


# ------------------------------------------------------------------ default suite
def test_figures_quick_subset(tmp_path):
    p = run(
        "figures",
        "--quick",
        "--out",
        str(tmp_path),
        "--only",
        "polytope",
        "--only",
        "subspace",
        "--json",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    index = json.loads(p.stdout)  # one JSON object on stdout
    assert set(index["figures"]) == {"fig_polytope", "fig_subspace"}
    check_index(index, ["polytope", "subspace"])
    side = check_sidecar(tmp_path / "fig_polytope.json")
    assert {r["name"] for r in side["runs"]} == {"d2", "d3"}
    assert all(r["observed"]["label"] == "polytope" for r in side["runs"])
    assert all(r["hull_measure_max_increase"] <= 1e-9 for r in side["runs"])  # never grows
    sub = check_sidecar(tmp_path / "fig_subspace.json")
    assert sub["runs"][0]["observed"]["label"] == "subspace"
    for case in ("polytope", "polytope-3d"):
        assert gif_frames(tmp_path / "movies" / f"{case}.gif") > 1
    assert (tmp_path / "index_quick.json").exists()


def untimed(obj):
    """``obj`` without its wall-clock entries (keys containing "seconds"), recursively."""
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if "seconds" not in k}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


@pytest.mark.slow
def test_figures_in_process_matches_workers(tmp_path):
    """--jobs 1 runs the scripts in this process; the files and numbers are those of the
    worker processes (default), and --jobs 0 is refused naming the option."""
    a, b = tmp_path / "a", tmp_path / "b"
    for out, jobs in ((a, "1"), (b, "2")):
        p = run(
            "figures",
            "--quick",
            "--out",
            str(out),
            "--only",
            "subspace",
            "--only",
            "origin",
            "--jobs",
            jobs,
            "--json",
        )
        assert p.returncode == 0, p.stderr[-3000:]
        index = json.loads(p.stdout)
        assert index["jobs"] == int(jobs) and not index["failed"]
    for name in ("fig_subspace.json", "fig_origin.json"):
        sa, sb = (json.loads((d / name).read_text()) for d in (a, b))
        assert untimed(sa["runs"]) == untimed(sb["runs"])
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["figures", "--quick", "--jobs", "0", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2


@pytest.mark.slow
def test_animate_writes_gif(tmp_path):
    out = tmp_path / "m" / "h.gif"
    p = run(
        "animate",
        "--case",
        "hyperplanes",
        "--n",
        "6",
        "--t1",
        "2",
        "--frames",
        "5",
        "--dpi",
        "40",
        "--out",
        str(out),
        "--json",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads(p.stdout)
    assert info["path"] == str(out) and info["frames"] > 1
    assert info["params"]["status"] == "ok" and info["params"]["n"] == 6
    assert gif_frames(out) == info["frames"] > 1


@pytest.mark.parametrize(
    "args,word",
    [
        (("--case", "nonsense"), "--case"),
        (("--frames", "1"), "--frames"),
        (("--out", "movie.mp4"), ".gif"),
    ],
)
def test_animate_errors(capsys, args, word):
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["animate", *args])
    cap = capsys.readouterr()
    assert exc.value.code == 2 and word in cap.err and cap.out == ""


def test_figures_list_has_the_nine():
    p = run("figures", "--list", "--json")
    assert p.returncode == 0, p.stderr
    names = set(json.loads(p.stdout)["figures"])
    assert {f"fig_{n}" for n in ISSUE_FIGURES} <= names


def test_plotting_geometry():
    from attnflow.plotting import box_section, euler_saves, hull_measure, hull_vertices

    sq = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]], float)
    assert hull_measure(sq) == pytest.approx(1.0)
    assert sorted(hull_vertices(sq).tolist()) == [0, 1, 2, 3]
    assert hull_measure(np.array([[0, 0], [1, 1], [2, 2]], float)) == 0.0  # degenerate
    cube = np.array(np.meshgrid([0, 1], [0, 1], [0, 1])).reshape(3, -1).T.astype(float)
    assert hull_measure(cube) == pytest.approx(1.0)
    seg = box_section(np.array([1.0, 1.0]), 1.0, [0, 0], [1, 1])
    np.testing.assert_allclose(sorted(map(tuple, seg)), [(0, 1), (1, 0)], atol=1e-12)
    poly = box_section(np.array([0.0, 0.0, 1.0]), 0.5, [0, 0, 0], [1, 1, 1])
    assert poly.shape == (4, 3) and np.allclose(poly[:, 2], 0.5)
    assert box_section(np.array([1.0, 0.0]), 5.0, [0, 0], [1, 1]) is None
    ts = euler_saves(1.0, 0.1, 4)
    assert np.allclose(ts / 0.1, np.round(ts / 0.1)) and ts[0] == 0 and ts[-1] == 1.0


def test_draw_levels_lie_on_their_hyperplanes():
    """draw_levels: one line per level that meets the box, every end point on
    {phi . z = c} and on the box's boundary, the level 0 styled apart; a level outside
    the box draws nothing."""
    from matplotlib.figure import Figure

    from attnflow.plotting import draw_levels

    phi = np.array([0.6, -0.8])
    lo, hi = np.array([-1.0, -2.0]), np.array([3.0, 1.0])
    ax = Figure().add_subplot()
    drawn = draw_levels(
        ax, phi, (-1.0, 0.0, 0.5, 9.0), lo, hi, color="C3", ls="-", zero={"ls": ":"}
    )
    assert len(drawn) == 3  # phi . z <= 0.6 * 3 + 0.8 * 2 = 3.4 < 9 in the box
    for (line,), c in zip(drawn, (-1.0, 0.0, 0.5)):
        pts = np.column_stack(line.get_data())
        assert pts.shape == (2, 2)
        np.testing.assert_allclose(pts @ phi, c, atol=1e-12)
        on_side = np.isclose(pts, lo) | np.isclose(pts, hi)
        assert on_side.any(axis=1).all() and (pts >= lo - 1e-12).all() and (pts <= hi + 1e-12).all()
        assert line.get_linestyle() == (":" if c == 0 else "-")


def test_3d_color_is_face_and_edge_and_2d_axes_are_refused():
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure

    from attnflow.plotting import draw_hull, draw_level, set_box

    cube = np.array(np.meshgrid([0, 1], [0, 1], [0, 1])).reshape(3, -1).T.astype(float)
    fig = Figure()
    ax3 = fig.add_subplot(projection="3d")
    hull = draw_hull(ax3, cube, color="C2", alpha=0.3)
    plane = draw_level(ax3, np.array([0.0, 0.0, 1.0]), 0.5, [0, 0, 0], [1, 1, 1], color="C0")
    for coll, c, a in ((hull, "C2", 0.3), (plane, "C0", 0.18)):  # 0.18: the planes' default
        np.testing.assert_allclose(coll.get_facecolor()[0], to_rgba(c, a))
        np.testing.assert_allclose(coll.get_edgecolor()[0][:3], to_rgba(c)[:3])
    set_box(ax3, [-1, -2, -3], [1, 2, 3])
    assert ax3.get_zlim() == (-3, 3) and ax3.get_ylim() == (-2, 2)
    with pytest.raises(ValueError, match="projection='3d'"):
        draw_hull(fig.add_subplot(), cube)


def test_movie_cases_and_simulate_tokens_arguments():
    """Every movie case names a d x d value matrix; those drawn with levels have the
    simple leading eigenvalue that levels need. simulate_tokens and movie refuse bad
    arguments by name, before any work."""
    import attnflow as af
    from attnflow.plotting import MOVIE_CASES, movie, simulate_tokens
    from attnflow.studies.setups import case_matrix

    for case in MOVIE_CASES.values():
        V = case_matrix(case)
        assert V.shape == (case["d"], case["d"])
        if case["draw"] == "levels":
            assert af.spectral_structure(V).phi1_left is not None
    for kw, word in (({"n": 0}, "n"), ({"scale": -1.0}, "scale"), ({"batch": 0}, "batch")):
        with pytest.raises(ValueError, match=f"^{word} must"):
            simulate_tokens(np.eye(2), **kw)
    with pytest.raises(ValueError, match="^case must be one of"):
        movie("nonsense", "m.gif")


def test_jobs_run_scripts_in_worker_processes_with_one_blas_thread(tmp_path):
    """--jobs 2: each script runs in a worker process of this one (not in it), with one
    BLAS thread, and the workers are gone when run_figures returns."""
    from attnflow.experiments.runner import run_figures

    ext = tmp_path / "mine"
    ext.mkdir()
    for name in ("a", "b"):
        (ext / f"fig_{name}.py").write_text(
            "import os\nfrom pathlib import Path\n\n\n"
            "def make(out_dir, quick=False):\n"
            f"    p = Path(out_dir) / '{name}.txt'\n"
            "    env = os.environ['OPENBLAS_NUM_THREADS']\n"
            "    p.write_text(f'{os.getpid()} {os.getppid()} {env}')\n"
            "    return {'figures': [p]}\n"
        )
    index = run_figures(tmp_path / "out", quick=True, experiments=ext, jobs=2, progress=False)
    assert not index["failed"] and index["jobs"] == 2
    seen = [(tmp_path / "out" / f"{n}.txt").read_text().split() for n in ("a", "b")]
    for pid, ppid, blas in seen:
        assert int(pid) != os.getpid() and int(ppid) == os.getpid() and blas == "1"
    deadline = time.time() + 10
    while any(Path(f"/proc/{pid}").exists() for pid, _, _ in seen) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid, _, _ in seen)


def test_exclusive_scripts_run_first_with_nothing_beside_them(tmp_path):
    """A full run with --jobs 2: the scripts that declare EXCLUSIVE (they use every core
    themselves) run one at a time before the others, whose runs overlap each other."""
    from attnflow.experiments.runner import run_figures

    ext = tmp_path / "mine"
    ext.mkdir()
    body = (
        "import time\nfrom pathlib import Path\n\nSECONDS = {{'quick': 1, 'full': {s}}}\n"
        "EXCLUSIVE = {x}\n\n\n"
        "def make(out_dir, quick=False):\n"
        "    t0 = time.time()\n"
        "    time.sleep(0.6)\n"
        "    p = Path(out_dir) / '{n}.txt'\n"
        "    p.write_text(f'{{t0}} {{time.time()}}')\n"
        "    return {{'figures': [p]}}\n"
    )
    for name, secs, excl in (
        ("big", 50, True),
        ("pool", 5, True),
        ("a", 9, False),
        ("b", 8, False),
    ):
        (ext / f"fig_{name}.py").write_text(body.format(s=secs, x=excl, n=name))
    index = run_figures(tmp_path / "out", experiments=ext, jobs=2, progress=False, reuse=False)
    assert not index["failed"]
    span = {
        n: [float(v) for v in (tmp_path / "out" / f"{n}.txt").read_text().split()]
        for n in ("big", "pool", "a", "b")
    }
    assert span["big"][1] <= span["pool"][0]  # the longer exclusive one first, alone
    assert span["pool"][1] <= min(span["a"][0], span["b"][0])
    assert max(span["a"][0], span["b"][0]) < min(span["a"][1], span["b"][1])  # a, b overlap


def test_find_experiments_installed_and_external(tmp_path):
    """Default: the installed subpackage; --experiments DIR: any folder of fig_*.py."""
    import attnflow.experiments
    from attnflow.experiments.runner import find_experiments, list_figures, run_figures

    assert find_experiments() == Path(attnflow.experiments.__file__).resolve().parent
    assert {f"fig_{n}" for n in ISSUE_FIGURES} <= set(list_figures(find_experiments()))
    ext = tmp_path / "mine"
    ext.mkdir()
    (ext / "fig_tiny.py").write_text(
        "from pathlib import Path\n\n\n"
        "def make(out_dir, quick=False):\n"
        "    p = Path(out_dir) / 'tiny.txt'\n"
        "    p.write_text('quick' if quick else 'full')\n"
        "    return {'figures': [p]}\n"
    )
    assert find_experiments(ext) == ext and list_figures(ext) == ["fig_tiny"]
    index = run_figures(tmp_path / "out", quick=True, experiments=ext, jobs=1, progress=False)
    assert not index["failed"] and (tmp_path / "out" / "tiny.txt").read_text() == "quick"
    with pytest.raises(ValueError, match="--experiments"):
        find_experiments(tmp_path / "empty")


def test_what_a_script_prints_goes_to_the_index_not_the_terminal(tmp_path, capfd):
    """A script's prints broke the progress bar (fig_paper128, fig_ginibre): the runner
    keeps them in the index; a script that fails is reported on stderr with its error,
    its traceback and what it printed."""
    from attnflow.experiments.runner import run_figures

    ext = tmp_path / "mine"
    ext.mkdir()
    (ext / "fig_talk.py").write_text(
        "import sys\nfrom pathlib import Path\n\n\n"
        "def make(out_dir, quick=False):\n"
        "    print('computing the talk figure')\n"
        "    print('halfway', file=sys.stderr)\n"
        "    p = Path(out_dir) / 'talk.txt'\n"
        "    p.write_text('x')\n"
        "    return {'figures': [p]}\n"
    )
    (ext / "fig_broken.py").write_text(
        "def make(out_dir, quick=False):\n"
        "    print('about to fail')\n"
        "    raise RuntimeError('no figure')\n"
    )
    index = run_figures(tmp_path / "out", quick=True, experiments=ext, jobs=1, progress=False)
    out, err = capfd.readouterr()
    assert "computing the talk figure" not in out + err and "halfway" not in out + err
    assert index["figures"]["fig_talk"]["output"] == "computing the talk figure\nhalfway\n"
    assert index["failed"]["fig_broken"] == "RuntimeError: no figure"
    assert "it printed:\nabout to fail" in err and "Traceback" in err


def test_long_studies_are_left_out_of_a_full_run_unless_named(tmp_path):
    """A script that declares LONG (the max-retrieval training) is listed as skipped by a
    full run, and runs when named with only= (or in a quick run)."""
    import attnflow.experiments.fig_max_retrieval as retrieval
    from attnflow.experiments.runner import run_figures

    assert retrieval.LONG
    ext = tmp_path / "mine"
    ext.mkdir()
    for name, extra in (("short", ""), ("long", "LONG = 'an hour of training'\n")):
        (ext / f"fig_{name}.py").write_text(
            f"from pathlib import Path\n{extra}\n\n"
            "def make(out_dir, quick=False):\n"
            f"    p = Path(out_dir) / '{name}.txt'\n"
            "    p.write_text('quick' if quick else 'full')\n"
            "    return {'figures': [p]}\n"
        )
    out = tmp_path / "out"
    index = run_figures(out, experiments=ext, jobs=1, progress=False)
    assert list(index["figures"]) == ["fig_short"] and not (out / "long.txt").exists()
    assert index["skipped"] == {
        "fig_long": "not run: an hour of training (run it with --only long)"
    }
    index = run_figures(out, experiments=ext, jobs=1, progress=False, only=["long"])
    assert list(index["figures"]) == ["fig_long"] and (out / "long.txt").read_text() == "full"
    index = run_figures(out, experiments=ext, jobs=1, progress=False, quick=True)
    assert sorted(index["figures"]) == ["fig_long", "fig_short"] and not index["skipped"]


def test_the_longest_declared_script_starts_first(tmp_path):
    """The runner orders by each script's own SECONDS (quick or full), not by name or by
    an index left in the output folder; every installed script declares both."""
    from attnflow.experiments.runner import _load, find_experiments, list_figures, run_figures

    ext, out = tmp_path / "mine", tmp_path / "out"
    ext.mkdir()
    log = tmp_path / "order.txt"
    for name, quick, full in (("a", 1, 50), ("b", 9, 2), ("c", 5, 20)):
        (ext / f"fig_{name}.py").write_text(
            "from pathlib import Path\n"
            f"SECONDS = {{'quick': {quick}, 'full': {full}}}\n\n"
            "def make(out_dir, quick=False):\n"
            f"    with open({str(log)!r}, 'a') as f:\n"
            f"        f.write('{name}')\n"
            f"    p = Path(out_dir) / '{name}.txt'\n"
            "    p.write_text('x')\n"
            "    return {'figures': [p]}\n"
        )
    out.mkdir()
    # an earlier run's index that says otherwise is not what orders the scripts
    (out / "index.json").write_text('{"figures": {"fig_b": {"seconds": 999}}}')
    run_figures(out, experiments=ext, jobs=1, progress=False, reuse=False)
    assert log.read_text() == "acb"
    log.unlink()
    run_figures(out, experiments=ext, jobs=1, progress=False, quick=True)
    assert log.read_text() == "bca"
    installed = find_experiments()
    for name in list_figures(installed):
        declared = _load(installed, name).SECONDS
        assert set(declared) == {"quick", "full"} and declared["full"] >= 0, name


@pytest.mark.slow
def test_wheel_ships_the_figures_and_draws_outside_the_checkout(tmp_path):
    """The wheel holds attnflow/experiments; installed from it (not this checkout),
    `attnflow figures` draws from an empty folder elsewhere."""
    import importlib.util
    import zipfile

    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            *isolation,
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("attnflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = sorted(q.name for q in (ROOT / "src" / "attnflow" / "experiments").glob("*.py"))
    assert {"__init__.py", "_plotting.py", "agreement_study.py"} <= set(scripts)
    assert {f"fig_{n}.py" for n in ISSUE_FIGURES} <= set(scripts)
    assert {f"attnflow/experiments/{q}" for q in scripts} <= names
    assert not any(n.startswith("experiments/") for n in names)

    site, work = tmp_path / "site", tmp_path / "work"
    work.mkdir()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run(
        [sys.executable, "-c", "import attnflow.experiments as e; print(e.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert Path(p.stdout.strip()).resolve().is_relative_to(site.resolve()), p.stdout
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnflow",
            "figures",
            "--quick",
            "--only",
            "polytope",
            "--out",
            "figs",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=1800,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    for f in ("fig_polytope.png", "fig_polytope.pdf", "fig_polytope.json", "movies/polytope.gif"):
        assert (work / "figs" / f).stat().st_size > 0, f
    side = check_sidecar(work / "figs" / "fig_polytope.json")
    assert side["script"] == "attnflow.experiments.fig_polytope"


MANNERS = r"""
import json, sys
from pathlib import Path
import matplotlib
matplotlib.use("pdf")            # a backend of the caller's choosing (not Agg)
import matplotlib.pyplot as plt
plt.rcParams["font.size"] = 13.0  # and settings of its own
import jax
import numpy as np
out = Path(sys.argv[1])
backend, rc = matplotlib.get_backend(), dict(matplotlib.rcParams)
interactive, x64 = plt.isinteractive(), bool(jax.config.jax_enable_x64)

import attnflow.plotting as AP
from attnflow.experiments.runner import run_figures

with AP.use_style({"axes.linewidth": 2.0}):
    inside = (matplotlib.rcParams["font.size"], matplotlib.rcParams["axes.linewidth"])
traj, _ = AP.simulate_tokens(np.eye(2), n=6, t1=1.0)
AP.animate(traj, out / "a.gif", frames=3, dpi=30, draw="hull")
AP.movie("hyperplanes", out / "b.gif", n=6, t1=1.0, frames=3, dpi=30)
fig, ax = plt.subplots()
z = np.asarray(traj.z)
AP.draw_trajectories(ax, z)
AP.draw_hull(ax, z[-1])
AP.draw_level(ax, np.array([1.0, 0.5]), 0.0, *AP.data_box(z))
plt.close(fig)
index = run_figures(out / "figs", quick=True, jobs=1, only=["polytope"], progress=False)
print(json.dumps({
    "failed": index["failed"], "inside": inside,
    "backend": [backend, matplotlib.get_backend()],
    "changed": sorted(k for k in rc if str(rc[k]) != str(matplotlib.rcParams[k])),
    "interactive": [interactive, plt.isinteractive()],
    "x64": [x64, bool(jax.config.jax_enable_x64)],
    "open_figures": plt.get_fignums(),
}))
"""


@pytest.mark.slow
def test_plotting_and_runner_leave_matplotlib_and_x64_alone(tmp_path):
    """Drawing functions and run_figures(jobs=1) in a caller's process (a notebook, say)
    keep its backend, rcParams and x64 setting, and leave no pyplot figure open."""
    p = subprocess.run(
        [sys.executable, "-c", MANNERS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert not r["failed"], r["failed"]
    assert r["inside"] == [8, 2.0]  # use_style applies inside its block only
    assert r["backend"] == ["pdf", "pdf"]
    assert r["changed"] == []
    assert r["interactive"][0] == r["interactive"][1]
    assert r["x64"] == [False, False]
    assert r["open_figures"] == []
    assert gif_frames(tmp_path / "a.gif") > 1 and gif_frames(tmp_path / "b.gif") > 1
    assert (tmp_path / "figs" / "fig_polytope.png").stat().st_size > 0
    assert (tmp_path / "figs" / "fig_polytope.json").exists()


# --------------------------------------------------------------------- slow suite
@pytest.mark.slow
def test_figures_quick_all(tmp_path):
    """The README's command in quick mode: every script of attnflow.experiments runs."""
    p = run("figures", "--quick", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    # (the index file, not --json: some scripts return Path objects, which the --json
    # printer cannot serialise)
    index = json.loads((tmp_path / "index_quick.json").read_text())
    check_index(index, ISSUE_FIGURES)
    for name in SIDECAR_SCRIPTS:
        check_sidecar(tmp_path / f"fig_{name}.json")
    for case in ("polytope", "polytope-3d", "hyperplanes", "hyperplanes-3d"):
        assert gif_frames(tmp_path / "movies" / f"{case}.gif") > 1
    side = json.loads((tmp_path / "fig_paper128.json").read_text())
    r = side["runs"][0]
    # negative-eigenvalue coordinates diverge, positive ones freeze
    assert r["negative_modes_std_at_T_range"][0] > 1e3 * r["positive_modes_std_at_T_range"][1]
    assert r["positive_modes_final_speed_max"] < 1e-3
    side = json.loads((tmp_path / "fig_phase_diagram.json").read_text())
    for run_ in side["runs"]:
        cells = [c for row in run_["cells"] for c in row]
        # where a theorem applies, the observed limit agrees or has not settled
        for c in cells:
            if c["predicted"] != "unclassified":
                assert c["majority"] in (c["predicted"], "not-converged"), c


@pytest.mark.slow
def test_issue_figures_quick(tmp_path):
    """The nine figures of the phase-figures issue, quick."""
    args = ["figures", "--quick", "--out", str(tmp_path)]
    for name in ISSUE_FIGURES:
        args += ["--only", name]
    p = run(*args)
    assert p.returncode == 0, p.stderr[-3000:]
    check_index(json.loads((tmp_path / "index_quick.json").read_text()), ISSUE_FIGURES)


def test_a_rerun_writes_the_same_bytes(tmp_path):
    """Unchanged code, run twice (in two folders): the same PNG, PDF and sidecar bytes,
    so the main job leaves a clean checkout clean. The wall times are in the result's
    ``timings`` (the runner's index), not in the sidecar."""
    from attnflow.experiments import fig_origin

    a = fig_origin.make(tmp_path / "a", quick=True)
    b = fig_origin.make(tmp_path / "b", quick=True)
    assert a["timings"]["runtime_seconds"] > 0 and b["timings"]["runtime_seconds"] > 0
    files = sorted(
        p.name for p in (tmp_path / "a").iterdir() if p.suffix in (".png", ".pdf", ".json")
    )
    assert {".png", ".pdf", ".json"} <= {Path(f).suffix for f in files}
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_a_figure_whose_numbers_are_unchanged_keeps_its_files(tmp_path, monkeypatch):
    """A rerun whose numbers equal, to rounding, those of the sidecar already in the
    folder keeps every file there as it is (a fresh clone's main job on another machine
    leaves the checkout clean); a change beyond rounding, a missing file or REWRITE
    draws and writes again."""
    import matplotlib.pyplot as plt

    from attnflow.experiments import _figure as F
    from attnflow.experiments import _plotting as H

    value = {"v": 0.5, "err": 8.0195e-13, "dtype": "float64"}

    def compute(quick):
        return F.Data(sidecar=H.sidecar(script="t", quick=quick, runs=[], seeds=[0], **value))

    def draw(data):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, data.sidecar["v"]])
        return {"fig_t": fig}

    make = F.figure("fig_t", compute, draw)
    first = make(tmp_path)
    assert "unchanged" not in first
    files = sorted(p for p in tmp_path.iterdir() if p.suffix in (".png", ".pdf", ".json"))
    stamp = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}

    def same_files() -> bool:
        return all((p.read_bytes(), p.stat().st_mtime_ns) == stamp[p] for p in files)

    value["err"] = 8.0199e-13  # a rounding-level error estimate moved
    value["v"] = 0.5 * (1 + 3e-16)
    again = make(tmp_path)
    assert again["unchanged"] is True and same_files()
    assert sorted(map(str, again["figures"])) == sorted(
        str(tmp_path / f) for f in json.loads((tmp_path / "fig_t.json").read_text())["figures"]
    )
    value["v"] = 0.5 * (1 + 1e-9)  # beyond float64 rounding: drawn and written
    assert "unchanged" not in make(tmp_path)
    assert json.loads((tmp_path / "fig_t.json").read_text())["v"] == value["v"]
    stamp = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    monkeypatch.setenv(F.REWRITE, "1")
    assert "unchanged" not in make(tmp_path)
    monkeypatch.delenv(F.REWRITE)
    (tmp_path / "fig_t.pdf").unlink()  # a listed file is missing: written again
    assert "unchanged" not in make(tmp_path) and (tmp_path / "fig_t.pdf").is_file()
    # float32 figures: the float32 tolerance
    value.update(dtype="float32", v=0.25)
    make(tmp_path)
    value["v"] = 0.25 * (1 + 1e-7)
    assert make(tmp_path)["unchanged"] is True
