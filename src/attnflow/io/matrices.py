"""Named weight matrices: the examples of the clustering paper and random ensembles.

``named(name, d, seed)`` is what the command line's ``--V/--Q/--K NAME`` uses;
``load(spec, d, seed)`` also reads ``.npy``, ``.npz`` (the first array, or ``file.npz:key``)
and ``.txt`` files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["PAPER", "NAMES", "named", "load", "ginibre", "paper_128"]

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


def load(spec: str, d: int | None = None, seed: int = 0) -> np.ndarray:
    """A matrix by name (``named``) or from a ``.npy``, ``.npz[:key]`` or ``.txt`` file."""
    path, _, key = (
        spec.partition(":") if spec.count(":") == 1 and ".npz:" in spec else (spec, "", "")
    )
    p = Path(path)
    if p.suffix in (".npy", ".npz", ".txt", ".csv"):
        if not p.exists():
            raise ValueError(f"matrix file {path!r} does not exist.")
        if p.suffix == ".npy":
            A = np.load(p)
        elif p.suffix == ".npz":
            with np.load(p) as f:
                if key:
                    if key not in f:
                        raise ValueError(f"{path!r} has no array {key!r}; it has {list(f)}.")
                    A = f[key]
                else:
                    A = f[list(f)[0]]
        else:
            A = np.loadtxt(p, delimiter="," if p.suffix == ".csv" else None, ndmin=2)
        A = np.asarray(A, dtype=np.float64)
        if d is not None and A.shape != (d, d):
            raise ValueError(f"matrix file {path!r} holds shape {A.shape}; expected ({d}, {d}).")
        return A
    return named(spec, d, seed)
