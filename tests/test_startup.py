"""Start-up: a command line that answers without JAX, a light ``import attnflow``, the
public names loaded on first use, and compiled programs kept across processes by the
persistent compilation cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import attnflow
from attnflow import _cache, _exported
from attnflow.cli import _options

# Never imported by the command line's help, version and usage errors.
HEAVY = ("jax", "jaxlib", "scipy", "matplotlib", "equinox", "diffrax", "tqdm", "optax")


def python(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 300, unset: tuple = ()
):
    """Run ``code`` in a fresh interpreter (without the variables ``unset``); returns the
    CompletedProcess."""
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
    )
    assert p.returncode == 0, p.stderr
    return p


# ------------------------------------------------------------------- command line
CLI_ARGS = [
    ["--version"],
    ["--help"],
    *(
        [name, "--help"]
        for name in (
            "simulate",
            "rank",
            "ginibre",
            "classify",
            "animate",
            "heads",
            "dispersion",
            "retrieval",
            "longcontext",
            "figures",
            "cache",
        )
    ),
    ["cache", "info", "--help"],
    ["--bogus"],
    ["simulate", "--bogus"],
    ["simulate", "--frame", "rescled"],
    ["simulate", "--method", "rk4"],
    ["simulate", "--n", "0"],
    ["simulate", "--x0", "missing.npy"],
    ["rank", "--norm", "l2"],
    ["classify", "--V", "no-such-matrix"],
    ["ginibre", "--interval", "exactish"],
    ["animate", "--case", "spiral"],
    ["dispersion", "--kernels", "softmax,flash"],
    ["figures", "--jobs", "0"],
]


def test_cli_help_version_and_usage_errors_import_no_jax(tmp_path):
    """Every call in one fresh process, the heavy modules looked at after each."""
    p = python(
        f"""
        import contextlib, io, json, sys
        from attnflow.cli import main
        heavy = {HEAVY!r}
        out = []
        for args in {CLI_ARGS!r}:
            with contextlib.redirect_stdout(io.StringIO()), \\
                    contextlib.redirect_stderr(io.StringIO()):
                try:
                    main(args)
                except SystemExit as exc:
                    code = exc.code
            out.append([args, code, [m for m in heavy if m in sys.modules]])
        print(json.dumps(out))
        """
    )
    results = json.loads(p.stdout)
    loaded = {" ".join(args): mods for args, _, mods in results if mods}
    assert not loaded, f"heavy modules imported by: {loaded}"
    codes = {" ".join(args): code for args, code, _ in results}
    assert codes["--version"] == 0 and codes["simulate --help"] == 0
    assert codes["--bogus"] == 2 and codes["simulate --frame rescled"] == 2


def test_comma_list_usage_errors_import_no_jax():
    p = python(
        """
        import contextlib, io, sys
        from attnflow.cli import main
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                main(["ginibre", "--d", "2,x"])
            except SystemExit:
                pass
        print("jax" in sys.modules)
        """
    )
    assert p.stdout.strip() == "False"


def test_option_tables_are_the_library_tables():
    """The command line's copies of the library's tables (see cli/_options.py)."""
    from attnflow.analysis.rank import NORMS
    from attnflow.dynamics.frames import FRAMES
    from attnflow.dynamics.kernels import KERNELS
    from attnflow.dynamics.simulate import FIXED, MAX_STEPS_LIMIT, SOLVERS
    from attnflow.studies.ginibre import BACKENDS, INTERVALS
    from attnflow.studies.setups import MOVIE_CASES

    assert _options.FRAMES == tuple(FRAMES)
    assert _options.SOLVERS == tuple(SOLVERS)
    assert _options.FIXED == tuple(FIXED)
    assert _options.MAX_STEPS_LIMIT == MAX_STEPS_LIMIT
    assert _options.KERNELS == tuple(KERNELS)
    from attnflow.dynamics.frames import LAYERNORMS

    assert _options.LAYERNORMS == tuple(LAYERNORMS)
    assert _options.NORMS == tuple(NORMS)
    assert _options.INTERVALS == tuple(INTERVALS)
    assert _options.BACKENDS == tuple(BACKENDS)
    assert _options.MOVIE_CASES == tuple(MOVIE_CASES)


# ------------------------------------------------------------------------- import
def test_import_attnflow_is_light():
    p = python(
        f"""
        import json, sys
        import attnflow
        version = attnflow.__version__
        light = [m for m in {HEAVY!r} if m in sys.modules]
        attnflow.simulate
        after_simulate = [m for m in ("matplotlib", "scipy.stats", "tqdm") if m in sys.modules]
        print(json.dumps([version, light, after_simulate]))
        """
    )
    version, light, after_simulate = json.loads(p.stdout)
    assert version == attnflow.__version__
    assert light == [], f"import attnflow loaded {light}"
    assert after_simulate == [], f"attnflow.simulate loaded {after_simulate}"


def test_every_public_name_resolves():
    for name in attnflow.__all__:
        assert getattr(attnflow, name) is not None, name
    assert set(attnflow.__all__) <= set(dir(attnflow))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        attnflow.no_such_name  # noqa: B018


def test_public_modules_are_faces_of_their_layer():
    import attnflow.kernels
    import attnflow.matrices
    from attnflow.dynamics import kernels as dyn_kernels
    from attnflow.io import matrices as io_matrices
    from attnflow.studies import sweep as studies_sweep
    from attnflow.sweep import run

    assert run is studies_sweep.run
    for face, target in (
        (attnflow.kernels, dyn_kernels),
        (attnflow.matrices, io_matrices),
        (attnflow.sweep, studies_sweep),
    ):
        assert list(face.__all__) == list(target.__all__)
        for name in target.__all__:
            assert getattr(face, name) is getattr(target, name), name
    assert attnflow.matrices.PAPER is io_matrices.PAPER
    assert attnflow.kernels.DENSE_MAX_N == dyn_kernels.DENSE_MAX_N
    assert attnflow.sweep.MANIFEST == studies_sweep.MANIFEST  # not in __all__: read through
    assert not hasattr(attnflow.kernels, "__path__")  # a module, not the package


# ------------------------------------------------------------- compilation cache
def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNFLOW_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform != "win32":
        assert _cache.cache_dir() == tmp_path / "xdg" / "attnflow" / "jax"
    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(tmp_path / "env"))
    assert _cache.cache_dir() == tmp_path / "env"
    assert _cache.cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_cache_off_by_environment_changes_nothing(monkeypatch, tmp_path):
    import jax

    before = jax.config.values["jax_compilation_cache_dir"]
    monkeypatch.setenv("ATTNFLOW_COMPILATION_CACHE", "0")
    assert attnflow.enable_compilation_cache(tmp_path / "c") is None
    assert not (tmp_path / "c").exists()
    assert jax.config.values["jax_compilation_cache_dir"] == before
    assert _cache.cache_info(tmp_path / "c")["enabled"] is False


README_SIMULATE = """
    import json, sys
    import jax
    from jax import monitoring

    events = {}
    def count(event, **kwargs):
        if "compilation_cache" in event:
            key = event.rsplit("/", 1)[-1]
            events[key] = events.get(key, 0) + 1
    monitoring.register_event_listener(count)

    jax.config.update("jax_enable_x64", True)
    import numpy as np, attnflow as af
    print(af.enable_compilation_cache(), file=sys.stderr)

    V = af.matrices.PAPER["paper-2d"]
    model = af.Attention(Q=np.eye(2), K=np.eye(2), V=V)
    x0 = np.random.default_rng(0).uniform(-5, 5, (20, 2))
    traj = af.simulate(model, x0, t1=10.0, ts=np.linspace(0, 10, 101))
    traj.raise_for_status()
    layers = af.simulate(model, x0, 10.0, method="euler", dt=0.1)
    print(json.dumps(events))
