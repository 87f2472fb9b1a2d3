"""Tests run in float64 with strict rank and dtype promotion (tests set them, not the library)."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

# Two host devices, and XLA:CPU compiling for the suite: most of the suite's time is XLA
# compiling thousands of small programs (each test its own shapes and models), and two
# options halve it -- the older loop emitters instead of the fusion emitters, and LLVM
# at -O0 -- while the programs compute the same numbers (to rounding) and run slower
# only where the suite's sizes make no difference. The long checks (`-m slow`), whose
# time is computing, and ATTNFLOW_TEST_XLA=default compile as users do;
# tests/test_install.py runs JAX's known miscompile reproducer with XLA's defaults.
# XLA aborts on an option it does not know (jaxlib 0.12 has no loop emitters), so the
# controlling process tries each set in a child and keeps the first that starts; xdist
# workers inherit XLA_FLAGS.
TEST_XLA_CHOICES = (
    "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0",
    "--xla_backend_optimization_level=0",
)
_DEVICES = "--xla_force_host_platform_device_count=2"


def _selects_slow(argv: list[str]) -> bool:
    """Whether a ``-m`` expression of the command line asks for the slow checks."""
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            expr = argv[i + 1]
        elif arg.startswith("-m") and len(arg) > 2:
            expr = arg[2:]
        else:
            continue
        if "slow" in expr.replace("not slow", ""):  # "slow", "slow or not slow", ...
            return True
    return False


def _xla_starts_with(flags: str) -> bool:
    """Whether JAX's CPU backend starts with these XLA options (in a child process)."""
    import subprocess

    probe = "import jax; jax.devices()"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _suite_xla_flags() -> str:
    if os.environ.get("ATTNFLOW_TEST_XLA", "").strip().lower() == "default":
        return _DEVICES
    if _selects_slow(sys.argv):
        return _DEVICES
    for extra in TEST_XLA_CHOICES:
        if _xla_starts_with(f"{_DEVICES} {extra}"):
            return f"{_DEVICES} {extra}"
    return _DEVICES


if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = _suite_xla_flags()

# The suite's compilation cache: a directory of its own, never the user's cache (the
# command line enables that one by default), made or chosen by the controlling process
# and inherited by the xdist workers through the environment. It is kept across runs
# (most of a first run's time is XLA compiling programs that the next run, or the next
# Python of the same JAX, reads back), at ATTNFLOW_TEST_CACHE_DIR, else
# <user cache>/attnflow/jax-tests; cleared when it has grown past _TEST_CACHE_BYTES.
# ATTNFLOW_TEST_CACHE_DIR=off: a fresh directory for this run only (a cold run), removed
# when the run ends. A compiled program is looked up by its HLO, compile options, JAX
# version and devices, so a kept program is the one this run would compile.
_OWNER = "ATTNFLOW_TEST_CACHE_OWNER"
_TEST_CACHE_BYTES = 2 * 2**30
_FRESH = False  # the controller's: whether the directory is this run's own, to remove


def _suite_cache() -> tuple[str, bool]:
    """The suite's cache directory and whether it is this run's own (to remove)."""
    choice = os.environ.get("ATTNFLOW_TEST_CACHE_DIR", "").strip()
    if choice.lower() in ("0", "false", "no", "off"):
        return tempfile.mkdtemp(prefix="attnflow-test-cache-"), True
    base = Path(os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache")
    path = Path(choice).expanduser() if choice else base / "attnflow" / "jax-tests"
    try:
        path.mkdir(parents=True, exist_ok=True)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        if size > _TEST_CACHE_BYTES:  # a bound on what old JAX versions and shapes leave
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache directory: a cold run in a temporary one
        return tempfile.mkdtemp(prefix="attnflow-test-cache-"), True
    return str(path), False


if _OWNER not in os.environ:
    os.environ[_OWNER] = str(os.getpid())
    _dir, _FRESH = _suite_cache()
    os.environ["ATTNFLOW_CACHE_DIR"] = _dir
_CACHE = os.environ["ATTNFLOW_CACHE_DIR"]
# XLA:CPU's loader writes two lines per program read from the cache on CPUs whose
# compile-time features name tuning preferences (see attnflow._cache); fatal only
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# equinox's runtime checks as NaN instead of host callbacks, so that the adaptive solve
# is kept in the suite's cache, as the command line does for its own process
# (attnflow.cli._common.setup_cache); the library leaves equinox's mode to the user,
# and the tests of that run in child processes without it (tests/test_cache_dir.py)
os.environ.setdefault("EQX_ON_ERROR", "nan")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
from attnflow import _cache  # noqa: E402

_cache.enable_compilation_cache()
# as diffrax's tests do: an implicit rank promotion (a (d,) array meeting an (n, d) one
# without an explicit axis) and an implicit dtype promotion (int32 times float64, float32
# meeting float64) are errors, so broadcasting and casts are always written out
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


import importlib.util  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings as _hypothesis_settings  # noqa: E402

# The property tests draw the same examples on every run (CI included), so that a red run
# is a fact about the code, not about the draw. ATTNFLOW_HYPOTHESIS=random draws anew;
# every failing example found that way stays in its test as an @example.
_hypothesis_settings.register_profile("attnflow", derandomize=True)
_hypothesis_settings.register_profile("random", derandomize=False)
_hypothesis_settings.load_profile(os.environ.get("ATTNFLOW_HYPOTHESIS", "attnflow"))


@pytest.fixture
def no_minilm(monkeypatch):
    """The MiniLM checkpoint package looks absent (as on a fresh machine), whether or not
    it is installed: scripts that need it must skip cleanly."""
    from attnflow.io import checkpoints

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == checkpoints.MINILM_PACKAGE else real(name, *a),
    )


