"""The compilation cache's directory: ``clear`` deletes only what attnflow can prove is
its own (the marker, JAX's cache files), equinox's error mode stays the user's, and a
read-only, full or damaged cache, or JAX imported first, prints nothing.

Siblings of the reproducers of the fourth reliability pass: ``ATTNFLOW_CACHE_DIR=~/mywork
attnflow cache clear`` removed ``~/mywork``; ``enable_compilation_cache`` turned the
user's ``eqx.error_if`` into NaN; a damaged cache printed a warning per program and a
warm run after ``import jax`` ~100 lines of XLA's loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnflow import _cache

ENV_DROP = ("EQX_ON_ERROR", "TF_CPP_MIN_LOG_LEVEL", "ATTNFLOW_CACHE_DIR")


def child(code: str, cache: Path, *, preexec=None, env: dict | None = None):
    """``code`` in a fresh interpreter as a user runs it: the cache at ``cache``, neither
    equinox's mode nor XLA's log level set (the suite sets both)."""
    full = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    full.update(ATTNFLOW_CACHE_DIR=str(cache), ATTNFLOW_COMPILATION_CACHE="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        preexec_fn=preexec,
    )


def cli(*args: str, cache: Path):
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env.update(ATTNFLOW_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "attnflow", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


# ------------------------------------------------------------------ clear: ownership
def test_cli_clear_refuses_a_folder_it_did_not_create(tmp_path):
    """The reproducer's sibling: a user's folder with a file of theirs and a subfolder,
    named as the cache; ``clear`` exits 2 naming it, and everything is still there."""
    mine = tmp_path / "mywork"
    (mine / "src").mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    (mine / "src" / "a.py").write_text("x = 1")
    (mine / "abc-cache").write_bytes(b"looks like a program")
    p = cli("cache", "clear", cache=mine)
    assert p.returncode == 2, p.stderr
    assert str(mine) in p.stderr and "nothing was deleted" in p.stderr
    assert "ATTNFLOW_CACHE_DIR" in p.stderr  # what to do
    assert sorted(str(f.relative_to(mine)) for f in mine.rglob("*")) == [
        "abc-cache",
        "notes.txt",
        "src",
        "src/a.py",
    ]
    with pytest.raises(_cache.NotACache, match="mywork"):
        _cache.clear_cache(mine)
    assert (mine / "notes.txt").read_text() == "precious"


def test_clear_refuses_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(_cache.NotACache, match="not a directory"):
        _cache.clear_cache(f)
    assert f.read_text() == "x"


def test_enable_marks_new_and_empty_folders_only(tmp_path, monkeypatch):
    """A new or empty folder, or one of JAX's files alone (an earlier attnflow's cache),
    is marked; a folder with anything else is used but not marked."""
    import jax

    before = jax.config.values["jax_compilation_cache_dir"]
    monkeypatch.setenv("ATTNFLOW_COMPILATION_CACHE", "1")
    new, empty, legacy, mine = (tmp_path / n for n in ("new", "empty", "legacy", "mine"))
    empty.mkdir()
    legacy.mkdir()
    (legacy / "jit_f-0a-cache").write_bytes(b"p")
    (legacy / "jit_f-0a-atime").write_bytes(b"t")
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    try:
        for d in (new, empty, legacy, mine):
            assert _cache.enable_compilation_cache(d) == d
    finally:
        _cache.enable_compilation_cache(before)
    assert all((d / _cache.MARKER).is_file() for d in (new, empty, legacy))
    assert not (mine / _cache.MARKER).exists()
    assert _cache.cache_info(legacy)["marked"] and not _cache.cache_info(mine)["marked"]


def test_clear_of_an_unmarked_cache_of_programs_alone(tmp_path):
    """A cache of an attnflow that wrote no marker (JAX's files alone) is cleared."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in ("jit_f-0a-cache", "jit_f-0a-atime", "jit_g-1b-cache"):
        (legacy / name).write_bytes(b"p")
    info = _cache.clear_cache(legacy)
    assert info["entries"] == 2 and not info["marked"] and not legacy.exists()


NAMES = st.sampled_from(
    ["notes.txt", "jit_f-cache.bak", "cache", "atime", ".lockfile2", "-cache", "CACHEDIR.TAG"]
) | st.from_regex(r"[a-z_]{1,8}-[0-9a-f]{1,6}-(cache|atime)", fullmatch=True)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(names=st.sets(NAMES, max_size=6), marked=st.booleans(), folder=st.booleans())
def test_clear_deletes_exactly_jax_files_of_a_proven_cache(names, marked, folder):
    """For any folder contents: clear deletes JAX's files and the marker and nothing else;
    without the marker it deletes nothing unless JAX's files are all there is; the
    folder goes only when it is left empty."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "c"
        d.mkdir()
        for n in names:
            (d / n).write_bytes(n.encode())
        if folder:
            (d / "sub").mkdir()
            (d / "sub" / "k-1-cache").write_bytes(b"p")  # not deleted: only the top level
        if marked:  # over another tool's tag, if any
            (d / _cache.MARKER).write_text(_cache._MARKER_TEXT)
            names = names - {_cache.MARKER}
        jax_files = {n for n in names if n.endswith(("-cache", "-atime"))}
        others = (set(names) - jax_files) | ({"sub"} if folder else set())
        before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
        if not marked and others:
            with pytest.raises(_cache.NotACache, match=str(d)):
                _cache.clear_cache(d)
            assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
            return
        res = _cache.clear_cache(d)
        if not others:
            assert not d.exists()
            return
        left = {p.name for p in d.iterdir()}
        assert left == others | ({_cache.MARKER} if marked else set())
        assert sorted(res["kept"]) == sorted(others)
        assert all((d / n).read_bytes() == before[n] for n in others if n in before)
        if folder:
            assert (d / "sub" / "k-1-cache").is_file()


# ------------------------------------------------------------------ equinox's mode
def test_enable_leaves_equinox_error_mode_to_the_user(tmp_path):
    """After enable_compilation_cache, the user's own eqx.error_if still raises, and
    EQX_ON_ERROR is not set by attnflow."""
    p = child(
        """
        import os
        import attnflow as af
        af.enable_compilation_cache()
        import equinox as eqx, jax, jax.numpy as jnp
        print(os.environ.get("EQX_ON_ERROR"))
        f = jax.jit(lambda x: eqx.error_if(x, x < 0, "negative"))
        try:
            out = f(jnp.asarray(-1.0))
            out.block_until_ready()
            print("returned", out)
        except Exception as exc:
            print("raised", "negative" in str(exc))
        """,
        tmp_path / "c",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["None", "raised", "True"], p.stdout


# ------------------------------------------------------------------ no noise
PROGRAMS = """
    import sys
    {first}
    import attnflow as af
    print(af.enable_compilation_cache(), file=sys.stderr)
    import jax, jax.numpy as jnp
    x = jnp.arange(4.0)
    for k in range(6):  # six programs, as a command's small ones
        jax.jit(lambda v, k=k: jnp.sin(v) * k + jnp.cumsum(v) ** (k + 1))(x).block_until_ready()
    print("ok")
"""


def _noise(stderr: str) -> list[str]:
    return [
        ln
        for ln in stderr.splitlines()
        if ln.strip() and not ln.startswith(str(Path(tempfile.gettempdir()))) and "/" not in ln[:1]
    ]


def test_damaged_and_unwritable_caches_print_nothing(tmp_path):
    """A cache whose entries are truncated, and one on a 'full disk' (no file may grow:
    RLIMIT_FSIZE), cost compile time only: no warning per program."""
    import resource

    cache = tmp_path / "c"
    code = PROGRAMS.format(first="")
    first = child(code, cache)
    assert first.returncode == 0 and "ok" in first.stdout, first.stderr
    entries = list(cache.glob("*-cache"))
    assert len(entries) >= 6
    for e in entries:  # damaged: cut short, as a killed write leaves them
        e.write_bytes(e.read_bytes()[:40])
    damaged = child(code, cache)
    assert damaged.returncode == 0 and "ok" in damaged.stdout, damaged.stderr
    assert "persistent compilation cache" not in damaged.stderr, damaged.stderr[:600]

    def full_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    fresh = tmp_path / "full"
    full = child(code, fresh, preexec=full_disk)
    assert full.returncode == 0 and "ok" in full.stdout, full.stderr
    assert "persistent compilation cache" not in full.stderr, full.stderr[:600]
    # JAX created each entry and could write none of it, and nothing was said
    assert all(f.stat().st_size == 0 for f in fresh.glob("*-cache"))
    assert len(full.stderr.strip().splitlines()) == 1  # the directory enable printed


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_cache_prints_nothing(tmp_path):
    cache = tmp_path / "ro"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        p = child(PROGRAMS.format(first=""), cache)
    finally:
        cache.chmod(0o755)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[:600]


def test_jax_imported_first_warm_run_prints_no_loader_lines(tmp_path):
    """The README's order (import jax, then attnflow, then the cache): the second run
    reads every program back and XLA's loader says nothing (on CPUs whose recorded
    features name tuning preferences it wrote two lines per program)."""
    cache = tmp_path / "c"
    code = PROGRAMS.format(first="import jax")
    cold = child(code, cache)
    assert cold.returncode == 0, cold.stderr
    warm = child(code, cache)
    assert warm.returncode == 0 and "ok" in warm.stdout, warm.stderr
    assert "cpu_aot_loader" not in warm.stderr, warm.stderr[:600]
    assert len(warm.stderr.strip().splitlines()) == 1, warm.stderr[:600]
    if sys.platform.startswith("linux"):
        # the threshold is set in the loaded library (an env variable is read too late)
        quiet = child(
            "import jax\nfrom attnflow import _cache\nprint(_cache._quiet_loaded_xla())",
            cache,
        )
        assert quiet.stdout.strip() == "True", quiet.stderr


def test_cache_info_json_reports_the_marker(tmp_path):
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / _cache.MARKER).write_text(_cache._MARKER_TEXT)
    (cache / "jit_f-1-cache").write_bytes(b"pp")
    (cache / "notes.txt").write_text("not counted")
    p = cli("cache", "info", "--json", cache=cache)
    info = json.loads(p.stdout)
    assert info["marked"] and info["entries"] == 1 and info["bytes"] == 2
    p = cli("cache", "clear", cache=cache)
    assert p.returncode == 0 and "kept 1 file" in p.stdout, p.stderr
    assert sorted(f.name for f in cache.iterdir()) == [_cache.MARKER, "notes.txt"]
