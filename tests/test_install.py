"""The installed JAX computes correctly, and the package is installed as declared.

jax/jaxlib 0.10.2 miscompile on CPU: a vmapped matrix-vector product followed by a
reduction returns wrong numbers past ~16k rows (jax-ml/jax#39103). pyproject.toml
excludes that release; these tests make a bad JAX fail the suite loudly wherever it came
from (a pinned environment, a conda install, a future release with the same bug).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnflow as af

ROOT = Path(__file__).resolve().parents[1]


_REPRODUCER = """
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
i = jnp.arange(16385, dtype=jnp.float64)
x = jnp.stack((i, 0 * i, 0 * i), axis=1)
M = jnp.eye(3)
f = lambda x: jax.vmap(lambda r: jnp.sum((M @ r) ** 2))(x)
print(float(f(x)[-1]), float(jax.jit(f)(x)[-1]))
"""


def test_vmapped_matvec_reduction_past_16k_rows_with_xla_defaults():
    """The upstream reproducer in a child process that compiles as users do (the suite
    compiles with its own XLA:CPU options, see conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run(
        [sys.executable, "-c", _REPRODUCER], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    eager, jitted = map(float, p.stdout.split())
    assert eager == jitted == 16384.0**2, (
        f"jax {jax.__version__} with XLA's default options miscompiles a vmapped matvec + "
        f"reduction ({eager}, {jitted} != {16384.0**2}); install another release "
        f"(0.10.2 is known bad)."
    )


def test_vmapped_matvec_reduction_past_16k_rows():
    """The upstream reproducer: both numbers must be 16384**2 exactly."""
    i = jnp.arange(16385, dtype=jnp.float64)
    x = jnp.stack((i, 0 * i, 0 * i), axis=1)
    M = jnp.eye(3)

    def f(x):
        return jax.vmap(lambda r: jnp.sum((M @ r) ** 2))(x)

    eager, jitted = float(f(x)[-1]), float(jax.jit(f)(x)[-1])
    assert eager == 16384.0**2, f"jax {jax.__version__}: eager {eager}"
    assert jitted == 16384.0**2, (
        f"jax {jax.__version__} miscompiles a vmapped matvec + reduction "
        f"({jitted} != {16384.0**2}); install another release (0.10.2 is known bad)."
    )


def _numpy_field(x, Q, K, V, beta, rows):
    """``sum_j P_ij V x_j`` for the given query rows, softmax in float64, plain numpy."""
    q, k = x[rows] @ Q.T, x @ K.T
    L = beta * q @ k.T
    L -= L.max(axis=1, keepdims=True)
    P = np.exp(L)
    P /= P.sum(axis=1, keepdims=True)
    return P @ x @ V.T


def test_attention_field_past_16k_tokens_matches_numpy():
    """attnflow's vector field and overflow bound at n = 16,400 tokens (tiled path)
    against numpy, on tokens whose norms grow with the index like the reproducer's, so
    the last rows carry the largest numbers."""
    n, d = 16_400, 3
    rng = np.random.default_rng(0)
    idx = np.arange(n, dtype=np.float64)
    x = np.stack((idx / n, rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)), axis=1)
    Q = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    K = np.eye(d) + 0.1 * rng.standard_normal((d, d))
    V = rng.standard_normal((d, d))
    model = af.Attention(Q, K, V, beta=2.0)
    field = np.asarray(jax.jit(lambda x: model.vector_field(x))(jnp.asarray(x)))
    rows = np.r_[0:64, n - 512 : n]
    ref = _numpy_field(x, Q, K, V, 2.0, rows)
    np.testing.assert_allclose(field[rows], ref, rtol=1e-10, atol=1e-12)
    # The overflow guard's bound reads row norms through a vmapped reduction.
    bound = float(jax.jit(lambda x: model.log_logit_bound(x))(jnp.asarray(x)))
    qn = np.linalg.norm(x @ Q.T, axis=1).max()
    kn = np.linalg.norm(x @ K.T, axis=1).max()
    assert bound == pytest.approx(np.log(2.0 * qn * kn), rel=1e-12)


def test_version_and_typed_marker():
    assert af.__version__ == importlib.metadata.version("attnflow")
    assert (Path(af.__file__).parent / "py.typed").is_file()


def _declared():
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    names = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, flags=re.M)
    return {n.lower().replace("_", "-") for n in names}


