"""Files given on the command line (--V/--Q/--K, --x0, --tokens): a file that is empty,
truncated, not an array, or holds objects or text is one line naming the option and the
file, exit 2, before any solve; good files give the numbers numpy reads."""

import contextlib
import io
from unittest import mock

import numpy as np
import pytest

import attnflow
from attnflow.cli import main
from attnflow.io import matrices


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as exc:
            main(list(args))
    return exc.value.code, out.getvalue(), err.getvalue()


def forbidden(*args, **kwargs):
    raise AssertionError("a solve started before the files were checked")


def _npy(path, arr):
    np.save(path, arr)


BAD = {
    "empty.npy": lambda p: p.write_bytes(b""),
    "empty.txt": lambda p: p.write_text(""),
    "truncated.npy": lambda p: (
        _npy(p, np.eye(3)),
        p.write_bytes(p.read_bytes()[:100]),
    ),
    "short.npy": lambda p: (_npy(p, np.eye(3)), p.write_bytes(p.read_bytes()[:-30])),
    "text.npy": lambda p: p.write_text("not an array\n"),
    "objects.npy": lambda p: np.save(p, np.array([{"a": 1}, None], dtype=object)),
    "strings.npy": lambda p: np.save(p, np.array([["a", "b"], ["c", "d"]])),
    "complex.npy": lambda p: np.save(p, np.eye(2) * 1j),
    "nan.npy": lambda p: np.save(p, np.array([[np.nan, 0.0], [0.0, 1.0]])),
    "scalar.npy": lambda p: np.save(p, np.float64(2.0)),
    "ragged.txt": lambda p: p.write_text("1 2 3\n4 5\n"),
    "words.txt": lambda p: p.write_text("1 a\n2 b\n"),
    "binary.txt": lambda p: p.write_bytes(bytes(range(256))),
    "notzip.npz": lambda p: p.write_bytes(b"PK\x03\x04garbage"),
    "noarrays.npz": lambda p: np.savez(p),
}
ADVICE = ("usecols", "allow_pickle", "pickle.load", "Traceback", "np.str_")


def make(tmp_path, name):
    p = tmp_path / name
    BAD[name](p)
    return p


def assert_file_error(code, out, err, option, path):
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"attnflow: error: {option}: "), line
    assert path.name in line, line
    for word in ADVICE:
        assert word not in line, line


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("option", ["--V", "--Q", "--K"])
def test_bad_matrix_file(tmp_path, name, option):
    p = make(tmp_path, name)
    args = ["simulate", "--n", "3", "--t1", "1", "--saves", "2", option, str(p)]
    if option != "--V":
        args += ["--d", "2"]
    with mock.patch.object(attnflow, "simulate", forbidden):
        code, out, err = run(*args)
    assert_file_error(code, out, err, option, p)


@pytest.mark.parametrize("name", sorted(n for n in BAD if not n.endswith(".npz")))
def test_bad_token_file(tmp_path, name):
    p = make(tmp_path, name)
    with mock.patch.object(attnflow, "simulate", forbidden):
        code, out, err = run("simulate", "--t1", "1", "--saves", "2", "--x0", str(p))
    assert_file_error(code, out, err, "--x0", p)


@pytest.mark.parametrize("name", ["empty.npy", "objects.npy", "ragged.txt", "strings.npy"])
def test_bad_dispersion_token_file(tmp_path, name):
    p = make(tmp_path, name)
    with mock.patch.object(attnflow, "dispersion_scan", forbidden):
        code, out, err = run("dispersion", "--n", "4,8", "--tokens", str(p), "--json")
    assert_file_error(code, out, err, "--tokens", p)


