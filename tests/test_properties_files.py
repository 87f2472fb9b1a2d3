"""Property-based damage to every file the package reads: a loader either refuses the
file with one ``ValueError`` whose message names the file and says what is wrong, or
returns exactly what was saved. Two loaders refuse as their contracts say instead: a
figure's ``make.redraw`` raises ``MissingData`` naming the file, and a training
checkpoint that is not whole is named in a ``RuntimeWarning`` and dropped (``None``:
training starts over).

A valid small file of each kind is written once; hypothesis then truncates it at a
random length, flips random bytes (uniformly, and where the structure lives: zip
headers, ``.npy`` headers, the central directory, a safetensors header), appends junk,
replaces a field of its JSON metadata with a value of another kind or deletes it, or
rewrites an ``.npy`` header inside an ``.npz`` so that it declares another size (a huge
shape among them) or Python objects. Never a raw ``KeyError``, ``JSONDecodeError``,
``AttributeError``, ``zipfile.BadZipFile``, ``OSError``, ``EOFError`` or
``MemoryError``, never a silently different result. Files without any checksum (plain
``.npy``, safetensors, text tables, a training record ``train.json``) cannot tell a
flipped byte that leaves them well formed from a true value: for those, what is checked
is that the result keeps the saved structure. A size an ``.npy`` header declares is
checked against the file before anything that large is allocated
(``test_a_huge_declared_shape_is_refused_before_allocating``).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import shutil
import struct
import time
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnflow as af
from attnflow.io import checkpoints, matrices
from attnflow.studies import sweep as S

SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FEW = settings(SETTINGS, max_examples=30)


# ====================================================================== damage
def byte_damage(data: st.DataObject, raw: bytes, hot: list[tuple[int, int]]) -> bytes:
    """``raw`` truncated, with 1-4 bytes flipped (anywhere, or in one of the ``hot``
    ranges where the structure lives), or with junk appended."""
    kind = data.draw(st.sampled_from(["truncate", "flip", "append"]), label="damage")
    if kind == "truncate":
        return raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    if kind == "append":
        return raw + data.draw(st.binary(min_size=1, max_size=64), label="junk")
    out = bytearray(raw)
    ranges = [(0, len(raw))] + [(a, min(b, len(raw))) for a, b in hot if a < len(raw)]
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        lo, hi = data.draw(st.sampled_from(ranges), label="where")
        at = data.draw(st.integers(lo, hi - 1), label="at")
        out[at] ^= data.draw(st.integers(1, 255), label="mask")
    return bytes(out)


def zip_hot(raw: bytes) -> list[tuple[int, int]]:
    """The structure of a zip archive: each member's local header and the start of its
    data (the ``.npy`` header), and the central directory."""
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        hot = [
            (i.header_offset, i.header_offset + 30 + len(i.filename) + 200) for i in zf.infolist()
        ]
        hot.append((zf.start_dir, len(raw)))
    return hot


WRONG = [None, "junk", -1, 2.5, True, [], {}, [1, "a"], {"x": 1}]


def _kind(v: Any) -> str:
    return "none" if v is None else type(v).__name__


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for k, v in items:
        out.append(prefix + (k,))
        out += _paths(v, prefix + (k,))
    return out


def json_edit(data: st.DataObject, obj: dict, *, top: bool = False) -> dict:
    """``obj`` with one field (at any depth; the top level only with ``top``) replaced by
    a value of another kind, or deleted."""
    paths = [(k,) for k in obj] if top else _paths(obj)
    path = data.draw(st.sampled_from(paths), label="field")
    new = copy.deepcopy(obj)
    parent = new
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    if data.draw(st.booleans(), label="delete"):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(
            st.sampled_from([w for w in WRONG if _kind(w) != _kind(old)]), label="value"
        )
    return new


# ------------------------------------------------------------------ npz members
def members(raw: bytes) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return [(i, zf.read(i)) for i in zf.infolist()]


def rezip(parts: list[tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    """An archive of these members, with valid CRCs (a crafted file, not a damaged one)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for info, blob in parts:
            new = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            new.compress_type = info.compress_type
            zf.writestr(new, blob)
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def npy_read(blob: bytes) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)


