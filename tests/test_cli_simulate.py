"""The `attnflow simulate` command: JSON on stdout, metadata in --out, errors on stderr."""

import json
import subprocess
import sys

import numpy as np
import pytest


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnflow", *args], capture_output=True, text=True, timeout=300
    )


def test_simulate_json_and_out(tmp_path):
    out = tmp_path / "r.npz"
    p = run(
        "simulate",
        "--V",
        "paper-2d",
        "--n",
        "6",
        "--t1",
        "2",
        "--x64",
        "--seed",
        "4",
        "--saves",
        "3",
        "--json",
        "--out",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)  # exactly one JSON object on stdout
    assert res["status"] == "ok" and res["n"] == 6 and res["d"] == 2
    assert res["ts"] == [0.0, 1.0, 2.0]
    meta = res["metadata"]
    assert meta["extra"]["seed"] == 4 and meta["run"]["versions"]["x64"] is True
    assert meta["run"]["solver"]["solver"] == "Tsit5" and meta["run"]["solver"]["rtol"] == 1e-6
    with np.load(out) as f:
        saved_meta = json.loads(str(f["metadata"]))
        z = f["z"]
    assert saved_meta["run"]["status"] == "ok" and saved_meta["run"]["dtype"] == "float64"
    assert saved_meta["extra"] == meta["extra"] and saved_meta["extra"]["command"] == (
        "attnflow simulate"
    )
    assert z.shape == (3, 6, 2)
    np.testing.assert_allclose(z[-1], np.array(res["z_final"]), rtol=1e-12)


def test_simulate_matrix_from_file_and_euler(tmp_path):
    V = np.array([[0.5, 0.2], [0.0, -0.3]])
    np.save(tmp_path / "V.npy", V)
    p = run(
        "simulate",
        "--V",
        str(tmp_path / "V.npy"),
        "--n",
        "4",
        "--t1",
        "1",
        "--method",
        "euler",
        "--dt",
        "0.25",
        "--json",
        "--x64",
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["metadata"]["model"]["V"] == V.tolist()
    assert res["metadata"]["run"]["solver"] == {"method": "euler", "dt": 0.25, "layers": 4}


def run_inprocess(capsys, *args):
    """The command line in this process (errors happen before any solve)."""
    from attnflow.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    cap = capsys.readouterr()
    return exc.value.code, cap.out, cap.err


@pytest.mark.parametrize(
    "args,word",
    [
        (("--V", "nonsense"), "unknown matrix name"),
        (("--n", "0"), "--n"),
        (("--t1", "-1"), "t1"),
        (("--method", "euler"), "--dt"),
        (("--bogus",), "bogus"),
        (("--kernel", "nope"), "--kernel"),
        (("--mask", "alibi:x"), "--mask"),
        (("--mask", "window"), "--mask"),
        (("--layernorm", "middle"), "--layernorm"),
    ],
)
def test_simulate_errors_are_one_line_exit_2(capsys, args, word):
    code, out, err = run_inprocess(capsys, "simulate", "--x64", *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0]


def test_overflow_reported_not_raised():
    # float32 (--no-x64; the default is float64), V = I
    p = run("simulate", "--t1", "80", "--saves", "3", "--json", "--no-x64")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["status"] == "overflow" and 30 < res["t_stop"] < 50
    assert all(np.isfinite(np.array(res["z_final"])).ravel())


@pytest.mark.parametrize(
    ("kernel", "mask", "frame"),
    [
        ("sparsemax", "alibi:0.3", "original"),
        ("softmax", "rope:100,causal", "rescaled"),
        ("sink", "sinkwindow:1,2", "original"),
    ],
)
def test_simulate_kernel_and_mask_are_the_library_model(capsys, kernel, mask, frame):
    """`--kernel` and `--mask` build the same head as the library (the same tokens at t1)."""
    import jax

    import attnflow as af
    from attnflow import masks
    from attnflow.cli._common import initial_tokens, mask_object
    from attnflow.io.matrices import PAPER

    args = (
        "simulate",
        "--x64",
        "--V",
        "paper-2d",
        "--n",
        "5",
        "--t1",
        "1",
        "--seed",
        "2",
        "--kernel",
        kernel,
        "--mask",
        mask,
        "--frame",
        frame,
        "--json",
    )
    code, out, err = run_inprocess(capsys, *args)
    assert code == 0, err
    got = np.asarray(json.loads(out)["x_final"])
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        V = PAPER["paper-2d"]
        head = af.Attention(np.eye(2), np.eye(2), V, kernel=kernel, mask=mask_object(mask))
        assert isinstance(head.mask, (masks.ALiBi, masks.RoPE, masks.SinkWindow))
        x0 = initial_tokens("uniform", 5, 2, 2, 5.0)  # the CLI's default --scale
        ref = np.asarray(af.simulate(head, x0, 1.0, frame=frame, ts=[0.0, 1.0]).x[-1])
    finally:
        jax.config.update("jax_enable_x64", before)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


def test_simulate_says_where_the_tokens_went(capsys):
    """One line beside the prediction, and the labels in --json (the library's own)."""
    import attnflow as af

    code, out, err = run_inprocess(capsys, "simulate", "--V", "paper-2d", "--n", "12", "--t1", "10")
    assert code == 0, err
    assert "where the tokens went: observed hyperplanes; predicted hyperplanes (agrees)" in out
    code, out, err = run_inprocess(
        capsys, "simulate", "--V", "paper-2d", "--n", "12", "--t1", "10", "--json"
    )
    limit = json.loads(out)["limit"]
    assert limit["observed"] == limit["predicted"] == str(af.Label.HYPERPLANES)
    code, out, err = run_inprocess(capsys, "simulate", "--n", "6", "--t1", "2")
    assert "not settled by t1" in out