"""


def _programs(directory: Path) -> list[str]:
    """The names of the compiled programs a cache directory holds (one per entry)."""
    return sorted(
        p.name.removesuffix("-cache").rsplit("-", 1)[0] for p in directory.glob("*-cache")
    )


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The README's simulate in two fresh processes sharing one cache directory: the
    cache's events in each, and the programs the directory held after the first."""
    cache = tmp_path_factory.mktemp("jaxcache")
    env = {"ATTNFLOW_CACHE_DIR": str(cache), "ATTNFLOW_COMPILATION_CACHE": "1"}
    # as on a user's machine: neither XLA's log level nor equinox's error mode set (this
    # run's conftest sets both)
    quiet = ("TF_CPP_MIN_LOG_LEVEL", "EQX_ON_ERROR")
    first = json.loads(python(README_SIMULATE, env=env, unset=quiet).stdout)
    programs = _programs(cache)
    run = python(README_SIMULATE, env=env, unset=quiet)
    second = json.loads(run.stdout)
    second["stderr"] = run.stderr
    return first, second, programs


def test_second_process_reuses_the_first_ones_programs(two_processes):
    first, second, programs = two_processes
    requests, misses = first["compile_requests_use_cache"], first["cache_misses"]
    assert first.get("cache_hits", 0) == 0 and misses >= len(programs)
    # the adaptive solve, the Euler loop and the few small programs around them
    assert len(programs) >= 5
    assert "jit__adaptive_batch" in programs and "jit_layer_loop" in programs
    # every program the first process wrote, the second one read instead of compiling;
    # the ones it did not write (see the next test) are compiled again
    assert second["compile_requests_use_cache"] == requests
    assert second["cache_hits"] == len(programs)
    assert second.get("cache_misses", 0) == misses - len(programs)


def test_second_process_reuses_the_adaptive_solve(two_processes):
    """The README's adaptive solve is read back by a second process."""
    first, second, programs = two_processes
    assert "jit__adaptive_batch" in programs
    assert second.get("cache_misses", 0) == 0


