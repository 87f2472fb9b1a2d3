"""Named weight matrices: the examples of the clustering paper and random ensembles.

``named(name, d, seed)`` is what the command line's ``--V/--Q/--K NAME`` uses;
``load(spec, d, seed)`` also reads ``.npy``, ``.npz`` (the first array, or ``file.npz:key``),
``.txt`` and ``.csv`` files. ``read_array`` reads any of these files; a file that is empty,
truncated, damaged, not an array, or holds objects or text instead of numbers is a
``ValueError`` that names the file and says what is wrong with it. Binary files are read
by ``files.read_npy`` and ``files.read_npz``: every size an ``.npy`` header or a zip
member declares is checked against the file before anything is allocated, and bytes
that the header does not account for are refused.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from jaxtyping import Float

from .. import _checks
from .files import BadFile, read_npy, read_npz

__all__ = [
    "PAPER",
    "NAMES",
    "FILE_SUFFIXES",
    "named",
    "load",
    "read_array",
    "is_file_spec",
    "ginibre",
    "paper_128",
]

# Value matrices of the published figures of Geshkovski, Letrouit, Polyanskiy, Rigollet
# (2023); eigenvalues in the comments.
PAPER = {
    # 1.348, -0.068
    "paper-2d": np.array([[0.64709742, 0.81911926], [0.61210449, 0.63263484]]),
    # 0.991, -0.055 +- 0.254i
    "paper-3d-re-neg": np.array(
        [
            [0.2362413, 0.0599536, 0.40506019],
            [0.81321448, 0.49948705, 0.33754772],
            [0.2160645, 0.38505272, 0.14588075],
        ]
    ),
    # 1.078, 0.099 +- 0.082i
    "paper-3d-re-pos": np.array(
        [
            [0.18608476, 0.34391026, 0.13905949],
            [0.35244288, 0.6694859, 0.39992145],
            [0.46685606, 0.17094454, 0.42092308],
        ]
    ),
    # symmetric, 1.963, 0.253, -0.222 (the codimension-k conjecture)
    "paper-codim": np.array(
        [
            [0.92761287, 0.94333073, 0.3827744],
            [0.94333073, 0.59991396, 0.47825472],
            [0.3827744, 0.47825472, 0.46668605],
        ]
    ),
    # "paranormal": F = span(e1, e2) with V = Id, G = span(e3) with V = -0.5
    "paranormal": np.diag([1.0, 1.0, -0.5]),
}


def ginibre(d: int, seed: int = 0) -> np.ndarray:
    """A real Ginibre matrix: iid standard normal entries (``numpy`` PCG64 stream)."""
    return np.random.default_rng(seed).standard_normal((d, d))


def paper_128(seed: int = 0, d: int = 128, density: float = 0.1) -> np.ndarray:
    """The symmetric value matrix of the paper's 128 x 128 experiment, re-drawn.

    A sparse random matrix (a fraction ``density`` of entries uniform in [0, 1], the rest
    0) is symmetrised, ``(A + A^T) / 2``; every eigenvalue of modulus at most 1 is then
    replaced by one of modulus uniform in [1, 2] with the same sign. The result is
    symmetric with no eigenvalue in (-1, 1) and one large Perron eigenvalue (about 6.7
    at d = 128).
    """
    rng = np.random.default_rng(seed)
    A = np.where(rng.random((d, d)) < density, rng.random((d, d)), 0.0)
    S = (A + A.T) / 2
    w, U = np.linalg.eigh(S)
    small = np.abs(w) <= 1
    sign = np.where(w[small] < 0, -1.0, 1.0)
    w[small] = sign * rng.uniform(1.0, 2.0, size=int(small.sum()))
    V = (U * w) @ U.T
    return (V + V.T) / 2


def _rotation(d: int) -> np.ndarray:
    """Generator of a rotation in the first plane plus a small contraction elsewhere."""
    if d < 2:
        raise ValueError("the 'rotation' matrix needs d >= 2.")
    A = np.zeros((d, d))
    A[0, 1], A[1, 0] = -1.0, 1.0
    for i in range(2, d):
        A[i, i] = -0.5
    return A


def _symmetric(d: int, seed: int) -> np.ndarray:
    G = ginibre(d, seed)
    return (G + G.T) / np.sqrt(2 * d)


_GENERATED = {
    "identity": lambda d, seed: np.eye(d),
    "neg-identity": lambda d, seed: -np.eye(d),
    "zeros": lambda d, seed: np.zeros((d, d)),
    "ginibre": lambda d, seed: ginibre(d, seed),
    "ginibre-scaled": lambda d, seed: ginibre(d, seed) / np.sqrt(d),
    "symmetric": _symmetric,
    "rotation": lambda d, seed: _rotation(d),
    "jordan": lambda d, seed: np.eye(d) + np.diag(np.ones(d - 1), 1),
    "paper-128": lambda d, seed: paper_128(seed, d),
}

NAMES = tuple(_GENERATED) + tuple(PAPER)

# Suffixes read as files by ``load`` and ``read_array``.
FILE_SUFFIXES = (".npy", ".npz", ".txt", ".csv")


def named(name: str, d: int | None = None, seed: int = 0) -> np.ndarray:
    """The matrix called ``name`` (see ``NAMES``), of size ``d`` where it has one."""
    if name in PAPER:
        A = PAPER[name].copy()
        if d is not None and d != A.shape[0]:
            raise ValueError(f"the matrix {name!r} is {A.shape[0]}x{A.shape[0]}; got d = {d}.")
        return A
    if name not in _GENERATED:
        raise ValueError(
            f"unknown matrix name {name!r}; known names: {', '.join(NAMES)}, "
            f"or a .npy/.npz/.txt file."
        )
    if d is None or d < 1:
        raise ValueError(f"the matrix {name!r} needs a dimension d >= 1.")
    return np.asarray(_GENERATED[name](int(d), int(seed)), dtype=np.float64)


def _split_spec(spec: str) -> tuple[str, str]:
    """``"file.npz:key"`` -> ``("file.npz", "key")``; anything else -> ``(spec, "")``."""
    if spec.count(":") == 1 and ".npz:" in spec:
        path, _, key = spec.partition(":")
        return path, key
    return spec, ""


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a file (by its suffix) rather than a matrix name."""
    return Path(_split_spec(spec)[0]).suffix in FILE_SUFFIXES