def with_header(
    blob: bytes, shape: tuple[int, ...] | None = None, descr: str | None = None
) -> bytes:
    """An ``.npy`` blob with its header rewritten (the data kept as they are)."""
    fh = io.BytesIO(blob)
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        old_shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        old_shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    header = {
        "descr": descr if descr is not None else np.lib.format.dtype_to_descr(dtype),
        "fortran_order": fortran,
        "shape": old_shape if shape is None else shape,
    }
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, header)
    return out.getvalue() + blob[fh.tell() :]


def member_edit(raw: bytes, name: str, edit: Callable[[bytes], bytes]) -> bytes:
    return rezip([(i, edit(b) if i.filename == name else b) for i, b in members(raw)])


HUGE = [(30_000_000,), (2**40,), (2**31, 2**31), (10**18,), (3_000, 10_000)]


@st.composite
def other_size(draw, blob: bytes):
    """A header for the data of ``blob`` that declares another number of bytes (or
    Python objects)."""
    arr = npy_read(blob)
    if draw(st.booleans()):
        return with_header(blob, shape=draw(st.sampled_from(HUGE)))
    if draw(st.integers(0, 4)) == 0:
        return with_header(blob, descr="|O")
    shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
    if int(np.prod(shape)) * arr.itemsize == arr.nbytes:
        shape = shape + (2,) if arr.nbytes else (1,)
    return with_header(blob, shape=shape)


# ====================================================================== cases
@dataclasses.dataclass
class Case:
    """A valid file of one kind and how to load it.

    ``files`` are the valid files (relative path: bytes) copied into a fresh folder for
    every example; ``target`` is the one damaged; ``load(folder)`` reads it the way the
    package does; ``same(result)`` asserts that the result is what was saved;
    ``shape_only(result)`` that it keeps the saved structure (formats whose data carry
    no checksum); ``json_get``/``json_put`` read and write its JSON metadata.
    """

    files: dict[str, bytes]
    target: str
    load: Callable[[Path], Any]
    same: Callable[[Any], None]
    hot: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    errors: tuple[type[BaseException], ...] = (ValueError,)
    json_get: Callable[[bytes], dict] | None = None
    json_put: Callable[[bytes, dict], bytes] | None = None
    json_top: bool = False
    checksum: bool = True  # False: no checksum tells a flipped byte (checked loosely)
    text: bool = False  # a text file: a truncated one can be a smaller valid file
    shape_only: Callable[[Any], None] | None = None

    def folder(self, tmp_path: Path, target: bytes | None = None) -> Path:
        work = tmp_path / "w"
        shutil.rmtree(work, ignore_errors=True)
        for rel, raw in self.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(target if rel == self.target and target is not None else raw)
            # written a while ago: a sweep manifest that is empty for under 5 s is one
            # being created, which read_manifest waits for
            os.utime(work / rel, (time.time() - 60, time.time() - 60))
        return work

    def check(
        self, tmp_path: Path, damaged: bytes, *, must_refuse: bool = False, loose: bool = False
    ):
        """Load ``damaged`` in place of the target: refused naming it, or the saved
        content (with ``loose``: the saved structure)."""
        work = self.folder(tmp_path, damaged)
        path = work / self.target
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.load(work)
        except self.errors as exc:
            msg = str(exc)
            assert path.name in msg, f"the error does not name {path.name}: {msg}"
            assert "\n" not in msg.strip(), msg
            return
        assert not must_refuse, f"a damaged {self.target} was loaded"
        if loose and self.shape_only is not None:
            self.shape_only(out)
        else:
            self.same(out)