def test_every_third_party_import_is_declared():
    """Every top-level import of the core package (outside optional, lazily imported
    extras) is a declared dependency."""
    import ast
    import sys

    optional = {"safetensors", "tokenizers", "xarray", "mpl_toolkits", "PIL", "threadpoolctl"}
    declared = _declared() | {"mpl-toolkits"}
    dist_of = {
        "jax": "jax",
        "jaxlib": "jaxlib",
        "numpy": "numpy",
        "scipy": "scipy",
        "diffrax": "diffrax",
        "equinox": "equinox",
        "jaxtyping": "jaxtyping",
        "typer": "typer",
        "tqdm": "tqdm",
        "matplotlib": "matplotlib",
    }
    missing = set()
    for path in (Path(af.__file__).parent).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module.split(".")[0]]
            else:
                continue
            for mod in mods:
                if mod in sys.stdlib_module_names or mod == "attnflow" or mod in optional:
                    continue
                if dist_of.get(mod, mod).lower() not in declared:
                    missing.add(f"{mod} ({path.name})")
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def _requirements():
    """The core dependencies declared in pyproject.toml, by normalised name."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = (Requirement(r) for r in project["dependencies"])
    return {canonicalize_name(r.name): r for r in reqs}


# Releases known bad with what attnflow does, and where it is said:
# 0.7.0 segfaults and 0.7.1 runs very slowly with diffrax (diffrax#680, equinox#1104);
# 0.10.2 miscompiles on CPU (jax-ml/jax#39103, the reproducers above).
KNOWN_BAD_JAX = ("0.7.0", "0.7.1", "0.10.2")


@pytest.mark.parametrize("dist", ["jax", "jaxlib"])
def test_known_bad_jax_is_excluded(dist):
    """The declared pins refuse every known-bad release (a pin dropped from pyproject.toml
    fails here), admit the installed one, and the installed one is not known bad."""
    from packaging.version import Version

    spec = _requirements()[dist].specifier
    for bad in KNOWN_BAD_JAX:
        assert not spec.contains(bad, prereleases=True), f"{dist} {spec} admits {bad}"
    # the neighbours stay allowed: the exclusions are exact, not ranges
    assert spec.contains("0.7.2") and spec.contains("0.10.1")
    installed = importlib.metadata.version(dist)
    assert spec.contains(Version(installed).base_version, prereleases=True), (
        f"installed {dist} {installed} is outside the declared {spec}"
    )
    assert Version(installed).base_version not in KNOWN_BAD_JAX


def test_floors_match_what_the_code_calls():
    """The floors are no older than the first releases with what the code uses: jax 0.6.1
    (jax.shard_map with check_vma), diffrax 0.7.0 (0.6.1 is the first that works with jax
    0.4.36 and later, diffrax#532; 0.7.0 the first that keeps float32 runs float32 with
    x64 enabled), equinox 0.12.2 (the first that imports with jax 0.6.1), numpy 2."""
    from packaging.version import Version

    reqs = _requirements()
    for dist, first in [
        ("jax", "0.6.1"),
        ("jaxlib", "0.6.1"),
        ("diffrax", "0.7.0"),
        ("equinox", "0.12.2"),
        ("numpy", "2.0"),
    ]:
        spec = reqs[dist].specifier
        floors = [s.version for s in spec if s.operator == ">="]
        assert floors, f"{dist} has no floor in pyproject.toml"
        assert Version(floors[0]) >= Version(first), f"{dist} {spec} admits below {first}"
        assert spec.contains(first), f"{dist} {spec} refuses {first}"
    assert hasattr(jax, "shard_map")


def test_installed_versions_satisfy_the_declared_requirements():
    """Every core dependency as installed lies within its declared range: the pins hold
    for the environment the suite runs in (a floors install, a conda environment)."""
    from packaging.version import Version

    bad = []
    for name, req in _requirements().items():
        installed = importlib.metadata.version(name)
        if not req.specifier.contains(Version(installed).base_version, prereleases=True):
            bad.append(f"{name} {installed} (declared {req.specifier})")
    assert not bad, f"installed outside the declared ranges: {bad}"


def test_docs_pin_mkdocs_below_2():
    """MkDocs 2 drops the plugin model the site relies on (markdown-exec, mkdocstrings,
    the hooks in docs/_hooks/)."""
    import tomllib

    from packaging.requirements import Requirement

    with open(ROOT / "pyproject.toml", "rb") as f:
        docs = tomllib.load(f)["project"]["optional-dependencies"]["docs"]
    (mkdocs,) = [Requirement(r) for r in docs if Requirement(r).name == "mkdocs"]
    assert mkdocs.specifier.contains("1.6.1") and not mkdocs.specifier.contains("2.0.0")
