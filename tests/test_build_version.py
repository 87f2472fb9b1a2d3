"""A version that tells commits apart: ``_meta.build_version`` (the package version plus
the git commit it runs from, and whether its folder differs from it), in every record of
``run_metadata``, in figure data files and new sidecars, never in the figures' input key,
and an unchanged sidecar left as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnflow import _meta

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _fake_checkout(root: Path, head: str = "ref: refs/heads/main\n") -> Path:
    """A checkout's ``.git`` (HEAD and a branch) and a package folder inside it."""
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head)
    (git / "refs" / "heads" / "main").write_text(SHA + "\n")
    package = root / "src" / "attnflow"
    package.mkdir(parents=True)
    return package


@pytest.fixture
def git_calls(monkeypatch):
    """Every git command ``_meta`` runs, answered as a folder git does not know."""
    calls: list[tuple[str, ...]] = []

    def fake(root, *args):
        calls.append(args)
        return None

    monkeypatch.setattr(_meta, "_git", fake)
    return calls


def test_the_label():
    assert _meta._build_version("0.1.0", None) == "0.1.0"
    assert _meta._build_version("0.1.0", (SHA, False)) == "0.1.0+g0123456789ab"
    assert _meta._build_version("0.1.0", (SHA, True)) == "0.1.0+g0123456789ab.dirty"
    assert _meta._build_version("0.1.0", (SHA, None)) == "0.1.0+g0123456789ab"
    assert _meta._build_version("0.1.0+local", (SHA, True)) == "0.1.0+local.g0123456789ab.dirty"


def test_the_commit_is_read_from_the_git_folder_without_running_git(tmp_path, git_calls):
    package = _fake_checkout(tmp_path)
    assert _meta.git_commit(package) == (SHA, None)  # git could not tell the state
    assert all(args[0] == "status" for args in git_calls)  # the commit: files alone
    # a branch only in packed-refs (after `git gc`)
    (tmp_path / ".git" / "refs" / "heads" / "main").unlink()
    (tmp_path / ".git" / "packed-refs").write_text(
        f"# pack-refs with: peeled\n{OTHER} refs/heads/other\n{SHA} refs/heads/main\n"
    )
    assert _meta.git_commit(package) == (SHA, None)
    # a detached HEAD
    (tmp_path / ".git" / "HEAD").write_text(OTHER + "\n")
    assert _meta.git_commit(package) == (OTHER, None)


def test_a_linked_work_tree_reads_its_common_dir(tmp_path, git_calls):
    main = tmp_path / "main"
    _fake_checkout(main)
    linked = tmp_path / "linked"
    gitdir = main / ".git" / "worktrees" / "linked"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (gitdir / "commondir").write_text("../..\n")
    (linked / "src" / "attnflow").mkdir(parents=True)
    (linked / ".git").write_text(f"gitdir: {gitdir}\n")
    assert _meta.git_commit(linked / "src" / "attnflow") == (SHA, None)


def test_git_is_asked_only_when_the_files_cannot_tell(tmp_path, monkeypatch):
    package = _fake_checkout(tmp_path, head="ref: refs/heads/gone\n")
    answers = {"rev-parse": OTHER + "\n", "status": " M src/attnflow/x.py\n"}
    monkeypatch.setattr(_meta, "_git", lambda root, *args: answers[args[0]])
    assert _meta.git_commit(package) == (OTHER, True)
    answers["status"] = ""
    assert _meta.git_commit(package) == (OTHER, False)
    answers["rev-parse"] = "fatal: not a git repository\n"  # neither: no commit
    assert _meta.git_commit(package) is None


def test_an_installed_copy_or_a_folder_outside_git_has_no_commit(tmp_path, git_calls):
    assert _meta.git_commit(tmp_path / "lib" / "attnflow") is None
    _fake_checkout(tmp_path)
    # a venv inside a checkout: its site-packages is not the checkout's code
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages" / "attnflow"
    site.mkdir(parents=True)
    assert _meta.git_commit(site) is None
    assert git_calls == []