def _same(a: Any, b: Any) -> None:
    """Bit-for-bit equality of two arrays: dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert a.tobytes() == b.tobytes()


def _same_dicts(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        _same(a[k], b[k])


def _npz_json(member: str, *, raw_bytes: bool = False):
    """JSON metadata stored as the ``.npz`` member ``member`` (a 0-d string, or UTF-8
    bytes)."""

    def get(raw: bytes) -> dict:
        blob = dict((i.filename, b) for i, b in members(raw))[member + ".npy"]
        arr = npy_read(blob)
        return json.loads(arr.tobytes() if raw_bytes else str(arr))

    def put(raw: bytes, meta: dict) -> bytes:
        text = json.dumps(meta)
        arr = np.frombuffer(text.encode(), np.uint8) if raw_bytes else np.asarray(text)
        return member_edit(raw, member + ".npy", lambda _: npy_bytes(arr))

    return get, put


def _file_json():
    return (lambda raw: json.loads(raw)), (lambda raw, meta: json.dumps(meta).encode())


# ------------------------------------------------------------------ trajectory
def _same_traj(ref):
    def same(out):
        for name in ("ts", "x", "reached", "t_stop", "_y", "x0", "_to_x"):
            a, b = getattr(ref, name), getattr(out, name)
            assert (a is None) == (b is None), name
            if a is not None:
                _same(a, b)
        if ref.has_z:
            _same(ref.z, out.z)
        assert out.statuses == ref.statuses and out.solver == ref.solver
        assert (out.frame, out.coords, out.t1, out.batched) == (
            ref.frame,
            ref.coords,
            ref.t1,
            ref.batched,
        )
        assert out.saved_metadata == ref.saved_metadata
        assert out.model.describe() == ref.model.describe()
        _same_dicts(
            {k: np.asarray(v) for k, v in ref.model.arrays().items()},
            {k: np.asarray(v) for k, v in out.model.arrays().items()},
        )
        assert set(out.stats) == set(ref.stats)
        for k in ref.stats:
            _same(ref.stats[k], out.stats[k])

    return same


@pytest.fixture(scope="module")
def trajectory(tmp_path_factory) -> Case:
    d = tmp_path_factory.mktemp("traj")
    model = af.Attention(np.eye(2), np.eye(2), np.array([[1.0, 0.3], [-0.2, 0.5]]))
    x0 = np.random.default_rng(0).uniform(-1, 1, (4, 2))
    run = af.simulate(model, x0, 0.5, ts=np.linspace(0.0, 0.5, 3))
    path = run.save(d / "run.npz", seed=3)
    raw = path.read_bytes()
    get, put = _npz_json("metadata")
    return Case(
        files={"run.npz": raw},
        target="run.npz",
        load=lambda w: af.Trajectory.load(w / "run.npz"),
        same=_same_traj(af.Trajectory.load(path)),
        hot=zip_hot(raw),
        json_get=get,
        json_put=put,
    )


# --------------------------------------------------------------------- density
@pytest.fixture(scope="module")
def density(tmp_path_factory) -> Case:
    d = tmp_path_factory.mktemp("density")
    model = af.CircleMeanField(5.0, modes=8)
    sol = af.solve_density(model, lambda th: 1 + 0.1 * np.cos(th), 0.1)
    path = sol.save(d / "rho.npz")
    ref = af.DensityTrajectory.load(path)
    raw = path.read_bytes()

    def same(out):
        _same(ref.ts, out.ts)
        _same(ref.q, out.q)
        assert out.model.describe() == ref.model.describe()
        assert (out.status, out.t_stop, out.num_steps, out.tail_tol) == (
            ref.status,
            ref.t_stop,
            ref.num_steps,
            ref.tail_tol,
        )
        for k in ("status", "t_stop", "num_steps", "tail_tol"):
            assert type(getattr(out, k)) is type(getattr(ref, k)), k

    get, put = _npz_json("meta")
    return Case(
        files={"rho.npz": raw},
        target="rho.npz",
        load=lambda w: af.DensityTrajectory.load(w / "rho.npz"),
        same=same,
        hot=zip_hot(raw),
        json_get=get,
        json_put=put,
    )


# ----------------------------------------------------------------------- sweeps
def kernel(config, start, stop, seed):
    """A tiny sweep kernel: rows that depend on (seed, index) only."""
    x = np.stack([S.rng(seed, 5, i).standard_normal(3) for i in range(start, stop)])
    return {"x": x, "index": np.arange(start, stop), "flag": x[:, 0] > 0}


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory) -> tuple[dict[str, bytes], Any]:
    d = tmp_path_factory.mktemp("sweep")
    sw = S.Sweep("files", kernel, {"a": 1}, size=4, seed=0, shard_size=2)
    S.run(sw, d)
    files = {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}
    return files, S.merge(d)


def _same_sweep(ref):
    def same(out):
        _same_dicts(ref.arrays, out.arrays)
        for k in ("name", "config", "size", "seed", "shard_size", "digest"):
            assert out.manifest[k] == ref.manifest[k], k

    return same


SHARD = "shard-0000000000-0000000002.npz"


@pytest.fixture(scope="module")
def shard(sweep_files) -> Case:
    files, ref = sweep_files
    get, put = _npz_json("__meta__")
    return Case(
        files=files,
        target=SHARD,
        load=S.merge,
        same=_same_sweep(ref),
        hot=zip_hot(files[SHARD]),
        json_get=get,
        json_put=put,
    )


@pytest.fixture(scope="module")
def manifest(sweep_files) -> Case:
    files, ref = sweep_files
    get, put = _file_json()
    return Case(
        files=files,
        target=S.MANIFEST,
        load=S.merge,
        same=_same_sweep(ref),
        json_get=get,
        json_put=put,
    )


# -------------------------------------------------------------------- retrieval
RETRIEVAL = dict(width=8, depth=1, max_steps=2, eval_every=1, val_sets=8, batch=4, patience=1)


@pytest.fixture(scope="module")
def retrieval_files(tmp_path_factory):
    """A finished model's cache folder and a training checkpoint, written by the
    functions training writes them with (no training: it would take seconds)."""
    import equinox as eqx

    from attnflow.networks import _checkpoint
    from attnflow.networks._training import finish
    from attnflow.studies import retrieval as R

    cfg = R.RetrievalConfig(**RETRIEVAL)
    d = tmp_path_factory.mktemp("retrieval")
    model, opt_state = R._template(cfg)
    state = {"step": 1, "best": 0.25, "bad": 0, "history": [[1, 2.3, 0.25]], "seconds": 0.5}
    folder = d / cfg.key()
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))  # as train does
    record = dict(state, finished=True, resumed=False, config=cfg.to_dict())
    finish(folder, model, record)
    _checkpoint.save(d / "checkpoint.bin", (model, opt_state, model), state)
    like = (model, opt_state, model)
    ref_model, ref_record, reused = R.load_or_train(cfg, d, progress=False)
    assert reused
    files = {f"{cfg.key()}/{p.name}": p.read_bytes() for p in folder.iterdir()}
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(ref_model, eqx.is_array))]
    return {
        "cfg": cfg,
        "files": files,
        "leaves": leaves,
        "record": ref_record,
        "checkpoint": (d / "checkpoint.bin").read_bytes(),
        "like": like,
        "state": state,
    }


def _retrieval_case(files_: dict, target: str) -> Case:
    import equinox as eqx

    from attnflow.studies import retrieval as R

    cfg = files_["cfg"]

    def load(w: Path):
        model, record, reused = R.load_or_train(cfg, w, progress=False)
        assert reused, "a damaged cache was trained again"
        return model, record

    def same_model(model):
        got = [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))]
        assert len(got) == len(files_["leaves"])
        for a, b in zip(files_["leaves"], got):
            _same(a, b)

    def same(out):
        model, record = out
        same_model(model)
        ref = files_["record"]
        if "model_sha256" not in record:  # as a cache written before the hash was recorded
            ref = {k: v for k, v in ref.items() if k != "model_sha256"}
        assert record == ref

    def well_formed(out):  # train.json has no checksum: the record it holds, checked
        model, record = out
        same_model(model)
        assert record["config"] == cfg.to_dict() and record["finished"] is True
        for key, kind in (("step", int), ("bad", int), ("best", float), ("seconds", float)):
            assert isinstance(record[key], (kind, int)) and not isinstance(record[key], bool)
        assert all(len(row) == 3 for row in record["history"])

    get, put = _file_json()
    name = f"{cfg.key()}/{target}"
    is_json = target.endswith(".json")
    record = target == "train.json"
    return Case(
        files=files_["files"],
        target=name,
        load=load,
        same=same,
        json_get=get if is_json else None,
        json_put=put if is_json else None,
        checksum=not record,
        text=record,
        shape_only=well_formed if record else None,
    )


@pytest.fixture(scope="module")
def retrieval_model(retrieval_files) -> Case:
    return _retrieval_case(retrieval_files, "model.eqx")


@pytest.fixture(scope="module")
def retrieval_record(retrieval_files) -> Case:
    return _retrieval_case(retrieval_files, "train.json")


@pytest.fixture(scope="module")
def retrieval_config(retrieval_files) -> Case:
    return _retrieval_case(retrieval_files, "config.json")


@pytest.fixture(scope="module")
def retrieval_checkpoint(retrieval_files) -> Case:
    """``checkpoint.bin``: its documented contract is to warn, naming the file, and
    return None (training starts over) rather than raise."""
    import equinox as eqx

    from attnflow.networks import _checkpoint

    like = retrieval_files["like"]
    ref_leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(like, eqx.is_array))]

    class Refused(ValueError):
        pass

    def load(w: Path):
        path = w / "checkpoint.bin"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = _checkpoint.load(path, like)
        if got is None:
            said = [str(x.message) for x in seen if issubclass(x.category, RuntimeWarning)]
            assert said, "a damaged checkpoint was dropped without a warning"
            raise Refused(" ".join(said))
        return got

    def same(out):
        tree, state = out
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))]
        assert len(leaves) == len(ref_leaves)
        for a, b in zip(ref_leaves, leaves):
            _same(a, b)
        assert state == retrieval_files["state"]

    return Case(
        files={"checkpoint.bin": retrieval_files["checkpoint"]},
        target="checkpoint.bin",
        load=load,
        same=same,
        hot=[(0, 120)],
    )


# ------------------------------------------------------------------- safetensors
@pytest.fixture(scope="module")
def safetensors(tmp_path_factory) -> Case:
    d = tmp_path_factory.mktemp("st")
    rng = np.random.default_rng(1)
    tensors = {
        "encoder.layer.0.attention.self.query.weight": rng.normal(size=(4, 4)).astype(np.float32),
        "b": np.arange(5, dtype=np.int64),
        "c": rng.normal(size=(2, 3)),
        "d": np.array([True, False, True]),
        "e": np.zeros(2, np.float16),
    }
    path = checkpoints.write_safetensors(d / "m.safetensors", tensors, {"kind": "test"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    ref = {k: tensors[k] for k in sorted(tensors)}

    def load(w: Path):
        return checkpoints.read_safetensors(w / "m.safetensors", reader="numpy")

    def same(out):
        _same_dicts(ref, dict(sorted(out.items())))

    def shape_only(out):
        # no checksum: a flipped byte of a name, a dtype or the data that leaves the
        # header consistent makes another valid file, covering the same bytes
        assert len(out) == len(ref)
        assert sum(a.nbytes for a in out.values()) == sum(a.nbytes for a in ref.values())

    def get(raw: bytes) -> dict:
        m = int.from_bytes(raw[:8], "little")
        return json.loads(raw[8 : 8 + m])

    def put(raw: bytes, header: dict) -> bytes:
        m = int.from_bytes(raw[:8], "little")
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return len(text).to_bytes(8, "little") + text + raw[8 + m :]

    return Case(
        files={"m.safetensors": raw},
        target="m.safetensors",
        load=load,
        same=same,
        hot=[(0, 8 + n)],
        json_get=get,
        json_put=put,
        checksum=False,
        shape_only=shape_only,
    )


# ---------------------------------------------------------------------- matrices
MATRIX = np.array([[0.5, 1.0, -2.0], [3.0, 0.25, 1e-3], [-7.0, 2.0, 1.5]])


@pytest.fixture(scope="module")
def matrix_npy(tmp_path_factory) -> Case:
    raw = npy_bytes(MATRIX)
    return Case(
        files={"V.npy": raw},
        target="V.npy",
        load=lambda w: matrices.load(str(w / "V.npy")),
        same=lambda out: _same(out, MATRIX),
        hot=[(0, 128)],
        checksum=False,
        shape_only=lambda out: (out.shape == MATRIX.shape) or pytest.fail(str(out.shape)),
    )


@pytest.fixture(scope="module")
def matrix_npz(tmp_path_factory) -> Case:
    d = tmp_path_factory.mktemp("npz")
    np.savez(d / "w.npz", Q=np.eye(3), V=MATRIX)
    raw = (d / "w.npz").read_bytes()
    return Case(
        files={"w.npz": raw},
        target="w.npz",
        load=lambda w: matrices.load(f"{w / 'w.npz'}:V"),
        same=lambda out: _same(out, MATRIX),
        hot=zip_hot(raw),
    )


def _table(suffix: str) -> Case:
    buf = io.StringIO()
    np.savetxt(buf, MATRIX, delimiter="," if suffix == ".csv" else " ")
    raw = buf.getvalue().encode()
    name = "V" + suffix

    def shape_only(out):  # text carries no checksum: any finite matrix it holds
        assert out.dtype == np.float64 and out.ndim == 2

    return Case(
        files={name: raw},
        target=name,
        load=lambda w: matrices.load(str(w / name)),
        same=lambda out: _same(out, MATRIX),
        checksum=False,
        text=True,
        shape_only=shape_only,
    )


@pytest.fixture(scope="module")
def matrix_txt() -> Case:
    return _table(".txt")


@pytest.fixture(scope="module")
def matrix_csv() -> Case:
    return _table(".csv")


# ----------------------------------------------------------------------- figures
FIG = "fig_files"


def _figure_draw(data):
    return {f"{FIG}.md": json.dumps(sorted(data.arrays))}


def _figure_compute(quick):
    raise AssertionError("a redraw computes nothing")


@pytest.fixture(scope="module")
def figure_files(tmp_path_factory):
    from attnflow._meta import attnflow_version
    from attnflow.experiments import _figure as F

    d = tmp_path_factory.mktemp("fig")
    arrays = {
        "x": np.linspace(0.0, 1.0, 12).reshape(4, 3),
        "label": np.array(["one", "two"]),
        "flag": np.array([True, False]),
        "n": np.int64(7),
    }
    meta = {
        "name": FIG,
        "attnflow": attnflow_version(),
        "quick": True,
        "compute_seconds": 0.5,
        "movies": [],
        "sidecar": {"script": "files", "runs": [{"seed": 3, "top": 1.0}]},
        "result": {"n": 7},
    }
    path = F.data_path(d, FIG, True)
    F.write_data(path, {k: np.asarray(v) for k, v in arrays.items()}, meta)
    return path.name, path.read_bytes(), meta, {k: np.asarray(v) for k, v in arrays.items()}


@pytest.fixture(scope="module")
def figure_data(figure_files) -> Case:
    from attnflow.experiments import _figure as F

    name, raw, meta, arrays = figure_files
    get, put = _npz_json("__meta__", raw_bytes=True)

    def same(out):
        got_meta, got = out
        assert got_meta == meta
        _same_dicts(arrays, got)

    return Case(
        files={name: raw},
        target=name,
        load=lambda w: F.read_data(w / name),
        same=same,
        hot=zip_hot(raw),
        json_get=get,
        json_put=put,
        json_top=True,
    )


@pytest.fixture(scope="module")
def figure_redraw(figure_files) -> Case:
    """``make.redraw``: its documented refusal is ``MissingData``, naming the file."""
    from attnflow.experiments import _figure as F

    name, raw, meta, arrays = figure_files
    make = F.figure(FIG, _figure_compute, _figure_draw)
    get, put = _npz_json("__meta__", raw_bytes=True)

    def same(out):
        assert out["figures"] and Path(out["figures"][0]).read_text() == json.dumps(sorted(arrays))

    return Case(
        files={name: raw},
        target=name,
        load=lambda w: make.redraw(w, quick=True),
        same=same,
        errors=(ValueError, F.MissingData),
        json_get=get,
        json_put=put,
        json_top=True,
    )


ALL = [
    "trajectory",
    "density",
    "shard",
    "manifest",
    "retrieval_model",
    "retrieval_record",
    "retrieval_config",
    "retrieval_checkpoint",
    "safetensors",
    "matrix_npy",
    "matrix_npz",
    "matrix_txt",
    "matrix_csv",
    "figure_data",
    "figure_redraw",
]


def _case(request, name: str) -> Case:
    return request.getfixturevalue(name)


# ======================================================================= tests
@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(data=st.data())
def test_damaged_bytes_are_refused_naming_the_file_or_read_exactly(request, tmp_path, name, data):
    case = _case(request, name)
    raw = case.files[case.target]
    damaged = byte_damage(data, raw, case.hot)
    flipped = len(damaged) == len(raw)
    loose = (flipped and not case.checksum) or (case.text and not damaged.startswith(raw))
    case.check(tmp_path, damaged, loose=loose)


JSON_CASES = [
    "trajectory",
    "density",
    "shard",
    "manifest",
    "retrieval_record",
    "retrieval_config",
    "safetensors",
    "figure_data",
    "figure_redraw",
]


@pytest.mark.parametrize("name", JSON_CASES)
@SETTINGS
@given(data=st.data())
def test_edited_metadata_is_refused_naming_the_file_or_read_exactly(request, tmp_path, name, data):
    case = _case(request, name)
    assert case.json_get is not None and case.json_put is not None
    raw = case.files[case.target]
    meta = json_edit(data, case.json_get(raw), top=case.json_top)
    loose = case.text and not case.checksum  # a JSON file no checksum covers
    case.check(tmp_path, case.json_put(raw, meta), loose=loose)


def _rehash(raw: bytes, meta: dict) -> bytes:
    """A trajectory file with edited metadata and a recomputed SHA-256 (crafted)."""
    from attnflow.io.files import arrays_sha256

    parts = members(raw)
    arrays = {i.filename[:-4]: npy_read(b) for i, b in parts}
    arrays["metadata"] = np.asarray(json.dumps(meta))
    arrays.pop("sha256")
    arrays["sha256"] = np.asarray(arrays_sha256(arrays))
    return rezip([(i, npy_bytes(arrays[i.filename[:-4]])) for i, _ in parts])


@SETTINGS
@given(data=st.data())
def test_trajectory_metadata_of_the_wrong_kind_is_one_error_even_with_a_good_hash(
    trajectory, tmp_path, data
):
    raw = trajectory.files["run.npz"]
    assert trajectory.json_get is not None
    meta = json_edit(data, trajectory.json_get(raw))
    work = trajectory.folder(tmp_path, _rehash(raw, meta))
    try:
        af.Trajectory.load(work / "run.npz")
    except ValueError as exc:
        assert "run.npz" in str(exc), str(exc)


NPZ_CASES = ["trajectory", "density", "shard", "matrix_npz", "figure_data"]


@pytest.mark.parametrize("name", NPZ_CASES)
@FEW
@given(data=st.data())
def test_an_npy_header_declaring_another_size_is_refused(request, tmp_path, name, data):
    case = _case(request, name)
    raw = case.files[case.target]
    parts = members(raw)
    info, blob = data.draw(st.sampled_from(parts), label="member")
    crafted = member_edit(raw, info.filename, lambda b: data.draw(other_size(b), label="header"))
    tracemalloc.start()
    try:
        case.check(tmp_path, crafted, must_refuse=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MB allocated reading a crafted file"


@pytest.mark.parametrize("name", NPZ_CASES)
def test_a_directory_read_as_a_shorter_one_is_refused(request, tmp_path, name):
    """A central directory that zipfile reads, without an error, as a shorter one (one
    flipped bit in an entry's extra-field length did it: hypothesis found a trajectory
    that loaded without its x0, its statistics and its hash). Crafted here by cutting the
    last entry out of the directory and its size: the end record still counts it, and
    the file is refused."""
    case = _case(request, name)
    raw = case.files[case.target]
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        entries, cd = len(zf.infolist()), zf.start_dir
    if entries < 2:
        pytest.skip("one array: no entry can vanish")
    at = cd
    for _ in range(entries - 1):  # to the last entry
        n, m, k = struct.unpack_from("<HHH", raw, at + 28)
        at += 46 + n + m + k
    n, m, k = struct.unpack_from("<HHH", raw, at + 28)
    cut = 46 + n + m + k
    out = bytearray(raw[:at] + raw[at + cut :])
    eocd = out.rfind(b"PK\x05\x06")
    (size_cd,) = struct.unpack_from("<I", out, eocd + 12)
    struct.pack_into("<I", out, eocd + 12, size_cd - cut)
    with zipfile.ZipFile(io.BytesIO(bytes(out))) as zf:  # zipfile reads one entry less
        assert len(zf.infolist()) == entries - 1
    case.check(tmp_path, bytes(out), must_refuse=True)


def test_a_saved_trajectory_without_its_hash_is_refused(trajectory, tmp_path):
    """A file written with its ``saved`` record always has its hash: one without it (a
    crafted archive, valid in every other way) is refused, naming the file."""
    raw = trajectory.files["run.npz"]
    parts = [(i, b) for i, b in members(raw) if i.filename != "sha256.npy"]
    assert len(parts) == len(members(raw)) - 1
    trajectory.check(tmp_path, rezip(parts), must_refuse=True)


def _forge_sizes(raw: bytes, name: str, size: int) -> bytes:
    """A stored (uncompressed) archive whose member ``name`` claims ``size`` bytes in
    both its local and its central directory header."""
    out = bytearray(raw)
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        info = zf.getinfo(name)
        assert info.compress_type == zipfile.ZIP_STORED
        struct.pack_into("<II", out, info.header_offset + 18, size, size)
        cd = zf.start_dir
        while True:
            assert out[cd : cd + 4] == b"PK\x01\x02"
            n, m, k = struct.unpack_from("<HHH", out, cd + 28)
            if out[cd + 46 : cd + 46 + n].decode() == name:
                struct.pack_into("<II", out, cd + 20, size, size)
                break
            cd += 46 + n + m + k
    return bytes(out)


def _plain_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """An archive as ``np.savez`` lays it out, without zip64 extras (so its sizes can be
    forged in place)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for k, v in arrays.items():
            zf.writestr(k + ".npy", npy_bytes(v))
    return buf.getvalue()