def _reason(exc: BaseException) -> str:
    """What is wrong with a text table, in words, from the exception ``np.loadtxt`` or
    the file system raised reading it (binary files are read by ``files``)."""
    msg = str(exc).strip()
    if isinstance(exc, UnicodeDecodeError):
        return "it is not a text file"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    first = msg.split(";")[0].rstrip(". ")
    if "number of columns changed" in first:
        return f"its rows have different lengths ({first})"
    if "could not convert" in first:
        return f"it is not a table of numbers ({first})"
    return first or type(exc).__name__


def read_array(path: str | Path, *, key: str = "") -> np.ndarray:
    """The array stored in a ``.npy``, ``.npz`` (``key``, or its first array), ``.txt``
    or ``.csv`` file (text files: one row per line, at least 2-d).

    Args:
        path: the file.
        key: the array to take from an ``.npz`` archive (default: its first).

    Returns:
        The array as stored (its own dtype; the caller checks and casts it).

    Raises:
        ValueError: the file does not exist or cannot be read as an array; the message
            names the file and says why in one line.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"file {str(p)!r} does not exist.")
    if p.suffix not in FILE_SUFFIXES:
        raise ValueError(
            f"file {str(p)!r} must end in {', '.join(FILE_SUFFIXES)}; "
            f"got {p.suffix or 'no suffix'!r}."
        )
    try:
        if p.is_file() and p.stat().st_size == 0:
            raise ValueError("the file is empty")
        if p.suffix in (".txt", ".csv"):
            with warnings.catch_warnings():
                # an empty table warns and returns an empty array: reported below
                warnings.simplefilter("ignore", UserWarning)
                A = np.loadtxt(p, delimiter="," if p.suffix == ".csv" else None, ndmin=2)
        else:
            with open(p, "rb") as f:
                head = f.read(len(_NPY_MAGIC))
            if head.startswith(_ZIP_MAGIC):  # an archive, whatever the suffix, as np.load
                # tells (an archive of no arrays is its end record alone)
                if p.suffix == ".npy":
                    raise ValueError("it is an .npz archive, not a .npy file")
                A = _from_npz(p, key)
            elif head.startswith(_NPY_MAGIC[: len(head)]):
                A = read_npy(p)
            else:
                raise ValueError(f"it is not a {p.suffix} file (no .npy header)")
    except BadFile as exc:
        raise ValueError(f"cannot read {str(p)!r}: {exc.reason}.") from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"cannot read {str(p)!r}: {_reason(exc)}.") from None
    return A


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"


def _from_npz(p: Path, key: str) -> np.ndarray:
    """Array ``key`` (default: the first) of an archive, read by ``files.read_npz``."""
    arrays = read_npz(p)
    names = list(arrays)
    if key and key not in names:
        raise ValueError(f"it has no array {key!r} (it has {names})")
    if not names:
        raise ValueError("the archive holds no array")
    return arrays[key or names[0]]


def load(spec: str, d: int | None = None, seed: int = 0) -> Float[np.ndarray, "d d"]:
    """A ``d x d`` matrix by name (``named``) or from a ``.npy``, ``.npz[:key]``, ``.txt``
    or ``.csv`` file.

    Args:
        spec: a name of ``NAMES``, or a file (``file.npz:key`` takes one array of an
            archive).
        d: the size the matrix must have (None: a file decides; a name needs it unless
            it has a fixed size).
        seed: the seed of the random names (``ginibre``, ``symmetric``, ...).

    Returns:
        The matrix in float64.

    Raises:
        ValueError: an unknown name, a file that cannot be read, a file that does not
            hold one finite real square matrix, or a size other than ``d``; file errors
            name the file.
    """
    path, key = _split_spec(spec)
    if Path(path).suffix not in FILE_SUFFIXES:
        return named(spec, d, seed)
    if not Path(path).exists():
        raise ValueError(f"matrix file {path!r} does not exist.")
    A = _checks.real_array(
        f"matrix file {path!r}", read_array(path, key=key), ndim=2, shape_hint="(a d x d matrix)"
    )
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"matrix file {path!r} holds shape {A.shape}; a matrix must be square.")
    if d is not None and A.shape != (d, d):
        raise ValueError(f"matrix file {path!r} holds shape {A.shape}; expected ({d}, {d}).")
    return np.asarray(A, dtype=np.float64)
