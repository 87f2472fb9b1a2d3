"""The notebooks of ``docs/notebooks/`` (jupytext percent scripts, rendered as pages of the
site by ``docs/_hooks/notebooks.py`` through their stubs ``docs/notebooks/<name>.md``) run
to the end, and the numbers their text states are the numbers they compute.

Each script runs with ``runpy`` in one child Python per test process, one after the
other as the site build runs them (x64 as each script sets it, and the suite's
compilation cache), so that JAX is imported once. For every notebook, ``CLAIMS`` pairs a
pattern of its markdown text with expressions evaluated in the script's globals: each
number the pattern captures must equal the value of its expression, written to the
same number of decimals; a pattern without groups must be found and its expressions
must be true. A notebook without claims fails ``test_every_notebook_states_checked_claims``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "docs" / "notebooks"
HOOK = ROOT / "docs" / "_hooks" / "notebooks.py"
TIMEOUT = 300.0  # seconds for one notebook, compilation included
MARK = "@@notebook-result@@"

_NUMBER_WORDS = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())
}

_HYPERPLANE_HEADS = "[(h.layer, h.head) for h in census.heads if h.label == 'hyperplanes']"

# notebook -> [(pattern of its markdown, expressions in its globals)]
CLAIMS: dict[str, list[tuple[str, list[str]]]] = {
    "clustering": [
        (r"agree in (\d+) of (\d+) runs", ["agree", "total"]),
        (r"agree in 32 of 32 runs", ["agree == total"]),
        (
            r"varies from start to start \((\d+) to (\d+) here\)",
            [
                "min(o.n_clusters for o in runs['V = I'][2])",
                "max(o.n_clusters for o in runs['V = I'][2])",
            ],
        ),
        (
            r"every start ends on two levels, \$a < 0 < b\$",
            [
                "all(o.n_clusters == 2 and o.details['a'] < 0 < o.details['b']"
                " for o in runs['paper 2x2 V'][2])"
            ],
        ),
    ],
    "ginibre_curve": [
        (r"\$d = 1\$ gives (\d+(?:\.\d+)?)", ["estimates[1].fraction"]),
        (r"\$d = 2\$ gives (\d+(?:\.\d+)?)", ["estimates[2].fraction"]),
        (r"against \$1/\(2\\sqrt 2\) = (\d+(?:\.\d+)?)\$", ["1 / (2 * np.sqrt(2))"]),
        (
            r"Both exact values lie inside their intervals",
            ["all(estimates[d].low <= p <= estimates[d].high for d, p in exact.items())"],
        ),
        (r"At \$d = 64\$ the fraction is (\d+(?:\.\d+)?)", ["estimates[64].fraction"]),
        (
            r"ratios (\d+(?:\.\d+)?) to (\d+(?:\.\d+)?) here",
            [
                "min(e.good_ginibre.fraction / e.fraction for e in estimates.values())",
                "max(e.good_ginibre.fraction / e.fraction for e in estimates.values())",
            ],
        ),
        (
            r"(\w+) of the ten meet the spectral hypothesis \(samples (\d+), (\d+) and (\d+);",
            [
                "len(spectral)",
                "spectral[0]",
                "spectral[1]",
                "spectral[2]",
            ],
        ),
        (r"and sample (\d+) fails\s+the \$Q, K\$ condition", ["fails_qk[0]"]),
        (r"sample 9 fails", ["len(fails_qk) == 1"]),
    ],
    "sphere_phase": [
        (
            r"first at \$\\beta = (\d+(?:\.\d+)?)\$ in\s+\$d = 2\$",
            ["betas[np.argmax(diagrams[2].fraction[:, -1] < 0.5)]"],
        ),
        (
            r"and at \$\\beta = (\d+(?:\.\d+)?)\$ in \$d = 32\$",
            ["betas[np.argmax(diagrams[32].fraction[:, -1] < 0.5)]"],
        ),
        (
            r"below, the time to cluster barely depends on \$\\beta\$; above, it grows",
            ["curve[-1] > 10 * curve[0]", "np.all(np.diff(curve) > 0)"],
        ),
    ],
    "heads_census": [
        (
            r"(\w+) of the eight heads meet the hyperplane theorem \(L(\d) H(\d) and L(\d) H(\d)\)",
            [
                "census.counts['hyperplanes']",
                *[f"{_HYPERPLANE_HEADS}[{i}][{j}]" for i in range(2) for j in range(2)],
            ],
        ),
        (
            r"(\w+) meet its\s+spectral hypothesis .*?and (\w+) of those\s+fail",
            ["census.hypotheses['spectral']", "census.hypotheses['spectral_not_qk']"],
        ),
        (r"no head has", ["census.hypotheses['qk_pd'] == 0"]),
        (
            r"Both heads end on the hyperplane structure, each on a single level",
            [
                "all(r.observed[0] == 'hyperplanes' and r.n_clusters[0] == 1"
                " and r.statuses[0] == 'ok' for r in runs.values())",
                "all(r.boolean_distance[0] < 1e-6 for r in runs.values())",
                "all(len(r.leaders[0]) == 1 for r in runs.values())",
                "[r.predicted for r in runs.values()] == ['hyperplanes', 'unclassified']",
            ],
        ),
    ],
    "own_family": [
        (r"`observe_limit` finds (\d+) limit\s+points", ["observed.n_clusters"]),
        (r"`track_rank` (\d+) leaders", ["len(rank.leaders)"]),
        (
            r"as the polytope theorem says",
            ["regime.label == 'polytope'", "observed.label == 'polytope'"],
        ),
        (
            r"the same layers to rounding",
            ["gap < 1e-12", "all(t.status == 'ok' for t in layers.values())"],
        ),
        (
            r"Save and load",
            ["type(back.model) is TiedAttention", "back.model.describe() == model.describe()"],
        ),
        (
            r"refuses it with a message",
            [
                "af.predict_regime(sig).label == 'unclassified'",
                "af.predict_regime(causal).label == 'unclassified'",
                "run.status == 'ok'",
            ],
        ),
    ],
    "metastability": [
        (
            r"At \$t = 0\$ every count is 1: .*?\(\$\\arccos 0\.99 = (\d+\.\d+)\$ rad\)",
            ["np.arccos(THRESHOLD)"],
        ),
        (
            r"At \$t = 0\$ every count is 1",
            ["all(bool(np.all(r['counts'][:, 0] == 1)) for r in runs.values())"],
        ),
        (
            r"At \$\\beta = 10\$ the run plateaus at (\d+) clusters, and \$k\^\* = (\d+)\$",
            ["runs[10.0]['plateau'][0]", "pred[10.0].clusters"],
        ),
        (
            r"the count is settled from \$2T\$ and does not move to \$6T\$",
            ["bool(np.all(runs[10.0]['counts'][0][20:] == runs[10.0]['plateau'][0]))"],
        ),
        (
            r"At \$\\beta = 5\$ the run plateaus at (\d+) clusters, against \$k\^\* = (\d+)\$",
            ["runs[5.0]['plateau'][0]", "pred[5.0].clusters"],
        ),
        (
            r"mode 2 grows at (\d+)% of mode 3's rate",
            ["int(round(100 * pred[5.0].rates[1] / pred[5.0].rates[2]))"],
        ),
        (
            r"other starts plateau at (\d+), (\d+) and (\d+) \(\$\\beta = 5\$\) and at (\d+), (\d+)"
            r" and (\d+) \(\$\\beta = 10\$\)",
            [f"runs[{b}]['plateau'][{i}]" for b in (5.0, 10.0) for i in (1, 2, 3)],
        ),
    ],
    "leaders": [
        (
            r"the leaders are tokens (\d+) and (\d+), the largest and the smallest at the start",
            ["int(np.argmax(x1))", "int(np.argmin(x1))"],
        ),
        (
            r"the order of the tokens never changes",
            ["order_kept", "sorted(rank1.leaders.tolist()) == extremes", "rows_ok"],
        ),
        (
            r"The numerical rank is (\d+) at \$t = 0\$ .*? to (\d+) at \$t = (\d+\.\d+)\$, then"
            r" falls, and is 2 from \$t = (\d+\.\d+)\$ on",
            ["int(rank1.rank[0])", "peak", "t_peak", "first_two"],
        ),
        (
            r"slope (\d+\.\d+) against \$\\lambda = 1\$, \$R\^2 = (\d+\.\d+)\$",
            ["rank1.rate", "rank1.r2"],
        ),
        (r"\$\\lambda_1 = (\d+\.\d+)\$ drives", ["rank2.lambda_max"]),
        (
            r"The rank of \$P\$ is 2 from \$t = (\d+\.\d+)\$ on, and the two leaders, tokens (\d+)"
            r" and (\d+), end one on each extreme hyperplane",
            ["first_two2", "leaders2[0]", "leaders2[1]"],
        ),
        (
            r"end one on each extreme hyperplane",
            [
                "rank2.final_rank == 2",
                "limit.label == 'hyperplanes'",
                "bool(np.allclose(sorted(levels[-1, leaders2]), [a, b], atol=1e-2))",
            ],
        ),
        (
            r"here they are also the two tokens with the extreme levels at the start",
            ["start_extremes == sorted(leaders2)"],
        ),
        (
            r"The fitted slope is (\d+\.\d+), that is \$(\d+\.\d+)\\,\\lambda_1\$ with"
            r" \$R\^2 = (\d+\.\d+)\$",
            ["rank2.rate", "rank2.rate / rank2.lambda_max", "rank2.r2"],
        ),
    ],
    "meanfield": [
        (r"solves these equations", ["closure.ok"]),
        (
            r"At \$t = 1\$ the distance is (\d+\.\d+) at \$n = 100\$, (\d+\.\d+) at \$n = 400\$"
            r" and (\d+\.\d+) at \$n = 1600\$",
            ["dist[100][-1]", "dist[400][-1]", "dist[1600][-1]"],
        ),
        (r"sixteen times the tokens, (\d+\.\d+) times the distance", ["ratio"]),
        (
            r"the samples are already (\d+\.\d+), (\d+\.\d+) and (\d+\.\d+) away",
            ["dist[100][0]", "dist[400][0]", "dist[1600][0]"],
        ),
        (
            r"by a factor (\d+\.\d+) at \$n = 100\$ and (\d+\.\d+) at \$n = 1600\$",
            ["dist[100][-1] / dist[100][0]", "dist[1600][-1] / dist[1600][0]"],
        ),
    ],
}

_DRIVER = r"""
import contextlib, io, json, runpy, sys, time, traceback
import numpy as np
from attnflow import _cache

