"""Every option of the command line is checked before any work: bad numbers, cross-option
mistakes and unusable output paths exit 2 at once with one line naming the option."""

import contextlib
import io
import json
import re
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow
from attnflow.cli import _common, main
from attnflow.dynamics.simulate import MAX_STEPS_LIMIT


def run(*args):
    """The command line in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as exc:
            main(list(args))
    return exc.value.code, out.getvalue(), err.getvalue()


def forbidden(*args, **kwargs):
    raise AssertionError("work started before the arguments were checked")


@contextlib.contextmanager
def no_simulation():
    with mock.patch.object(attnflow, "simulate", forbidden):
        yield


@contextlib.contextmanager
def no_work():
    """Nothing may start: no JAX set-up, no weights, no tokens, no solve."""
    with contextlib.ExitStack() as stack:
        for name in ("setup_jax", "load_weights", "initial_tokens"):
            stack.enter_context(mock.patch.object(_common, name, forbidden))
        stack.enter_context(no_simulation())
        yield


def names_option(line: str, option: str) -> bool:
    return re.search(re.escape(option) + r"(?![\w-])", line) is not None


def assert_usage_error(code, out, err, option):
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnflow: error:"), lines[0]
    assert names_option(lines[0], option), (option, lines[0])


# ------------------------------------------------------ property: simulate's options
def _text(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)


NOT_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity"])
NOT_A_NUMBER = st.sampled_from(["abc", "1,5", "", "0x", "one", "1e", "--"])
NOT_POSITIVE = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False).map(_text)
NEGATIVE = st.floats(max_value=-1e-300, allow_infinity=False).map(_text)
NOT_WHOLE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).filter(lambda x: x != int(x))

BAD_VALUES = {
    "--n": st.one_of(st.integers(max_value=0).map(str), NOT_WHOLE.map(_text), NOT_A_NUMBER),
    "--d": st.one_of(st.integers(max_value=0).map(str), NOT_WHOLE.map(_text), NOT_A_NUMBER),
    "--t1": st.one_of(NOT_POSITIVE, NOT_FINITE, NOT_A_NUMBER),
    "--seed": st.one_of(st.integers(max_value=-1).map(str), NOT_WHOLE.map(_text)),
    "--beta": st.one_of(NOT_POSITIVE, NOT_FINITE, NOT_A_NUMBER),
    "--dt": st.one_of(NOT_POSITIVE, NOT_FINITE, NOT_A_NUMBER),
    "--saves": st.one_of(st.integers(max_value=1).map(str), NOT_WHOLE.map(_text)),
    "--rtol": st.one_of(
        st.floats(min_value=1.0, allow_infinity=False).map(_text),
        NEGATIVE,
        NOT_FINITE,
    ),
    "--atol": st.one_of(NEGATIVE, NOT_FINITE),
    "--max-steps": st.one_of(
        st.integers(max_value=0).map(str),
        st.integers(min_value=MAX_STEPS_LIMIT + 1).map(str),
        NOT_WHOLE.map(_text),
    ),
    "--scale": st.one_of(NOT_POSITIVE, NOT_FINITE, NOT_A_NUMBER),
    "--frame": st.sampled_from(["rescled", "sphere-ish", "Original", ""]),
    "--method": st.sampled_from(["rk4", "Euler", "tsit", ""]),
    "--x0": st.sampled_from(["gaussian", "missing.npy", "tokens.csv", ""]),
    "--V": st.sampled_from(["nonsense", "missing.npy", "Identity", ""]),
    "--Q": st.sampled_from(["nonsense", "missing.npz", ""]),
    "--K": st.sampled_from(["nonsense", "missing.txt", ""]),
}


@st.composite
def bad_option(draw):
    option = draw(st.sampled_from(sorted(BAD_VALUES)))
    return option, draw(BAD_VALUES[option])


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(bad=bad_option(), json_out=st.booleans(), method=st.sampled_from(["adaptive", "euler"]))
def test_bad_simulate_option_exits_2_before_any_simulation(tmp_path, bad, json_out, method):
    option, value = bad
    args = ["simulate", "--n", "3", "--t1", "1", "--saves", "2"]
    if option != "--method":
        args += ["--method", method] + (["--dt", "0.5"] if method == "euler" else [])
    args += [f"{option}={value}"]  # '=' keeps values such as '-inf' or '--' a value
    if json_out:
        args.append("--json")
    with contextlib.chdir(tmp_path), no_simulation():
        code, out, err = run(*args)
    assert_usage_error(code, out, err, option)


# --------------------------------------------------------- cross-option and others
@pytest.mark.parametrize(
    "args,option",
    [
        (("--method", "euler"), "--dt"),
        (("--method", "euler", "--dt", "0.3", "--t1", "1"), "--t1"),
        (("--rtol", "0", "--atol", "0"), "--rtol"),
    ],
)
def test_options_that_go_together_are_checked_before_any_work(args, option):
    with no_work():
        code, out, err = run("simulate", *args)
    assert_usage_error(code, out, err, option)


@pytest.mark.parametrize(
    "args,option",
    [
        (("rank", "--tol", "2"), "--tol"),
        (("rank", "--fit-max", "nan"), "--fit-max"),
        (("rank", "--fit-max", "1e-10", "--fit-min", "1e-9"), "--fit-min"),
        (("rank", "--leader-threshold", "0"), "--leader-threshold"),
        (("rank", "--saves", "1"), "--saves"),
        (("classify", "--rtol", "nan"), "--rtol"),
        (("classify", "--tol", "-1"), "--tol"),
        (("classify", "--simulate", "--method", "euler"), "--dt"),
        (("ginibre", "--samples", "0"), "--samples"),
        (("ginibre", "--workers", "-1"), "--workers"),
        (("ginibre", "--level", "1.5"), "--level"),
        (("ginibre", "--seed", "-3"), "--seed"),
        (("ginibre", "--shard", "3/2"), "--shard"),
        (("animate", "--fps", "0"), "--fps"),
        (("animate", "--dpi", "5"), "--dpi"),
        (("animate", "--n", "0"), "--n"),
        (("animate", "--t1", "1.05"), "--t1"),
        (("heads", "--horizon", "-1"), "--horizon"),
        (("heads", "--num-heads", "0"), "--num-heads"),
        (("dispersion", "--d", "0"), "--d"),
        (("dispersion", "--queries", "0"), "--queries"),
        (("dispersion", "--sink", "17", "--n", "16,32"), "--sink"),
        (("dispersion", "--s", "inf"), "--s"),
        (("figures", "--jobs", "0"), "--jobs"),
    ],
)
def test_every_subcommand_checks_its_numbers_before_any_work(args, option):
    with no_work():
        code, out, err = run(*args)
    assert_usage_error(code, out, err, option)


# ------------------------------------------------------------------- output paths
def test_out_whose_parent_is_a_file_fails_before_the_solve(tmp_path):
    (tmp_path / "afile").write_text("x")
    with no_work():
        code, out, err = run("simulate", "--out", str(tmp_path / "afile" / "run.npz"))
    assert_usage_error(code, out, err, "--out")
    assert "afile" in err


def test_out_that_is_a_directory_fails_before_the_solve(tmp_path):
    with no_work():
        code, out, err = run("simulate", "--out", str(tmp_path))
    assert_usage_error(code, out, err, "--out")
    assert "is a directory" in err


def test_out_in_missing_folders_is_written_and_reported(tmp_path):
    target = tmp_path / "new" / "deeper" / "run"  # no suffix: .npz is appended
    code, out, err = run(
        "simulate", "--n", "3", "--t1", "1", "--saves", "2", "--out", str(target), "--json"
    )
    assert code == 0, err
    res = json.loads(out)
    written = tmp_path / "new" / "deeper" / "run.npz"
    assert res["out"] == str(written) and written.is_file()
    loaded = attnflow.Trajectory.load(written)
    assert loaded.status == res["status"] == "ok"


def test_animate_out_is_checked_before_drawing(tmp_path):
    (tmp_path / "afile").write_text("x")
    with no_work():
        code, out, err = run("animate", "--out", str(tmp_path / "afile" / "m.gif"))
    assert_usage_error(code, out, err, "--out")


def test_figures_out_that_is_a_file_fails_before_any_script(tmp_path):
    (tmp_path / "afile").write_text("x")
    with mock.patch("attnflow.experiments.runner.run_figures", forbidden):
        code, out, err = run("figures", "--out", str(tmp_path / "afile"))
    assert_usage_error(code, out, err, "--out")


def _ginibre(tmp_path, *extra):
    return run("ginibre", "--d", "8,32", "--samples", "200", "--workers", "1", *extra)


def test_ginibre_checks_every_shard_folder_before_computing(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    (out / "d00032").write_text("in the way")
    with mock.patch("attnflow.studies.sweep.run", forbidden):
        code, stdout, err = _ginibre(tmp_path, "--out", str(out), "--json")
    assert_usage_error(code, stdout, err, "--out")
    assert "d00032" in err
    assert not (out / "d00008").exists()  # d = 8 was not computed


def test_ginibre_refuses_another_sweep_before_computing(tmp_path):
    out = tmp_path / "runs"
    code, _, err = run(
        "ginibre", "--d", "32", "--samples", "100", "--workers", "1", "--out", str(out)
    )
    assert code == 0, err
    with mock.patch("attnflow.studies.sweep.run", forbidden):
        code, stdout, err = _ginibre(tmp_path, "--out", str(out), "--json")
    assert_usage_error(code, stdout, err, "--out")
    assert "different sweep" in err and "size: stored 100, asked 200" in err
    assert not (out / "d00008").exists()


def test_ginibre_resumes_a_matching_sweep(tmp_path):
    out = tmp_path / "runs"
    code, first, err = _ginibre(tmp_path, "--out", str(out), "--json")
    assert code == 0, err
    code, again, err = _ginibre(tmp_path, "--out", str(out), "--json")
    assert code == 0, err
    a, b = json.loads(first), json.loads(again)
    assert a["results"] == b["results"]
    assert all(r["computed"] == [] for r in b["runs"])  # everything was on disk


# ------------------------------------------------------------------ interruptions
def test_ctrl_c_exits_130_quietly(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_common, "load_weights", interrupted)
    code, out, err = run("simulate", "--json")
    assert code == 130 and out == "" and "Traceback" not in err


def test_an_eof_error_is_not_reported_as_an_interruption(monkeypatch):
    # click turns EOFError into Abort ("interrupted", status 1): report what happened
    def truncated(*args, **kwargs):
        raise EOFError("No data left in file")

    monkeypatch.setattr(_common, "load_weights", truncated)
    code, out, err = run("simulate", "--json")
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted" not in lines[0]
    assert lines[0].startswith("attnflow: internal error: EOFError: No data left in file")