def test_shapes_that_do_not_fit(tmp_path):
    np.save(tmp_path / "rect.npy", np.ones((2, 3)))
    np.save(tmp_path / "V3.npy", np.eye(3))
    np.save(tmp_path / "x2.npy", np.ones((4, 2)))
    with mock.patch.object(attnflow, "simulate", forbidden):
        code, out, err = run("simulate", "--V", str(tmp_path / "rect.npy"))
        assert_file_error(code, out, err, "--V", tmp_path / "rect.npy")
        assert "square" in err
        code, out, err = run(
            "simulate", "--V", "identity", "--d", "2", "--Q", str(tmp_path / "V3.npy")
        )
        assert_file_error(code, out, err, "--Q", tmp_path / "V3.npy")
        code, out, err = run(
            "simulate", "--V", str(tmp_path / "V3.npy"), "--x0", str(tmp_path / "x2.npy")
        )
        assert_file_error(code, out, err, "--x0", tmp_path / "x2.npy")
        assert "d = 3" in err
    with mock.patch.object(attnflow, "dispersion_scan", forbidden):
        code, out, err = run(
            "dispersion", "--n", "4,8", "--d", "2", "--tokens", str(tmp_path / "x2.npy")
        )
    assert code == 2 and "--tokens" in err and "need at least (8, 2)" in err


# ------------------------------------------------------------------- io.matrices
def test_read_array_names_the_file_and_says_why(tmp_path):
    reasons = {
        "empty.npy": "the file is empty",
        "empty.txt": "the file is empty",
        "truncated.npy": "truncated",
        "short.npy": "truncated",
        "text.npy": "not a .npy file",
        "objects.npy": "Python objects",
        "ragged.txt": "rows have different lengths",
        "words.txt": "not a table of numbers",
        "binary.txt": "not a text file",
        "notzip.npz": "not an .npz archive",
        "noarrays.npz": "holds no array",
    }
    for name, why in reasons.items():
        p = make(tmp_path, name)
        with pytest.raises(ValueError) as exc:
            matrices.read_array(p)
        msg = str(exc.value)
        assert msg.startswith(f"cannot read {str(p)!r}: ") and why in msg, msg
        assert "\n" not in msg and not any(w in msg for w in ADVICE), msg


def test_load_reads_what_numpy_reads(tmp_path):
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(3, 3)), rng.normal(size=(4, 4))
    np.save(tmp_path / "a.npy", A)
    np.savez(tmp_path / "ab.npz", first=A, second=B)
    np.savetxt(tmp_path / "a.txt", A)
    np.savetxt(tmp_path / "a.csv", A, delimiter=",")
    np.save(tmp_path / "i.npy", np.arange(9).reshape(3, 3))
    np.testing.assert_array_equal(
        matrices.load(str(tmp_path / "a.npy")), np.load(tmp_path / "a.npy")
    )
    np.testing.assert_array_equal(matrices.load(str(tmp_path / "ab.npz")), A)
    np.testing.assert_array_equal(matrices.load(f"{tmp_path / 'ab.npz'}:second"), B)
    np.testing.assert_array_equal(
        matrices.load(str(tmp_path / "a.txt")), np.loadtxt(tmp_path / "a.txt", ndmin=2)
    )
    np.testing.assert_array_equal(
        matrices.load(str(tmp_path / "a.csv")), np.loadtxt(tmp_path / "a.csv", delimiter=",")
    )
    ints = matrices.load(str(tmp_path / "i.npy"), 3)
    assert ints.dtype == np.float64
    np.testing.assert_array_equal(ints, np.arange(9.0).reshape(3, 3))
    with pytest.raises(ValueError, match="no array 'third'"):
        matrices.load(f"{tmp_path / 'ab.npz'}:third")
    with pytest.raises(ValueError, match=r"expected \(4, 4\)"):
        matrices.load(str(tmp_path / "a.npy"), 4)


def test_named_matrices_are_unchanged():
    # the names go through the same load: pin a few entries against their definitions
    np.testing.assert_array_equal(matrices.load("identity", 3), np.eye(3))
    np.testing.assert_array_equal(
        matrices.load("ginibre", 4, 7), np.random.default_rng(7).standard_normal((4, 4))
    )
    np.testing.assert_array_equal(matrices.load("paper-2d"), matrices.PAPER["paper-2d"])