_cache.enable_compilation_cache()  # the suite's directory (ATTNFLOW_CACHE_DIR)


def plain(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [plain(a) for a in v]
    if isinstance(v, np.ndarray):
        return plain(v.tolist())
    return str(v)


for line in sys.stdin:
    job = json.loads(line)
    out, started = io.StringIO(), time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            g = runpy.run_path(job["path"], run_name="__main__")
            values = [plain(eval(e, g)) for e in job["expressions"]]
        result = {"ok": True, "values": values}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    try:
        import matplotlib.pyplot as plt

        plt.close("all")
    except ImportError:
        pass
    result.update(output=out.getvalue(), seconds=time.perf_counter() - started)
    print(MARK + json.dumps(result), flush=True)
""".replace("MARK", repr(MARK))


def _hook():
    spec = importlib.util.spec_from_file_location("notebooks_hook", HOOK)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _markdown(name: str) -> str:
    """The markdown of a notebook as the site renders it, whitespace collapsed."""
    text = (NOTEBOOKS / f"{name}.py").read_text(encoding="utf-8")
    cells = _hook().cells(text)
    return re.sub(r"\s+", " ", " ".join(body for kind, _, body in cells if kind == "markdown"))


class _Child:
    """One Python that runs notebooks on request (JSON lines in, marked lines out)."""

    def __init__(self):
        env = dict(os.environ, MPLBACKEND="Agg")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )

    def run(self, name: str, expressions: list[str]) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        job = {"path": str(NOTEBOOKS / f"{name}.py"), "expressions": expressions}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT
        while True:
            if os.name == "posix":
                import select

                ready, _, _ = select.select([self.proc.stdout], [], [], 5.0)
                if not ready:
                    if self.proc.poll() is not None:
                        raise AssertionError(f"the notebook runner died running {name}")
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{name} ran longer than {TIMEOUT:.0f} s")
                    continue
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the notebook runner died running {name}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def child():
    c = _Child()
    yield c
    c.close()


def _same(stated: str, value) -> bool:
    """Whether the stated text is the computed value, written as the text writes it."""
    word = stated.lower()
    if word in _NUMBER_WORDS:
        return value == _NUMBER_WORDS[word]
    if re.fullmatch(r"-?\d+", stated):
        return isinstance(value, (int, float)) and value == int(stated)
    if re.fullmatch(r"-?\d+\.\d+", stated):
        decimals = len(stated.split(".")[1])
        return isinstance(value, (int, float)) and f"{value:.{decimals}f}" == stated
    return str(value) == stated


def test_every_notebook_states_checked_claims():
    found = sorted(p.stem for p in NOTEBOOKS.glob("*.py"))
    assert found == sorted(CLAIMS), "every notebook needs its claims here, and only those"
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in found:
        assert f"notebooks/{name}.md" in nav, f"{name} is not in the site's navigation"
        stub = (NOTEBOOKS / f"{name}.md").read_text(encoding="utf-8")
        assert f"<!-- notebook: {name}.py -->" in stub, f"{name}.md does not render {name}.py"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_the_hook_renders_the_notebook(name):
    text = (NOTEBOOKS / f"{name}.py").read_text(encoding="utf-8")
    hook = _hook()
    kinds = [kind for kind, _, _ in hook.cells(text)]
    assert kinds[0] == "markdown" and "code" in kinds
    page = hook.to_markdown(name, text)
    assert page.startswith("# ")
    assert page.count('exec="on"') == kinds.count("code")
    assert 'html="1"' in page, "every notebook draws a figure (a cell tagged figure)"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_notebook_runs_and_states_what_it_computes(child, name):
    claims = CLAIMS[name]
    markdown = _markdown(name)
    expressions = [e for _, exprs in claims for e in exprs]
    # every notebook ends with a figure cell, which leaves its figure in ``fig``
    result = child.run(name, [*expressions, "type(fig).__name__"])
    assert result["ok"], f"{name} failed:\n{result.get('error')}\n{result['output'][-2000:]}"
    *values, figure = result["values"]
    assert figure == "Figure", f"{name}: fig is a {figure}, not a matplotlib Figure"
    values = iter(values)
    for pattern, exprs in claims:
        got = [next(values) for _ in exprs]
        m = re.search(pattern, markdown)
        assert m, f"{name}: the text no longer says {pattern!r}"
        if m.groups():
            assert len(m.groups()) == len(got), pattern
            for stated, value, expr in zip(m.groups(), got, exprs):
                assert _same(stated, value), f"{name}: the text says {stated}, {expr} = {value}"
        else:
            assert all(v is True for v in got), f"{name}: {pattern!r}: {dict(zip(exprs, got))}"
