"""`attnflow simulate` gives the status of every array it shows, and never says "ok" above
numbers that are NaN or inf."""

import contextlib
import io
import json
from types import SimpleNamespace

import numpy as np
import pytest

from attnflow.cli import _common, main


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as exc:
            main(list(args))
    return exc.value.code, out.getvalue(), err.getvalue()


def as_array(rows):
    return np.array([[float(v) for v in row] for row in rows])


# V = -I, Q = K = 0, original frame: P is uniform, so dx_i/dt = -mean(x) and the tokens'
# differences stay put (x stays finite), while z = e^{-tV} x = e^t x leaves the float64
# range near t = 709.8: the solve is fine, the rescaled frame is not representable.
OVERFLOWING_Z = (
    "simulate",
    "--V",
    "neg-identity",
    "--Q",
    "zeros",
    "--K",
    "zeros",
    "--frame",
    "original",
    "--n",
    "3",
    "--t1",
    "800",
    "--saves",
    "2",
)


def test_json_gives_the_status_of_each_array():
    code, out, err = run(*OVERFLOWING_Z, "--json")
    assert code == 0, err
    assert err == ""  # the library's range warning is replaced by the statuses
    res = json.loads(out)
    assert res["status"] == "ok" and res["ok"] is True
    x, z = as_array(res["x_final"]), as_array(res["z_final"])
    assert np.all(np.isfinite(x)) and res["x_final_status"] == "ok"
    assert not np.all(np.isfinite(z)) and res["z_final_status"] not in ("ok", "")
    # independent reference: x(t) = x0 - (1 - e^{-t}) mean(x0), mean-free part constant
    x0 = np.random.default_rng(0).uniform(-5, 5, size=(3, 2))
    want = x0 - (1 - np.exp(-800.0)) * x0.mean(axis=0)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)
    # e^800 x overflows float64 wherever x is not 0
    assert np.all(np.isinf(z) == (want != 0))


def test_text_never_says_ok_above_nonfinite_numbers():
    code, out, err = run(*OVERFLOWING_Z)
    assert code == 0, err
    lines = out.splitlines()
    head = lines[0]
    assert head.startswith("status: ") and not head.startswith("status: ok")
    assert "(solve: ok)" in head
    (zline,) = [ln for ln in lines if ln.startswith("final z")]
    assert "status: ok" not in zline and "status:" in zline
    assert "inf" in out


def test_finite_runs_say_ok_everywhere():
    code, out, err = run("simulate", "--n", "4", "--t1", "2", "--saves", "3", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["status"] == res["z_final_status"] == res["x_final_status"] == "ok"
    code, out, err = run("simulate", "--n", "4", "--t1", "2", "--saves", "3")
    assert out.splitlines()[0].startswith("status: ok   (t_stop = 2")
    assert "final z (rescaled frame; status: ok):" in out


def test_array_status_falls_back_to_numpy():
    """Without Trajectory.status_of, NaN or inf in the numbers shown is 'nonfinite'."""
    traj = SimpleNamespace(status="ok")
    assert _common.array_status(traj, "z", np.ones((2, 2))) == "ok"
    assert _common.array_status(traj, "z", np.array([[1.0, np.nan]])) == "nonfinite"
    assert _common.array_status(traj, "x", np.array([[np.inf, 0.0]])) == "nonfinite"
    failed = SimpleNamespace(status="max_steps")
    assert _common.array_status(failed, "z", np.array([[np.nan]])) == "max_steps"
    # with status_of, its word wins; "ok" with NaN shown is still not ok
    says_ok = SimpleNamespace(status="ok", status_of=lambda name: "ok")
    assert _common.array_status(says_ok, "z", np.array([np.nan])) == "nonfinite"
    says_overflow = SimpleNamespace(status="ok", status_of=lambda name: "overflow")
    assert _common.array_status(says_overflow, "x", np.array([np.inf])) == "overflow"
