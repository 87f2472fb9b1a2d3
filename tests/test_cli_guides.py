"""The command line guides: choices in --help and checked before any work, help on every
option, --version, one --x64 default, exit codes 0/1/2, the float32 cast warning."""

import json
import os
import subprocess
import sys
import time

import jax
import pytest
import typer

import attnflow
from attnflow import cli
from attnflow.cli import _common

COMMAND = typer.main.get_command(cli.app)
# The subcommands that compute with JAX in this process take --x64/--no-x64; ginibre and
# figures always compute in float64.
X64_COMMANDS = {"simulate", "rank", "classify", "animate", "heads", "dispersion"}


def run(capsys, *args):
    """The command line in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(list(args))
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


def run_subprocess(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "attnflow", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """Make any real work fail loudly: a check that passes must have run before it."""

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    for name in ("load_weights", "initial_tokens", "setup_jax"):
        monkeypatch.setattr(_common, name, forbidden)
    monkeypatch.setattr(attnflow, "simulate", forbidden)
    monkeypatch.setattr(attnflow, "Attention", forbidden)


# ------------------------------------------------------------------------- choices
@pytest.mark.parametrize(
    "args,choices",
    [
        (("simulate", "--frame", "rescled"), ("rescaled", "original")),
        (("simulate", "--method", "rk4"), ("adaptive", "euler", "tsit5", "dopri5")),
        (("rank", "--norm", "l2"), ("inf", "l1")),
        (("rank", "--frame", "sphere-ish"), ("rescaled", "original")),
        (("classify", "--method", "rk4"), ("adaptive", "euler")),
        (("ginibre", "--interval", "exactish"), ("wilson", "clopper-pearson")),
        (("ginibre", "--backend", "torch"), ("numpy", "jax")),
        (("animate", "--case", "spiral"), ("polytope", "hyperplanes", "origin")),
        (("dispersion", "--kernels", "softmax,flash"), ("softmax", "qknorm", "ssmax")),
        (("simulate", "--x0", "gaussian"), ("uniform", "normal", ".npy/.txt")),
        (("dispersion", "--tokens", "ball"), ("sphere", "uniform", "normal")),
    ],
)
def test_bad_choice_exits_2_at_once_naming_the_choices(capsys, no_work, args, choices):
    start = time.perf_counter()
    code, out, err = run(capsys, *args)
    elapsed = time.perf_counter() - start
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith("attnflow: error:") and args[1] in line
    for c in choices:
        assert c in line
    assert "Value error" not in line
    assert elapsed < 5.0  # parsing only: no weights, no model, no compilation


def test_bad_choice_fails_fast_from_the_shell():
    start = time.perf_counter()
    p = run_subprocess("simulate", "--frame", "rescled")
    elapsed = time.perf_counter() - start
    assert p.returncode == 2 and p.stdout == ""
    line = one_line(p.stderr)
    assert "'rescaled', 'original'" in line and "rescled" in line
    # Loose: the import of the package dominates; no solve is compiled or run.
    assert elapsed < 60


@pytest.mark.parametrize(
    "args,word",
    [
        (("simulate", "--x0", "missing.npy"), "does not exist"),
        (("simulate", "--V", "missing.npy"), "does not exist"),
        (("simulate", "--V", "nonsense"), "unknown matrix name"),
        (("simulate", "--out", "."), "is a directory"),
        (("dispersion", "--n", "16,32,...,100"), "--n"),
        (("ginibre", "--d", "2,4,...,9"), "--d"),
    ],
)
def test_files_and_comma_lists_are_checked_before_any_work(
    capsys, no_work, tmp_path, monkeypatch, args, word
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and word in one_line(err)


def test_method_choices_follow_the_solvers():
    from attnflow.dynamics.simulate import FIXED, FRAMES

    methods = [m.value for m in cli.Method]
    assert set(methods) == {"adaptive", *FIXED, *attnflow.SOLVERS}
    assert [f.value for f in cli.Frame] == list(FRAMES)


def test_choices_are_listed_in_help(capsys):
    code, out, _ = run(capsys, "simulate", "--help")
    assert code == 0
    assert "rescaled|original" in out
    assert "|".join(m.value for m in cli.Method) in out


# ---------------------------------------------------------------------- version
def test_version(capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == ""
    assert out == f"attnflow {attnflow.__version__}\n"


def test_version_from_the_shell():
    p = run_subprocess("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"attnflow {attnflow.__version__}"


# ------------------------------------------------------------------------- help
def all_params():
    yield "attnflow", COMMAND.params
    for name, cmd in COMMAND.commands.items():
        yield name, cmd.params


def test_every_option_has_help():
    missing = [
        f"{name} {'/'.join(p.opts)}"
        for name, params in all_params()
        for p in params
        if not (getattr(p, "help", None) or "").strip()
    ]
    assert not missing, missing
    for name, cmd in COMMAND.commands.items():
        assert (cmd.short_help or "").strip(), name


@pytest.mark.parametrize("name", sorted(COMMAND.commands))
def test_help_of_every_subcommand(capsys, name):
    code, out, err = run(capsys, name, "--help")
    assert code == 0 and err == ""
    assert f"Usage: attnflow {name}" in out
    if name in X64_COMMANDS:
        assert "--x64 / --no-x64" in out and "default: on" in out


def test_app_help_documents_the_exit_codes(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for word in (
        "Exit status",
        "0   success",
        "1   runtime failure",
        "2   usage error",
        "internal error",
        "--traceback",
        "ATTNFLOW_TRACEBACK=1",
        "--version",
    ):
        assert word in out
    assert "Exit status" in cli.__doc__ and "internal error" in cli.__doc__


# -------------------------------------------------------------------------- x64
def test_one_x64_option_with_one_default():
    found = {}
    for name, cmd in COMMAND.commands.items():
        for p in cmd.params:
            if p.name == "x64":
                found[name] = p
    assert set(found) == X64_COMMANDS
    for name, p in found.items():
        assert p.default is True, name
        assert p.opts == ["--x64"] and p.secondary_opts == ["--no-x64"], name
        assert "default: on" in p.help, name
    assert len({p.help for p in found.values()}) == 1  # declared once, shared


def test_x64_is_the_default_from_the_shell():
    p = run_subprocess("simulate", "--n", "3", "--t1", "1", "--saves", "2", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["metadata"]["run"]["versions"]["x64"] is True
    assert res["metadata"]["run"]["dtype"] == "float64"
    assert "cast to float32" not in p.stderr


def test_no_x64_computes_in_float32_without_the_cast_warning():
    p = run_subprocess("simulate", "--n", "3", "--t1", "1", "--saves", "2", "--json", "--no-x64")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["metadata"]["run"]["versions"]["x64"] is False
    assert res["metadata"]["run"]["dtype"] == "float32"
    assert "cast to float32" not in p.stderr  # float32 is what was asked for


def test_in_process_runs_restore_the_x64_mode(capsys):
    assert jax.config.jax_enable_x64
    code, out, err = run(capsys, "classify", "--V", "paper-2d", "--no-x64", "--json")
    assert code == 0, err
    assert json.loads(out)["label"] == "hyperplanes"
    assert jax.config.jax_enable_x64


# ------------------------------------------------------------------- exit codes
@pytest.mark.parametrize(
    "exc, size",
    [
        (MemoryError(), ""),
        (RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 32412502432 bytes."), "30.2"),
    ],
)
def test_out_of_memory_is_a_size_not_an_internal_error(capsys, monkeypatch, exc, size):
    def too_big(*args, **kwargs):
        raise exc

    monkeypatch.setattr(_common, "load_weights", too_big)
    code, out, err = run(capsys, "simulate", "--json")
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith("attnflow: error: out of memory") and "--n" in line
    assert "internal error" not in line
    assert (f"({size} GiB asked)" in line) if size else ("asked" not in line)


def test_out_of_memory_advice_names_only_the_commands_own_options(capsys, monkeypatch):
    """modes has no --n: its out-of-memory line must not advise it (it advised
    'fewer tokens (--n)' for every command)."""
    import attnflow.analysis.modes as modes_mod

    def too_big(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(modes_mod, "predict_metastable", too_big)
    code, out, err = run(capsys, "modes", "--beta", "1e6")
    line = one_line(err)
    assert code == 1 and line.startswith("attnflow: error: out of memory")
    assert "--n" not in line and "--saves" not in line and "--beta" in line


@pytest.mark.parametrize("option", ["--n", "--d"])
@pytest.mark.parametrize("command", ["simulate", "rank"])
def test_sizes_past_any_machine_are_refused_by_name(capsys, no_work, command, option):
    code, out, err = run(capsys, command, option, "99999999999999999999")
    line = one_line(err)
    assert code == 2 and out == ""
    assert f"'{option}'" in line and "99999999999999999999" in line and "1e+06" in line
    assert "Maximum allowed dimension" not in line


def test_simulate_on_the_sphere_is_not_headed_rescaled_frame(capsys):
    code, out, err = run(capsys, "simulate", "--frame", "sphere", "--n", "4", "--t1", "1")
    assert code == 0, err
    (zline,) = [ln for ln in out.splitlines() if ln.startswith("final z")]
    assert "rescaled" not in zline and "unit sphere" in zline
    code, out, err = run(capsys, "simulate", "--frame", "original", "--n", "4", "--t1", "1")
    assert "final z (rescaled frame; status: ok):" in out


def test_internal_error_exits_1_with_one_line(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.delenv("ATTNFLOW_TRACEBACK", raising=False)
    monkeypatch.setattr(_common, "load_weights", broken)
    code, out, err = run(capsys, "simulate", "--json")
    assert code == 1 and out == ""
    line = one_line(err)
    assert line.startswith("attnflow: internal error: ZeroDivisionError: a bug")
    assert "--traceback" in line and "ATTNFLOW_TRACEBACK=1" in line

    code, out, err = run(capsys, "--traceback", "simulate", "--json")
    assert code == 1 and out == ""
    assert "Traceback (most recent call last)" in err and "in broken" in err
    assert err.strip().splitlines()[-1].startswith("attnflow: internal error: ")

    # the flag does not outlive its run
    code, out, err = run(capsys, "simulate", "--json")
    assert code == 1 and "Traceback" not in err

    monkeypatch.setenv("ATTNFLOW_TRACEBACK", "1")
    code, out, err = run(capsys, "simulate", "--json")
    assert code == 1 and "Traceback (most recent call last)" in err


def test_library_value_errors_are_usage_errors(capsys):
    code, out, err = run(capsys, "simulate", "--t1", "-1")
    assert code == 2 and out == ""
    line = one_line(err)
    assert line.startswith("attnflow: error:") and "t1" in line


def test_failed_solve_exits_1_only_with_strict(capsys):
    args = ("simulate", "--n", "4", "--t1", "5", "--saves", "2", "--max-steps", "2", "--json")
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert json.loads(out)["status"] == "max_steps"
    code, out, err = run(capsys, *args, "--strict")
    assert code == 1
    res = json.loads(out)  # the results are still printed, as one JSON object
    assert res["status"] == "max_steps" and not res["ok"]
    line = one_line(err)
    assert line.startswith("attnflow: error: the solve failed (max_steps)")


def test_failed_figure_script_exits_1(capsys, tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "fig_broken.py").write_text(
        "def make(out_dir, quick=False):\n    raise RuntimeError('no figure today')\n"
    )
    code, out, err = run(
        capsys,
        "figures",
        "--experiments",
        str(exp),
        "--jobs",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--json",
    )
    assert code == 1
    index = json.loads(out)
    assert "fig_broken" in index["failed"]
    assert err.strip().splitlines()[-1].startswith("attnflow: error: 1 figure script(s) failed")


def test_missing_experiments_folder_is_a_usage_error(capsys, tmp_path):
    code, out, err = run(capsys, "figures", "--experiments", str(tmp_path / "nowhere"))
    assert code == 2 and out == "" and "--experiments" in one_line(err)


# ------------------------------------------------------------- float32 warning
WARNING_SCRIPT = """
import warnings
import numpy as np
import jax
assert not jax.config.jax_enable_x64
import attnflow as af

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = af.Attention(np.eye(2), np.eye(2), np.eye(2))
    af.Attention(np.eye(2), np.eye(2), np.eye(2))
    af.simulate(m, np.ones((3, 2)), 0.5)
msgs = [str(w.message) for w in caught if issubclass(w.category, UserWarning)
        and "cast to float32" in str(w.message)]
print(len(msgs))
print(msgs[0] if msgs else "")
print(caught[0].filename if caught else "")
"""


def test_float32_cast_warning_once_per_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    script = tmp_path / "cast.py"
    script.write_text(WARNING_SCRIPT)
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stderr
    count, message, filename = p.stdout.strip().splitlines()
    assert count == "1"
    assert message == (
        "float64 input cast to float32 because JAX's x64 mode is off; enable "
        "it with jax.config.update('jax_enable_x64', True) or --x64"
    )
    assert filename == str(script)  # points at the user's line, not the library


def test_float32_inputs_are_not_warned_about(tmp_path):
    code = (
        "import warnings, numpy as np, attnflow as af\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    m = af.Attention(*(np.eye(2, dtype=np.float32),) * 3)\n"
        "    af.simulate(m, np.ones((3, 2), np.float32), 0.5)\n"
        "bad = [w for w in caught if 'cast to float32' in str(w.message)]\n"
        "print('quiet' if not bad else bad)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "quiet"