def test_a_real_git_checkout(tmp_path):
    """Against git itself: the commit, clean, then dirty when the package folder changes
    (a file elsewhere in the checkout does not count)."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        git("init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not installed")
    package = tmp_path / "src" / "attnflow"
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = git("rev-parse", "HEAD")
    assert _meta.git_commit(package) == (sha, False)
    (tmp_path / "figure.json").write_text("{}")  # a run's output elsewhere: still clean
    assert _meta.git_commit(package) == (sha, False)
    (package / "a.py").write_text("x = 2\n")
    assert _meta.git_commit(package) == (sha, True)
    label = _meta._build_version("0.1.0", _meta.git_commit(package))
    assert label == f"0.1.0+g{sha[:12]}.dirty"


def test_this_process_records_its_build_in_run_metadata():
    build = _meta.build_version()
    assert build.startswith(_meta.attnflow_version())
    assert _meta.build_version() is build  # computed once
    meta = _meta.run_metadata()
    assert meta["attnflow_build"] == build and meta["attnflow"] == _meta.attnflow_version()
    root = Path(_meta.__file__).resolve().parents[2]
    if (root / ".git").exists() and "site-packages" not in _meta.__file__:
        p = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True)
        if p.returncode == 0:
            assert f"+g{p.stdout.decode().strip()[:12]}" in build


def test_the_build_imports_nothing_heavy():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from attnflow._meta import build_version; b = build_version()\n"
        "print(b, time.perf_counter() - t, 'jax' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    build, seconds, jax = p.stdout.split()
    assert build.startswith(_meta.attnflow_version()) and jax == "False"
    assert float(seconds) < 3.0


def test_an_unchanged_sidecar_is_left_as_it_is(tmp_path):
    """A sidecar that differs only in the build that made it is not rewritten (a rerun of
    another commit leaves the checkout clean); one whose numbers changed is, with the
    new build; one written before builds were recorded is kept too."""
    from attnflow.experiments import _plotting as H

    side = {"a": [1.0, 2.0], "versions": {"attnflow": "0.1.0", "attnflow_build": "0.1.0+gaaa"}}
    path = H.write_json(tmp_path, "fig", side, compact=True)
    first = path.read_bytes()
    again = {**side, "versions": {"attnflow": "0.1.0", "attnflow_build": "0.1.0+gbbb.dirty"}}
    H.write_json(tmp_path, "fig", again, compact=True)
    assert path.read_bytes() == first
    changed = {**again, "a": [1.0, 2.5]}
    H.write_json(tmp_path, "fig", changed, compact=True)
    assert json.loads(path.read_text())["versions"]["attnflow_build"] == "0.1.0+gbbb.dirty"
    old = {"a": [1.0, 2.5], "versions": {"attnflow": "0.1.0"}}  # a committed sidecar
    path.write_text(json.dumps(old))
    H.write_json(tmp_path, "fig", changed, compact=True)
    assert json.loads(path.read_text()) == old


def test_figure_data_and_sidecars_record_the_build_and_the_input_key_ignores_it(tmp_path):
    import numpy as np

    from attnflow.experiments import _figure as F
    from attnflow.experiments import _plotting as H
    from attnflow.experiments.runner import input_key

    def compute(quick):
        return F.Data(sidecar=H.sidecar(script="t", quick=quick, runs=[]), arrays={"x": [1]})

    def draw(data):
        return {"t.md": f"{np.asarray(data.arrays['x']).tolist()}\n"}

    res = F.figure("fig_t", compute, draw)(tmp_path, quick=True)
    meta, _ = F.read_data(res["data"])
    side = json.loads(Path(res["json"]).read_text())
    assert meta["attnflow_build"] == _meta.build_version()
    assert side["versions"]["attnflow_build"] == _meta.build_version()
    script = tmp_path / "fig_t.py"
    script.write_text("x = 1\n")
    versions = {"attnflow": "0.1.0", "jax": "0.10.1"}
    key = input_key(tmp_path, "fig_t", True, "digest", {**versions, "attnflow_build": "a"})
    assert key == input_key(tmp_path, "fig_t", True, "digest", versions)
    assert key != input_key(tmp_path, "fig_t", True, "digest", {**versions, "jax": "0.10.2"})
