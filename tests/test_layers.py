"""The package's layers import only downwards.

``dynamics`` (the particle system) < ``analysis`` (functions of trajectories) < ``io``
(files) < ``testing`` < ``networks`` (trained networks) < ``studies`` < ``plotting`` <
``experiments`` (figure scripts) < ``cli``. A module may import its own layer and the
layers below it, never one above; private modules at the top of the package
(``attnflow._*``) sit below every layer, and the
package root (``import attnflow``, the public API) is open to the figure scripts and the
command line only. Lazy imports inside functions count too, with one listed exception
(``FACES``): ``Trajectory``'s file methods (``save``, ``load``, ``metadata``,
``to_xarray``) are the face of ``io.trajectory_file``, the file format, which they import
inside a function, so that loading the dynamics never loads ``io``; ``DensityTrajectory``'s
``save`` and ``load`` are the face of ``io.density_file`` in the same way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attnflow

PKG = Path(attnflow.__file__).resolve().parent
ORDER = [
    "dynamics",
    "analysis",
    "io",
    "testing",
    "networks",
    "studies",
    "plotting",
    "experiments",
    "cli",
]
# (module, the module of a higher layer it may import inside a function): its methods
# are that module's face
FACES = {
    ("attnflow.dynamics.trajectory", "attnflow.io.trajectory_file"),
    ("attnflow.dynamics.meanfield", "attnflow.io.density_file"),
}


def _layer(module: str) -> int | None:
    """Rank of a module ``attnflow.x.y``; -1 for private root modules, None if external."""
    parts = module.split(".")
    if parts[0] != "attnflow":
        return None
    if len(parts) == 1 or parts[1] in ("kernels", "masks", "matrices", "sweep"):  # root, faces
        # the root package re-exports every layer: only the scripts and the command line,
        # consumers of the public API like a user's own script, may import it
        return ORDER.index("experiments")
    if parts[1] in ORDER:
        return ORDER.index(parts[1])
    if parts[1].startswith("_") and parts[1] != "__main__":
        return -1
    raise AssertionError(f"module {module} belongs to no layer; add it to ORDER")


def _module_name(path: Path) -> tuple[str, str]:
    """(dotted module name, its package) of a file of the package."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _imports(path: Path, *, top_level: bool = False):
    """Absolute names of every module imported by a file (top level and lazy; the top
    level only, outside any function, with ``top_level``)."""
    _, package = _module_name(path)
    tree = ast.parse(path.read_text())
    lazy = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if top_level and id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # ``from attnflow.x import y`` imports the submodule x.y when there is one,
            # else the name y of module x
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                yield (full if _resolve(full) == full else mod), node.lineno


def _resolve(name: str) -> str:
    """The longest prefix of ``name`` that is a module or package of attnflow."""
    parts = name.split(".")
    while parts:
        cand = PKG.parent.joinpath(*parts)
        if cand.with_suffix(".py").is_file() or (cand / "__init__.py").is_file():
            return ".".join(parts)
        parts = parts[:-1]
    return name


def test_layers_import_only_downwards():
    violations = []
    for path in sorted(PKG.rglob("*.py")):
        me, _ = _module_name(path)
        if me in ("attnflow", "attnflow.__main__"):
            continue
        mine = _layer(me)
        for name, line in _imports(path):
            target = _resolve(name)
            theirs = _layer(target)
            if theirs is None or theirs <= mine or (me, target) in FACES:
                continue
            violations.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}")
    assert not violations, "imports that go up a layer:\n" + "\n".join(sorted(set(violations)))


def test_faces_import_their_module_lazily_only():
    """A face imports its module of a higher layer inside a function, never at the top
    level, so that importing the lower layer does not load the higher one."""
    for me, target in FACES:
        path = PKG.parent.joinpath(*me.split(".")).with_suffix(".py")
        assert path.is_file(), f"{me} is listed in FACES but does not exist"
        top = {_resolve(n) for n, _ in _imports(path, top_level=True)}
        assert target not in top, f"{me} imports {target} at its top level"
        assert target in {_resolve(n) for n, _ in _imports(path)}, f"{me} no longer uses {target}"


def test_every_module_has_a_layer():
    for path in PKG.rglob("*.py"):
        me, _ = _module_name(path)
        if me not in ("attnflow", "attnflow.__main__"):
            assert _layer(me) is not None


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The checker itself: a dynamics module that imports the analysis layer is caught."""
    fake = tmp_path / "attnflow" / "dynamics"
    fake.mkdir(parents=True)
    (tmp_path / "attnflow" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (tmp_path / "attnflow" / "analysis").mkdir()
    (tmp_path / "attnflow" / "analysis" / "__init__.py").write_text("")
    (tmp_path / "attnflow" / "analysis" / "rank.py").write_text("")
    bad = fake / "model.py"
    bad.write_text("def f():\n    from ..analysis.rank import x\n")
    monkeypatch.setitem(globals(), "PKG", tmp_path / "attnflow")
    found = [(_resolve(n), _layer(_resolve(n))) for n, _ in _imports(bad)]
    assert ("attnflow.analysis.rank", 1) in found


# Modules still over the size limit, each with its size when the limit came in: they
# may shrink, not grow; a module that drops under the limit leaves the list.
MAX_LINES = 600
OVER_LIMIT = {}


def test_no_module_over_the_size_limit():
    over, shrunk = [], []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        n = len(path.read_text().splitlines())
        allowed = OVER_LIMIT.get(rel, MAX_LINES)
        if n > allowed:
            over.append(f"{rel}: {n} lines (limit {allowed})")
        if rel in OVER_LIMIT and n <= MAX_LINES:
            shrunk.append(rel)
    assert not over, "modules over their size limit:\n" + "\n".join(over)
    assert not shrunk, f"under {MAX_LINES} lines now, remove from OVER_LIMIT: {shrunk}"