def test_a_huge_declared_shape_is_refused_before_allocating(tmp_path):
    """An ``.npz`` member whose ``.npy`` header declares 30 million float64 (240 MB) in a
    file of a few kB is refused naming the file, without allocating: whether the zip
    headers tell the true member size or also claim 240 MB."""
    from attnflow.experiments import _figure as F
    from attnflow.io.files import read_npz

    arrays = {"x": np.arange(500.0), "y": np.eye(3)}
    declared = 30_000_000
    honest = member_edit(_plain_npz(arrays), "x.npy", lambda b: with_header(b, shape=(declared,)))
    member = dict((i.filename, b) for i, b in members(honest))["x.npy"]
    forged = _forge_sizes(
        honest, "x.npy", len(member) - 4000 + declared * 8
    )  # header + the declared data
    for label, raw in (("honest", honest), ("forged", forged)):
        assert len(raw) < 10_000
        path = tmp_path / f"{label}.npz"
        path.write_bytes(raw)
        for loader in (
            read_npz,
            lambda p: matrices.read_array(p, key="x"),
            F.read_data,
            af.Trajectory.load,
            af.DensityTrajectory.load,
        ):
            tracemalloc.start()
            try:
                with pytest.raises(ValueError) as err:
                    loader(path)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert path.name in str(err.value), str(err.value)
            assert peak < 20 * 2**20, f"{label}: {peak / 2**20:.0f} MB allocated"
    # a plain .npy file declaring as much
    npy = tmp_path / "huge.npy"
    npy.write_bytes(with_header(npy_bytes(np.arange(500.0)), shape=(declared,)))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"huge\.npy") as err:
            matrices.read_array(npy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "240000000 bytes" in str(err.value) and peak < 20 * 2**20


def test_a_model_file_declaring_a_huge_array_is_refused_before_allocating(
    retrieval_files, tmp_path
):
    """A finished model's ``model.eqx`` (a cache written before its hash was recorded)
    whose first ``.npy`` header declares 30 million float32: refused naming the file,
    without allocating."""
    from attnflow.studies import retrieval as R

    cfg = retrieval_files["cfg"]
    files = dict(retrieval_files["files"])
    model = f"{cfg.key()}/model.eqx"
    raw = files[model]
    first = io.BytesIO(raw)
    np.lib.format.read_magic(first)
    np.lib.format.read_array_header_1_0(first)
    files[model] = with_header(raw[: first.tell()], shape=(30_000_000,)) + raw[first.tell() :]
    record = json.loads(files[f"{cfg.key()}/train.json"])
    del record["model_sha256"]
    files[f"{cfg.key()}/train.json"] = json.dumps(record).encode()
    for rel, blob in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(blob)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"model\.eqx.*120000000 bytes"):
            R.load_or_train(cfg, tmp_path, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MB allocated"
