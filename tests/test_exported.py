"""Traced programs kept across processes (``attnflow._exported``): a kept program gives
the numbers of the program ``jax.jit`` traces, to the bit; what cannot be named
faithfully is not kept; a damaged file is traced again; the command line keeps its
solve, so its second run imports no diffrax."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from attnflow import _cache, _exported

SUFFIX = _exported.SUFFIX

# In a child process: JAX's cache is switched on for the whole process.
CHILD = r"""
import json, sys
from pathlib import Path
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
import attnflow as af
from attnflow import _exported
from attnflow.dynamics.noise import Noise
where = Path(sys.argv[1])
af.enable_compilation_cache(where)
rng = np.random.default_rng(3)
V = rng.standard_normal((3, 3))
x0 = rng.standard_normal((7, 3))
ts = np.linspace(0.0, 2.0, 5)
def run(model, **kw):
    tr = af.simulate(model, x0, 2.0, ts=ts, **kw)
    return np.asarray(tr.z).tobytes().hex(), np.asarray(tr.stats["num_steps"]).tolist()
def kept():
    return sorted(p.name for p in where.iterdir() if p.name.endswith(_exported.SUFFIX))
model = af.Attention(np.eye(3), np.eye(3), V, beta=1.5)
out = {"plain": run(model)}
with _exported.allowed():
    out["first"] = run(model)         # traced, exported, written
    out["files_first"] = kept()
    out["second"] = run(model)        # read back from the file
    out["files_second"] = kept()
    for f in out["files_second"]:     # a damaged file is traced again, and rewritten
        (where / f).write_bytes(b"not a program")
    out["damaged"] = run(model)
    out["files_damaged"] = kept()
    other = af.Attention(np.eye(3), np.eye(3), V, beta=0.7)
    out["other_beta"] = run(other)             # the same program, other numbers
    out["files_beta"] = kept()
    out["other_frame"] = run(model, frame="original")   # another program
    out["files_other"] = kept()
    out["layers"] = run(model, method="euler", dt=0.25)   # the layer loop: kept too
    out["files_layers"] = kept()
    out["layers_again"] = run(model, method="euler", dt=0.25)   # read back
    # a noisy loop carries its systems' keys: not kept
    out["noisy"] = run(model, frame="sphere", method="euler", dt=0.25, noise=Noise(0.1, 0))
    out["files_noisy"] = kept()
out["layers_plain"] = run(model, method="euler", dt=0.25)
out["other_beta_plain"] = run(other)
out["other_frame_plain"] = run(model, frame="original")
print(json.dumps(out))
"""


def _child(tmp_path: Path) -> dict:
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNFLOW_COMPILATION_CACHE",)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_kept_solve_gives_the_traced_numbers_to_the_bit(tmp_path: Path) -> None:
    out = _child(tmp_path)
    # one file for the model, written by the first call and read by the second
    assert len(out["files_first"]) == 1
    assert out["files_second"] == out["files_first"]
    assert out["plain"] == out["first"] == out["second"] == out["damaged"]
    # a damaged file was replaced by a program under the same key
    assert out["files_damaged"] == out["files_first"]
    # beta is an array: the same program computes the other head's numbers
    assert out["files_beta"] == out["files_first"]
    assert out["other_beta"] == out["other_beta_plain"]
    assert out["other_beta"][0] != out["plain"][0]
    # another frame is another program
    assert len(out["files_other"]) == 2
    assert out["other_frame"] == out["other_frame_plain"]
    # the layer loop is a third program, the same numbers; a noisy loop is not kept
    assert len(out["files_layers"]) == 3 and set(out["files_other"]) < set(out["files_layers"])
    assert out["layers"] == out["layers_again"] == out["layers_plain"]
    assert out["files_noisy"] == out["files_layers"]


def test_keys_refuse_what_they_cannot_name() -> None:
    """A lambda or a function defined in a function has no faithful name: its programs
    are not kept."""
    import jax.numpy as jnp

    def local(x):
        return x

    args = (jnp.ones(3),)
    assert _exported._key("f", args, {"g": local})[0] is None
    assert _exported._key("f", args, {"g": lambda x: x})[0] is None
    k1 = _exported._key("f", args, {"g": jnp.sin})[0]
    k2 = _exported._key("f", args, {"g": jnp.cos})[0]
    k3 = _exported._key("f", (jnp.ones(4),), {"g": jnp.sin})[0]
    assert None not in (k1, k2, k3) and len({k1, k2, k3}) == 3
    # outside ``allowed`` nothing is looked up or kept
    calls = []
    assert _exported.call("f", lambda *a, **k: calls.append(1) or 7, args, {}) == 7
    assert calls == [1]


def test_the_command_line_keeps_its_solve_and_cache_clear_deletes_it(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    env = {**os.environ, "ATTNFLOW_CACHE_DIR": str(cache)}
    env.pop("ATTNFLOW_COMPILATION_CACHE", None)
    probe = textwrap.dedent(
        """
        import sys
        from attnflow.cli import main
        sys.argv = ["attnflow", "simulate", "--n", "6", "--t1", "2", "--json"]
        try:
            main()
        finally:
            sys.stderr.write(f"\\ndiffrax={'diffrax' in sys.modules}\\n")
        """
    )
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600
        )
        assert p.returncode == 0, p.stderr
        runs.append((json.loads(p.stdout), p.stderr.strip().splitlines()[-1]))
    (first, loaded1), (second, loaded2) = runs
    assert loaded1 == "diffrax=True"  # traced the solve
    assert loaded2 == "diffrax=False"  # read it back
    assert first["z_final"] == second["z_final"]
    assert first["stats"] == second["stats"]
    kept = [p for p in cache.iterdir() if p.name.endswith(SUFFIX)]
    assert len(kept) == 1
    assert _cache.cache_info(cache)["entries"] >= 2  # counted with JAX's programs
    _cache.clear_cache(cache)
    assert not cache.exists()