def test_cli_writes_the_cache_and_no_cache_does_not(tmp_path):
    args = ["-m", "attnflow"]
    sim = ["simulate", "--n", "3", "--t1", "1", "--saves", "2", "--json"]

    def cli(*argv, cache):
        env = {**os.environ, "ATTNFLOW_CACHE_DIR": str(cache), "ATTNFLOW_COMPILATION_CACHE": "1"}
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        env.pop("EQX_ON_ERROR", None)
        p = subprocess.run(
            [sys.executable, *args, *argv], capture_output=True, text=True, env=env, timeout=300
        )
        assert p.returncode == 0, p.stderr
        # a command reading its programs back prints no XLA loader lines (on CPUs whose
        # recorded features name tuning preferences, XLA logs one per feature and program)
        assert "cpu_aot_loader" not in p.stderr, p.stderr[:400]
        return p.stdout

    on, off = tmp_path / "on", tmp_path / "off"
    json.loads(cli(*sim, cache=on))
    json.loads(cli(*sim, cache=on))  # the second run reads the programs back
    json.loads(cli("--no-cache", *sim, cache=off))
    assert len(_programs(on)) >= 5
    # the command line's own process runs equinox's checks as NaN: the solve is kept,
    # traced once into an exported program (attnflow._exported) that XLA compiles as
    # jit_call_exported
    assert "jit_call_exported" in _programs(on)
    assert any(p.name.endswith(_exported.SUFFIX) for p in on.iterdir())
    assert not off.exists()
    info = json.loads(cli("cache", "info", "--json", cache=on))
    assert info["dir"] == str(on) and info["exists"] and info["enabled"]
    assert info["entries"] == len(_programs(on)) and info["bytes"] > 0
    assert "compiled program(s)" in cli("cache", "info", cache=on)
    cleared = json.loads(cli("cache", "clear", "--json", cache=on))
    assert cleared["cleared"] and cleared["entries"] == info["entries"]
    assert not on.exists()
    assert json.loads(cli("cache", "info", "--json", cache=on))["entries"] == 0


def test_in_process_runs_restore_the_cache_settings(capsys, tmp_path, monkeypatch):
    import jax

    from attnflow import cli

    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("ATTNFLOW_COMPILATION_CACHE", "1")
    before = jax.config.values["jax_compilation_cache_dir"]
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate", "--n", "2", "--t1", "1", "--saves", "2", "--json"])
    assert exc.value.code == 0, capsys.readouterr().err
    assert (tmp_path / "c").is_dir()
    assert jax.config.values["jax_compilation_cache_dir"] == before


def test_figures_hand_the_cache_to_worker_processes(monkeypatch, tmp_path):
    """``setup_cache(children=True)`` (``attnflow figures``) exports the cache as JAX_*
    variables for the workers; ``restore_jax`` takes them back with the JAX options."""
    import jax

    from attnflow.cli import _common

    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("ATTNFLOW_COMPILATION_CACHE", "1")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    before = jax.config.values["jax_compilation_cache_dir"]
    monkeypatch.setitem(_common.STATE, "cache", True)
    monkeypatch.setitem(_common.STATE, "restore", {})
    monkeypatch.setitem(_common.STATE, "restore_env", {})
    _common.setup_cache(children=True)
    try:
        assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "c")
        assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.0"
        assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "c")
    finally:
        _common.restore_jax()
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ
    assert jax.config.values["jax_compilation_cache_dir"] == before


def test_the_dispersion_function_survives_its_submodules_import():
    """``attnflow.analysis`` is lazy, and its function ``dispersion`` shares its name with
    the submodule ``dispersion``: importing the submodule first must not replace the
    function on the package (as importing a submodule normally does)."""
    code = (
        "from attnflow.analysis.dispersion import DispersionReport\n"
        "from attnflow.analysis import dispersion\n"
        "import attnflow as af\n"
        "assert callable(dispersion) and af.dispersion is dispersion\n"
        "assert af.analysis.dispersion is dispersion\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_cache_quiets_xla_for_child_processes_even_after_jax_is_imported(tmp_path):
    """Importing JAX sets TF_CPP_MIN_LOG_LEVEL=1 when unset; the figure workers must
    still get the cache's quiet level (3), and a user's own setting is kept."""
    code = f"""
        import subprocess, sys
        import jax
        from attnflow import _cache, _exported
        _cache.enable_compilation_cache({str(tmp_path)!r}, children=True)
        child = "import os; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
        print(subprocess.run([sys.executable, "-c", child], capture_output=True,
                             text=True).stdout.strip())
    """
    env = {"ATTNFLOW_COMPILATION_CACHE": "1"}
    out = python(code, env=env, unset=("TF_CPP_MIN_LOG_LEVEL",)).stdout.split()
    assert out[-1] == "3"
    own = python(code, env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"}).stdout.split()
    assert own[-1] == "0"