def pytest_runtest_teardown(item, nextitem):
    """A worker runs hundreds of tests that compile thousands of distinct programs:
    XLA:CPU maps each program's code in ~20 memory regions and Linux allows a process
    65,530, past which LLVM fails to allocate and the worker aborts. Past
    attnflow._cache.MAX_MEMORY_REGIONS, JAX's in-memory caches are dropped (programs
    still needed are read back from the suite's persistent cache)."""
    _cache.release_compiled_programs()


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(_OWNER) == str(os.getpid()):  # the controller, after the workers
        if _FRESH:
            shutil.rmtree(_CACHE, ignore_errors=True)


# The default suite stays within about five minutes on two cores: these end-to-end checks
# (each 4-30 s) run with the long checks (`pytest -m slow`), because a cheaper check of
# the same path stays in the default suite (named after each).
LONG_END_TO_END = {
    # five notebooks stay (clustering, leaders, ginibre_curve, heads_census, own_family)
    "tests/test_notebooks.py::test_notebook_runs_and_states_what_it_computes[metastability]",
    "tests/test_notebooks.py::test_notebook_runs_and_states_what_it_computes[meanfield]",
    "tests/test_notebooks.py::test_notebook_runs_and_states_what_it_computes[sphere_phase]",
    # figure scripts at --quick size: tests/test_figures.py runs the runner on small ones,
    # and the plateau, Renyi and mean-field numbers have their own unit checks
    "tests/test_fig_sphere.py::test_fig_modes_quick",
    "tests/test_fig_sphere.py::test_fig_metastability_quick",
    "tests/test_lost_middle.py::test_fig_lost_middle_quick",
    "tests/test_figures.py::test_figures_quick_subset",
    "tests/test_figures.py::test_exclusive_scripts_run_first_with_nothing_beside_them",
    "tests/test_critical.py::test_fig_critical_quick",
    "tests/test_normalization.py::test_fig_normalization_quick",
    "tests/test_fig_transformer.py::test_fig_rank_collapse_quick",
    "tests/test_redraw.py::test_cli_redraw_of_installed_figures",
    "tests/test_causal_sphere.py::test_the_plateau_count_of_a_causal_run_is_the_number_of_renyi_centres",
    "tests/test_experiments_scripts.py::test_plateau_counts_quick_resumes",
    "tests/test_gaussian_noise.py::test_particles_follow_the_closure_as_n_grows",
    # gradients: every frame with the layers, and the rescaled frame adaptive, stay
    "tests/test_gradients.py::test_every_leaf_matches_finite_differences[sphere-adaptive]",
    "tests/test_gradients.py::test_every_leaf_matches_finite_differences[original-adaptive]",
    # the runner's faults: test_runner_faults.py keeps its cheaper kills
    "tests/test_runner_faults.py::test_a_dead_worker_costs_its_script_alone",
    "tests/test_runner_faults.py::test_sigterm_stops_the_run_and_nothing_starts_afterwards",
    # the noise's statistics: test_stochastic.py keeps its moments and the solve's path
    "tests/test_stochastic.py::test_strong_convergence_on_one_path",
    "tests/test_stochastic.py::test_antipodal_outcomes_on_both_sides_of_the_threshold",
    "tests/test_stochastic.py::test_lyapunov_exponent_monte_carlo",
    "tests/test_sinks.py::test_learned_scales_train_through_the_solve",
    # the command line in float32: test_cli_guides.py keeps the cast warning's checks
    "tests/test_cli_guides.py::test_float32_inputs_are_not_warned_about",
    "tests/test_cli_guides.py::test_no_x64_computes_in_float32_without_the_cast_warning",
}


def pytest_collection_modifyitems(config, items):
    """Mark ``LONG_END_TO_END`` slow (before the ``-m`` selection applies)."""
    del config
    for item in items:
        if item.nodeid in LONG_END_TO_END:
            item.add_marker(pytest.mark.slow)
